"""arpo_env: Gymnasium environments for tool-integrated reasoning, with forkable state.

    import gymnasium as gym
    import arpo_env  # registers the environments

    env = gym.make("ARPO-Math-v0")

Environment ids: ``ARPO-Math-v0`` (math with a Python interpreter), ``ARPO-QA-v0`` (multi-hop QA with search and
Python), ``ARPO-DeepSearch-v0`` (search, browse and Python). Every environment exposes ``fork()``,
``snapshot()`` and ``restore()`` on ``env.unwrapped``; `arpo_env.fork`, `arpo_env.snapshot` and `arpo_env.restore`
do the same for the env ``gym.make`` returns, keeping its wrappers (`arpo_env.forking`).
"""

from gymnasium.envs.registration import register, registry

from arpo_env.datasets.loaders import load_tasks
from arpo_env.datasets.task import Task
from arpo_env.env import ToolEnv
from arpo_env.forking import fork, restore, snapshot
from arpo_env.rewards import HierarchicalReward, RewardParts
from arpo_env.tools.protocol import Tool, ToolOutput

__version__ = "0.1.0"

ENV_IDS = {
    "ARPO-Math-v0": "arpo_env.envs.math:MathEnv",
    "ARPO-QA-v0": "arpo_env.envs.qa:QAEnv",
    "ARPO-DeepSearch-v0": "arpo_env.envs.qa:DeepSearchEnv",
}
# gym.make returns the env itself, without OrderEnforcing and the passive checker: ToolEnv enforces reset before
# step on its own and passes check_env (tests/test_math_env.py). So env.unwrapped.restore(snapshot) followed by a
# step of the made env works, as arpo_env.restore(env, snapshot) does; those wrappers' counters made it fail.
for _id, _entry in ENV_IDS.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, disable_env_checker=True, order_enforce=False)

__all__ = ["ENV_IDS", "HierarchicalReward", "RewardParts", "Task", "Tool", "ToolEnv", "ToolOutput", "fork",
           "load_tasks", "restore", "snapshot"]
