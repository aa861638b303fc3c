"""Generators by backend name (``hf``, ``vllm``, ``vllm-server``), and the files that identify a model's weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def make_generator(model: str, backend: str = "hf") -> Any:
    if backend == "vllm":
        from arpo_algo.generation.models import resolve
        from arpo_algo.generation.vllm_generator import VLLMGenerator

        return VLLMGenerator.from_pretrained(resolve(model))
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.models import generation_device, load_model

    loaded, tokenizer = load_model(model, device=generation_device())
    return HFGenerator(loaded, tokenizer)


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_files(model: str, backend: str) -> str | None:
    """What tells the model evaluated from another under the same name: for a local folder, its config and weight
    files with their sizes and times (a model trained or saved again into the folder is another model); for the
    embedded model, the package and file it is made from; None for a hub id or a served model (the name is all there
    is of it here)."""
    import hashlib

    from arpo_algo.generation.models import EMBEDDED, embedded_source

    if backend == "openai":
        return None
    if model.lower() in EMBEDDED:
        return embedded_source(model.lower())
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    files = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in WEIGHT_SUFFIXES or path.name == "config.json"):
            stat = path.stat()
            files.append((path.name, stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16] if files else None
