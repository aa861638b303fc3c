"""Fork, snapshot and restore an environment *as made by* ``gym.make``: wrappers included.

``env.unwrapped.fork()`` copies the bare `ToolEnv`; an env from ``gym.make`` is a stack of wrappers around it
(``TimeLimit`` with its step count, ``OrderEnforcing`` with its reset flag, the passive checker, and whatever the
user added, ``RecordEpisodeStatistics`` say). These functions take either and keep the stack::

    import gymnasium as gym
    import arpo_env

    env = gym.make("ARPO-Math-v0", max_episode_steps=4)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env.reset(seed=0)
    env.step("<python>x = 1</python>")
    branch = arpo_env.fork(env)          # RecordEpisodeStatistics(TimeLimit(...(ToolEnv))), 1 step elapsed in both
    saved = arpo_env.snapshot(env)       # picklable: the env and every wrapper's counters
    other = gym.make("ARPO-Math-v0", max_episode_steps=4)
    arpo_env.restore(other, saved)       # steppable at once: no reset() needed, the time limit goes on counting

A fork shares nothing mutable with its origin: each wrapper layer is copied with its counters and queues, and the
`ToolEnv` inside is forked (its interpreter live-forked). `restore` needs an env with the same wrapper classes in
the same order (made the same way); it brings back each layer's counters and marks the env as reset.

**Vector envs** are not forked as a whole. A fork of a ``SyncVectorEnv`` means forking the sub-environments you
want (``fork(vec.envs[i])``); those of an ``AsyncVectorEnv`` live in worker processes: take
``vec.call("snapshot")`` there and `restore` the snapshots into envs made the same way, in any process.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import gymnasium as gym

_SHARED = {"env", "_action_space", "_observation_space", "_metadata", "_cached_spec", "_reward_range", "spec"}
"""Wrapper attributes that describe the env rather than hold episode state: shared by a fork, not snapshotted."""


def _layers(env: gym.Env) -> list[gym.Env]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _layer_state(layer: gym.Wrapper) -> dict[str, Any]:
    state = {}
    for name, value in vars(layer).items():
        if name in _SHARED or isinstance(value, (gym.Env, gym.Space)):
            continue
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 - state that cannot travel (a file handle, a lock) stays behind
            continue
        state[name] = value
    return state


def fork(env: gym.Env) -> gym.Env:
    """An independent env whose state equals `env`'s now, with the same wrappers and their counters."""
    layers = _layers(env)
    base = layers[-1]
    if not hasattr(base, "fork"):
        raise TypeError(f"{type(base).__name__} cannot be forked: fork() is for arpo_env environments")
    inner = base.fork()
    for layer in reversed(layers[:-1]):
        clone = copy.copy(layer)
        for name, value in _layer_state(layer).items():
            setattr(clone, name, copy.deepcopy(value))
        clone.env = inner
        inner = clone
    return inner


def snapshot(env: gym.Env) -> dict[str, Any]:
    """A picklable value: the bare env's `snapshot()` and each wrapper's counters, outermost first."""
    layers = _layers(env)
    return {"env": layers[-1].snapshot(),
            "wrappers": [[type(layer).__name__, _layer_state(layer)] for layer in layers[:-1]]}


def restore(env: gym.Env, saved: dict[str, Any]) -> None:
    """Bring `snapshot(...)` (or a bare ``env.unwrapped.snapshot()``) back into `env`, made the same way; the env is
    steppable through its wrappers at once."""
    layers = _layers(env)
    if not isinstance(saved, dict) or "wrappers" not in saved:
        layers[-1].restore(saved)  # a bare ToolEnv snapshot (no dict: its ValueError); the wrappers accept steps
        wrappers: list[list[Any]] = [[type(layer).__name__, {}] for layer in layers[:-1]]
    else:
        wrappers = saved["wrappers"]
        names = [type(layer).__name__ for layer in layers[:-1]]
        if [name for name, _ in wrappers] != names:
            raise ValueError(f"the snapshot's wrappers {[n for n, _ in wrappers]} are not this env's {names}: make "
                             "the env the same way (gym.make arguments and added wrappers)")
        layers[-1].restore(saved["env"])
    for layer, (_, state) in zip(layers[:-1], wrappers):
        for name, value in state.items():
            setattr(layer, name, copy.deepcopy(value))
        if isinstance(layer, gym.wrappers.OrderEnforcing):
            layer._has_reset = True
        if isinstance(layer, gym.wrappers.PassiveEnvChecker) and getattr(layer, "_previous_data", None) is None:
            # no reset of its own to compare the first step with: Gymnasium's checker unpacked None there (a bare
            # snapshot, `vec.call("snapshot")`'s, restored into a fresh env raised a TypeError at its first step)
            layer.checked_reset = layer.checked_step = layer.checked_data_reuse = True
