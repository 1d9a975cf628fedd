"""Scenes of the synthetic world and its training shards (the embedded default image-caption dataset).

A scene (:func:`sample_scene`, :mod:`mdc.world.graphs`) holds 1-4 objects on a background; it
renders with :func:`render` and is captioned with :func:`caption`.

:func:`write_shards` writes webdataset tar shards in img2dataset's layout (``000000.tar``, ...,
members ``NNNNNNNNN.png``, ``.txt``, ``.json``), byte-identical for a given seed and image
format. Sample ``i`` of seed ``s`` draws its scene from the random stream ``(s, 0, i)``
(:mod:`mdc.world.streams`), so shards of the two caption styles with the same seed hold the
same images: only the captions differ. Evaluation sets (:mod:`mdc.world.evalsets`) draw from
other streams, so they are held out.

Image formats: ``png`` (the default: small, readable by every tool) or ``npy``, the image as a
uint8 [H, W, 3] array in NumPy's ``.npy`` format (webdataset's own convention for arrays). ``npy``
members are about 7x larger at 64 px but cost nothing to encode or decode, which makes writing
shards about twice as fast; the training pipeline reads both. Shards are independent, so
``workers`` > 1 writes them in parallel processes (the bytes do not depend on it).

Command line::

    python -m mdc.world.scenes --out DIR --num N --style {alt,descriptive} --seed S [--format npy] [--workers K]

A writer holds ``DIR/.shards.lock`` (:mod:`mdc.base.lock`) while it writes: a second writer into the
same folder is refused at once, naming the first. A bad value is refused in one line,
``error: --num must be >= 1, got 0`` (exit status 2; ``--debug`` shows the traceback).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os

from PIL import Image

from mdc.data.writer import npy_bytes, png_bytes, write_tar
from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import ConfigError, must
from mdc.base.lock import FolderLock
from mdc.world.render import render, render_array
from mdc.world.graphs import AXIS_RATIO, GAP, P_LARGE, relation, sample_scene, scene_record
from mdc.world.streams import STREAM_CAPTION, STREAM_REFERENCES, STREAM_SCENE, stream_rng
from mdc.world.text import MAX_OBJECTS, MAX_TOKENS, RELATIONS, STYLES, caption, references, vocabulary

__all__ = ["AXIS_RATIO", "GAP", "MAX_OBJECTS", "P_LARGE", "relation", "sample_scene", "render", "caption", "references", "vocabulary", "write_shards", "scene_record",
           "stream_rng", "IMAGE_FORMATS", "MAX_TOKENS", "STYLES", "RELATIONS"]

NUM_REFERENCES = 5
IMAGE_FORMATS = ("png", "npy")
SHARDS_LOCK = ".shards.lock"  # held in the output folder while shards are written (mdc.base.lock)


def scene_captions(n: int, style: str = "alt", seed: int = 0) -> list[str]:
    """The captions of the first ``n`` scenes of the world of ``seed`` in ``style``, as its shards hold them."""
    return [caption(sample_scene(stream_rng(seed, STREAM_SCENE, i)), style, stream_rng(seed, STREAM_CAPTION, i))
            for i in range(n)]


def _samples(start: int, stop: int, style: str, seed: int, image_size: int, image_format: str = "png"):
    for i in range(start, stop):
        scene = sample_scene(stream_rng(seed, STREAM_SCENE, i))
        text = caption(scene, style, stream_rng(seed, STREAM_CAPTION, i))
        refs = references(scene, stream_rng(seed, STREAM_REFERENCES, i), NUM_REFERENCES)
        key = f"{i:09d}"
        record = scene_record(scene, image_size, key=key, style=style, caption=text, references=refs)
        pixels = render_array(scene, image_size)
        if image_format == "npy":
            yield f"{key}.npy", npy_bytes(pixels)
        else:
            yield f"{key}.png", png_bytes(Image.fromarray(pixels))
        yield f"{key}.txt", text.encode("utf-8")
        yield f"{key}.json", json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _write_shard(job: tuple) -> str:
    path, *args = job
    return write_tar(path, _samples(*args))


def write_shards(out_dir: str, num: int, style: str, seed: int, image_size: int = 64,
                 shard_size: int = 1000, image_format: str = "png", workers: int = 1) -> list[str]:
    """Write ``num`` samples of ``style`` captions as ``out_dir/000000.tar``, ...; returns the paths.

    ``image_format``: ``png`` or ``npy`` (see the module docstring); ``workers``: processes
    writing shards in parallel (forked where the platform allows; the bytes are the same).
    """
    if style not in ("alt", "descriptive"):
        raise ConfigError(f"style must be 'alt' or 'descriptive'; got {style!r}", "style")
    if image_format not in IMAGE_FORMATS:
        raise ConfigError(f"image_format must be one of {IMAGE_FORMATS}; got {image_format!r}", "image_format")
    for name, value, least in (("num", num, 1), ("shard_size", shard_size, 1), ("workers", workers, 1),
                               ("image_size", image_size, 1), ("seed", seed, 0)):
        if value < least:
            raise must(name, value, f">= {least}")
    with FolderLock(out_dir, SHARDS_LOCK, "a shard writer", "wait for it to end, or write into another folder (--out)"):
        return _write_all(out_dir, num, style, seed, image_size, shard_size, image_format, workers)


def _write_all(out_dir, num, style, seed, image_size, shard_size, image_format, workers) -> list[str]:
    jobs = [(os.path.join(out_dir, f"{shard:06d}.tar"), start, min(num, start + shard_size), style, seed,
             image_size, image_format) for shard, start in enumerate(range(0, num, shard_size))]
    workers = min(workers, len(jobs))
    if workers == 1:
        return [_write_shard(job) for job in jobs]
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    with multiprocessing.get_context(method).Pool(workers) as pool:
        return pool.map(_write_shard, jobs, chunksize=1)


def main(argv: list[str] | None = None) -> list[str]:
    parser = ArgumentParser(description="Write synthetic scene-caption webdataset shards.")
    parser.add_argument("--out", required=True, help="output folder for 000000.tar, 000001.tar, ...")
    parser.add_argument("--num", type=int, required=True, help="number of samples")
    parser.add_argument("--style", choices=["alt", "descriptive"], required=True, help="caption style")
    parser.add_argument("--seed", type=int, default=0, help="world seed (same seed, same bytes)")
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--shard-size", type=int, default=1000, help="samples per shard")
    parser.add_argument("--format", dest="image_format", choices=IMAGE_FORMATS, default="png",
                        help="image members: png, or npy (uint8 HxWx3 arrays: faster to write and read, ~7x larger)")
    parser.add_argument("--workers", type=int, default=1, help="processes writing shards in parallel")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback (or set MDC_DEBUG=1)")
    args = parser.parse_args(argv)
    paths = report(lambda: write_shards(args.out, args.num, args.style, args.seed, args.image_size, args.shard_size,
                                        args.image_format, args.workers), parser, debug=args.debug)
    last = len(paths) - 1
    print(json.dumps({"shards": len(paths), "pattern": os.path.join(args.out, f"{{000000..{last:06d}}}.tar"),
                      "num": args.num, "style": args.style, "seed": args.seed, "image_size": args.image_size,
                      "format": args.image_format}))
    return paths


if __name__ == "__main__":
    main()
