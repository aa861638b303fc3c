"""arpo environments under TRL's own multi-turn API: ``GRPOTrainer(environment_factory=…)``.

TRL (1.16+) plays an environment through the model's native tool calling: it calls ``reset(**row)`` with the dataset
row, exposes the environment's public methods as tools (their signatures and docstrings become the tool schema), and
asks ``get_reward()`` for the reward when the rollout ends. `environment_factory` wraps an arpo environment that way:

* ``reset(**row)`` starts an episode on the row's ``question`` and ``answer`` (``prompt``'s last user turn when there
  is no ``question``; ``kind`` and ``meta`` too when present: `arpo_env.integrations.trl_dataset.row_task`, the rows of
  `task_dataset`) and returns how to use the tools;
* one tool per tool of the env — ``python(code)``, ``search(query)``, ``browse(url)``, and a user's tools (functions,
  MCP servers' tools) with their own arguments — each a step of the env, so budgets, the sandbox's and the servers'
  state and the tool cache work as in `ToolEnv`; and ``answer(final_answer)``, which submits
  the final answer and ends the episode. An argument the text protocol cannot carry — one holding its call's closing
  tag (``</python>``), an answer whose braces do not balance — is refused with a message, uncounted;
* ``get_reward()`` is arpo's hierarchical reward of the episode: −1 if no answer was submitted, else correctness
  (math-verify or F1) and +0.1 when both search and Python ran.

The README's "Under TRL's own multi-turn API" shows a complete ``GRPOTrainer(environment_factory=
environment_factory("ARPO-Math-v0"), train_dataset=task_dataset("ARPO-Math-v0"), …)``. This module imports nothing
from TRL: arpo_env stays free of the training stack.

**When to use which.** This adapter is plain GRPO over independent rollouts, with the model's chat-template tool
calls: use it to try arpo's tasks and rewards inside an existing TRL setup. ARPO itself — entropy-guided branching
from forked env states, shared prefixes, soft/hard attribution, tool tokens masked by the env — needs the text
protocol and the rollout engine: `arpo_algo.ARPOTrainer`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import gymnasium as gym

from arpo_env import tags
from arpo_env.integrations.trl_dataset import row_task, task_dataset

__all__ = ["TRLEnvironment", "environment_factory", "task_dataset"]


class TRLEnvironment:
    """One arpo environment as a TRL environment (see the module docstring). Made by `environment_factory`."""

    def __init__(self, env_id: str, **env_kwargs: Any) -> None:
        import arpo_env  # noqa: F401 - registers the ids

        self.env = gym.make(env_id, **env_kwargs).unwrapped
        self.reward: float | None = None
        self.done = False

    # TRL's contract --------------------------------------------------------------------------------------------------
    def reset(self, **row: Any) -> str:
        self.env.reset(options={k: v for k, v in row_task(row).items() if v not in ("", None) or k == "answer"})
        self.reward, self.done = None, False
        tools = ", ".join(f"`{t}`" for t in self.env.tool_factories)
        return (f"\n\nYou can call these tools: {tools} (at most {self.env.max_tool_calls} calls). When you know the "
                "answer, call `answer` with it; that ends the task.")

    def get_reward(self) -> float:
        """arpo's reward for the episode: −1 when no answer was submitted."""
        if self.reward is None:
            return -1.0
        return self.reward

    # Tools -----------------------------------------------------------------------------------------------------------
    def answer(self, final_answer: str) -> str:
        """Submit the final answer to the task. This ends the task: call it once, last.

        Args:
            final_answer: The final answer alone, for example a number, an expression or a name.
        """
        if self.done:
            return "The task has already ended."
        final_answer = str(final_answer)
        _protocol_safe("answer", "final_answer", final_answer)
        boxed = f"\\boxed{{{final_answer}}}"
        if tags.boxed(boxed) != final_answer:  # its braces would end \boxed{} early, or leave it open
            raise ValueError("answer(): the braces { } in final_answer do not balance; give the answer with every { "
                             "closed by a }")
        _, reward, _, _, _ = self.env.step(f"<answer>{boxed}</answer>")
        self.reward, self.done = float(reward), True
        return "Answer received."

    def _run(self, tag: str, query: str) -> str:
        if self.done:
            return "The task has ended; no more tool calls."
        obs, reward, terminated, truncated, _ = self.env.step(f"<{tag}>{query}</{tag}>")
        if terminated or truncated:
            self.reward, self.done = float(reward), True
        return _strip_result(obs)


def _protocol_safe(tag: str, argument: str, value: str) -> None:
    """A tool's argument goes into arpo's text protocol as ``<tag>value</tag>``: a ``</tag>`` in it would end the
    call early (the rest of the code run as a call of its own, or the completion's format broken: reward −1), so it
    is refused with a message the model reads (TRL hands it what a tool raises), and the call is not counted."""
    if f"</{tag}>" in value:
        raise ValueError(f"{tag}(): the {argument} cannot hold the text '</{tag}>' here (it would end the call); "
                         f"build it from parts, as '</' + '{tag}>'")


def _strip_result(observation: str) -> str:
    found = [s for s in tags.spans(observation)[0] if s.tag == tags.RESULT]
    return found[-1].content.strip() if found else observation.strip()


def _tool_method(tag: str, argument: str, summary: str, arg_help: str) -> Callable[..., str]:
    def method(self: TRLEnvironment, *args: str, **kwargs: str) -> str:
        given = list(args) + list(kwargs.values())
        if len(given) != 1 or (kwargs and argument not in kwargs):  # TRL hands the model this message
            raise TypeError(f"{tag}() takes one argument, {argument!r}; it was called with "
                            f"{len(args)} positional and {sorted(kwargs) or 'no'} keyword arguments")
        _protocol_safe(tag, argument, str(given[0]))
        return self._run(tag, str(given[0]))

    method.__name__ = tag
    method.__doc__ = f"{summary}\n\nArgs:\n    {argument}: {arg_help}\n"
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD  # the schema TRL shows the model comes from this signature
    method.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", kind), inspect.Parameter(argument, kind, annotation=str)], return_annotation=str)
    method.__annotations__ = {argument: str, "return": str}
    return method


_TOOLS = {
    "python": ("code", "Run Python code in a persistent interpreter (variables are kept between calls) and return "
                       "what it prints.", "The Python code to run."),
    "search": ("query", "Search the web and return the top results as text.", "The search query."),
    "browse": ("url", "Open a web page and return its main text.", "The page's address."),
}


_PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _spec_method(spec: Any) -> Callable[..., str]:
    """A method for a user's tool: its arguments as its schema lists them (TRL shows the model this signature and
    docstring), sent to the env as the tool's call (`arpo_env.tags.call_arguments` reads it back)."""
    import json

    properties = dict(spec.parameters.get("properties") or {})
    required = set(spec.parameters.get("required") or ())
    single = tags.text_argument(spec.parameters)

    def method(self: TRLEnvironment, **kwargs: Any) -> str:
        if single is not None and set(kwargs) == {single}:
            body = str(kwargs[single])
            _protocol_safe(spec.name, single, body)
            if body.lstrip().startswith("{"):  # text that looks like JSON is sent as JSON, to stay text
                body = json.dumps({single: body}, ensure_ascii=False).replace("</", "<\\/")
        else:  # "</" is written "<\/" in the JSON: it cannot end the call early, and reads back the same
            body = json.dumps(kwargs, ensure_ascii=False).replace("</", "<\\/")
        return self._run(spec.name, body)

    kind = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    ordered = sorted(properties, key=lambda name: name not in required)  # required ones first
    for name in ordered:
        kinds = (properties[name] or {}).get("type") if isinstance(properties[name], dict) else None
        annotation = _PYTHON_TYPES.get(kinds if isinstance(kinds, str) else "", str)
        default = inspect.Parameter.empty if name in required else properties[name].get("default")
        params.append(inspect.Parameter(name, kind, annotation=annotation, default=default))
    method.__name__ = spec.name.replace(".", "_").replace("-", "_")
    arg_lines = "".join(f"    {name}: {(properties[name] or {}).get('description') or name}\n" for name in ordered)
    method.__doc__ = f"{spec.description or spec.name}\n" + (f"\nArgs:\n{arg_lines}" if ordered else "")
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = {**{p.name: p.annotation for p in params[1:]}, "return": str}
    return method


def _environment_class(specs: dict[str, Any]) -> type:
    """A subclass of `TRLEnvironment` whose public methods are exactly the env's tools, and ``answer``. A user's
    tool whose name is not a Python name (``crm.find``) is offered as ``crm_find``."""
    members = {}
    for tag, spec in specs.items():
        method = _tool_method(tag, *_TOOLS[tag]) if tag in _TOOLS else _spec_method(spec)
        if method.__name__ in members or method.__name__ in ("reset", "get_reward", "answer"):
            raise ValueError(f"the tool {tag!r} would be offered to TRL as {method.__name__}(), a name taken; "
                             "rename it")
        members[method.__name__] = method
    return type("ARPOEnvironment", (TRLEnvironment,), {"__module__": __name__, **members})


def environment_factory(env_id: str = "ARPO-Math-v0", **env_kwargs: Any) -> Callable[[], TRLEnvironment]:
    """A factory for ``GRPOTrainer(environment_factory=…)``: each call makes one arpo env (``gym.make(env_id,
    **env_kwargs)``) as a TRL environment with the env's own tools."""
    import arpo_env  # noqa: F401

    probe = gym.make(env_id, **env_kwargs).unwrapped
    specs = dict(probe.tool_specs)
    probe.close()
    cls = _environment_class(specs)
    return lambda: cls(env_id, **env_kwargs)
