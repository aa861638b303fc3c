"""Environment ids: arpo's own, and the ones users register for environments of their own tools.

``gym.make`` returns the env itself, without Gymnasium's OrderEnforcing wrapper and passive checker: `ToolEnv`
enforces reset before step on its own and passes ``check_env`` (tests/test_math_env.py), so
``env.unwrapped.restore(snapshot)`` followed by a step of the made env works, as ``arpo_env.restore(env, snapshot)``
does; those wrappers' counters made it fail.
"""

from __future__ import annotations

from typing import Any, Callable

from gymnasium.envs.registration import register, registry

ENV_IDS = {
    "ARPO-Math-v0": "arpo_env.envs.math:MathEnv",
    "ARPO-QA-v0": "arpo_env.envs.qa:QAEnv",
    "ARPO-DeepSearch-v0": "arpo_env.envs.qa:DeepSearchEnv",
}


def register_env(env_id: str, entry_point: str | Callable[..., Any] = "arpo_env.env:ToolEnv", *,
                 replace: bool = False, **kwargs: Any) -> None:
    """Register an environment under `env_id` the way arpo's own are, so that ``gym.make(env_id)``, ``arpo rollout
    --env_id``, ``arpo train`` and `arpo_env.integrations.trl_environment.environment_factory` make it::

        register_env("Glossary-v0", tasks=[{"question": …, "answer": …}], tools=["python", lookup], reward="qa")

    `entry_point` is `ToolEnv` unless given (a subclass, or ``"module:Class"``); `kwargs` are its default arguments
    (``gym.make(env_id, **more)`` adds to them). Another process makes the env by importing the module that
    registers it: name the id ``"module:Glossary-v0"`` on the command line. An id that is taken is a `ValueError`
    unless `replace`."""
    if env_id in registry and not replace:
        raise ValueError(f"{env_id} is registered already; give replace=True to register it again")
    if env_id in registry:
        del registry[env_id]
    register(id=env_id, entry_point=entry_point, kwargs=kwargs, disable_env_checker=True, order_enforce=False)


for _id, _entry in ENV_IDS.items():
    if _id not in registry:
        register_env(_id, _entry)
