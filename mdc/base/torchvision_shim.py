"""Make the CUDA-only torchvision wheel importable on CPU-only torch.

PyPI ships torchvision only as a CUDA build. Against a CPU build of torch its compiled
extension fails to load, and ``import torchvision`` (hence ``timm`` and ``open_clip``)
then dies with ``operator torchvision::nms does not exist`` while registering fake kernels.
Declaring the two operator schemas it looks for makes the import succeed; the compiled
image ops stay unavailable, which is fine: ``mdc`` decodes images with PIL.

Environments where torchvision's extension loads (CUDA torch, or PyTorch's own CPU wheels)
are left untouched: we only act after trying to load the extension ourselves and failing.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys

_LIBRARY = None  # keeps the torch.library.Library alive for the life of the process


def _extension_loads() -> bool:
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # torchvision absent: nothing to patch
    for path in glob.glob(os.path.join(spec.submodule_search_locations[0], "_C*.so")):
        try:
            torch.ops.load_library(path)
            return True
        except (OSError, RuntimeError):
            return False
    return False


def patch_torchvision() -> None:
    """Idempotent; call before the first import of torchvision, timm or open_clip."""
    global _LIBRARY
    if _LIBRARY is not None or "torchvision" in sys.modules or _extension_loads():
        return
    import torch

    _LIBRARY = torch.library.Library("torchvision", "DEF")
    _LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.define(
        "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
    )
