"""`ToolEnv`: the text-in, text-out Gymnasium environment for tool-integrated reasoning, with forkable state."""

from __future__ import annotations

import collections
import copy
import re
import time
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from arpo_env import faults, prompts, tags
from arpo_env.datasets.loaders import as_tasks, gold_text
from arpo_env.datasets.task import Task
from arpo_env.episode import EpisodeState, whole_number
from arpo_env.rewards import HierarchicalReward, RewardParts
from arpo_env.spaces import UnicodeText
from arpo_env.tools.protocol import Tool, ToolOutput, ToolSpec

BUILT_IN_SPECS = {
    tags.PYTHON: ToolSpec(tags.PYTHON, "Run Python code in a persistent interpreter and return what it prints.",
                          {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}),
    tags.SEARCH: ToolSpec(tags.SEARCH, "Search the web and return the top results.",
                          {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    tags.BROWSE: ToolSpec(tags.BROWSE, "Read a web page and return its main text.",
                          {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}),
}
"""The built-in tools as specs, one text argument each: how the notices write their calls."""

ToolFactory = Callable[[], Any]
"""Makes the tool of one episode: a `Tool` for a built-in tag, or the `arpo_env.tools.protocol.Toolset` of a
`arpo_env.tools.registry.ToolsetFactory` (which stands under each of its tools' tags)."""


class ToolEnv(gym.Env[str, str]):
    """A multi-turn tool-use episode over one task, as text. Subclasses choose the tasks, tools and reward; or make
    one directly, with tools of your own::

        env = ToolEnv(tasks=[{"question": "…", "answer": "…"}], tools=["python", my_function, MCPTools([…])],
                      reward="math")

    `tasks`: `Task` objects or records (``{"question", "answer"}``); `tools`: tool factories by tag, or a list of
    built-in tools' names (``"python"``, ``"search"``, ``"browse"``, with their default backends), functions,
    `arpo_env.tools.functions.FunctionTool` and `arpo_env.tools.mcp.MCPTools`; `reward`: a `HierarchicalReward`,
    a scorer ``f(prediction, gold, meta) -> float`` in [0, 1] (put in one), or ``"math"`` / ``"qa"``.

    `reset()` returns the task's user turn; `step(action)` takes what the model generated since the last
    observation, runs the tool call the action ends with and returns its output in ``<result>…</result>``.
    An ``<answer>`` ends the episode and the reward is computed over the whole completion; a turn with no tag at all
    is the model's final word and ends it too. Budgets on tool calls, turns and completion characters truncate
    the episode with a last observation that says why. `close()` shuts the tools down: `step`, `fork` and
    `snapshot` then raise ``gym.error.ClosedEnvironmentError`` until the next `reset()`.

    The state is forkable: `fork()` returns an independent copy (live-forking the Python interpreter), `snapshot()`
    a picklable value, `restore(snapshot)` rebuilds it here or in another process. ``copy.deepcopy(env)`` is
    `fork()`, and an env made by ``gym.make`` pickles as its id, its arguments and its snapshot (unpickling makes the
    env again and restores the snapshot, replaying the interpreter's cells).
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __new__(cls, *args: Any, server_url: str | None = None, **kwargs: Any) -> Any:
        """``gym.make(id, server_url="http://host:port")`` (several, separated by commas, spread sessions): the same
        env as a session on an `arpo serve` server, a `arpo_env.remote.client.RemoteEnv`; the other keyword
        arguments go to it (``token_file``, ``timeout_s``, and the env's own)."""
        if server_url is None:
            return super().__new__(cls)
        from arpo_env.registration import ENV_IDS
        from arpo_env.remote.client import RemoteEnv

        env_id = kwargs.pop("remote_env_id", None) or next(
            (i for i, entry in ENV_IDS.items() if entry == f"{cls.__module__}:{cls.__qualname__}"), None)
        if env_id is None:
            raise ValueError(f"{cls.__name__} has no id of arpo's: give remote_env_id= the id the server serves")
        return RemoteEnv(server_url, env_id, **kwargs)

    def __init__(self, tasks: Sequence[Task | dict[str, Any]], tools: dict[str, ToolFactory] | Sequence[Any],
                 reward: HierarchicalReward | Callable[..., float] | str, max_tool_calls: int = 5,
                 max_turns: int | None = None, max_chars: int = 32000, render_mode: str | None = None) -> None:
        if not tasks:
            raise ValueError("the environment needs at least one task")
        if not isinstance(tools, collections.abc.Mapping):
            from arpo_env.tools.registry import build_tools

            tools = build_tools(tools)
        specs = {tag: _spec(tag, make) for tag, make in tools.items()}
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, not {render_mode!r}")
        budgets = {"max_tool_calls": (max_tool_calls, 0), "max_chars": (max_chars, 1)}
        budgets.update({"max_turns": (max_turns, 1)} if max_turns is not None else {})
        problems = [f"{name} must be a whole number of at least {low}, not {value!r}"
                    for name, (value, low) in budgets.items()
                    if whole_number(value) is None or whole_number(value) < low]
        if problems:  # 1.5, True and text are refused by name, not rounded or cast
            raise ValueError("budgets: " + "; ".join(problems))
        self.tasks = as_tasks(tasks, "math") if any(not isinstance(t, Task) for t in tasks) else list(tasks)
        self.tool_factories = dict(tools)
        self.tool_specs: dict[str, ToolSpec] = specs
        """What the model is told of each tool, by tag (built-in tools too)."""
        self.protocol_tags = tags.protocol_tags(list(tools))
        """The tool tags a transcript of this env is read with: the built-in three and the env's own."""
        self.reward_fn = _reward(reward)
        self.max_tool_calls = whole_number(max_tool_calls)
        self.max_turns = whole_number(max_turns) if max_turns is not None else self.max_tool_calls + 2
        self.max_chars = whole_number(max_chars)
        self.render_mode = render_mode
        self.system_prompt = prompts.system_prompt(list(self.tool_factories), self.max_tool_calls,
                                                   specs=self.tool_specs)
        self.observation_space = UnicodeText(max_length=max(self.max_chars, 100_000))
        self.action_space = UnicodeText(max_length=self.max_chars)
        self.tools: dict[str, Tool] = {}
        self.state: EpisodeState | None = None

    # ---------------------------------------------------------------------------------------------------------------
    # Gymnasium API
    # ---------------------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode. `options`: ``{"index": i}`` picks task i; ``{"question": q, "answer": a}`` a custom one;
        neither draws a task with the env's RNG. A custom task may also carry ``id``, ``source``, ``kind`` and
        ``meta`` (what scorers read, e.g. ``answer_type``)."""
        super().reset(seed=seed)
        options = options or {}
        if not isinstance(options, collections.abc.Mapping):  # a string is not a table of options
            raise ValueError(f"reset options are a dict ({{'index': i}} or {{'question': q, 'answer': a}}), not "
                             f"{type(options).__name__} {str(options)[:100]!r}")
        unknown = sorted(set(options) - _RESET_OPTIONS, key=str)
        if unknown:  # a misspelt "index" ({"idx": 5}) drew a random task, silently
            raise ValueError(f"reset options {unknown} are not known: give {{'index': i}} for a task of the dataset, "
                             "or {'question': q, 'answer': a} (and 'id', 'source', 'kind', 'meta') for one of your own")
        if "question" in options or "answer" in options:  # an answer alone drew a task of the dataset, silently
            if "answer" not in options or options.get("question") is None:
                raise ValueError('a custom task needs both "question" (text) and "answer"; give {"index": i} for a '
                                 'task of the dataset')
            question = tags.unicode_text(str(options["question"]))  # a lone surrogate: U+FFFD, as a tokenizer needs
            try:
                answer = gold_text(options["answer"])  # as a dataset's: 1990.0 is "1990", QA's F1 0 against "1990"
            except ValueError as exc:
                raise ValueError(f"the custom task's {exc}") from None
            task = Task(question, answer, str(options.get("id") or "custom"),
                        str(options.get("source") or "custom"), str(options.get("kind") or self.tasks[0].kind),
                        dict(options.get("meta") or {}))
        elif "index" in options:
            index = whole_number(options["index"])
            if index is None:  # only a whole number names a task
                raise ValueError(f"options['index'] must be a whole number, a task of the dataset, not "
                                 f"{options['index']!r}")
            if not -len(self.tasks) <= index < len(self.tasks):
                raise IndexError(f"task index {index} out of range: the dataset has {len(self.tasks)} tasks")
            task = self.tasks[index]
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        old = self.tools
        self.tools = _make_tools(self.tool_factories)  # before the old ones close: a shared server stays up
        _close(old)
        self.state = EpisodeState(task)
        # What the episode's tool calls and its score will need (an interpreter's template, scoring workers) starts
        # now, in the background, while the model writes its first turn.
        for part in (*_unique(self.tools), self.reward_fn):
            start = getattr(part, "prestart", None)
            if start is not None:
                start()
        user = prompts.user_turn(task.question)
        info = {"messages": [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": user}],
                "task": task.as_dict()}
        return user, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        state = self._require_state()
        if state.done:
            raise gym.error.ResetNeeded("the episode has ended: call reset() before stepping again")
        self._require_open()
        text = _as_text(action)
        state.turns += 1
        state.segments.append(("action", text))
        info: dict[str, Any] = {"tool": None, "tool_query": None, "tool_latency_s": 0.0, "tool_failed": False,
                                "tool_error": None, "tool_fault": None}
        calls = tags.tool_calls(text, self.protocol_tags)
        call = calls[-1] if calls else None
        final = tags.answer(text, self.protocol_tags)
        open_tag = tags.unclosed_tag(text, self.protocol_tags)
        truncation = None

        if final is not None and (call is None or call.start < final.start):
            observation = ""  # the answer ends the episode
        elif call is not None and len(calls) > 1 and state.budget_used < self.max_tool_calls:
            # Each call must be followed by its result; a turn cannot be, and running only some would mislead.
            state.refused_calls += 1
            written = ", ".join(f"<{c.tag}>" for c in calls) if len(calls) <= 4 else ", ".join(  # not one per call
                f"<{tag}> ×{n}" for tag, n in collections.Counter(c.tag for c in calls).items())
            info.update(tool_failed=True, tool_error=f"{len(calls)} tool calls in one turn")
            observation = tags.wrap_result(
                f"error: {len(calls)} tool calls in one turn ({written}); none ran. Write one call, then wait for its "
                "<result> before the next.")
        elif call is not None and call.tag not in self.tools:
            # A tool this env lacks: an observation the model can learn from, and it costs budget like any call.
            if state.budget_used >= self.max_tool_calls:
                truncation = (f"The tool-call budget is used up ({self.max_tool_calls} of {self.max_tool_calls}); "
                              "the episode ends here.")
                observation = tags.wrap_result(truncation)
            else:
                state.unavailable_calls += 1
                available = ", ".join(f"<{t}>…</{t}>" for t in self.tool_factories) or "none"
                info.update(tool_failed=True, tool_error=f"unavailable tool <{call.tag}>")
                observation = tags.wrap_result(
                    f"error: there is no <{call.tag}> tool here. Tools you can call: {available}. "
                    "Give the final answer as <answer>\\boxed{…}</answer>.")
        elif call is not None:
            if len(state.completion) > self.max_chars:
                truncation = (f"The transcript reached its length budget ({self.max_chars} characters); "
                              "the episode ends here.")
                observation = tags.wrap_result(truncation)
            elif state.budget_used >= self.max_tool_calls:
                truncation = (f"The tool-call budget is used up ({self.max_tool_calls} of {self.max_tool_calls}); "
                              "the episode ends here.")
                observation = tags.wrap_result(truncation)
            else:
                fault = faults.scheduled(state.task.meta, call.tag, state.tool_calls.get(call.tag, 0))
                out = self._run_tool(call.tag, call.content, fault)
                state.tool_calls[call.tag] = state.tool_calls.get(call.tag, 0) + 1
                info.update(tool=call.tag, tool_query=call.content, tool_latency_s=out.latency_s,
                            tool_failed=out.failed, tool_error=out.error, tool_extra=out.extra, tool_fault=fault)
                note = ""
                if state.budget_used == self.max_tool_calls:
                    note = "\n(That was your last tool call: give the final answer now.)"
                observation = tags.wrap_result(out.text + note)
        elif open_tag is not None or "<" + tags.ANSWER in text:
            tag = open_tag or tags.ANSWER
            forms = " or ".join(tags.call_form(t, self.tool_specs[t].parameters)  # built-in ones in their order
                                for t in self.protocol_tags if t in self.tool_specs)
            observation = tags.wrap_result(  # the tools this env has, as the system prompt names them
                f"error: the <{tag}> tag is not closed. Write "
                + (f"a tool call as {forms} and " if forms else "")
                + "the answer as <answer>\\boxed{…}</answer>."
                if tag in self.protocol_tags or tag == tags.ANSWER else
                f"error: the <{tag}> tag is not closed; close it, then call a tool or give the answer.")
        else:
            observation = ""  # a turn with neither a call nor an answer is the model's final word

        terminated = observation == "" and truncation is None
        if not terminated and truncation is None:
            if state.turns >= self.max_turns:
                truncation = f"The turn budget is used up ({self.max_turns} turns); the episode ends here."
                observation = tags.wrap_result(truncation)
            elif len(state.completion) + len(observation) > self.max_chars:
                truncation = (f"The transcript reached its length budget ({self.max_chars} characters); "
                              "the episode ends here.")
                observation = tags.wrap_result(truncation)
        if observation:
            state.segments.append(("observation", observation))
        truncated = truncation is not None
        reward = 0.0
        if terminated or truncated:
            state.done = True
            parts = self.score()
            reward = parts.total
            info["reward_parts"] = parts.as_dict()
        info.update(self._counters(), truncation=truncation)
        if self.render_mode == "human":
            self.render()
        return observation, reward, terminated, truncated, info

    def render(self) -> str | None:
        """The transcript as text ("ansi": returned; "human": printed). A control character in it, which the model
        or a tool wrote (an escape sequence that clears the screen or sets the terminal's title, a carriage return
        that writes over a line, a bidirectional override), is shown as its escape (``\\x1b``), not sent to the
        terminal; newlines and tabs stay."""
        state = self._require_state()
        text = f"[system]\n{self.system_prompt}\n[user]\n{prompts.user_turn(state.task.question)}\n[assistant]\n"
        text = _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text + state.completion)
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        self._close_tools()
        super().close()

    # ---------------------------------------------------------------------------------------------------------------
    # Forkable state
    # ---------------------------------------------------------------------------------------------------------------
    def fork(self) -> "ToolEnv":
        """An independent environment whose state equals this one's now (tools forked, RNG copied)."""
        state = self._require_state()
        self._require_open()  # a closed env has nothing to fork: say so now, not at the fork's first step
        child = copy.copy(self)
        child.state = state.copy()
        forks: dict[int, Any] = {}
        try:
            child.tools = {tag: forks[id(tool)] if id(tool) in forks else forks.setdefault(id(tool), tool.fork())
                           for tag, tool in self.tools.items()}
        except BaseException:  # a tool that refuses to fork (a stateful MCP server): the forks made so far close
            _close(forks)
            raise
        child._np_random = copy.deepcopy(self._np_random)
        return child

    def __copy__(self) -> "ToolEnv":
        """A shallow copy, attribute for attribute (what `fork` starts from; pickling's `__reduce__` is not it)."""
        child = object.__new__(type(self))
        child.__dict__.update(self.__dict__)
        return child

    def __deepcopy__(self, memo: dict[int, Any]) -> "ToolEnv":
        """``copy.deepcopy(env)`` (the usual way to clone an environment, in tree search): `fork()`; before the first
        reset, an env of the same configuration and no episode. The tools hold processes and sockets, which cannot
        be copied as data."""
        if self.state is not None:
            child = self.fork()
        else:
            child = copy.copy(self)
            child.tools = {}
            child._np_random = copy.deepcopy(self._np_random, memo)
        memo[id(self)] = child
        return child

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickling: the env's id and arguments (``gym.make``'s) and its snapshot; unpickled, the env is made again
        and the snapshot restored. An env made without ``gym.make`` has no id to be made again from."""
        if self.spec is None:
            raise TypeError(f"{type(self).__name__} made without gym.make cannot be pickled (its tool factories may "
                            "be any function): pickle env.snapshot() and restore it into an env made the same way")
        return _unpickle_env, (self.spec.id, dict(self.spec.kwargs),
                               self.snapshot() if self.state is not None else None)

    def snapshot(self) -> dict[str, Any]:
        """A picklable value that `restore` turns back into this state (the interpreter by replaying its cells)."""
        state = self._require_state()
        self._require_open()  # its tools, and the interpreter's cells, are gone
        rng = self._np_random.bit_generator.state if self._np_random is not None else None
        return {"version": 1, "state": state.to_dict(), "tools": {t: tool.snapshot() for t, tool in _first_tags(
                self.tools).items()}, "np_random": rng}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Bring back a `snapshot()` (taken in this env, another one with the same tools, or another process)."""
        if not isinstance(snapshot, dict):  # None: a snapshot that was never taken
            raise ValueError(f"a snapshot is the dict snapshot() returns, not {type(snapshot).__name__}")
        if snapshot.get("version") != 1:
            raise ValueError(f"unsupported snapshot version {snapshot.get('version')!r}")
        try:  # checked before anything changes: a snapshot edited or damaged left the env half restored
            state = EpisodeState.from_dict(snapshot["state"])
            if not isinstance(snapshot["tools"], dict):
                raise ValueError("its tools are no object of tool snapshots")
            rng = None
            if snapshot.get("np_random") is not None:
                rng = np.random.Generator(np.random.PCG64())
                rng.bit_generator.state = snapshot["np_random"]
        except (KeyError, TypeError, ValueError) as exc:
            what = f"no {exc.args[0]!r} field" if isinstance(exc, KeyError) and exc.args else f"{exc}"
            raise ValueError(f"not a snapshot as snapshot() takes it ({what})") from None
        missing = set(snapshot["tools"]) - set(self.tool_factories)
        if missing:
            raise ValueError(f"the snapshot uses tools this env does not have: {sorted(missing)}")
        tools = _make_tools(self.tool_factories)
        try:
            for tag, tool_snapshot in snapshot["tools"].items():
                tools[tag].restore(tool_snapshot)  # a snapshot a tool refuses: this env's tools and state stay
        except BaseException:
            _close(tools)
            raise
        self._close_tools()
        self.tools = tools
        self.state = state
        if rng is not None:
            self._np_random = rng

    # ---------------------------------------------------------------------------------------------------------------
    # Inspection
    # ---------------------------------------------------------------------------------------------------------------
    @property
    def completion(self) -> str:
        """The assistant's side of the transcript: actions and observations, in order."""
        return self._require_state().completion

    @property
    def messages(self) -> list[dict[str, str]]:
        state = self._require_state()
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": prompts.user_turn(state.task.question)},
                {"role": "assistant", "content": state.completion}]

    def score(self) -> RewardParts:
        """The reward of the completion as it stands."""
        state = self._require_state()
        ran = {tool for tool, n in state.tool_calls.items() if n > 0}  # executed, not merely written
        return self.reward_fn(state.completion, state.task.answer, {**state.task.meta, "question": state.task.question},
                              tools_ran=ran, **({"tool_tags": self.protocol_tags}
                                                if isinstance(self.reward_fn, HierarchicalReward) else {}))

    @property
    def stop_strings(self) -> list[str]:
        """Where a generator stops a turn of this env: a tool call closed (any tool of the protocol, so a call to
        one the env lacks is answered) or the answer closed."""
        return tags.close_tags(self.protocol_tags)

    # ---------------------------------------------------------------------------------------------------------------
    def _run_tool(self, tag: str, query: str, fault: str | None = None) -> ToolOutput:
        """The call's output; a task's scripted `fault` (`arpo_env.faults`) replaces it: an ``error`` runs nothing,
        a ``stale`` one runs the cell and shows its first number instead of what it printed."""
        start = time.perf_counter()
        if tag == tags.PYTHON:
            query = tags.python_code(query)
        if fault == "error":
            return ToolOutput(faults.ERROR_TEXT, failed=True, error="scripted transient fault")
        tool = self.tools[tag]
        try:
            if tag in tags.TOOL_TAGS or not hasattr(tool, "run"):
                out = tool.call(query)
            else:  # a user's tool: its arguments read against its schema; a malformed call is an error to read
                try:
                    arguments = tags.call_arguments(query, tag, self.tool_specs[tag].parameters)
                except ValueError as exc:
                    return ToolOutput(f"error: {exc}", failed=True, error=str(exc),
                                      latency_s=time.perf_counter() - start)
                out = tool.run(tag, arguments)
        except Exception as exc:  # noqa: BLE001 - a broken tool is an observation, never a crash of the episode
            out = ToolOutput(f"{tag} failed: {type(exc).__name__}: {exc}", failed=True, error=str(exc))
        out.latency_s = out.latency_s or time.perf_counter() - start
        if fault == "stale" and not out.failed and (stale := faults.stale_output(query)) is not None:
            out = ToolOutput(stale, latency_s=out.latency_s, extra={"stale_of": out.text})
        return out

    def _counters(self) -> dict[str, Any]:
        state = self._require_state()
        return {"tool_calls": state.total_tool_calls, "tool_calls_by_tool": dict(state.tool_calls),
                "unavailable_calls": state.unavailable_calls, "refused_calls": state.refused_calls,
                "turns": state.turns, "chars": len(state.completion)}

    def _require_state(self) -> EpisodeState:
        if self.state is None:
            raise gym.error.ResetNeeded("call reset() before using the environment")
        return self.state

    def _require_open(self) -> None:
        """A `ClosedEnvironmentError` once `close()` shut the tools down (until the next reset): a step's call would
        be answered "there is no <python> tool", a lie, and a fork or snapshot would hold none of the tools' state."""
        if self.tool_factories and not self.tools:
            raise gym.error.ClosedEnvironmentError("the environment is closed (its tools are shut down): call reset() "
                                                   "to start a new episode")

    def _close_tools(self) -> None:
        tools, self.tools = self.tools, {}
        _close(tools)


def _spec(tag: str, make: ToolFactory) -> ToolSpec:
    """The spec of the tool under `tag`: a built-in one's, or the one its toolset factory lists."""
    if tag in BUILT_IN_SPECS:
        return BUILT_IN_SPECS[tag]
    tags.check_tool_name(tag)
    for spec in getattr(make, "specs", ()):
        if spec.name == tag:
            return spec
    raise ValueError(f"unknown tool {tag!r}: the built-in tools are {', '.join(tags.TOOL_TAGS)}; a tool of your own "
                     "is a function or an MCPTools (in a list of tools), or a ToolsetFactory that lists it")


def _make_tools(factories: dict[str, ToolFactory]) -> dict[str, Any]:
    """The tools of one episode by tag: each factory called once (a toolset serves all the tags it stands under)."""
    made: dict[int, Any] = {}
    tools = {}
    try:
        for tag, make in factories.items():
            if id(make) not in made:
                made[id(make)] = make()
            tools[tag] = made[id(make)]
    except BaseException:
        _close(made)
        raise
    return tools


def _unique(tools: dict[Any, Any]) -> list[Any]:
    """Each tool once, in order (a toolset stands under several tags)."""
    return list({id(tool): tool for tool in tools.values()}.values())


def _first_tags(tools: dict[str, Any]) -> dict[str, Any]:
    """Each tool under its first tag: a toolset's snapshot is taken, and restored, once."""
    first: dict[int, str] = {}
    for tag, tool in tools.items():
        first.setdefault(id(tool), tag)
    return {tag: tools[tag] for tag in first.values()}


def _close(tools: dict[Any, Any]) -> None:
    for tool in _unique(tools):
        tool.close()


def _reward(reward: Any) -> HierarchicalReward:
    """An env's ``reward=``: a `HierarchicalReward` (or any callable scoring a completion as one does), a scorer
    made into one, or the name of a built-in scorer."""
    if reward == "math":
        from arpo_env.scoring.math_equivalence import math_score

        return HierarchicalReward(math_score)
    if reward == "qa":
        from arpo_env.scoring.qa_metrics import qa_score

        return HierarchicalReward(qa_score)
    if isinstance(reward, HierarchicalReward):
        return reward
    if callable(reward):
        import inspect

        try:
            params = inspect.signature(reward).parameters
        except (TypeError, ValueError):
            params = {}
        if "tools_ran" in params or "completion" in params:  # scores a completion itself
            return reward
        return HierarchicalReward(reward)
    raise ValueError(f"reward is a HierarchicalReward, a scorer f(prediction, gold, meta) -> float, 'math' or 'qa', "
                     f"not {type(reward).__name__} {str(reward)[:100]!r}")


def _unpickle_env(env_id: str, kwargs: dict[str, Any], snapshot: dict[str, Any] | None) -> ToolEnv:
    env = gym.make(env_id, **kwargs).unwrapped
    if snapshot is not None:
        env.restore(snapshot)
    return env


def _as_text(action: Any) -> str:
    if isinstance(action, str):
        return action
    if isinstance(action, (bytes, bytearray)):
        return bytes(action).decode("utf-8", errors="replace")
    if isinstance(action, np.str_):
        return str(action)
    raise TypeError(f"an action is the text the model generated (str or UTF-8 bytes), not {type(action).__name__}")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Characters `render` shows as their escapes: C0 and C1 controls but newline and tab, and the bidirectional
marks, overrides and isolates."""

_RESET_OPTIONS = frozenset({"index", "question", "answer", "id", "source", "kind", "meta"})
