"""arpo_algo: ARPO (Agentic Reinforced Policy Optimization) over arpo_env environments.

``ARPOConfig`` and ``ARPOTrainer`` need the training extra (``pip install 'arpo[train]'``); they are imported
lazily so that the rollout engine works without TRL.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["ARPOConfig", "ARPOTrainer", "ConfigError"]


class ConfigError(ValueError):
    """A setting ARPO cannot honour; the message says which and what to do. (Here, not in `arpo_config`, so that
    the command line can catch it without the training extra installed.)"""


def __getattr__(name: str) -> Any:
    if name == "ARPOConfig":
        from arpo_algo.arpo_config import ARPOConfig

        return ARPOConfig
    if name == "ARPOTrainer":
        from arpo_algo.arpo_trainer import ARPOTrainer

        return ARPOTrainer
    raise AttributeError(f"module 'arpo_algo' has no attribute {name!r}")
