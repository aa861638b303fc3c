"""arpo_algo: ARPO (Agentic Reinforced Policy Optimization) over arpo_env environments.

``ARPOConfig`` and ``ARPOTrainer`` need the training extra (``pip install 'arpo[train]'``); they are imported
lazily so that the rollout engine works without TRL.
"""

from contextlib import contextmanager
from typing import Any, Iterator

__version__ = "0.1.0"

__all__ = ["ARPOConfig", "ARPOTrainer", "ConfigError"]


class ConfigError(ValueError):
    """A setting ARPO cannot honour; the message says which and what to do. (Here, not in `arpo_config`, so that
    the command line can catch it without the training extra installed.)"""


@contextmanager
def env_arguments(env_id: str) -> Iterator[None]:
    """Around the making of an environment from a user's arguments: an argument the env does not take, a value it
    refuses (``max_tool_calls: -1``) or a tool it cannot make (E2B without its key) is a `ConfigError` naming the env,
    one line on the command line, not a traceback. A dataset's or Gymnasium's own errors pass as they are."""
    import gymnasium as gym

    from arpo_env.datasets import DataError

    try:
        yield
    except (DataError, gym.error.Error):
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{env_id}: {' '.join(str(exc).split())}") from None


def __getattr__(name: str) -> Any:
    if name == "ARPOConfig":
        from arpo_algo.arpo_config import ARPOConfig

        return ARPOConfig
    if name == "ARPOTrainer":
        from arpo_algo.arpo_trainer import ARPOTrainer

        return ARPOTrainer
    raise AttributeError(f"module 'arpo_algo' has no attribute {name!r}")
