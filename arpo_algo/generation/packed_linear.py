"""Linear layers with oneDNN-prepacked weights, for decoding with a transformers model on a CPU.

A decoding step multiplies a few rows (one per path in the batch) by every weight matrix of the model. PyTorch's
default CPU kernel for that (MKL's sgemm on a plain row-major weight) is slow at small row counts: on a 2-core AMD
EPYC a step of SmolLM2-135M costs 58 ms with one row and 96 ms with two. oneDNN's linear on a weight reordered once
into its own blocked layout (`torch.ops.mkldnn._reorder_linear_weight`) makes a whole decoding step a fifth to two
fifths faster from two rows on (`benchmarks/step_cost.py` measures both kernels side by side). The logits agree with
the default kernel's to float32 rounding (about 1e-6 relative), so the tokens sampled can differ where a draw falls
within that of a boundary.

`PackedLinears(model)` is a context: inside it, every ``torch.nn.Linear`` of the model whose weight is a float32 CPU
tensor runs on its packed weight while gradients are off (with gradients on it runs as usual, so training is
untouched). A weight is packed the first time the context is entered and again whenever it has changed since (its
storage or its version counter, which every in-place update of the parameter moves: an optimizer step,
``load_state_dict``); the packed copy costs as much memory as the weight. Where oneDNN is not built in, the context
does nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_AVAILABLE: bool | None = None


def available() -> bool:
    """Whether this PyTorch can run oneDNN's packed linear (tried once on a small matrix)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            weight = torch.ones(4, 3)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
            out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 3), packed, None, "none", [], "")
            _AVAILABLE = bool(torch.allclose(out, torch.full((2, 4), 3.0)))
        except (AttributeError, RuntimeError):
            _AVAILABLE = False
    return _AVAILABLE


def _eligible(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (isinstance(module, torch.nn.Linear) and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and weight.device.type == "cpu" and weight.dtype == torch.float32 and not weight.is_sparse
            and (module.bias is None or module.bias.dtype == torch.float32))


class PackedLinears:
    """Run a model's float32 CPU linear layers on oneDNN-packed weights while gradients are off, inside the
    context (see the module's docstring). Re-entering re-packs only the weights that changed; nested entries are
    allowed."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = [m for m in model.modules() if _eligible(m)] if available() else []
        self._packed: dict[int, tuple[tuple[int, int], Any]] = {}
        """By module: the weight's (storage, version) when it was packed, and the forward on the packed copy."""
        self._depth = 0

    @property
    def active(self) -> bool:
        """Whether the model has a linear layer this context packs."""
        return bool(self.modules)

    def __enter__(self) -> PackedLinears:
        self._depth += 1
        if self._depth > 1 or not self.modules:
            return self
        try:
            with torch.no_grad():
                for module in self.modules:
                    weight = module.weight
                    key = (weight.data_ptr(), weight._version)
                    entry = self._packed.get(id(module))
                    if entry is None or entry[0] != key:
                        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
                        entry = key, _packed_forward(module, packed)
                        self._packed[id(module)] = entry
                    module.__dict__["forward"] = entry[1]  # an instance attribute: it shadows the class's forward
        except BaseException:  # out of memory while packing, an interrupt: the model is left as it was
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            for module in self.modules:
                module.__dict__.pop("forward", None)

    def release(self) -> None:
        """Drop the packed copies now (they are made again at the next entry): an owner that may outlive its use, or
        be freed only by Python's cycle collector, calls it to give their memory back at once."""
        self._packed.clear()


def _packed_forward(module: torch.nn.Linear, packed: torch.Tensor) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, module.weight, module.bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")

    return forward
