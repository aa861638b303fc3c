"""Rollouts: the scheduler (`scheduler`: ARPO's branching rollouts and GRPO's independent ones) and the state of
its paths and tasks (`paths`)."""
