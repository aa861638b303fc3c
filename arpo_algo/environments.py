"""Making environments from users' arguments (an id and keyword arguments from a recipe or flags): errors in one
line, and the run's own folder hidden from the sandbox."""

import re
from contextlib import contextmanager
from typing import Any, Iterator

from arpo_algo.settings import ConfigError


def unknown_env(exc: Exception) -> str:
    """Gymnasium's message for an id that is not registered, with arpo's ids: its own suggestion ("Did you mean:
    `Hopper`?" for ``Nope-v0``) is no help here."""
    from arpo_env import ENV_IDS

    said = re.sub(r" Did you mean: `(?!ARPO-)[^`]*`\?", "", str(exc))  # a close name among Gymnasium's own
    return (f"{said} arpo's environments: {', '.join(ENV_IDS)}; another package's is named with the module that "
            "registers it, as Gymnasium reads it (module:Name-v0)")


@contextmanager
def env_arguments(env_id: str) -> Iterator[None]:
    """Around the making of an environment from a user's arguments: an argument the env does not take, a value it
    refuses (``max_tool_calls: -1``) or a tool it cannot make (E2B without its key) is a `ConfigError` naming the env,
    one line on the command line, not a traceback; so is a ``module:Name-v0`` id whose module is missing. A dataset's
    or Gymnasium's own errors pass as they are (the command line says an unknown id with arpo's: `unknown_env`)."""
    import gymnasium as gym

    from arpo_env.datasets.task import DataError

    try:
        yield
    except ModuleNotFoundError as exc:
        if ":" not in env_id.split("/")[0]:
            raise
        raise ConfigError(f"{env_id}: {exc}") from None  # module:Name-v0, the module not there
    except (DataError, gym.error.Error):
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{env_id}: {' '.join(str(exc).split())}") from None


def takes_sandbox_options(env_id: str) -> bool:
    """Whether the env registered as `env_id` takes ``sandbox_options`` (ours do; another may not)."""
    import inspect

    import gymnasium as gym

    import arpo_env  # noqa: F401 - registers the ids

    try:
        from arpo_env.envs.math import MathEnv
        from arpo_env.envs.qa import QAEnv

        creator = gym.envs.registration.load_env_creator(gym.spec(env_id).entry_point)
        if isinstance(creator, type) and issubclass(creator, (MathEnv, QAEnv)):
            return True  # DeepSearchEnv passes its keyword arguments on
        return "sandbox_options" in inspect.signature(creator).parameters
    except Exception:  # noqa: BLE001 - an id gym.make will report on itself, or a creator without a signature
        return False


def hide_from_sandbox(env_id: str, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    """`kwargs` (gym.make's) with `path` among the local sandbox's hidden paths, where the env takes
    ``sandbox_options``: what a run writes (rollout trees, a training run's folder) holds the tasks' answers, and the
    same tasks come back. With another sandbox (E2B: a VM that cannot see this machine's files), envs on a server
    (``server_url``: the server sets its sandbox), or tools without ``python`` (the env warns of sandbox options it
    does not use), `kwargs` as they are."""
    import os

    from arpo_env.tools.registry import tool_names

    if kwargs.get("server_url") or kwargs.get("sandbox", "local") != "local" or not takes_sandbox_options(env_id):
        return kwargs
    try:
        if kwargs.get("tools") is not None and "python" not in tool_names(kwargs["tools"]):  # None: the default
            return kwargs
    except ValueError:  # the env says what is wrong with them
        return kwargs
    options = dict(kwargs.get("sandbox_options") or {})
    options["hidden_paths"] = (*options.get("hidden_paths", ()), os.path.abspath(path))
    return {**kwargs, "sandbox_options": options}
