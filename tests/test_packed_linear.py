"""Linear layers on oneDNN-packed weights (`arpo_algo.generation.packed_linear`), inside the transformers generator."""

from __future__ import annotations

import pytest
import torch

from arpo_algo.generation.packed_linear import PackedLinears, available

pytestmark = pytest.mark.skipif(not available(), reason="this PyTorch has no oneDNN linear")


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_packed_forward_agrees_with_the_default_kernel_and_is_undone_on_exit(tokenizer):
    from tiny_agent import tiny_llama

    model = tiny_llama(tokenizer, seed=3).eval()
    ids = torch.tensor([tokenizer.encode("Compute 12 * 7 with <python>print(12 * 7)</python>")])
    packed = PackedLinears(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert packed.active and len(packed.modules) == len(linears) > 0
    hidden = torch.randn(3, 1, 64)
    on_packed = torch.ops.mkldnn._linear_pointwise(hidden, torch.ops.mkldnn._reorder_linear_weight(
        model.lm_head.weight.detach()), None, "none", [], "")

    expected = _logits(model, ids)
    with packed:
        assert all("forward" in m.__dict__ for m in linears)
        got = _logits(model, ids)
        with torch.no_grad():
            assert torch.equal(model.lm_head(hidden), on_packed)  # the layer runs oneDNN's kernel
    assert all("forward" not in m.__dict__ for m in linears)
    with torch.no_grad():
        assert torch.equal(model.lm_head(hidden), torch.nn.functional.linear(hidden, model.lm_head.weight))
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_an_in_place_update_of_a_weight_is_packed_again(tokenizer):
    from tiny_agent import tiny_llama

    model = tiny_llama(tokenizer, seed=4).eval()
    ids = torch.tensor([tokenizer.encode("12 * 7 =")])
    packed = PackedLinears(model)
    with packed:
        before = _logits(model, ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.model.layers[0].mlp.down_proj.weight.grad = torch.ones_like(model.model.layers[0].mlp.down_proj.weight)
    opt.step()  # an in-place update: the parameter's version counter moves
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)  # a tied weight (the embeddings), updated in place as well
    expected = _logits(model, ids)
    with packed:
        after = _logits(model, ids)
    assert not torch.allclose(after, before, atol=1e-3)
    assert torch.allclose(after, expected, rtol=1e-4, atol=1e-4)


def test_with_gradients_on_the_packed_layers_run_as_usual_and_train(tokenizer):
    from tiny_agent import tiny_llama

    model = tiny_llama(tokenizer, seed=5)
    ids = torch.tensor([tokenizer.encode("12 * 7 = 84")])
    with PackedLinears(model):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_the_generator_packs_by_default_and_can_be_told_not_to(agent, tokenizer):
    from tiny_agent import tiny_llama

    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.protocol import SamplingParams

    assert HFGenerator(agent, tokenizer)._linears.active
    assert HFGenerator(agent, tokenizer, packed_weights=False)._linears is None
    with pytest.raises(ValueError, match="packed_weights=True"):
        HFGenerator(tiny_llama(tokenizer).to(torch.bfloat16), tokenizer, packed_weights=True)  # no float32 layer

    # The same seeded draws through either kernel: the log-probs agree to float32 rounding (the tokens, here, too).
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1.0, stop=(), entropy_k=20, seed=11)
    segments = []
    for packed in (True, False):
        gen = HFGenerator(agent, tokenizer, packed_weights=packed)
        path = gen.new_path(tokenizer.encode("Add one to forty-one."))
        segments.append(gen.generate([path], params)[0])
    assert segments[0].token_ids == segments[1].token_ids
    assert segments[0].logprobs == pytest.approx(segments[1].logprobs, abs=1e-4)


def test_a_failure_while_packing_leaves_the_model_as_it_was(tokenizer, monkeypatch):
    from tiny_agent import tiny_llama

    model = tiny_llama(tokenizer, seed=6).eval()
    packed = PackedLinears(model)
    reorder = torch.ops.mkldnn._reorder_linear_weight
    done = []

    def fail_on_the_third(weight):
        if len(done) == 2:
            raise RuntimeError("out of memory")
        done.append(weight)
        return reorder(weight)

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", fail_on_the_third)
    with pytest.raises(RuntimeError, match="out of memory"):
        packed.__enter__()
    assert all("forward" not in m.__dict__ for m in packed.modules)
    monkeypatch.undo()
    with packed:  # and the context works again
        assert all("forward" in m.__dict__ for m in packed.modules)
    assert all("forward" not in m.__dict__ for m in packed.modules)


def test_close_gives_the_packed_copies_back_and_the_generator_still_works(agent, tokenizer):
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.protocol import SamplingParams

    gen = HFGenerator(agent, tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, stop=(), entropy_k=4, seed=2)
    first = gen.generate([gen.new_path(tokenizer.encode("Add one to forty-one."))], params)[0]
    assert len(gen._linears._packed) == len(gen._linears.modules)
    gen.close()
    assert not gen._linears._packed
    again = gen.generate([gen.new_path(tokenizer.encode("Add one to forty-one."))], params)[0]
    assert again.token_ids == first.token_ids
