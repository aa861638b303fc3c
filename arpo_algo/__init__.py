"""arpo_algo: ARPO (Agentic Reinforced Policy Optimization) over arpo_env environments.

``ARPOConfig`` and ``ARPOTrainer`` need the training extra (``pip install 'arpo[train]'``); they are imported
lazily so that the rollout engine works without TRL.
"""

import re
from contextlib import contextmanager
from typing import Any, Iterator

__version__ = "0.1.0"

__all__ = ["ARPOConfig", "ARPOTrainer", "ConfigError"]


class ConfigError(ValueError):
    """A setting ARPO cannot honour; the message says which and what to do. (Here, not in `arpo_config`, so that
    the command line can catch it without the training extra installed.)"""


def json_object(name: str, value: Any, example: str) -> dict[str, Any]:
    """A table of keyword arguments given as a dict (YAML) or as JSON text (a flag): ``--env-kwargs`` of `arpo
    rollout`, ``env_kwargs`` and ``vllm_engine_kwargs`` of the trainer. Text that is not JSON, or JSON that is not an
    object, is a `ConfigError` naming `name` and showing `example`."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} is not JSON ({exc}): give an object, e.g. '{example}'") from None
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{name} must be an object of keyword arguments, not {type(value).__name__} {value!r}")
    return dict(value or {})


def unknown_env(exc: Exception) -> str:
    """Gymnasium's message for an id that is not registered, with arpo's ids: "Did you mean: `Hopper`?" was all it
    said of ``Nope-v0``."""
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

    from arpo_env.datasets import DataError

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
        from arpo_env.math_env import MathEnv
        from arpo_env.qa_env import QAEnv

        creator = gym.envs.registration.load_env_creator(gym.spec(env_id).entry_point)
        if isinstance(creator, type) and issubclass(creator, (MathEnv, QAEnv)):
            return True  # DeepSearchEnv passes its keyword arguments on
        return "sandbox_options" in inspect.signature(creator).parameters
    except Exception:  # noqa: BLE001 - an id gym.make will report on itself, or a creator without a signature
        return False


def hide_from_sandbox(env_id: str, kwargs: dict[str, Any], path: str) -> dict[str, Any]:
    """`kwargs` (gym.make's) with `path` among the local sandbox's hidden paths, where the env takes
    ``sandbox_options``: what a run writes (rollout trees, a training run's folder) holds the tasks' answers, and the
    same tasks come back. With another sandbox (E2B: a VM that cannot see this machine's files), or tools without
    ``python`` (the env warns of sandbox options it does not use), `kwargs` as they are."""
    import os

    from arpo_env.tools import tool_names

    if kwargs.get("sandbox", "local") != "local" or not takes_sandbox_options(env_id):
        return kwargs
    try:
        if kwargs.get("tools") is not None and "python" not in tool_names(kwargs["tools"]):  # None: the default
            return kwargs
    except ValueError:  # the env says what is wrong with them
        return kwargs
    options = dict(kwargs.get("sandbox_options") or {})
    options["hidden_paths"] = (*options.get("hidden_paths", ()), os.path.abspath(path))
    return {**kwargs, "sandbox_options": options}


def __getattr__(name: str) -> Any:
    if name == "ARPOConfig":
        from arpo_algo.arpo_config import ARPOConfig

        return ARPOConfig
    if name == "ARPOTrainer":
        from arpo_algo.arpo_trainer import ARPOTrainer

        return ARPOTrainer
    raise AttributeError(f"module 'arpo_algo' has no attribute {name!r}")
