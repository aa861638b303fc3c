"""`ARPO-QA-v0` (knowledge-intensive multi-hop QA) and `ARPO-DeepSearch-v0` (deep search)."""

from __future__ import annotations

from typing import Any, Sequence

from arpo_env.datasets.loaders import as_tasks, load_tasks, task_paths
from arpo_env.env import ToolEnv
from arpo_env.rewards import HierarchicalReward
from arpo_env.scoring.judge import shared_judge
from arpo_env.scoring.qa_metrics import qa_score
from arpo_env.tools.registry import build_tools


class QAEnv(ToolEnv):
    r"""Answer a knowledge-intensive question, searching the web (and running Python) while reasoning.

    ## Description
    The knowledge-intensive tasks of the ARPO paper: HotpotQA, 2Wiki, MuSiQue, Bamboogle, WebWalker (and SimpleQA),
    or the QA rows of the ARPO training set (``dataset="train"``). The agent searches with
    ``<search>query</search>``, may run ``<python>`` code, and answers with ``<answer>\boxed{…}</answer>``.
    By default search is local BM25 over a shipped corpus of real web snippets, so the env runs offline.

    ## Action Space
    Text (`arpo_env.spaces.UnicodeText`): what the model generated since the last observation.

    ## Observation Space
    Text: the user turn after `reset` (chat messages in ``info["messages"]``); after a tool call its output as
    ``\n<result>\n…\n</result>\n`` (search results are numbered entries: title, snippet, url when known).

    ## Rewards
    At the end: −1 when the format is broken, else the best token F1 (SQuAD normalisation, characters for Chinese)
    of the boxed answer over the gold aliases, +0.1 when it is correct (F1 > 0) and both search and Python were
    used. Exact match is in ``arpo_env.rewards.qa_em_reward``. With ``judge_url`` an LLM judge behind an
    OpenAI-compatible endpoint scores instead (F1 when it is unreachable).

    ## Starting State
    A task drawn with the env's RNG, ``options={"index": i}``, or ``options={"question": …, "answer": …}``.

    ## Episode End
    As `arpo_env.envs.math.MathEnv`: an ``<answer>`` or an untagged turn terminates; budgets truncate with a
    last observation saying why. Search failures (timeouts, rate limits, empty results) are observations.

    ## Arguments
    ```python
    env = gym.make("ARPO-QA-v0", dataset="hotpotqa", data_dir="data/eval", search="local")
    ```
    * ``dataset`` (``"default_qa"``), ``data_dir``; ``tools`` (``("search", "python")``, the paper's training tools;
      ``()`` none).
    * ``search``: ``"local"`` (BM25, ``search_options={"corpus": path}``), ``"ddgs"`` (live), ``"recorded"``
      (``search_options={"recording": path, "fallback": "local"}``, or ``"recorded:PATH:local"``);
      ``search_options["top_k"]`` (5), ``search_options["cache"]`` (SQLite tool cache).
    * ``browse_options`` when ``"browse"`` is among the tools (see `arpo_env.tools.browse.browse_tool_factory`).
    * ``sandbox``/``sandbox_options``, ``max_tool_calls`` (5), ``max_turns``, ``max_chars``, ``strict_think``,
      ``tool_bonus``, ``judge_url``/``judge_model`` (None: the model the endpoint serves).

    ## Example
    ```python
    import gymnasium as gym
    import arpo_env

    env = gym.make("ARPO-QA-v0")
    obs, info = env.reset(seed=0)
    obs, *_ = env.step("<search>Amy Smart film debut</search>")
    print(obs)
    ```

    ## Version History
    * v0: Initial version.
    """

    default_dataset = "default_qa"
    default_tools: tuple[str, ...] = ("search", "python")

    def __init__(self, dataset: str | None = None, data_dir: str | None = None, tools: Sequence[str] | None = None,
                 search: str = "local", search_options: dict[str, Any] | None = None,
                 browse_options: dict[str, Any] | None = None, sandbox: str = "local",
                 sandbox_options: dict[str, Any] | None = None, max_tool_calls: int = 5,
                 max_turns: int | None = None, max_chars: int = 32000, strict_think: bool = False,
                 tool_bonus: float = 0.1, judge_url: str | None = None, judge_model: str | None = None,
                 tasks: Sequence[Any] | None = None, render_mode: str | None = None) -> None:
        scorer = shared_judge(judge_url, judge_model) if judge_url else qa_score
        tools = self.default_tools if tools is None else tools  # () means no tool (--mode direct), not the default
        super().__init__(
            as_tasks(tasks, "qa") if tasks is not None
            else load_tasks(dataset or self.default_dataset, data_dir, kind="qa"),
            build_tools(tools, sandbox, sandbox_options, search, search_options, browse_options,
                        hide=task_paths(dataset or self.default_dataset, data_dir) if tasks is None else ()),
            HierarchicalReward(scorer, strict_think=strict_think, tool_bonus=tool_bonus),
            max_tool_calls=max_tool_calls, max_turns=max_turns, max_chars=max_chars, render_mode=render_mode,
        )


class DeepSearchEnv(QAEnv):
    r"""Deep search: find a hard-to-find fact by searching, reading pages and computing.

    ## Description
    The deep-search tasks of the ARPO paper: GAIA, HLE and xbench (read from a data directory only: GAIA and HLE
    must not be republished), or the release's hard-search training set (``dataset="hard_search"``). Tools:
    ``<search>``, ``<browse>url</browse>`` (fetch + main-text extraction, or an offline page store) and ``<python>``.
    The shipped default (``"default_deepsearch"``) is 100 hard-search questions.

    ## Action Space
    Text, as `QAEnv`.

    ## Observation Space
    Text, as `QAEnv`; a browsed page is its main text, truncated with a visible note.

    ## Rewards
    As `QAEnv`: format gate, then F1 over the gold aliases (letter match for HLE multiple-choice items), or an LLM
    judge (``judge_url``), +0.1 for a correct answer that used search and Python.

    ## Starting State
    As `QAEnv`.

    ## Episode End
    As `QAEnv`; the default tool budget is 10 calls.

    ## Arguments
    As `QAEnv`, with ``tools=("search", "browse", "python")`` and ``max_tool_calls=10`` by default;
    ``browse_options={"page_store": folder, "live": False}`` browses offline.

    ## Example
    ```python
    env = gym.make("ARPO-DeepSearch-v0", dataset="gaia", data_dir="data/eval", search="ddgs")
    ```

    ## Version History
    * v0: Initial version.
    """

    default_dataset = "default_deepsearch"
    default_tools = ("search", "browse", "python")

    def __init__(self, max_tool_calls: int = 10, **kwargs: Any) -> None:
        super().__init__(max_tool_calls=max_tool_calls, **kwargs)
