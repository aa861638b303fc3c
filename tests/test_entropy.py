"""ΔH and P on the paper's scale: the definitions in arpo_algo.core.entropy, the generator's measurements, and branching
decisions of real rollouts with tiny models whose uncertainty sits before or after their tool results."""

from __future__ import annotations

import math
import statistics

import gymnasium as gym
import pytest
import torch
from tiny_agent import TASK, hesitant_start_agent

import arpo_env  # noqa: F401
from arpo_algo.core.config import RolloutConfig
from arpo_algo.core.entropy import (
    nucleus_log_probs,
    token_entropy,
    top_logprob_entropy,
    window_entropy,
)
from arpo_algo.core.tree import entropy_windows
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.protocol import SamplingParams, Segment
from arpo_algo.rollout.scheduler import ARPORollout


def test_window_entropy_sums_the_k_tokens_and_scales_a_short_segment():
    assert window_entropy([0.1] * 20, 20) == pytest.approx(2.0)  # the reference's sum, not the mean
    assert window_entropy([0.1] * 30, 20) == pytest.approx(2.0)  # only the first k count
    assert window_entropy([0.1, 0.3], 20) == pytest.approx(0.2 * 20)  # short: mean × k
    assert window_entropy([], 20) is None
    assert window_entropy([None, float("nan"), 0.2, float("-inf")], 4) == pytest.approx(0.8)
    seg = Segment([1, 2], [-0.1, -0.2], [0.05, 0.15], "ab", "eos", entropy_k=20)
    assert seg.entropy == pytest.approx(2.0)


def test_entropies_are_finite_for_any_log_probs():
    log_vocab = math.log(49152)
    # vLLM's processed log-probs: tokens outside the top-p nucleus come back as -inf
    h = top_logprob_entropy([-0.1, float("-inf"), -2.5, None, float("nan")], log_vocab, 20)
    expected = -(math.exp(-0.1) * -0.1 + math.exp(-2.5) * -2.5) / log_vocab
    assert h == pytest.approx(expected)
    assert top_logprob_entropy([float("-inf")] * 20, log_vocab) == 0.0
    logits = torch.tensor([[0.0, 1.0, float("-inf"), 2.0], [float("-inf"), 5.0, float("-inf"), float("-inf")]])
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0), (1.3, 0.5)):
        values = token_entropy(logits, temperature, top_p)
        assert torch.isfinite(values).all() and (values >= 0).all() and (values <= 1).all()
    assert float(token_entropy(logits)[1]) == 0.0  # one possible token: no uncertainty


def test_hf_generator_measures_the_sampling_distribution(agent, tokenizer):
    """Entropy and the sampled token's log-prob are those of the distribution after temperature and top-p; the
    entropy is the reference's estimator by default (the top-10 log-probs) and exact with entropy_top_logprobs=0."""
    gen = HFGenerator(agent, tokenizer)
    prompt = tokenizer.encode("hello there", add_special_tokens=False)
    with torch.no_grad():
        logits = agent(torch.tensor([prompt])).logits[0, -1].float()
    logp = nucleus_log_probs(torch.log_softmax(logits / 0.7, -1)[None], 0.8)[0]
    probs = logp.exp()
    exact = float(torch.where(probs > 0, -probs * logp, torch.zeros_like(probs)).sum() / math.log(logits.numel()))
    top10 = logp.topk(10).values
    reference = float(torch.where(top10.exp() > 0, -top10.exp() * top10, torch.zeros(10)).sum()
                      / math.log(logits.numel()))
    for top_logprobs, expected in ((10, reference), (0, exact)):
        params = SamplingParams(max_new_tokens=1, temperature=0.7, top_p=0.8, entropy_k=1,
                                entropy_top_logprobs=top_logprobs)
        seg = gen.generate([gen.new_path(prompt)], params)[0]
        assert seg.logprobs[0] == pytest.approx(float(logp[seg.token_ids[0]]), abs=1e-4)
        assert seg.entropies[0] == pytest.approx(expected, rel=1e-4)
    assert SamplingParams().entropy_top_logprobs == 10
    assert reference <= exact < float(token_entropy(logits[None])[0])  # the nucleus is narrower than the model's


def test_the_top_n_estimator_agrees_with_what_vllm_returns():
    """`sampling_entropy` (the transformers backend) and `top_logprob_entropy` (vLLM's top log-probs, with the
    sampled token among them when it is not in the top N) give one number for one distribution."""
    from arpo_algo.core.entropy import sampling_entropy, top_logprob_entropy

    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(5, 300) * 3, -1)
    for n in (1, 10, 20):
        mine = sampling_entropy(logp, math.log(300), n).tolist()
        for row, value in zip(logp, mine):
            returned = row.topk(n).values.tolist() + [float(row.min())]  # vLLM adds the sampled token
            assert top_logprob_entropy(returned, math.log(300), n) == pytest.approx(value, rel=1e-5)
    assert sampling_entropy(logp, math.log(300), 0).tolist() == pytest.approx(token_entropy(logp).tolist(), rel=1e-5)


# Branching follows entropy -------------------------------------------------------------------------------------------
def make_env():
    return gym.make("ARPO-Math-v0", sandbox_options={"timeout_s": 5}, max_tool_calls=4).unwrapped


@pytest.fixture(scope="module")
def shaped_agents(tokenizer, undecided):
    env = make_env()
    agents = {"rising": undecided, "falling": hesitant_start_agent(tokenizer, env)}
    env.close()
    return agents


def decisions_of(model, tokenizer, alpha=0.5, beta=0.2):
    config = RolloutConfig(num_generations=8, num_global=4, alpha=alpha, beta=beta, max_new_tokens=24,
                           max_completion_tokens=400, temperature=1.0, seed=3)
    (tree,) = ARPORollout(HFGenerator(model, tokenizer), make_env, config).run([TASK])
    return tree


@pytest.mark.slow
def test_p_rises_with_entropy_after_tools_and_falls_without(shaped_agents, tokenizer):
    rising = [d for t in decisions_of(shaped_agents["rising"], tokenizer).trajectories for d in t.decisions]
    falling = [d for t in decisions_of(shaped_agents["falling"], tokenizer).trajectories for d in t.decisions]
    assert rising and falling
    # undecided between 42 and 43 after the last result: ΔH > 0 there, so P > α
    assert max(d["delta_h"] for d in rising) > 0.05
    assert max(d["p"] for d in rising) > 0.5
    # unsure how to write its first cell, sure after every result: ΔH < 0, so P < α
    assert statistics.median(d["delta_h"] for d in falling) < -0.05
    assert statistics.median(d["p"] for d in falling) < 0.5
    assert max(d["p"] for d in rising) > statistics.median(d["p"] for d in falling)
    for d in rising + falling:
        assert math.isfinite(d["p"]) and d["p"] == pytest.approx(min(max(0.5 + 0.2 * d["delta_h"], 0.0), 1.0))


@pytest.mark.slow
def test_delta_h_is_the_difference_of_window_sums(shaped_agents, tokenizer):
    """The recorded ΔH is H (after the result) − H₀ (start), each the sum of the k tokens' entropies."""
    tree = decisions_of(shaped_agents["rising"], tokenizer)
    starts = {n.id: n.start for n in tree.nodes}
    checked = 0
    for t in tree.trajectories:
        if starts[t.node] != 0:  # a branch regenerates from its branch point; check roots
            continue
        windows = list(entropy_windows(t.segments, t.entropies))
        h0 = window_entropy(windows[0][1], 20)
        after = [window_entropy(values, 20) for where, values in windows if where == "after_tool"]
        for d, h in zip(t.decisions, after):
            assert d["delta_h"] == pytest.approx(h - h0, abs=1e-9)
            checked += 1
    assert checked >= 2
