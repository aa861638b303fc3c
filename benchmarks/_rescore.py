"""Per-token entropies of finished trajectories under the policy that sampled them, both estimators at once.

A rollout records the entropy of the first k tokens of each segment with one estimator. The research benchmarks
compare estimators and timings on the same tokens, so they score every trajectory again with one forward pass:
at each completion position, the normalised entropy of the model's distribution (temperature 1, no nucleus: the
distribution the rollout sampled from) over the whole vocabulary (*exact*) and over its 10 most likely tokens
(*top-10*, the reference's estimator), both divided by ln|V| as `arpo_algo.core.entropy` does.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from arpo_algo.core.entropy import sampling_entropy
from arpo_algo.generation.hf_generator import cache_argument_name, output_cache

ESTIMATORS = {"top10": 10, "exact": 0}


def prompt_cache(model: Any, prompt_ids: list[int]) -> tuple[Any, Any]:
    """(the key-value cache of a prompt, the logits of its last position): the trajectories of one task share their
    prompt, about two thirds of their tokens, so each is scored from a copy of this."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    return output_cache(out), out.logits[0, -1:].float()


def completion_logits(model: Any, cached: tuple[Any, Any], completion_ids: list[int]) -> torch.Tensor:
    """Logits of the distributions each completion token was drawn from, ``[len(completion_ids), vocab]``."""
    cache, last = cached
    device = next(model.parameters()).device
    ids = torch.tensor([completion_ids], device=device)
    out = model(input_ids=ids, **{cache_argument_name(model): copy.deepcopy(cache)})
    return torch.cat([last, out.logits[0, :-1].float()])


@torch.no_grad()
def token_entropies(model: Any, cached: tuple[Any, Any], completion_ids: list[int]) -> dict[str, list[float]]:
    """For each estimator, the normalised entropy of the distribution each completion token was drawn from."""
    logp = torch.log_softmax(completion_logits(model, cached, completion_ids), dim=-1)
    log_vocab = math.log(model.config.vocab_size)
    return {name: sampling_entropy(logp, log_vocab, top).tolist() for name, top in ESTIMATORS.items()}


def window(entropies: list[float], mask: list[int], start: int, k: int) -> float | None:
    """The sum of the first `k` model-token entropies from completion offset `start` (None if there are none)."""
    picked = [e for e, m in zip(entropies[start:], mask[start:]) if m][:k]
    return sum(picked) if picked else None


def result_ends(trajectory: Any) -> list[int]:
    """Completion offsets where the model's turn after each tool result begins, in order."""
    return [s["end"] for s in trajectory.segments if s["kind"] == "tool"]
