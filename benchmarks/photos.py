"""Photographs at 224 px: JPEG shards decoded, cropped and resized as training reads them, and the workers a GPU
needs to feed the step at its measured rates (rows of ``python -m benchmarks data``).

The package ships no photographs, so the benchmark makes its own with photographic statistics (:func:`photograph`):
a dead-leaves image (opaque discs occluding each other, radii drawn with density ~ r^-3 from 3 px to a third of
the frame: scale-invariant occlusion, sharp edges, flat regions), a 1/f noise texture (the amplitude spectrum of
natural images) and a lens's blur, at 640 x 480, stored as JPEG quality 95 (img2dataset's default encoding and
``mdc.data.convert``'s); how much of each was fixed by one rule, stated at :data:`LEAVES`. Two shard sets: that
source size, and the 256-px centre crops ``python -m mdc.data.convert --image-size 256`` writes. Its decode cost
is checked against the real photographs pinned dependencies ship (scikit-learn's china.jpg and flower.jpg,
640 x 427; matplotlib's grace_hopper.jpg, 512 x 600), per image and per megapixel.

Rows: per image in the training process (``ImageTransform(224, train=True, uint8=True)`` on the lazily opened
JPEG), with PIL's draft mode (the DCT scales a large source down while decoding) and without, medians over
interleaved rounds, wall and CPU seconds; the loader (``make_loader``, batch 64, uint8, tiny's tokenizer) over
each shard set with 0, 1 and 2 workers, per worker, from its first batch on; then the workers per GPU each
measured H200 step rate (:data:`STEP_RATES`) needs at the one-worker rate, and at the decode's own CPU rate.
"""
from __future__ import annotations

import importlib.util
import io
import math
import os
import tempfile
import time

import numpy as np
from PIL import Image, ImageFilter

import mdc
from mdc.data.pipeline import SkipStats, iterate_batches, make_loader
from mdc.data.transforms import ImageTransform
from mdc.data.writer import write_tar

from benchmarks.common import Section, interleaved, median

SOURCE = (640, 480)
SHARD_SIDE = 256
QUALITY = 95
# the set's make, fixed by one rule before any decode was compared: at JPEG quality 95 its files hold as many bytes a
# megapixel as the real photographs (REAL) re-encoded at 95 (276-507 KB; the set: about 410)
LEAVES = 1000  # discs a photograph
TEXTURE = 12.0  # grey levels: the 1/f texture's SD
OPTICS = 1.0  # pixels: the Gaussian blur of a lens and demosaicing
REPEAT = 4  # a loader pass reads its shard this many times
BATCH = 64  # the loader's batch (the set's size in a quick run: a pass of REPEAT batches)
# images/s of the ViT-B/32 MDC step at batch 128 on one H200 (docs/benchmarks.md, the static step, 2026-11-29)
STEP_RATES = {"eager": 1610, "compiled": 1694, "CUDA graphs": 5076}
REAL = (("sklearn", "datasets/images/china.jpg"), ("sklearn", "datasets/images/flower.jpg"),
        ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"))


def photograph(rng: np.random.Generator, width: int = SOURCE[0], height: int = SOURCE[1],
               texture: float = TEXTURE) -> np.ndarray:
    """A [height, width, 3] uint8 image with photographic statistics (module docstring): :data:`LEAVES` discs
    painted back to front over a background (the front ones are those a dead-leaves image shows), a 1/f texture
    of standard deviation ``texture`` grey levels, its channels correlated, and a lens's blur (:data:`OPTICS`)."""
    canvas = np.empty((height, width, 3), np.float32)
    canvas[:] = rng.uniform(0, 255, 3)
    r_min, r_max = 3.0, min(width, height) / 3
    radii = (r_min ** -2 - rng.random(LEAVES) * (r_min ** -2 - r_max ** -2)) ** -0.5  # density ~ r^-3
    for r, cx, cy, colour in zip(radii, rng.uniform(0, width, LEAVES), rng.uniform(0, height, LEAVES),
                                 rng.uniform(0, 255, (LEAVES, 3))):
        x0, x1, y0, y1 = max(int(cx - r), 0), min(int(cx + r) + 1, width), max(int(cy - r), 0), min(int(cy + r) + 1,
                                                                                                  height)
        yy, xx = np.ogrid[y0:y1, x0:x1]
        canvas[y0:y1, x0:x1][(xx - cx) ** 2 + (yy - cy) ** 2 <= r * r] = colour
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    f = np.hypot(fx, fy)
    f[0, 0] = 1.0
    noise = np.fft.irfft2(np.fft.rfft2(rng.standard_normal((3, height, width))) / f, s=(height, width))  # 1/f
    noise = noise.mean(0, keepdims=True) * 0.7 + noise * 0.3  # channels correlated, as in photographs
    canvas += texture * (noise / noise.std()).transpose(1, 2, 0)
    image = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(OPTICS))
    return np.asarray(image)


def jpeg(image: Image.Image, quality: int = QUALITY) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def centre_crop(data: bytes, side: int = SHARD_SIDE) -> bytes:
    """``data`` as ``mdc.data.convert --image-size side`` stores it: shorter side to ``side``, centre square."""
    im = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = im.size
    size = (max(side, round(w * side / min(w, h))), max(side, round(h * side / min(w, h))))
    im = im.resize(size, Image.BICUBIC)
    left, top = (size[0] - side) // 2, (size[1] - side) // 2
    return jpeg(im.crop((left, top, left + side, top + side)))


def real_photographs() -> list[bytes]:
    """The JPEG photographs of :data:`REAL` that are installed (none where the packages are not)."""
    out = []
    for package, path in REAL:
        spec = importlib.util.find_spec(package)
        full = os.path.join(os.path.dirname(spec.origin), path) if spec and spec.origin else ""
        if os.path.isfile(full):
            with open(full, "rb") as f:
                out.append(f.read())
    return out


def _decode(images: list[bytes], draft: bool, cpu: list[float]):
    transform = ImageTransform(224, train=True, uint8=True, draft=draft)

    def run():
        start = time.process_time()
        for i, data in enumerate(images):
            transform(Image.open(io.BytesIO(data)), np.random.default_rng(i))
        cpu.append(time.process_time() - start)
    return run


def _pass(urls: list[str], workers: int, batch: int, rates: list[float]):
    """One pass of the loader over ``urls``; appends its images/s from the first batch on (the workers' start
    left out) to ``rates``."""
    tok = mdc.get_tokenizer("tiny")

    def one_pass():
        loader = make_loader(urls, tok, 224, batch, num_workers=workers, shuffle_buffer=64, uint8=True)
        n, start = 0, None
        for images, _ in iterate_batches(loader, SkipStats()):
            if start is None:
                start = time.perf_counter()
            else:
                n += len(images)
        rates.append(n / (time.perf_counter() - start))
    return one_pass


def add_rows(sec: Section, quick: bool) -> None:
    """The photograph rows and the workers-per-GPU table, into ``sec``."""
    num, rounds = (8, 1) if quick else (128, 3)
    rng = np.random.default_rng(0)
    source = [jpeg(Image.fromarray(photograph(rng))) for _ in range(num)]
    sets = {f"photographs {SOURCE[0]}x{SOURCE[1]}": source, f"photographs {SHARD_SIDE} px": [centre_crop(d)
                                                                                            for d in source]}
    real = real_photographs()
    if real:
        sets["real photographs"] = real
    contestants, cpu = {}, {}
    for name, images in sets.items():
        for draft in (True, False):
            key = f"{name}, {'draft' if draft else 'no draft'}"
            contestants[key] = _decode(images, draft, cpu.setdefault(key, []))
    times = interleaved(contestants, rounds=rounds)
    per_image, per_cpu = {}, {}
    for key, t in times.items():
        images = sets[key.rsplit(", ", 1)[0]]
        megapixels = sum(math.prod(Image.open(io.BytesIO(d)).size) for d in images) / 1e6
        wall, proc = median(t) / len(images), median(cpu[key][-len(t):]) / len(images)
        per_image[key], per_cpu[key] = wall, proc
        sec.add(f"JPEG to 224 px, {key}", round(1000 * wall, 2), "ms an image",
                f"{1 / wall:,.0f} images/s a core; CPU {1000 * proc:.2f} ms; "
                f"{1000 * wall * len(images) / megapixels:.1f} ms a megapixel; "
                f"{sum(map(len, images)) / len(images) / 1024:.0f} KB a file")
    big = f"photographs {SOURCE[0]}x{SOURCE[1]}"
    sec.add("draft mode speed-up, photographs at source size", round(per_image[f"{big}, no draft"]
                                                                     / per_image[f"{big}, draft"], 2), "x")
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        passes = {}
        for name in list(sets)[:2]:
            path = os.path.join(tmp, f"{name.split()[-1]}.tar")
            write_tar(path, [(f"{i:09d}.{ext}", data) for i, image in enumerate(sets[name]) for ext, data in
                             (("jpg", image), ("txt", b"a photograph of a red circle"))])
            for w in (0, 1, 2):  # the shard read REPEAT times a pass: the rate of a loader in its stride
                rate = rates.setdefault(f"{name}, {w} workers", [])
                passes[f"{name}, {w} workers"] = _pass([path] * REPEAT, w, min(BATCH, num), rate)
        interleaved(passes, rounds=rounds, warmup=0)
    one = {}
    for key, r in rates.items():
        name, w = key.rsplit(", ", 1)[0], int(key.rsplit(", ", 1)[1].split()[0])
        rate = median(r)
        one[name] = rate if w == 1 else one.get(name, rate)
        sec.add(f"loader, {key}", round(rate), "images/s", f"{rate / max(w, 1):.0f} per worker (0: in the training "
                f"process); batch {min(BATCH, num)}, train transform, draft, uint8")
    for name, rate in one.items():
        alone = 1 / per_cpu[f"{name}, draft"]  # decode, crop and resize alone, on a core of its own
        sec.add(f"workers per H200, {name}", " / ".join(f"{math.ceil(r / rate)}" for r in STEP_RATES.values()),
                "workers", f"{' / '.join(f'{k} {v:,}' for k, v in STEP_RATES.items())} images/s (ViT-B/32 MDC, "
                           f"batch 128) at one worker's {rate:.0f} images/s; at the decode's own {alone:.0f} a core: "
                           + " / ".join(f"{math.ceil(r / alone)}" for r in STEP_RATES.values()))
    sec.notes.append(f"Photographs: {num} dead-leaves images with 1/f texture at {SOURCE[0]}x{SOURCE[1]}, JPEG "
                     f"quality {QUALITY}, and their {SHARD_SIDE}-px centre crops; real photographs: {len(real)} "
                     f"({', '.join(os.path.basename(p) for _, p in REAL)}) where installed.")
