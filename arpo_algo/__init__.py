"""arpo_algo: ARPO (Agentic Reinforced Policy Optimization) over arpo_env environments."""

__version__ = "0.1.0"
