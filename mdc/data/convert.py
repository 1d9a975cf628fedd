"""Your images and captions -> webdataset shards in img2dataset's layout (what training reads).

img2dataset downloads image-caption pairs into ``00000.tar``, ``00001.tar``, ... with members
``KEY.jpg`` + ``KEY.txt`` (the caption) + ``KEY.json`` (metadata), KEY = shard number (5 digits)
then the sample's index in the shard, and ``NNNNN_stats.json`` beside each tar. Data you already
have on disk becomes the same thing with :func:`write_shards_from_items`, from items
``{"image_path", "caption"}``, one sample each, or ``{"image_path", "references": [...]}``, one
sample per reference (what :func:`mdc.data.formats.load_coco_captions` and ``load_karpathy``
return for a COCO captions file or a Karpathy split). :func:`items_from_folder` reads a folder
of images with a caption file beside each (``cat.jpg`` + ``cat.txt``).

Command line::

    python -m mdc.data.convert --coco captions_train2017.json --images train2017/ --out shards/ [--image-size 256]
    python -m mdc.data.convert --folder my_images/ --out shards/

A writer holds ``shards/.shards.lock`` (:mod:`mdc.base.lock`) while it writes: a second writer into the
same folder is refused at once, naming the first. A bad value is refused in one line,
``error: --shard-size must be >= 1, got 0`` (exit status 2; ``--debug`` shows the traceback).
"""
from __future__ import annotations

import argparse
import io
import json
import os
from typing import Iterable, Iterator, Mapping

from PIL import Image

from mdc.data.formats import IMAGE_SUFFIXES, load_coco_captions, load_karpathy
from mdc.data.writer import write_tar
from mdc.base.cli import ArgumentParser, report
from mdc.base.errors import ConfigError, must
from mdc.base.lock import FolderLock

# image suffix -> shard member extension (img2dataset writes jpg; the training loader reads these)
MEMBER_EXT = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png", ".webp": "webp"}
SHARDS_LOCK = ".shards.lock"  # held in the output folder while shards are written (mdc.base.lock)


def items_from_folder(folder: str) -> list[dict]:
    """``{"image_path", "caption"}`` for every image in ``folder`` (sorted, not recursive) that has a
    UTF-8 caption file of the same stem beside it (``cat.jpg`` + ``cat.txt``); images without one
    are left out. A ValueError names a missing folder or a folder without any pair."""
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: folder not found")
    items = []
    for name in sorted(os.listdir(folder)):
        stem, suffix = os.path.splitext(name)
        text = os.path.join(folder, stem + ".txt")
        if suffix.lower() in IMAGE_SUFFIXES and os.path.isfile(text):
            with open(text, encoding="utf-8") as f:
                items.append({"image_path": os.path.join(folder, name), "caption": f.read().strip()})
    if not items:
        raise ValueError(f"{folder}: no image with a caption file beside it (e.g. cat.jpg + cat.txt)")
    return items


def _pairs(items: Iterable[Mapping]) -> Iterator[tuple[str, str]]:
    """(image_path, caption) per sample: one per item, or one per reference."""
    for index, item in enumerate(items):
        if "image_path" not in item or ("caption" not in item and "references" not in item):
            raise ValueError(f"item {index} needs 'image_path' and 'caption' (or 'references'); got {sorted(item)}")
        captions = [item["caption"]] if "caption" in item else list(item["references"])
        for caption in captions:
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"item {index} ({item['image_path']}) has an empty caption")
            yield item["image_path"], caption.strip()


def _image_member(path: str, image_size: int | None) -> tuple[str, bytes, tuple[int, int], tuple[int, int]]:
    """(member extension, bytes, (width, height), original (width, height)). ``image_size``: the
    shorter side resized to it and the centre cropped to a square (img2dataset's ``center_crop``),
    saved as JPEG (quality 95); None keeps the file's bytes as they are."""
    suffix = os.path.splitext(path)[1].lower()
    with Image.open(path) as im:
        original = im.size
        if image_size is None:
            if suffix not in MEMBER_EXT:
                raise ValueError(f"{path}: cannot store {suffix or 'an image without suffix'} as is "
                                 f"(the loader reads {sorted(set(MEMBER_EXT.values()))}); give image_size to re-encode")
            with open(path, "rb") as f:
                return MEMBER_EXT[suffix], f.read(), original, original
        im = im.convert("RGB")
        w, h = original
        scale = image_size / min(w, h)
        size = (max(image_size, round(w * scale)), max(image_size, round(h * scale)))
        im = im.resize(size, Image.BICUBIC)
        left, top = (size[0] - image_size) // 2, (size[1] - image_size) // 2
        im = im.crop((left, top, left + image_size, top + image_size))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=95)
        return "jpg", buf.getvalue(), (image_size, image_size), original


def write_shards_from_items(items: Iterable[Mapping], out_dir: str, shard_size: int = 10000,
                            image_size: int | None = None, on_error: str = "error") -> list[str]:
    """Write image-caption pairs as ``out_dir/00000.tar``, ... (img2dataset's layout); returns the paths.

    ``items``: ``{"image_path", "caption"}`` (one sample) or ``{"image_path", "references"}`` (one
    sample per reference). ``image_size``: resize and centre-crop to that square (JPEG); None copies
    the image files as they are (JPEG, PNG or WebP). ``on_error``: "error" raises a ValueError naming
    an image that is missing or unreadable; "skip" leaves it out and counts it in the shard's
    ``NNNNN_stats.json`` (``failed_to_download`` / ``failed_to_resize``, as img2dataset does).
    The bytes depend only on the items and options (fixed tar metadata), so a re-run writes the same shards.
    """
    if on_error not in ("error", "skip"):
        raise ConfigError(f"on_error must be 'error' or 'skip'; got {on_error!r}", "on_error")
    if shard_size < 1:
        raise must("shard_size", shard_size, ">= 1")
    if image_size is not None and image_size < 1:
        raise must("image_size", image_size, ">= 1")
    with FolderLock(out_dir, SHARDS_LOCK, "a shard writer", "wait for it to end, or write into another folder (--out)"):
        return _write_all(items, out_dir, shard_size, image_size, on_error)


def _write_all(items, out_dir, shard_size, image_size, on_error) -> list[str]:
    digits = max(1, len(str(shard_size - 1)))
    paths, shard, members, stats = [], 0, [], None

    def flush():
        name = os.path.join(out_dir, f"{shard:05d}")
        paths.append(write_tar(name + ".tar", members))
        with open(name + "_stats.json", "w") as f:
            json.dump(stats, f, indent=1)

    index = 0
    for image_path, caption in _pairs(items):
        if stats is None:
            stats = {"count": 0, "successes": 0, "failed_to_download": 0, "failed_to_resize": 0}
        stats["count"] += 1
        try:
            if not os.path.isfile(image_path):
                raise FileNotFoundError(image_path)
            ext, data, (w, h), (ow, oh) = _image_member(image_path, image_size)
        except (OSError, ValueError) as exn:
            if on_error == "error":
                raise ValueError(f"image {image_path}: {exn!r} (on_error='skip' leaves such items out)") from exn
            stats["failed_to_download" if isinstance(exn, FileNotFoundError) else "failed_to_resize"] += 1
            continue
        key = f"{shard:05d}{index:0{digits}d}"
        meta = {"key": key, "caption": caption, "url": image_path, "status": "success", "width": w, "height": h,
                "original_width": ow, "original_height": oh}
        members += [(f"{key}.{ext}", data), (f"{key}.txt", caption.encode("utf-8")),
                    (f"{key}.json", json.dumps(meta, sort_keys=True).encode("utf-8"))]
        stats["successes"] += 1
        index += 1
        if index == shard_size:
            flush()
            shard, members, stats, index = shard + 1, [], None, 0
    if stats is not None and stats["successes"]:
        flush()
    if not paths:
        raise ValueError("no sample was written: the items were empty or every image failed")
    return paths


def main(argv: list[str] | None = None) -> list[str]:
    parser = ArgumentParser(description="Images + captions -> webdataset shards (img2dataset's layout).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--coco", help="official COCO captions file (images + annotations)")
    source.add_argument("--karpathy", help="Karpathy split file (dataset_coco.json, dataset_flickr30k.json)")
    source.add_argument("--folder", help="folder of images, each with a caption file of the same stem (.txt)")
    parser.add_argument("--images", help="image folder of --coco / --karpathy")
    parser.add_argument("--split", nargs="+", default=["train"], help="--karpathy splits (e.g. train restval)")
    parser.add_argument("--out", required=True, help="output folder for 00000.tar, 00001.tar, ...")
    parser.add_argument("--shard-size", type=int, default=10000, help="samples per shard")
    parser.add_argument("--image-size", type=int, default=None, help="resize + centre crop to this square (JPEG)")
    parser.add_argument("--skip-bad", action="store_true", help="leave out missing or unreadable images")
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback (or set MDC_DEBUG=1)")
    args = parser.parse_args(argv)
    if (args.coco or args.karpathy) and not args.images:
        parser.error("--images is needed with --coco and --karpathy")
    return report(lambda: _main(args), parser, debug=args.debug)


def _main(args: argparse.Namespace) -> list[str]:
    for name in ("shard_size", "image_size"):  # before reading any item
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise must(name, getattr(args, name), ">= 1")
    on_missing = "skip" if args.skip_bad else "error"
    if args.coco:
        items = load_coco_captions(args.coco, args.images, on_missing)
    elif args.karpathy:
        items = load_karpathy(args.karpathy, args.images, args.split, on_missing)
    else:
        items = items_from_folder(args.folder)
    paths = write_shards_from_items(items, args.out, args.shard_size, args.image_size, on_missing)
    print(json.dumps({"shards": len(paths), "pattern": os.path.join(args.out, f"{{00000..{len(paths) - 1:05d}}}.tar")}))
    return paths


if __name__ == "__main__":
    main()
