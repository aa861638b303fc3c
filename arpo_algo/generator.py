"""The `Generator` protocol: one interface over generation backends (transformers, vLLM).

A generator grows *paths*. A path is a token sequence (prompt + completion so far) plus whatever the backend keeps
to continue it cheaply (the transformers backend keeps the key/value cache of the encoded prefix). The rollout
engine calls:

* `new_path(prompt_ids)` — a path at the start of the response;
* `generate(paths, params)` — continue every path until a stop string (a closing tool tag or ``</answer>``), the
  end-of-sequence token or ``max_new_tokens``; returns one `Segment` per path, with the sampled tokens' log-probs
  and the normalised entropy of the first ``entropy_k`` tokens;
* `extend(path, token_ids)` — append an observation's tokens (encoded lazily at the next `generate`);
* `fork(path, at=None)` — a new path sharing the prefix ``tokens[:at]`` (and its cache: no re-encoding);
* `submit(path, params, key)` and `poll()` — the same continuation, asked for one path at a time: `poll` returns
  ``(key, Segment)`` for the requests that have finished since the last call; `cancel(key)` drops a request
  (ARPO's spare samples that a task turns out not to need), counting the tokens it had generated. A *lock-step* backend
  (``lockstep = True``: transformers with ``continuous=False``) generates everything submitted in one batch per
  `poll`; a *stepped* one (``stepped = True``: transformers, continuous batching) keeps a running batch that
  submitted paths join and ended ones leave, each poll a deterministic number of steps; an asynchronous one (vLLM,
  engine or server) serves each path as its own request, so the rollout engine can hand a path its next request
  the moment its tool result is back, while the others are still generating.

Every backend measures the same thing: the entropy of the sampling distribution (after temperature and top-p),
normalised by ln|V|, for each of the first ``entropy_k`` tokens; a segment's H is their sum, ΔH a difference of two
such sums (`arpo_algo.entropy` defines all of it, with its formulas), so α and β mean what they mean in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from arpo_algo.entropy import window_entropy


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    entropy_k: int = 20
    """Measure the entropy of this many first tokens of every segment."""
    seed: int | None = None
    """A per-request sampling seed: the same continuation whatever else is in the batch (on every backend, up to the
    last bits of batched arithmetic); None: drawn from the generator's own seeded sequence."""


@dataclass
class Segment:
    """What one `generate` call produced for one path."""

    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    """Normalised entropy of each of the first `entropy_k` tokens (fewer if the segment is shorter)."""
    text: str
    finish: str
    """"stop" (a stop string), "eos" or "length"."""
    entropy_k: int = 20
    """The window the entropies were measured over."""

    @property
    def entropy(self) -> float | None:
        """H: the window entropy ARPO compares (`arpo_algo.entropy.window_entropy`: the sum over the k measured
        tokens, on the reference's scale); None for an empty segment."""
        return window_entropy(self.entropies, self.entropy_k)


@dataclass
class Path:
    """A growing sequence. `state` is the backend's (the transformers cache; nothing for vLLM)."""

    tokens: list[int]
    encoded: int = 0
    """How many leading tokens the backend's state already covers."""
    state: Any = None
    prompt_len: int = field(default=0)


@dataclass
class GeneratorStats:
    prefill_tokens: int = 0
    """Tokens encoded without being generated (prompts, observations, and prefixes that had to be re-encoded)."""
    generated_tokens: int = 0
    calls: int = 0
    decode_steps: int = 0
    """Decoding steps of the running batch, one after the other (the transformers backend; 0 where the backend does
    not count them): its critical path, whatever the batch width."""

    def as_dict(self) -> dict[str, int]:
        return {"prefill_tokens": self.prefill_tokens, "generated_tokens": self.generated_tokens, "calls": self.calls,
                "decode_steps": self.decode_steps}


Decide = Callable[[list[float]], list[tuple[Any, Path, SamplingParams]]]
"""A branch decision taken during generation (`PathGenerator.submit`): given the entropies of a path's first
``entropy_k`` tokens of the segment (fewer if it ends sooner), the (key, path, params) of the paths that join, each
a fork of that path at the start of the segment with its own request (the same sampling, its own seed)."""


class PathGenerator:
    """What every backend does the same way: a path starts as its prompt, and observations are appended to it
    (a backend encodes them lazily, at its next `generate`). `submit`/`poll` here are lock-step: `poll` generates
    everything submitted, one `generate` batch per distinct sampling setting, and returns it in submission order.

    A backend with ``decides_mid_segment = True`` (transformers, the vLLM engine) takes a request's `decide` during
    generation, as soon as the segment's first ``entropy_k`` tokens are sampled: the paths it returns join the running
    batch at once (a branch then starts ``entropy_k`` tokens after its parent, not a whole segment later)."""

    lockstep = True
    decides_mid_segment = False

    def new_path(self, prompt_ids: list[int]) -> Path:
        return Path(list(prompt_ids), 0, None, len(prompt_ids))

    def extend(self, path: Path, token_ids: list[int]) -> None:
        path.tokens.extend(token_ids)

    def generate(self, paths: list[Path], params: SamplingParams) -> list[Segment]:
        raise NotImplementedError

    def submit(self, path: Path, params: SamplingParams, key: Any, decide: Decide | None = None) -> None:
        self._check_decide(decide)
        self.__dict__.setdefault("_submitted", []).append((key, path, params, decide))

    def cancel(self, key: Any) -> int:
        """Drop the request submitted under `key` if it has not finished; returns the tokens it had generated (they
        count in `stats`). A lock-step backend generates nothing between polls, so it only forgets the request."""
        submitted = self.__dict__.get("_submitted", [])
        self.__dict__["_submitted"] = [s for s in submitted if s[0] != key]
        return 0

    def _check_decide(self, decide: Decide | None) -> None:
        if decide is not None and not self.decides_mid_segment:
            raise ValueError(f"{type(self).__name__} takes its branch decisions once a segment is back, not during "
                             "generation (decides_mid_segment is False)")

    def poll(self) -> list[tuple[Any, Segment]]:
        submitted = self.__dict__.pop("_submitted", [])
        done: dict[int, Segment] = {}
        unseeded = [replace(p, seed=None) for _, _, p, _ in submitted]
        for params in dict.fromkeys(unseeded):
            idx = [i for i, p in enumerate(unseeded) if p == params]
            for i, segment in zip(idx, self.generate([submitted[i][1] for i in idx], params)):
                done[i] = segment
        return [(key, done[i]) for i, (key, _, _, _) in enumerate(submitted)]


class Generator(Protocol):
    tokenizer: Any
    stats: GeneratorStats

    def new_path(self, prompt_ids: list[int]) -> Path: ...

    def generate(self, paths: list[Path], params: SamplingParams) -> list[Segment]: ...

    def extend(self, path: Path, token_ids: list[int]) -> None: ...

    def fork(self, path: Path, at: int | None = None) -> Path: ...

    def seed(self, seed: int) -> None: ...

    lockstep: bool

    def submit(self, path: Path, params: SamplingParams, key: Any, decide: Decide | None = None) -> None: ...

    def poll(self) -> list[tuple[Any, Segment]]: ...

    def cancel(self, key: Any) -> int: ...
