"""Trained weights into a vLLM engine without NCCL: vLLM's in-place reload, in process or through a server's folder.

TRL syncs weights by handing vLLM one tensor at a time (``load_weights``, colocated) or by broadcasting them over
vLLM's NCCL weight-transfer engine (server). Neither works on vLLM's CPU build: it repacks linear weights for its
kernels after loading, so per-tensor loads cannot reach them, and NCCL needs CUDA. vLLM's in-place reload
(``model_runner.reload_weights``) takes checkpoint-format weights and repacks them, in any build:

* colocated: `reload_engine_weights` on the engine's model runner, from the trained parameters;
* server (``vllm_weight_sync="disk"``): the trainer writes a safetensors file to a folder the server can read and
  asks the server, over its ``/collective_rpc`` development endpoint, to run `WeightReload.arpo_reload_weights`
  on every worker. The server must be started with the worker extension and dev mode::

      VLLM_SERVER_DEV_MODE=1 trl vllm-serve --model MODEL --worker-extension-cls
      arpo_algo.generation.weight_sync.WeightReload

A reload leaves a tied LM head (SmolLM2, Qwen2.5-0.5B) pointing at its old packed copy: the head has no weights of
its own in the checkpoint. `reload_engine_weights` ties it again and repacks it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import torch

EXTENSION = "arpo_algo.generation.weight_sync.WeightReload"
WEIGHTS_FILE = "model.safetensors"


def reload_engine_weights(runner: Any, weights: Iterable[tuple[str, torch.Tensor]] | None = None,
                          weights_path: str | None = None) -> None:
    """Reload a vLLM model runner's weights in place, from (name, tensor) pairs or a folder of safetensors."""
    runner.reload_weights(weights_iterator=weights, weights_path=weights_path)
    model = runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    tied = getattr(runner.model_config.hf_config, "tie_word_embeddings", False)
    if tied and head is not None and embed is not None:
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


class WeightReload:
    """vLLM worker extension (``--worker-extension-cls arpo_algo.generation.weight_sync.WeightReload``): methods a
    trainer calls on every worker through ``POST /collective_rpc``."""

    model_runner: Any

    def arpo_reload_weights(self, weights_path: str) -> bool:
        reload_engine_weights(self.model_runner, weights_path=weights_path)
        return True

    def arpo_weight_reload_ready(self) -> bool:
        return True


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], folder: str | os.PathLike) -> Path:
    """Write (name, tensor) pairs as one safetensors file in `folder`, atomically (a reader never sees half)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in weights}
    partial = folder / (WEIGHTS_FILE + ".partial")
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, folder / WEIGHTS_FILE)
    return folder


class ServerWeightSync:
    """Push weights to a ``trl vllm-serve`` server through a shared folder (see the module docstring)."""

    def __init__(self, client: Any, folder: str | os.PathLike) -> None:
        self.client = client
        self.folder = Path(folder).resolve()

    def _rpc(self, method: str, **kwargs: str) -> list[Any]:
        import requests  # not the client's session: it retries a 500, which here is a missing extension

        response = requests.post(f"{self.client.base_url}/collective_rpc", json={"method": method, "kwargs": kwargs})
        if response.status_code == 404:
            raise RuntimeError(f"the vLLM server at {self.client.base_url} has no /collective_rpc endpoint: start it "
                               "with VLLM_SERVER_DEV_MODE=1 (trl vllm-serve sets it)")
        if response.status_code != 200:
            raise RuntimeError(f"the vLLM server at {self.client.base_url} could not run {method}: it needs the worker "
                               f"extension, --worker-extension-cls {EXTENSION} "
                               f"(HTTP {response.status_code}: {response.text[:300]})")
        return response.json().get("results", []) if response.content else []

    def check(self) -> None:
        """Fail now, with the fix, if the server cannot reload from a folder."""
        self._rpc("arpo_weight_reload_ready")

    def push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        write_weights(weights, self.folder)
        self._rpc("arpo_reload_weights", weights_path=str(self.folder))
        self.client.reset_prefix_cache()

