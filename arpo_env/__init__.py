"""arpo_env: Gymnasium environments for tool-integrated reasoning, with forkable state.

    import gymnasium as gym
    import arpo_env  # registers the environments

    env = gym.make("ARPO-Math-v0")

Environment ids: ``ARPO-Math-v0`` (math with a Python interpreter), ``ARPO-QA-v0`` (multi-hop QA with search and
Python), ``ARPO-DeepSearch-v0`` (search, browse and Python). Every environment exposes ``fork()``,
``snapshot()`` and ``restore()`` on ``env.unwrapped``; `arpo_env.fork`, `arpo_env.snapshot` and `arpo_env.restore`
do the same for the env ``gym.make`` returns, keeping its wrappers (`arpo_env.forking`).

Tools of your own — a Python function (`tool`) or an MCP server's tools (`MCPTools`) — go in any env's ``tools``
(``gym.make("ARPO-Math-v0", tools=["python", my_function])``), or make an env of their own with `ToolEnv` and
`register_env`.
"""

from arpo_env.datasets.loaders import load_tasks
from arpo_env.datasets.task import Task
from arpo_env.env import ToolEnv
from arpo_env.forking import fork, restore, snapshot
from arpo_env.registration import ENV_IDS, register_env
from arpo_env.rewards import HierarchicalReward, RewardParts
from arpo_env.tools.functions import FunctionTool, tool
from arpo_env.tools.mcp import MCPTools
from arpo_env.tools.protocol import Tool, ToolOutput, ToolSpec

__version__ = "0.1.0"

__all__ = ["ENV_IDS", "FunctionTool", "HierarchicalReward", "MCPTools", "RewardParts", "Task", "Tool", "ToolEnv",
           "ToolOutput", "ToolSpec", "fork", "load_tasks", "register_env", "restore", "snapshot", "tool"]
