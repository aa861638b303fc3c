"""arpo_algo: ARPO (Agentic Reinforced Policy Optimization) over arpo_env environments.

The package is layered; each layer imports only those above it in this list:

* `arpo_algo.core`: the paper's maths, torch-free (rollout settings, entropy, branching, trees, advantages);
* `arpo_algo.generation`: the `Generator` protocol and its backends (transformers, vLLM), model loading;
* `arpo_algo.rollout`: the scheduler that grows a tree of trajectories per task;
* `arpo_algo.training`: `ARPOConfig` and `ARPOTrainer` on TRL, ``arpo train`` and ``arpo sft``;
* `arpo_algo.cli`: the ``arpo`` command, ``arpo eval`` and ``arpo view``.

Beside them, modules any layer may use: `settings` (`ConfigError` and checks), `environments` (making envs from a
user's arguments), `jsonl` (logs that survive a kill), `flags` (the command line's conventions) and `extras` (which
extra brings which import).

The public names below are imported on first use, so that ``import arpo_algo`` needs neither torch nor TRL:
``ARPOConfig`` and ``ARPOTrainer`` need the training extra (``pip install 'arpo[train]'``).
"""

from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "ARPOConfig": "arpo_algo.training.config",
    "ARPOTrainer": "arpo_algo.training.trainer",
    "ARPORollout": "arpo_algo.rollout.scheduler",
    "GRPORollout": "arpo_algo.rollout.scheduler",
    "RolloutConfig": "arpo_algo.core.config",
    "RolloutTree": "arpo_algo.core.tree",
    "Generator": "arpo_algo.generation.protocol",
    "ConfigError": "arpo_algo.settings",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'arpo_algo' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(_PUBLIC[name])
    except ModuleNotFoundError as exc:  # an extra not installed: say which (arpo_algo.extras)
        from arpo_algo.extras import install_hint

        hint = install_hint(exc)
        if hint is None:
            raise
        raise ModuleNotFoundError(f"arpo_algo.{name} {hint}", name=exc.name) from None
    return getattr(module, name)
