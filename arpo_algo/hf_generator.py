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
from typing import Any

import torch

from arpo_algo.entropy import nucleus_log_probs, token_entropy
from arpo_algo.generator import GeneratorStats, Path, PathGenerator, SamplingParams, Segment


class HFGenerator(PathGenerator):
    """Generate with a transformers causal LM on CPU or GPU."""

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

    # Generation -----------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, paths: list[Path], params: SamplingParams) -> list[Segment]:
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
        next_pos = torch.tensor([len(p.tokens) for p in paths])

        cache = self._stack_caches(paths, cache_len)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()

        generated: list[list[int]] = [[] for _ in paths]
        logprobs: list[list[float]] = [[] for _ in paths]
        entropies: list[list[float]] = [[] for _ in paths]
        finish = [""] * batch
        for step in range(params.max_new_tokens):
            active = [i for i in range(batch) if not finish[i]]
            tokens, token_logprobs, token_entropy = self._sample(logits, params)
            for i in active:
                token = int(tokens[i])
                generated[i].append(token)
                logprobs[i].append(float(token_logprobs[i]))
                if step < params.entropy_k:
                    entropies[i].append(float(token_entropy[i]))
                if token in self.eos_ids:
                    finish[i] = "eos"
                elif params.stop and self._hit_stop(generated[i], params.stop):
                    finish[i] = "stop"
            if all(finish) or step == params.max_new_tokens - 1:
                break
            # Feed the sampled tokens; finished rows are fed padding that the mask hides.
            live = torch.tensor([0 if finish[i] else 1 for i in range(batch)], dtype=torch.long)
            mask = torch.cat([mask, live[:, None]], dim=1)
            feed = torch.where(live.bool(), tokens, torch.full_like(tokens, self.pad_id))
            out = self.model(input_ids=feed[:, None].to(self.device), attention_mask=mask.to(self.device),
                             position_ids=next_pos[:, None].to(self.device), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + live
        finish = [f or "length" for f in finish]

        segments = []
        for i, path in enumerate(paths):
            path.state = self._unstack_cache(cache, mask, i)
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
        tokens = torch.multinomial(logp.exp().cpu(), 1, generator=self._rng)[:, 0].to(logits.device)
        probs = logp.exp()
        entropy = torch.where(probs > 0, -probs * logp, torch.zeros_like(probs)).sum(-1) / self.log_vocab
        return tokens, logp.gather(1, tokens[:, None])[:, 0], entropy

    def _hit_stop(self, generated: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(generated[-16:], skip_special_tokens=False)
        last = self.tokenizer.decode(generated[-1:], skip_special_tokens=False)
        window = tail[-(max(len(s) for s in stops) + len(last)):]
        return any(s in window for s in stops)

    # Caches ---------------------------------------------------------------------------------------------------------
    def _stack_caches(self, paths: list[Path], length: int) -> Any:
        from transformers import DynamicCache

        if length == 0:
            return DynamicCache(config=self.model.config)
        reference = next(p.state for p in paths if p.state is not None)
        layers = []
        for layer, (k_ref, v_ref) in enumerate(reference):
            keys, values = [], []
            for path in paths:
                heads, dim = k_ref.shape[0], k_ref.shape[2]
                k = path.state[layer][0] if path.state is not None else k_ref.new_zeros(heads, 0, dim)
                v = path.state[layer][1] if path.state is not None else v_ref.new_zeros(heads, 0, v_ref.shape[2])
                pad = length - k.shape[1]
                keys.append(torch.cat([k.new_zeros(heads, pad, dim), k], dim=1) if pad else k)
                values.append(torch.cat([v.new_zeros(heads, pad, v.shape[2]), v], dim=1) if pad else v)
            layers.append((torch.stack(keys), torch.stack(values)))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    @staticmethod
    def _unstack_cache(cache: Any, mask: torch.Tensor, row: int) -> tuple:
        keep = mask[row, : cache.layers[0].keys.shape[2]].bool().to(cache.layers[0].keys.device)
        return tuple((layer.keys[row][:, keep], layer.values[row][:, keep]) for layer in cache.layers)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
