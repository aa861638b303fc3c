"""The vLLM generator against a real engine: runs only where vLLM and a GPU are available (skipped elsewhere)."""

from __future__ import annotations

import pytest

from arpo_algo.vllm_generator import vllm_available

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (vllm_available() and torch.cuda.is_available()),
                                reason="needs vLLM and a GPU (pip install 'arpo[vllm]')")


def test_vllm_rollout_tree(tmp_path):
    import gymnasium as gym
    from tiny_agent import tiny_llama

    import arpo_env  # noqa: F401
    from arpo_algo.models import load_tokenizer
    from arpo_algo.rollout import ARPORollout, RolloutConfig
    from arpo_algo.vllm_generator import VLLMGenerator

    tokenizer = load_tokenizer("smollm2-135m")
    tiny_llama(tokenizer, hidden=128).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = VLLMGenerator.from_pretrained(str(tmp_path), gpu_memory_utilization=0.2, max_model_len=2048,
                                              enforce_eager=True)
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=16,
                           max_completion_tokens=128, seed=0)
    (tree,) = ARPORollout(generator, lambda: gym.make("ARPO-Math-v0").unwrapped, config).run([0])
    assert len(tree.trajectories) == 4
    for t in tree.trajectories:
        assert len(t.completion_ids) == len(t.mask) == len(t.logprobs)
        assert all(0.0 <= e <= 1.0 for e in t.entropies if e is not None)
    assert generator.stats.generated_tokens > 0
