"""The transformers backend of `Generator`: batched sampling over paths with their own key/value caches.

Every path keeps the key/value cache of its encoded prefix (per layer, ``[heads, tokens, head_dim]``). A
`generate` call stacks the active paths into one batch: caches left-padded to a common length, the pending tokens
(the last sampled token plus any observation) right-aligned after them, an attention mask that hides both
paddings, and explicit position ids, so each row sees exactly its own sequence. Only pending tokens are encoded; an
observation costs its own tokens, not the whole prefix. A fork shares its parent's cache tensors (cropped to the
branch point: a view, no copy). Entropy is exact: computed from the full sampling distribution (`arpo_algo.entropy`).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from transformers.cache_utils import DynamicLayer

from arpo_algo.entropy import nucleus_log_probs, token_entropy
from arpo_algo.generator import GeneratorStats, Path, PathGenerator, SamplingParams, Segment


class HFGenerator(PathGenerator):
    """Generate with a transformers causal LM on CPU or GPU."""

    decides_mid_segment = True

    def __init__(self, model: Any, tokenizer: Any, device: str | torch.device | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.stats = GeneratorStats()
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.log_vocab = math.log(model.config.vocab_size)  # the logits' width: the normaliser of every entropy
        self._rng = torch.Generator(device="cpu")
        self._rng.manual_seed(0)

    # Paths ----------------------------------------------------------------------------------------------------------
    def seed(self, seed: int) -> None:
        self._rng.manual_seed(seed)

    def fork(self, path: Path, at: int | None = None) -> Path:
        """A path with the prefix ``tokens[:at]``; its cache is the parent's, cropped (views, not copies)."""
        at = len(path.tokens) if at is None else at
        keep = min(path.encoded, at - 1)  # at least the last prefix token stays pending, to produce logits
        state = None if path.state is None or keep <= 0 else tuple((k[:, :keep], v[:, :keep]) for k, v in path.state)
        return Path(path.tokens[:at], keep if state is not None else 0, state, path.prompt_len)

    @torch.no_grad()
    def encode(self, paths: list[Path]) -> None:
        """Encode each path's tokens but the last into its cache, in one batch: a prompt shared by many paths (forks
        of it) is then encoded once."""
        todo = [p for p in paths if len(p.tokens) - 1 > p.encoded]
        if not todo:
            return
        pending = [p.tokens[p.encoded:-1] for p in todo]
        cache_len, width = max(p.encoded for p in todo), max(len(t) for t in pending)
        self.stats.prefill_tokens += sum(len(t) for t in pending)
        mask = torch.zeros(len(todo), cache_len + width, dtype=torch.long)
        input_ids = torch.full((len(todo), width), self.pad_id, dtype=torch.long)
        positions = torch.zeros(len(todo), width, dtype=torch.long)
        for i, (path, toks) in enumerate(zip(todo, pending)):
            mask[i, cache_len - path.encoded: cache_len] = 1
            mask[i, cache_len + width - len(toks):] = 1
            input_ids[i, width - len(toks):] = torch.tensor(toks)
            positions[i, width - len(toks):] = torch.arange(path.encoded, path.encoded + len(toks))
        cache = self._stack_caches(todo, cache_len)
        self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                   position_ids=positions.to(self.device), past_key_values=cache, use_cache=True, logits_to_keep=1)
        for i, path in enumerate(todo):
            path.state = self._unstack_cache(cache, mask, i)
            path.encoded = len(path.tokens) - 1

    # Generation -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, paths: list[Path], params: SamplingParams,
                 decide: list[Callable[[list[float]], list[Path]] | None] | None = None) -> list[Segment]:
        """Continue every path (see `arpo_algo.generator`). A path whose `decide` is set hands it the entropies of its
        first ``entropy_k`` tokens (fewer if it ends sooner) as soon as they are sampled; the paths it returns (forks of
        that path at its end, the start of this segment) join the batch at once and generate this segment afresh.
        Returns one segment per path, then one per joined path in the order they joined. Paths that end leave the
        batch (their rows are dropped once enough have ended), so a round costs what its live paths generate."""
        if not paths:
            return []
        self.stats.calls += 1
        batch = len(paths)
        pending = [p.tokens[p.encoded:] for p in paths]
        if any(not toks for toks in pending):
            raise ValueError("a path has no pending token: extend it or fork it before generating")
        cache_len = max(p.encoded for p in paths)
        width = max(len(t) for t in pending)
        self.stats.prefill_tokens += sum(len(t) for t in pending)

        mask = torch.zeros(batch, cache_len + width, dtype=torch.long)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        positions = torch.zeros(batch, width, dtype=torch.long)
        for i, (path, toks) in enumerate(zip(paths, pending)):
            mask[i, cache_len - path.encoded: cache_len] = 1
            mask[i, cache_len + width - len(toks):] = 1
            input_ids[i, width - len(toks):] = torch.tensor(toks)
            positions[i, width - len(toks):] = torch.arange(path.encoded, path.encoded + len(toks))
        prefix_end = cache_len + width - 1  # every row's last prefix token is in this column

        reserve = params.max_new_tokens + (params.entropy_k + 1 if decide else 0)
        cache = self._stack_caches(paths, cache_len, reserve)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()

        # Sequences (the paths, then the ones that join) and the batch rows that carry them.
        seqs = list(paths)
        pending_decide = list(decide) if decide else [None] * batch
        generated: list[list[int]] = [[] for _ in paths]
        logprobs: list[list[float]] = [[] for _ in paths]
        entropies: list[list[float]] = [[] for _ in paths]
        finish = [""] * batch
        rows = list(range(batch))  # rows[r]: the sequence in row r (-1: it has ended)
        dead = 0  # rows whose sequence has ended but that are still in the batch (fed padding the mask hides)
        while True:
            tokens, token_logprobs, token_entropy = self._sample(logits, params)
            sampled, token_logprobs, token_entropy = tokens.tolist(), token_logprobs.tolist(), token_entropy.tolist()
            joined: list[int] = []  # the rows whose sequences fork, once per new sequence
            for r, i in enumerate(rows):
                if i < 0:
                    continue
                token = sampled[r]
                generated[i].append(token)
                logprobs[i].append(token_logprobs[r])
                if len(generated[i]) <= params.entropy_k:
                    entropies[i].append(token_entropy[r])
                if token in self.eos_ids:
                    finish[i] = "eos"
                elif params.stop and self._hit_stop(generated[i], params.stop):
                    finish[i] = "stop"
                elif len(generated[i]) >= params.max_new_tokens:
                    finish[i] = "length"
                if pending_decide[i] is not None and (finish[i] or len(generated[i]) >= params.entropy_k):
                    for path in pending_decide[i](list(entropies[i])):
                        seqs.append(path)
                        generated.append([]), logprobs.append([]), entropies.append([]), finish.append("")
                        pending_decide.append(None)
                        joined.append(r)
                    pending_decide[i] = None
            for r, i in enumerate(rows):
                if i >= 0 and finish[i]:  # ended: keep its cache, free its row
                    seqs[i].state = self._unstack_cache(cache, mask, r)
                    rows[r] = -1
                    dead += 1
            if dead == len(rows) and not joined:
                break
            # Joining sequences copy their parent's row without this segment's columns (nor the last prefix
            # token's, which they are fed again to get their own first distribution); ended rows are dropped when
            # they are a quarter of the batch or rows are copied anyway.
            fresh: set[int] = set()
            if joined or dead * 4 >= len(rows):
                keep = [r for r, i in enumerate(rows) if i >= 0]
                index = torch.tensor(keep + joined, dtype=torch.long)
                self._select_rows(cache, index.to(self.device))
                mask = mask[index]
                mask[len(keep):, prefix_end:] = 0
                fresh = set(range(len(seqs) - len(joined), len(seqs)))
                sampled = [sampled[r] for r in keep]
                rows, dead = [rows[r] for r in keep] + sorted(fresh), 0
                self.stats.prefill_tokens += len(joined)
            ids, pos, live = [], [], []
            for r, i in enumerate(rows):
                if i < 0:  # fed padding, hidden by the mask
                    ids.append(self.pad_id), pos.append(0), live.append(0)
                elif i in fresh:  # a joining sequence: its last prefix token, again
                    ids.append(seqs[i].tokens[-1]), pos.append(len(seqs[i].tokens) - 1), live.append(1)
                else:
                    ids.append(sampled[r]), pos.append(len(seqs[i].tokens) + len(generated[i]) - 1), live.append(1)
            mask = torch.cat([mask, torch.tensor(live, dtype=torch.long)[:, None]], dim=1)
            out = self.model(input_ids=torch.tensor(ids)[:, None].to(self.device),
                             attention_mask=mask.to(self.device),
                             position_ids=torch.tensor(pos)[:, None].to(self.device), past_key_values=cache,
                             use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()

        segments = []
        for i, path in enumerate(seqs):
            path.tokens.extend(generated[i])
            path.encoded = len(path.tokens) - 1  # the last sampled token has not been fed yet
            self.stats.generated_tokens += len(generated[i])
            text_ids = [t for t in generated[i] if t not in self.eos_ids]
            segments.append(Segment(generated[i], logprobs[i], entropies[i],
                                    self.tokenizer.decode(text_ids, skip_special_tokens=False), finish[i],
                                    params.entropy_k))
        return segments

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample one token per row; return it, its log-prob under the sampling distribution (temperature and top-p
        applied, renormalised over the nucleus) and that distribution's normalised entropy (`arpo_algo.entropy`)."""
        if params.temperature <= 0:
            raw = torch.log_softmax(logits.float(), dim=-1)
            tokens = logits.argmax(-1)
            return tokens, raw.gather(1, tokens[:, None])[:, 0], token_entropy(logits)
        logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            logp = nucleus_log_probs(logp, params.top_p)
        probs = logp.exp()
        # Inverse-CDF sampling: one uniform draw per row from the seeded stream (torch.multinomial draws one per
        # vocabulary entry, a fifth of a batched step's time on a CPU).
        cdf = probs.cumsum(-1)
        draws = torch.rand(logits.shape[0], 1, generator=self._rng).to(cdf.device, cdf.dtype)
        tokens = torch.searchsorted(cdf, draws * cdf[:, -1:], right=True)[:, 0].clamp_(max=logits.shape[-1] - 1)
        entropy = torch.where(probs > 0, -probs * logp, torch.zeros_like(probs)).sum(-1) / self.log_vocab
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


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
