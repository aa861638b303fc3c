"""Applications: the ``arpo`` command (`main`), ``arpo rollout`` (`rollout`), ``arpo eval`` (`eval`) and
``arpo view`` (`viewer`)."""
