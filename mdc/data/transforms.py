"""Image transforms: PIL image -> CLIP-normalised FloatTensor [3, S, S], for training and evaluation; or the
resized uint8 pixels, which travel to the device four times smaller and are normalised there (:func:`normalize`)."""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)  # what PIL raises for bad bytes


class CorruptImageError(ValueError):
    """An image's bytes do not decode (PIL's error is its cause): the sample's fault, not the transform's."""


def decoded(image: Image.Image) -> Image.Image:
    """``image`` with its pixels decoded now (after any draft), bad bytes raising :class:`CorruptImageError`; what
    the transform does next raises as it is."""
    try:
        image.load()
    except DECODE_ERRORS as exn:
        raise CorruptImageError(repr(exn)) from exn
    return image


class ImageTransform:
    """PIL image -> FloatTensor [3, size, size], normalised with CLIP's mean/std.

    Train: random-resized crop (area fraction ``crop_scale``, aspect ratio 3/4..4/3, 10
    tries then a centre crop, as torchvision's RandomResizedCrop) resized bicubically to
    ``size``; ``crop_scale=None`` means a plain resize to ``size`` (no resize if the image
    already has that size). Eval: resize the shorter side to ``size``, centre crop.
    Train randomness comes from ``rng`` (a ``numpy.random.Generator``) when passed to the
    call, else from the transform's own generator seeded by ``seed``. ``uint8``: the resized pixels as a
    ByteTensor [3, size, size], left for :func:`normalize` (the same floats, bit for bit). ``draft`` (train): a
    JPEG not yet decoded is decoded at the smallest DCT scale its crop allows (:func:`draft`), the crop box the
    same as without it. Bytes that do not decode raise :class:`CorruptImageError` (:func:`decoded`); any other error
    is the transform's.
    """

    def __init__(self, image_size: int, train: bool, crop_scale: tuple[float, float] | None = (0.9, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), seed: int = 0, uint8: bool = False, draft: bool = True):
        self.size, self.train, self.crop_scale, self.ratio = image_size, train, crop_scale, ratio
        self.uint8, self.draft = uint8, draft
        self.rng = np.random.default_rng(seed)

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        s = self.size
        if not self.train:
            image = decoded(image).convert("RGB")
            w, h = image.size
            scale = s / min(w, h)
            new = (max(s, round(w * scale)), max(s, round(h * scale)))
            if new != image.size:
                image = image.resize(new, Image.BICUBIC)
            left, top = (new[0] - s) // 2, (new[1] - s) // 2
            image = image.crop((left, top, left + s, top + s))
        elif self.crop_scale is None and image.size == (s, s):
            image = decoded(image).convert("RGB")
        else:
            box = (0, 0, *image.size) if self.crop_scale is None else self._crop_box(
                image.size, rng if rng is not None else self.rng)
            image, box = draft(image, box, s) if self.draft else (image, box)
            image = decoded(image).convert("RGB").resize((s, s), Image.BICUBIC, box=box)
        pixels = torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1)  # [3, S, S]
        return pixels if self.uint8 else normalize(pixels)

    def _crop_box(self, size: tuple[int, int], rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) of a random crop with the configured area and ratio."""
        width, height = size
        area = width * height
        log_ratio = np.log(self.ratio)
        for _ in range(10):
            target = area * rng.uniform(*self.crop_scale)
            aspect = np.exp(rng.uniform(*log_ratio))
            w = int(round(np.sqrt(target * aspect)))
            h = int(round(np.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return left, top, left + w, top + h
        aspect = width / height  # fallback: the largest centred crop within the ratio range
        if aspect < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif aspect > self.ratio[1]:
            w, h = int(round(height * self.ratio[1])), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h


def draft(image: Image.Image, box: tuple, size: int) -> tuple[Image.Image, tuple]:
    """(image, box) to resize ``box`` of ``image`` to ``size`` x ``size`` from: a JPEG not yet decoded is set to
    decode at 1/2, 1/4 or 1/8 scale (PIL's draft mode: the DCT does the downscale), the largest reduction that
    leaves the box at least ``size`` pixels a side, and the box is scaled with it; anything else as it was."""
    if getattr(image, "format", None) != "JPEG" or not getattr(image, "tile", None):  # not a JPEG, or decoded
        return image, box
    (w, h), (bw, bh) = image.size, (box[2] - box[0], box[3] - box[1])
    if min(bw // size, bh // size) < 2:  # no reduction would keep size pixels a side: decode whole
        return image, box
    image.draft("RGB", (math.ceil(w * size / bw), math.ceil(h * size / bh)))
    fx, fy = image.size[0] / w, image.size[1] / h
    return image, (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)


@functools.lru_cache(maxsize=None)
def _mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # copied to a device once, not per batch
    return torch.tensor(CLIP_MEAN, device=device).view(3, 1, 1), torch.tensor(CLIP_STD, device=device).view(3, 1, 1)


def normalize(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels [..., 3, H, W] -> CLIP-normalised float32 [..., 3, H, W], on the pixels' device."""
    mean, std = _mean_std(pixels.device)
    return (pixels.float() / 255.0 - mean) / std


def image_transform(image_size: int, train: bool, *, crop_scale: tuple[float, float] | None = (0.9, 1.0),
                    seed: int = 0, uint8: bool = False, draft: bool = True) -> ImageTransform:
    """The CLIP-normalised train/eval image transform (see :class:`ImageTransform`)."""
    return ImageTransform(image_size, train, crop_scale=crop_scale, seed=seed, uint8=uint8, draft=draft)
