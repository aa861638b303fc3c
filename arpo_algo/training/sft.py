"""``arpo sft``: the cold start — supervised fine-tuning on tool-integrated trajectories in our protocol.

TRL's `SFTTrainer` trains on the model's own turns only: prompt tokens and tool output (``<result>…</result>``)
are masked from the loss (``assistant_masks``), exactly as the RL loss masks them.

Trajectory sources (JSONL, one record per line; any mix):

* **native** — ``{"messages": [{"role": "system", …}, {"role": "user", …}], "segments": [{"kind": "action",
  "text": "<think>…</think>\\n<python>…</python>"}, {"kind": "observation", "text": "\\n<result>\\n…\\n</result>\\n"},
  …]}``: the actions are what the model writes, the observations what the env returns (``[kind, text]`` pairs are
  accepted too). `arpo_env.datasets.procedural.scripted_episode` writes this format.
* **chat** (ShareGPT-style) — ``{"conversations": [{"from": "system"|"human"|"gpt"|"tool"|"observation"|"function",
  "value": …}]}`` (LLaMA-Factory's ``function_call`` turns too: a call as JSON text, ``{"name": …, "arguments": …}``)
  or ``{"messages": [{"role": …, "content": …}]}`` without ``segments``. The first user turn is the
  question; assistant turns become actions, mapped onto our tags (```` ```python ``` ```` blocks and ``<code>`` become
  ``<python>``; a final ``\\boxed{}`` outside ``<answer>`` is wrapped in one); OpenAI-style ``tool_calls`` to
  ``python``, ``search``, ``browse`` and ``answer`` (the tools of `arpo_env.integrations.trl_environment`) become those
  calls, and a content of parts its text; tool turns and later user turns become ``<result>`` observations, and so do
  ``<result>`` and ```` ```output ```` blocks written inside an assistant turn (a whole episode as one message, as
  NuminaMath-TIR keeps it). The env's system prompt replaces the record's unless ``keep_system_prompt`` is set, so
  the model learns the prompt it will see in RL.
* **rollouts** — trees written by ``arpo rollout`` or ``arpo train`` (rejection sampling, ``--from_rollouts``):
  trajectories whose answer is correct and format-valid are kept, as the exact token ids that were sampled.
* **synthetic** — ``synthetic_tasks: N`` plays N procedural arithmetic tasks with the scripted teacher, whose code
  really runs in the sandbox, so every ``<result>`` is real.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from arpo_algo import jsonl
from arpo_algo.generation.models import prompt_ids, text_ids
from arpo_env import tags
from arpo_env.scoring.chat_client import content_text

# Sources ----------------------------------------------------------------------------------------------------------


def numbered_records(path: str) -> Iterator[tuple[int, Any]]:
    """``(line number, record)`` of a JSONL file (``-`` is standard input). A line that is not JSON — what a writer
    killed mid-line leaves (``arpo train`` stopped hard, then resumed: `arpo_algo.jsonl`) — is skipped and named on
    stderr, as ``arpo view`` does; a file of nothing else is a `ValueError`."""
    handle = sys.stdin if path == "-" else open(path, encoding="utf-8-sig")  # past a byte-order mark
    read, skipped = 0, []

    def skip(n: int, line: str, exc: ValueError) -> None:
        skipped.append(n)
        print(f"arpo sft: {path}:{n}: skipped a line that is not JSON ({getattr(exc, 'msg', exc)}; {len(line):,} "
              "characters, a line cut short by a stopped writer?)", file=sys.stderr)

    try:
        for n, record in jsonl.records(handle, skip):
            read += 1
            yield n, record
    finally:
        if handle is not sys.stdin:
            handle.close()
    if skipped and not read:
        raise ValueError(f"{path}: no line is JSON ({len(skipped)} skipped)")


def env_messages(question: str, env_id: str = "ARPO-Math-v0", env_kwargs: dict[str, Any] | None = None
                 ) -> list[dict[str, str]]:
    """The chat messages (system prompt and user turn) the environment starts an episode with."""
    import gymnasium as gym

    import arpo_env  # noqa: F401

    env = gym.make(env_id, **(env_kwargs or {})).unwrapped
    try:
        _, info = env.reset(options={"question": question, "answer": ""})
        return info["messages"]
    finally:
        env.close()


_FENCE = re.compile(r"```([\w+.-]*)[ \t]*\n(.*?)```", re.S)
"""A fenced block and its language; a block in another language stays as it is, whole (a ```` ```python3 ```` block
was no match, and its closing fence opened a "block" of the text after it, run as code)."""
_PYTHON = frozenset({"", "python", "python3", "py", "py3", "ipython", "ipython3"})
_CODE = re.compile(r"<code>(.*?)</code>", re.S)
_OUTPUT = re.compile(r"```output[ \t]*\n(.*?)```", re.S)
"""A code block's output as ToRA-style data writes it after the block (NuminaMath-TIR's ```` ```output ```` blocks)."""
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
          "tool": "tool", "observation": "tool", "function": "tool", "ipython": "tool", "function_call": "assistant"}


def map_action(text: str, final: bool) -> str:
    """An assistant turn in another dialect, in our tags."""
    text = _FENCE.sub(lambda m: f"<python>{m.group(2).strip()}</python>" if m.group(1).lower() in _PYTHON
                      else m.group(0), text)
    text = _CODE.sub(lambda m: f"<python>{m.group(1).strip()}</python>", text)
    if final and tags.answer(text) is None:
        value = tags.boxed(text)
        if value is not None:
            text = text.rstrip() + f"\n<answer>\\boxed{{{value}}}</answer>"
    return text


_CALLS = {"python": ("python", "code"), "search": ("search", "query"), "browse": ("browse", "url"),
          "answer": ("answer", "final_answer")}
"""OpenAI-style tool calls (the names and arguments of `arpo_env.integrations.trl_environment`'s tools) → our tag,
argument."""


def _turn_text(turn: dict[str, Any], role: str) -> str:
    """A turn's text: ``value``/``content`` as a string, a list of content parts (their text), or nothing (``null``,
    an assistant turn that only calls tools); and an assistant turn's OpenAI-style ``tool_calls`` in our tags."""
    content = turn.get("value", turn.get("content"))
    calls = turn.get("tool_calls") or [] if role == "assistant" else []
    if str(turn.get("from", turn.get("role"))).lower() == "function_call":  # LLaMA-Factory: the call as JSON text
        try:
            called = json.loads(content) if isinstance(content, str) else content
        except ValueError:
            raise ValueError(f"a function_call turn is not a JSON call: {str(content)[:200]}") from None
        calls, content = (called if isinstance(called, list) else [called]), None
    if not isinstance(calls, (list, tuple)):  # a TypeError from the loop below, and a traceback
        raise ValueError(f"an assistant turn's tool_calls are a list of calls, not {type(calls).__name__} "
                         f"{str(calls)[:200]}")
    if isinstance(content, (dict, bool)):  # trained on as its Python spelling ("{'text': …}", "True"), silently
        raise ValueError(f"a turn's content is text, a list of parts or null, not {type(content).__name__} "
                         f"{str(content)[:200]}")
    text = content_text(content)
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else {}
        name, arguments = str(function.get("name")), function.get("arguments")
        if name not in _CALLS:
            raise ValueError(f"a tool call to {name!r}: the tools are {', '.join(_CALLS)}")
        tag, argument = _CALLS[name]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass  # a bare string: the argument itself
        value = arguments.get(argument) if isinstance(arguments, dict) else arguments
        if value is None:
            raise ValueError(f"a tool call to {name} without its argument {argument!r}: {str(arguments)[:200]}")
        if isinstance(value, (dict, list, bool)):  # its Python spelling ("['a', 'b']") between the tags, silently
            raise ValueError(f"a tool call to {name} whose {argument!r} is {type(value).__name__} "
                             f"{str(value)[:200]}, not text")
        call_text = f"<answer>\\boxed{{{value}}}</answer>" if tag == "answer" else f"<{tag}>{value}</{tag}>"
        text += ("\n" if text and not text.endswith("\n") else "") + call_text
    return text


def turn_segments(text: str) -> list[tuple[str, str]]:
    """An assistant turn as ``(kind, text)`` pieces: a ``<result>…</result>`` (or a ```` ```output ```` block) written
    inside it (a whole episode kept as one message, tool results inline) is an observation, in the env's own form
    (`tags.wrap_result`), and never trained on; the text around each is an action. A turn without one is one
    action."""
    text = _OUTPUT.sub(lambda m: f"<{tags.RESULT}>\n{m.group(1).strip()}\n</{tags.RESULT}>", text)
    results = [span for span in tags.spans(text)[0] if span.tag == tags.RESULT]
    pieces, last = [], 0
    for span in results:
        pieces.append(("action", text[last:span.start].rstrip()))
        pieces.append(("observation", tags.wrap_result(span.content.strip("\n"))))
        last = span.end
    pieces.append(("action", text[last:].lstrip("\n") if results else text))
    return [(kind, piece) for kind, piece in pieces if kind == "observation" or piece or not results]


def from_chat(record: dict[str, Any], system: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A ShareGPT-style conversation as a native record. `system` replaces the record's system message."""
    turns = record.get("conversations") or record.get("messages") or []
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise ValueError("a chat record's conversations (or messages) are a list of turns, each an object with "
                         "from/value (or role/content)")
    turns = [(role := _ROLES.get(str(t.get("from", t.get("role"))).lower(), "user"),
              _turn_text(t, role)) for t in turns]
    if not any(role == "assistant" for role, _ in turns):
        raise ValueError("a chat record needs at least one assistant turn")
    first_user = next((i for i, (role, _) in enumerate(turns) if role == "user"), None)
    if first_user is None:
        raise ValueError("a chat record needs a user turn (the question)")
    messages = [{"role": "system", "content": text} for role, text in turns[:first_user] if role == "system"]
    if system is not None:
        messages = [m for m in system if m["role"] == "system"]
    messages.append({"role": "user", "content": turns[first_user][1]})
    last_assistant = max(i for i, (role, _) in enumerate(turns) if role == "assistant")
    segments = []
    for i, (role, text) in enumerate(turns[first_user + 1:], first_user + 1):
        if role == "assistant":
            pieces = turn_segments(text)
            for j, (kind, piece) in enumerate(pieces):
                final = i == last_assistant and j == len(pieces) - 1
                segments.append({"kind": kind, "text": map_action(piece, final) if kind == "action" else piece})
        elif i < last_assistant:
            segments.append({"kind": "observation", "text": tags.wrap_result(text)})
    return {"messages": messages, "segments": segments}


def synthetic_records(n: int, seed: int = 1, env_id: str = "ARPO-Math-v0", progress: bool = True,
                      family: str = "arithmetic") -> list[dict[str, Any]]:
    """`n` scripted-teacher episodes on procedural tasks (`family`: ``arithmetic``, ``chain``, ``noisy``, or with a
    difficulty, ``chain:2``, ``noisy:3:25``; seed `seed`), played in the real sandbox. A ``noisy`` teacher that
    ran out of tool calls on retries (reward below 1) is left out."""
    import gymnasium as gym
    from tqdm.auto import tqdm

    import arpo_env  # noqa: F401
    from arpo_env.datasets.procedural import procedural_tasks, scripted_episode

    name, _, level = family.partition(":")
    tasks = procedural_tasks(f"{name}:{n}:{seed}:{level}")
    if tasks is None:
        raise ValueError(f"synthetic_family {family!r}: not a procedural family (arithmetic, chain or noisy)")

    env = gym.make(env_id).unwrapped
    try:
        records = []
        for task in tqdm(tasks, desc="synthetic traces", disable=not progress):
            episode = scripted_episode(env, task)
            if task.source == "noisy" and episode["reward"] < 1:
                continue
            records.append({"messages": episode["messages"], "segments": [
                {"kind": kind, "text": text} for kind, text in episode["segments"]], "reward": episode["reward"]})
        return records
    finally:
        env.close()


def rollout_records(path: str, min_reward: float | None = None, read: list[int] | None = None,
                    tokenizer: Any = None) -> list[dict[str, Any]]:
    """Rejection sampling: the correct, format-valid trajectories of rollout trees (``-`` reads standard input),
    as token ids; duplicates (the same completion twice) are kept once. `read`, if given, gets the number of
    trajectories read appended to it. With `tokenizer`, a tree whose prompt does not read as its question through
    it is a `ValueError`: trees sampled by a model of another tokenizer, whose ids would train on other tokens."""
    from arpo_algo.core.tree import RolloutTree

    kept, seen, total = [], set(), 0
    for n, record in numbered_records(path):
        try:
            tree = RolloutTree.from_dict(record)
            for tr in tree.trajectories:  # what is read of each, of the types it is read as
                if not (isinstance(tr.reward, numbers.Real) and isinstance(tr.truncated, bool)):
                    raise ValueError("a trajectory's reward is a number and its truncated true or false, not "
                                     f"{tr.reward!r} and {tr.truncated!r}")
        except ValueError as exc:  # a reward is a number and truncated a switch, or --min_reward compares text
            raise ValueError(f"{path} line {n}: {exc}") from None
        total += len(tree.trajectories)
        checked = tokenizer is None
        for tr in tree.trajectories:
            parts = tr.reward_parts
            if not (parts.get("correct") and parts.get("format_ok", True)) or tr.truncated:
                continue
            if min_reward is not None and tr.reward < min_reward:
                continue
            try:
                token_ids(vars(tr))  # ids given as text went on into training as its letters
            except ValueError as exc:
                raise ValueError(f"{path} line {n}: {exc}") from None
            if not checked:
                _check_tokenizer(tokenizer, tr.prompt_ids, str(tree.task.get("question") or ""), f"{path} line {n}")
                checked = True
            key = (tuple(tr.prompt_ids), tuple(tr.completion_ids))
            if key in seen:
                continue
            seen.add(key)
            kept.append({"prompt_ids": tr.prompt_ids, "completion_ids": tr.completion_ids, "mask": tr.mask})
    if read is not None:
        read.append(total)
    return kept


def _check_tokenizer(tokenizer: Any, ids: Sequence[int], question: str, where: str) -> None:
    """A `ValueError` naming `where` unless `ids` (a trajectory's prompt) decode, through `tokenizer`, to text that
    holds the start of `question`: the ids of another tokenizer decode to other words (or past its vocabulary)."""
    start = "".join(question.split())[:80]  # spaces aside: a tokenizer may decode them otherwise (" ?" as "?")
    try:
        text = tokenizer.decode(list(ids), clean_up_tokenization_spaces=False)
    except (IndexError, OverflowError, TypeError, ValueError):
        text = ""
    if start and start not in "".join(text.split()):
        raise ValueError(f"{where}: its prompt does not read as its question through this model's tokenizer (it "
                         f"reads {text[-120:]!r}): trees sampled by a model of another tokenizer? Their token ids would "
                         "train on other tokens; roll out with this model")


# Tokenisation -----------------------------------------------------------------------------------------------------
def tokenize(record: dict[str, Any], tokenizer: Any) -> dict[str, list[int]]:
    """``input_ids`` and ``assistant_masks`` (1 on the model's own tokens and the final EOS, 0 on the prompt and on
    tool output) for a native or token-id record. Each segment is encoded on its own, as the rollout does."""
    eos = tokenizer.eos_token_id
    if "prompt_ids" in record:
        prompt, completion, mask = token_ids(record)
    else:
        messages = record["messages"]
        if not (isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                   and isinstance(m.get("content"), str) for m in messages)):
            # the chat template needs a role in every message (jinja2 would raise UndefinedError)
            raise ValueError("a native record's messages are a list of {\"role\", \"content\"} objects, each "
                             "a text")
        prompt = prompt_ids(tokenizer, messages)
        completion, mask = [], []
        for segment in record["segments"]:
            kind, text = (segment["kind"], segment["text"]) if isinstance(segment, dict) else segment
            if kind not in ("action", "observation"):
                raise ValueError(f"segment kind must be action or observation, not {kind!r}")
            if not isinstance(text, str):
                raise ValueError(f"a segment's text is text, not {type(text).__name__} {str(text)[:200]}")
            # an observation is text only, as the rollout encodes it (`text_ids`: a result spelling <|im_end|>)
            piece = (text_ids(tokenizer, text) if kind == "observation"
                     else tokenizer.encode(text, add_special_tokens=False))
            completion += piece
            mask += [1 if kind == "action" else 0] * len(piece)
    if not any(mask):  # it trained on the EOS alone, right after the question: to stop at once, silently
        raise ValueError("no text of the model's own (no action, or only empty ones): it would teach the model to "
                         "stop right after the question")
    return {"input_ids": prompt + completion + [eos], "assistant_masks": [0] * len(prompt) + mask + [1]}


def token_ids(record: dict[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """A token-id record's (or trajectory's) ``prompt_ids``, ``completion_ids`` and ``mask``, or a `ValueError`
    saying which is amiss."""
    prompt, completion, mask = (_whole_numbers(record, key) for key in ("prompt_ids", "completion_ids", "mask"))
    if len(mask) != len(completion):
        raise ValueError(f"a mask of {len(mask)} for {len(completion)} completion ids")
    if not set(mask) <= {0, 1}:
        raise ValueError(f"a mask holds 0 (not trained) and 1 (trained) only, not {max(set(mask) - {0, 1})}")
    return prompt, completion, mask


def _whole_numbers(record: dict[str, Any], key: str) -> list[int]:
    """`record`'s `key` (token ids, a mask), a list of whole numbers. Text there became a list of its letters, and
    numbers with a fraction or true/false went on into the dataset; the first was a `TypeError` traceback (token ids
    compared), the others trained on what no tokenizer wrote, silently."""
    values = record[key]
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{key} is a list of whole numbers, not {str(values)[:200]}")
    return values


def normalise(record: dict[str, Any], system: list[dict[str, str]] | None) -> dict[str, Any]:
    if "prompt_ids" in record or "segments" in record:
        return record
    return from_chat(record, system)


RECORD_SHAPES = ('native {"messages", "segments": [{"kind", "text"}, …]}, chat {"conversations": [{"from", "value"}, '
                 '…]} or {"messages": [{"role", "content"}, …]}, or token ids {"prompt_ids", "completion_ids", "mask"}')


def example(record: Any, system: list[dict[str, str]] | None, tokenizer: Any, where: str) -> dict[str, list[int]]:
    """`tokenize(normalise(record))`, or a `ValueError` that names `where` the record is (file and line) and the
    shapes a record may have, for a record of another shape."""
    try:
        if not isinstance(record, dict):
            raise ValueError(f"a {type(record).__name__}, not an object of fields")
        return tokenize(normalise(record, system), tokenizer)
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        what = f"no {exc.args[0]!r} field" if isinstance(exc, KeyError) and exc.args else f"{exc}"
        raise ValueError(f"{where} is not a trajectory record ({what}); a record is {RECORD_SHAPES}") from None


# Command line -----------------------------------------------------------------------------------------------------
@dataclass
class SFTScriptArguments:
    """What ``arpo sft`` trains on (every SFTConfig and ModelConfig flag works too)."""

    trajectories: list[str] | None = field(
        default=None, metadata={"help": "JSONL files of trajectories: native or chat (ShareGPT-style) records."})
    from_rollouts: str | None = field(
        default=None, metadata={"help": "Rollout trees (JSONL, '-' for standard input): keep the correct, "
                                        "format-valid trajectories (rejection sampling)."})
    min_reward: float | None = field(
        default=None, metadata={"help": "With --from_rollouts: also require at least this reward."})
    synthetic_tasks: int = field(
        default=0, metadata={"help": "Add this many scripted-teacher traces on procedural tasks."})
    synthetic_seed: int = field(
        default=1, metadata={"help": "Seed of the synthetic tasks (the RL recipes train on seed 0)."})
    synthetic_family: str = field(
        default="arithmetic", metadata={"help": "Procedural family of the synthetic tasks: arithmetic, chain or noisy, "
                                                "optionally with a difficulty (arithmetic:5 terms, chain:2 steps, "
                                                "noisy:2:25 steps and the percent of faulty results)."})
    env_id: str = field(
        default="ARPO-Math-v0", metadata={"help": "Environment whose system prompt chat records get."})
    keep_system_prompt: bool = field(
        default=False, metadata={"help": "Keep a chat record's own system prompt instead of the env's."})

    def __post_init__(self) -> None:
        """The synthetic tasks' settings, checked before the model loads and named as the flags they are: they were
        refused once the weights had loaded, as "dataset 'arithmetic:-1:1:': N must be …"."""
        import os

        from arpo_env.datasets.procedural import FAMILIES, MAX_TASKS, parse_name
        from arpo_env.datasets.task import BadDatasetName

        if isinstance(self.trajectories, (str, os.PathLike)):  # a recipe's one file, not a list of its letters
            self.trajectories = [os.fspath(self.trajectories)]
        # nothing to train on, or a missing file, is said before the model loads (minutes, for a 7B one)
        if not (self.trajectories or self.from_rollouts or self.synthetic_tasks):
            raise ValueError("no trajectories: give --trajectories, --from_rollouts or --synthetic_tasks")
        files = [("trajectories", p) for p in self.trajectories or ()] + [("from_rollouts", self.from_rollouts)]
        for flag, path in files:
            if path is None or path == "-":
                continue
            if not os.path.exists(path):
                why = "does not exist"
            elif os.path.isdir(path):
                why = "is a folder"
            elif not os.access(path, os.R_OK):
                why = "cannot be read"
            else:
                continue
            given = " (arpo rollout's trees), or - for standard input" if flag == "from_rollouts" else ""
            raise ValueError(f"{flag} {path} {why}: give a JSONL file{given}")
        if self.min_reward is not None and math.isnan(self.min_reward):  # every reward compared false: all kept
            raise ValueError("min_reward must be a number (a reward to reach), not nan")
        count = self.synthetic_tasks
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TASKS:
            raise ValueError(f"synthetic_tasks must be a whole number from 0 (none) to {MAX_TASKS:,}, not {count!r}")
        name, _, level = str(self.synthetic_family).partition(":")
        if name not in FAMILIES:
            raise ValueError(f"synthetic_family {self.synthetic_family!r}: not a procedural family (arithmetic, "
                             "chain or noisy, :LEVEL optional)")
        try:
            parse_name(f"{name}:1:0:{level}")
        except BadDatasetName as exc:  # said of the flag's own fields, LEVEL[:RATE], not of the name made from it
            why = str(exc).split(": ", 1)[-1].split(" (", 1)[0].replace("more than N, SEED, ", "more than ")
            why = why if why.startswith("more than") else f"its {why}"
            raise ValueError(f"synthetic_family {self.synthetic_family!r}: {why} (e.g. {name}:"
                             f"{FAMILIES[name][2]}, or {name}:{FAMILIES[name][2]}:25 with 25 % of the tool results "
                             "faulty)") from None
        if ":" not in self.env_id:  # registered (module:Name-v0 registers on import, when it is made)
            import gymnasium as gym

            import arpo_env  # noqa: F401 - registers our ids

            gym.spec(self.env_id)  # NameNotFound: the command line names arpo's (arpo_algo.environments.unknown_env)


def make_parser() -> Any:
    from trl import ModelConfig

    from arpo_algo.training.config import ColdStartConfig
    from arpo_algo.training.parser import RecipeParser

    return RecipeParser((SFTScriptArguments, ColdStartConfig, ModelConfig), prog="arpo sft")


def build_dataset(script: SFTScriptArguments, tokenizer: Any, vocabulary: int | None = None) -> Any:
    """The SFT dataset of every source `script` names; `vocabulary`, the model's embedding rows, if given, is what
    token ids must stay under (`check_token_ids`)."""
    from datasets import Dataset

    records: list[dict[str, Any]] = []
    examples: list[dict[str, list[int]]] = []
    system = None
    for path in script.trajectories or []:
        batch = list(numbered_records(path))
        if system is None and not script.keep_system_prompt and any("segments" not in r for _, r in batch
                                                                     if isinstance(r, dict)):
            system = env_messages("", script.env_id)
        for n, record in batch:
            examples.append(example(record, system, tokenizer, f"{path} line {n}"))
            check_token_ids(examples[-1]["input_ids"], vocabulary, f"{path} line {n}")
    if script.from_rollouts:
        read: list[int] = []
        kept = rollout_records(script.from_rollouts, script.min_reward, read, tokenizer)
        least = f", reward at least {script.min_reward:g}" if script.min_reward is not None else ""
        print(f"arpo sft: {len(kept)} of {read[0]} trajectories kept from {script.from_rollouts} (correct, "
              f"format-valid{least}; each completion once)", file=sys.stderr)
        if not kept and not examples and not script.synthetic_tasks:  # name what was given and why none of it was kept
            raise SystemExit(f"arpo sft: nothing to train on: no trajectory of {script.from_rollouts} is correct and "
                             f"format-valid{least}; roll out more tasks, or add --synthetic_tasks N")
        for i, record in enumerate(kept, 1):
            check_token_ids(record["prompt_ids"] + record["completion_ids"], vocabulary,
                            f"{script.from_rollouts}: kept trajectory {i}")
        records += kept
    if script.synthetic_tasks:
        records += synthetic_records(script.synthetic_tasks, script.synthetic_seed, script.env_id,
                                     family=script.synthetic_family)
    examples += [tokenize(r, tokenizer) for r in records]
    if not examples:
        raise SystemExit("arpo sft: no trajectories: give --trajectories, --from_rollouts or --synthetic_tasks")
    return Dataset.from_list(examples)


def length_note(masks: Sequence[Sequence[int]], max_length: int | None) -> str | None:
    """What ``max_length`` does to these trajectories (their assistant masks), or None when it cuts none. TRL cuts
    each at ``max_length`` tokens and drops those left with no trained token, silently; when it dropped all of them
    the run died on "num_samples should be a positive integer value, but got num_samples=0". That is a `SystemExit`
    here, before training, saying what length would do."""
    if max_length is None:
        return None
    longer = [m for m in masks if len(m) > max_length]
    if not longer:
        return None
    firsts = [list(m).index(1) for m in masks if 1 in m]
    dropped = sum(1 for m in masks if 1 not in m[:max_length])
    if dropped == len(masks):
        raise SystemExit(f"arpo sft: max_length={max_length} leaves no trained token in any trajectory: the first "
                         f"comes after {min(firsts, default=0)} tokens at the soonest (the prompt), and the longest "
                         f"trajectory has {max(map(len, masks))}; raise --max_length")
    left = f"; left out, with no trained token before it: {dropped}" if dropped else ""
    return (f"{len(longer)} of {len(masks)} trajectories are longer than max_length={max_length} tokens and are cut "
            f"there (the longest has {max(map(len, masks))}){left}")


def check_token_ids(ids: Sequence[int], vocabulary: int | None, where: str) -> None:
    """A `ValueError` naming `where` for a token id the model has no embedding for: token-id records (rollout trees,
    ``prompt_ids`` records) sampled by a model of another vocabulary. Its first training step failed on it
    ("IndexError: index out of range in self"), after the model had loaded. (Ids inside the range but of another
    tokenizer: `_check_tokenizer`, for rollout trees.)"""
    if vocabulary is None or not ids or 0 <= min(ids) <= max(ids) < vocabulary:  # in C: a dataset's tokens are many
        return
    bad = next(i for i in ids if not 0 <= i < vocabulary)
    raise ValueError(f"{where} holds token id {bad}, past the model's vocabulary ({vocabulary:,} embeddings): token ids "
                     "sampled by another model? Roll out with this one, or give the trajectories as text")


def train(script: SFTScriptArguments, args: Any, model_args: Any) -> Any:
    from trl import SFTTrainer, get_peft_config

    from arpo_algo.generation.models import load_model
    from arpo_algo.training.train import note_starting_over, resolve_resume

    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir, "arpo sft")  # "last", as in arpo train
    model_name = model_args.model_name_or_path or "smollm2-135m"
    model, tokenizer = load_model(model_name, dtype=model_args.dtype if model_args.dtype not in (None, "auto")
                                  else None)
    try:
        dataset = build_dataset(script, tokenizer, model.get_input_embeddings().num_embeddings)
    except (ValueError, OSError) as exc:  # a file that is missing or not what it should be: one line, no traceback
        raise SystemExit(f"arpo sft: {exc}") from None
    steps = f"{args.max_steps} steps" if args.max_steps and args.max_steps > 0 else \
        f"{args.num_train_epochs:g} epoch{'' if args.num_train_epochs == 1 else 's'}"
    print(f"arpo sft: {model_name} on {len(dataset)} trajectories, {sum(map(sum, dataset['assistant_masks']))} "
          f"trained tokens (prompt and tool output masked); {steps}, micro-batches of "
          f"{args.per_device_train_batch_size} × {args.gradient_accumulation_steps} accumulated, device {args.device} "
          f"→ {args.output_dir}", file=sys.stderr)
    packed = getattr(args, "packing", False) or getattr(args, "padding_free", False)  # TRL drops no row then
    cut = None if packed else length_note(dataset["assistant_masks"], args.max_length)
    if cut:
        print(f"arpo sft: {cut}", file=sys.stderr)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=get_peft_config(model_args))
    note_starting_over(resume, args.output_dir, "arpo sft")
    if resume:
        print(f"arpo sft: resuming from {resume}", file=sys.stderr)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    return trainer


def run_sft_recipe(recipe: str, output_dir: str | None = None, extra: Sequence[str] = ()) -> Any:
    """Run an ``arpo sft`` recipe from Python (``arpo train``'s cold start uses it)."""
    from arpo_algo.training.train import parse_recipe

    argv = ["--config", recipe, *extra] + (["--output_dir", output_dir] if output_dir else [])
    script, args, model_args = parse_recipe(make_parser(), argv)
    return train(script, args, model_args)


def main(argv: Sequence[str] | None = None) -> int:
    import time

    from arpo_algo.flags import help_all_as_trl_help
    from arpo_algo.training.train import check_output_dir, held_output_dir, parse_recipe, removed_if_unused

    argv = help_all_as_trl_help(sys.argv[1:] if argv is None else argv)  # --help: arpo_algo.cli.main
    start = time.perf_counter()
    script, args, model_args = parse_recipe(make_parser(), argv)
    check_output_dir(args.output_dir)
    with removed_if_unused(args.output_dir), held_output_dir(args.output_dir):
        trainer = train(script, args, model_args)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if trainer.accelerator.is_main_process:
        first = f"{losses[0]:.3f} → {losses[-1]:.3f}" if losses else "n/a"
        print(f"\nSFT finished {trainer.state.global_step} steps in {time.perf_counter() - start:.0f} s; "
              f"loss {first}\n  model  {Path(args.output_dir)}\n  next   arpo train --config "
              f"examples/recipes/smollm2_cpu.yaml --model_name_or_path {args.output_dir}")
    return 0
