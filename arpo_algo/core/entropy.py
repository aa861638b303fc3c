"""Entropy as ARPO measures it: one definition of the per-token entropy, the window entropy H, ΔH and P.

**Which distribution.** Every backend measures the *sampling distribution*: the model's next-token distribution after
temperature and top-p, the one the token is actually drawn from (and the one whose log-probs TRL's importance
sampling expects: its colocated and served vLLM engines run with ``logprobs_mode="processed_logprobs"``). With
ARPO's rollout settings (temperature 1, top-p 1) this is the model's own distribution. Greedy decoding
(temperature 0) has a point mass as its sampling distribution; there we measure the temperature-1 distribution, so
that a greedy rollout still sees the model's uncertainty.

**Per token.** ``h_t = −Σ_v p(v) · ln p(v) / ln |V|``, summed over the top-N tokens of the distribution
(``entropy_top_logprobs``, N = 10 by default, as the reference code sums over vLLM's top-10 log-probs), or over the
whole vocabulary with N = 0 (exact; the transformers backend only, since vLLM returns top log-probs). Both backends
compute it with `sampling_entropy` / `top_logprob_entropy` on the same N, so they agree on the same tokens. The top-N
sum is below the exact entropy: by about half for a small model whose mass is spread (SmolLM2-135M), which is why the
estimator is a setting and the reference's is the default — α = 0.5 and β = 0.2 are the paper's values on its scale.
Tokens outside the top-p nucleus have probability 0 (log-prob −inf): they contribute 0, never NaN.

**Per window (H).** The entropy of a segment is the *sum* of ``h_t`` over its first k measured tokens (k =
``entropy_k``, 20), as the reference code computes it (its ``_calc_entropy`` sums −p·log p over the k tokens' top
log-probs, then divides by ln|V|). So H ranges over [0, k]. A segment shorter than k (the model stopped early) is
scaled up to the window: ``H = mean(h) · k``, equal to the sum when the window is full, so that a short segment is
not read as a confident one. An empty segment has no entropy (``None``): no branching decision is taken on it.

**When.** ΔH = H − H₀, where H₀ is the trajectory's own first window. By default H is the window right after the tool
result the decision is about (the paper). ``entropy_timing="lagged"`` uses the reference code's timing instead: the
decision at tool call t takes the window after result t−1 (for the first call, the first window: ΔH = 0, P = α).

**Where we differ from the reference.** H₀ is each trajectory's own first window, measured anew for every task
(the reference keeps one table across batches and never resets it); by default ΔH is measured on the tokens
generated right after the tool result.

What ARPO does with ΔH (P = clip(α + β·ΔH, 0, 1), and the branch) is `arpo_algo.core.branching`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:  # torch is imported where it computes, so that the rollout settings and the CLI start without it
    import torch


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Normalised entropy (by ln|V|) of the sampling distribution for each row of ``logits`` ``[batch, vocab]``.

    Exact over the whole vocabulary; tokens the nucleus (or a −inf logit) excludes contribute 0."""
    import torch

    log_vocab = math.log(logits.shape[-1])
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    if temperature > 0 and top_p < 1.0:
        logp = nucleus_log_probs(logp, top_p)
    return sampling_entropy(logp, log_vocab, top_logprobs=0)


def sampling_entropy(logp: torch.Tensor, log_vocab: float, top_logprobs: int = 10) -> torch.Tensor:
    """Normalised entropy of each row of a sampling distribution's log-probs ``[batch, vocab]``: summed over its
    `top_logprobs` most likely tokens (as `top_logprob_entropy` sums what vLLM returns), or over the whole vocabulary
    when `top_logprobs` is 0. Tokens with log-prob −inf contribute 0."""
    import torch

    values = logp if top_logprobs <= 0 else logp.topk(min(top_logprobs, logp.shape[-1]), dim=-1).values
    probs = values.exp()
    terms = torch.where(probs > 0, -probs * values, torch.zeros_like(probs))
    return terms.sum(-1) / log_vocab


def nucleus_log_probs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs restricted to the top-p nucleus and renormalised (−inf outside it), as vLLM's processed log-probs."""
    import torch

    sorted_logp, order = logp.sort(-1, descending=True)
    probs = sorted_logp.exp()
    drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_logp = sorted_logp.masked_fill(drop, float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    return torch.log_softmax(kept, dim=-1)


def top_logprob_entropy(logprobs: Iterable[float | None], log_vocab: float, k: int | None = None) -> float:
    """Normalised entropy of one token from the log-probs of its `k` most likely candidates (vLLM's top-k; the
    sampled token may come with them, and is left out when it is not among the `k`).

    Non-finite and missing values (tokens outside the nucleus come back as −inf) contribute 0."""
    finite = sorted((float(v) for v in logprobs if v is not None and math.isfinite(float(v))), reverse=True)
    ranked = finite[:k] if k else finite
    return -sum(math.exp(v) * v for v in ranked) / log_vocab


def window_entropy(entropies: Sequence[float | None], k: int) -> float | None:
    """H of one segment: the sum of its first `k` per-token entropies, or their mean times `k` when the segment is
    shorter than `k`. ``None`` for a segment with no measured token. Non-finite values are skipped."""
    values = [float(e) for e in list(entropies)[:k] if e is not None and math.isfinite(float(e))]
    if not values:
        return None
    return sum(values) if len(values) >= k else sum(values) / len(values) * k
