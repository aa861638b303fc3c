"""`ARPO-Math-v0`: mathematical reasoning with a Python interpreter."""

from __future__ import annotations

from typing import Any, Sequence

from arpo_env.datasets.loaders import as_tasks, load_tasks, task_paths
from arpo_env.env import ToolEnv
from arpo_env.rewards import HierarchicalReward
from arpo_env.scoring.math_equivalence import math_score
from arpo_env.tools.registry import build_tools


class MathEnv(ToolEnv):
    r"""Solve a math problem, calling a Python interpreter while reasoning.

    ## Description
    A multi-turn tool-integrated reasoning task from the ARPO paper (Dong et al. 2025). The agent reads a problem,
    thinks, runs Python (a persistent interpreter with numpy and sympy) as often as its budget allows, and answers
    with ``<answer>\boxed{…}</answer>``. Datasets: gsm8k, math500, math, aime24, aime25 from a data directory, the
    math rows of the ARPO training set (``dataset="train"``), any JSONL/JSON/parquet/CSV file, or the 100 problems
    shipped in the package (``dataset="default"``).

    ## Action Space
    Text (`arpo_env.spaces.UnicodeText`): what the model generated since the last observation, normally ending
    with a tool call (``<python>code</python>``) or the answer. Bytes are decoded as UTF-8.

    ## Observation Space
    Text. After `reset`, the user turn (the problem and the answer instruction); the chat messages, with the system
    prompt that explains the protocol, are in ``info["messages"]``. After a tool call, the tool's output wrapped as
    ``\n<result>\n…\n</result>\n``, exactly the text to append to the completion. After the episode ends, ``""``
    (or the last ``<result>`` that says why it was truncated).

    ## Rewards
    0 on every step but the last. At the end, the hierarchical reward (`arpo_env.rewards.HierarchicalReward`):
    −1 if the completion breaks the format (no boxed answer, unbalanced tags, a tool call after the answer);
    otherwise 1 if math-verify finds the answer equal to the gold one, else 0; +0.1 when it is correct and both
    search and Python were used. The parts are in ``info["reward_parts"]``.

    ## Starting State
    A task drawn with the env's RNG (seeded by ``reset(seed=…)``), or ``options={"index": i}``, or a custom
    ``options={"question": …, "answer": …}``. A fresh interpreter (started at the first call).

    ## Episode End
    Termination: the action contains a complete ``<answer>…</answer>``, or it contains no tag at all (the model's
    final word). Truncation: a tool call beyond ``max_tool_calls``, ``max_turns`` steps, or a completion longer than
    ``max_chars``; the last observation says which. An unclosed tag is answered with an error observation and the
    episode goes on; so is a turn with several complete tool calls, which runs none of them (each call needs its own
    result) and counts one call against the budget (``info["refused_calls"]``). A tool failure (an exception, a
    timeout, a killed interpreter) is an observation too.

    ## Arguments
    ```python
    import gymnasium as gym
    import arpo_env

    env = gym.make("ARPO-Math-v0", dataset="gsm8k", data_dir="data/eval", max_tool_calls=5)
    ```
    * ``dataset`` (``"default"``): a dataset name or file (see `arpo_env.datasets.loaders.load_tasks`).
    * ``data_dir`` (``None``): where named datasets live (default: ``$ARPO_DATA_DIR``).
    * ``tools`` (``("python",)``): add ``"search"`` to allow web search as well; ``()`` is no tools (the no-tool
      baseline, with a prompt of its own), None the default.
    * ``sandbox`` (``"local"``) and ``sandbox_options`` (`arpo_env.tools.sandbox.host.SandboxLimits` fields, e.g.
      ``{"timeout_s": 10, "memory_mb": 1024}``); ``"e2b"`` runs the interpreter in an E2B cloud sandbox.
    * ``search`` / ``search_options``: the search backend when search is enabled; ``browse_options`` when browse is.
      A tool's options given without the tool are not used, and a warning says so.
    * ``max_tool_calls`` (5), ``max_turns`` (``max_tool_calls + 2``), ``max_chars`` (32000): the budgets.
    * ``strict_think`` (False): the reference code's stricter ``<think>`` format check. ``tool_bonus`` (0.1).
    * ``tasks``: a list of `arpo_env.datasets.task.Task`, or of records as a dataset file holds them (``{"question": …,
      "answer": …}``), to use instead of a dataset.

    ## Forking
    ``env.unwrapped.fork()`` returns an independent env in the same state; its interpreter is a live fork of this
    one's. ``env.unwrapped.snapshot()`` is a picklable value; ``env.unwrapped.restore(snapshot)`` rebuilds it (the
    interpreter by replaying its cells), in this process or another.

    ## Example
    ```python
    import gymnasium as gym
    import arpo_env

    env = gym.make("ARPO-Math-v0")
    obs, info = env.reset(seed=0, options={"question": "What is 12 * 34?", "answer": "408"})
    obs, reward, terminated, truncated, info = env.step("<python>print(12 * 34)</python>")
    branch = env.unwrapped.fork()                      # same state, independent from now on
    obs, reward, terminated, truncated, info = env.step("<answer>\\boxed{408}</answer>")
    assert reward == 1.0 and terminated
    env.close(); branch.close()
    ```

    ## Version History
    * v0: Initial version.
    """

    default_tools: tuple[str, ...] = ("python",)

    def __init__(self, dataset: str | None = "default", data_dir: str | None = None,
                 tools: Sequence[str] | None = None, sandbox: str = "local",
                 sandbox_options: dict[str, Any] | None = None, search: str = "local",
                 search_options: dict[str, Any] | None = None, browse_options: dict[str, Any] | None = None,
                 max_tool_calls: int = 5, max_turns: int | None = None,
                 max_chars: int = 32000, strict_think: bool = False, tool_bonus: float = 0.1,
                 tasks: Sequence[Any] | None = None, render_mode: str | None = None) -> None:
        dataset = dataset or "default"  # None, as QAEnv takes it: an AttributeError traceback
        tools = self.default_tools if tools is None else tools  # as QAEnv's: () is none
        factories = build_tools(tools, sandbox, sandbox_options, search, search_options, browse_options,
                                hide=task_paths(dataset, data_dir) if tasks is None else ())
        super().__init__(
            as_tasks(tasks, "math") if tasks is not None else load_tasks(dataset, data_dir, kind="math"),
            factories,
            HierarchicalReward(math_score, strict_think=strict_think, tool_bonus=tool_bonus),
            max_tool_calls=max_tool_calls, max_turns=max_turns, max_chars=max_chars, render_mode=render_mode,
        )
