"""Readers for the real evaluation data, exactly as published (captioning and linear probes).

Items are plain dicts holding an ``image_path`` (plus ``bbox`` where the benchmark crops);
:func:`load_image` opens one lazily, so notebooks choose their own batching. A benchmark
file with a missing field raises ``ValueError`` naming the file, the item and the field.
A missing image does too with ``on_missing="error"`` (the default); with ``"skip"`` the item
is left out, a warning gives the count and the first names, and the returned :class:`Items`
(a list) records how many items the file held (``total``) and which images were absent
(``missing``), so results can say how many items were evaluated out of how many.

Captioning files come in three layouts: the Karpathy split file (:func:`load_karpathy`), the
official COCO captions file (:func:`load_coco_captions`) and ARO/BLIP's Karpathy test file
(:func:`load_karpathy_test`); all three give ``{image_id, image_path, references}`` items.

The compositionality benchmarks (SugarCrepe, ARO, COCO/Flickr30k-Order) live in
``mdc.data.aro_sugarcrepe``.
"""
from __future__ import annotations

import io
import json
import logging
import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from PIL import Image
from torch.utils.data import Dataset, IterableDataset

from mdc.base.torchvision_shim import patch_torchvision

logger = logging.getLogger(__name__)
ON_MISSING = ("error", "skip")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
CLIP_BENCHMARK_DATASETS = ("imagenet1k", "food101", "cifar10", "cifar100", "pets")


# --------------------------------------------------------------------------- shared helpers
def read_json(path: str, root: type | None = None) -> Any:
    """Parse a JSON benchmark file; a missing or malformed file, or a top level that is not a
    ``root`` (``list`` or ``dict``) when one is asked for, raises ValueError naming it."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as exn:
        raise ValueError(f"{path}: not valid JSON ({exn})") from exn
    if root is not None and not isinstance(data, root):
        kind = "a list of items" if root is list else "an object of items keyed by index"
        raise ValueError(f"{path}: expected {kind}")
    return data


def require(record: Any, fields: Iterable[str], path: str, item: Any) -> None:
    """Raise ValueError naming ``path``, ``item`` and the first of ``fields`` missing in ``record``."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{path}: item {item!r} is a {type(record).__name__}, expected an object")
    for name in fields:
        if name not in record:
            raise ValueError(f"{path}: item {item!r} has no field {name!r}")


class Items(list):
    """Items read from a benchmark file: a list, plus ``source`` (the file), ``total`` (items the
    file holds) and ``missing`` (image paths of the items skipped because the image is absent)."""

    def __init__(self, items: Iterable = (), source: str = "", total: int | None = None,
                 missing: Sequence[str] = ()):
        super().__init__(items)
        self.source, self.missing = source, list(missing)
        self.total = len(self) + len(self.missing) if total is None else total


class ImageLookup:
    """Finds each item's image under ``image_dir`` for one benchmark file, per ``on_missing``:
    "error" raises ValueError naming the file, item and path; "skip" records it (``__call__``
    returns None and the caller drops the item)."""

    def __init__(self, image_dir: str, source: str, on_missing: str = "error"):
        if on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {ON_MISSING}; got {on_missing!r}")
        self.image_dir, self.source, self.on_missing = image_dir, source, on_missing
        self.missing: list[str] = []

    def __call__(self, name: str, item: Any) -> str | None:
        full = os.path.join(self.image_dir, name)
        if os.path.isfile(full):
            return full
        if self.on_missing == "error":
            raise ValueError(f"{self.source}: item {item!r} refers to a missing image {full} "
                             f"(on_missing='skip' evaluates the items whose images exist)")
        self.missing.append(full)
        return None

    def items(self, kept: list, total: int) -> Items:
        """The kept items as :class:`Items`; warns with the count and first names if any were skipped."""
        if self.missing:
            logger.warning("%s: skipped %d of %d items whose image is missing (first: %s)", self.source,
                           len(self.missing), total, ", ".join(self.missing[:3]))
        return Items(kept, self.source, total, self.missing)


def load_image(item: Mapping) -> Image.Image:
    """Open ``item["image_path"]`` as RGB, cropped to ``item["bbox"]`` = (x, y, w, h) if present."""
    return crop_box(Image.open(item["image_path"]).convert("RGB"), item.get("bbox"))


def crop_box(image: Image.Image, bbox: Sequence[int] | None) -> Image.Image:
    """``image`` cropped to ``bbox`` = (x, y, w, h), as :func:`load_image` crops an item; None: the whole image."""
    if bbox is None:
        return image
    x, y, w, h = bbox
    return image.crop((x, y, x + w, y + h))


# --------------------------------------------------------------------------- captioning
def load_karpathy(dataset_json: str, image_root: str, split: str | Sequence[str] = "test",
                  on_missing: str = "error") -> Items:
    """Karpathy split file (``dataset_coco.json`` / ``dataset_flickr30k.json``).

    Returns ``[{image_id, image_path, references: [raw sentences]}]`` for images whose
    ``split`` is ``split`` (a name or several, e.g. ``("train", "restval")``).
    ``image_path`` is ``image_root/filepath/filename`` (COCO has ``filepath``, e.g.
    ``val2014``; Flickr30k does not). ``image_id`` is ``cocoid`` when present (COCO's own
    ids, as the official caption files use), else ``imgid``.
    """
    data = read_json(dataset_json)
    require(data, ["images"], dataset_json, "<root>")
    splits = {split} if isinstance(split, str) else set(split)
    lookup = ImageLookup(image_root, dataset_json, on_missing)
    out, total = [], 0
    for index, image in enumerate(data["images"]):
        require(image, ["filename", "split", "sentences"], dataset_json, index)
        if image["split"] not in splits:
            continue
        total += 1
        references = []
        for s, sentence in enumerate(image["sentences"]):
            require(sentence, ["raw"], dataset_json, f"{index}.sentences[{s}]")
            references.append(sentence["raw"].strip())
        if "cocoid" not in image:
            require(image, ["imgid"], dataset_json, index)
        path = lookup(os.path.join(image.get("filepath", ""), image["filename"]), index)
        if path is not None:
            out.append({"image_id": image.get("cocoid", image.get("imgid")), "image_path": path,
                        "references": references})
    return lookup.items(out, total)


def load_coco_captions(captions_json: str, image_dir: str, on_missing: str = "error") -> Items:
    """Official COCO captions file (``captions_val2014.json``: ``images`` + ``annotations``).

    Returns ``[{image_id, image_path, references}]`` in the file's image order (references
    stripped); every annotation must name a listed image; missing images per ``on_missing``.
    """
    data = read_json(captions_json)
    require(data, ["images", "annotations"], captions_json, "<root>")
    references: dict[Any, list[str]] = {}
    for index, image in enumerate(data["images"]):
        require(image, ["id", "file_name"], captions_json, f"images[{index}]")
        references[image["id"]] = []
    for index, ann in enumerate(data["annotations"]):
        require(ann, ["image_id", "caption"], captions_json, f"annotations[{index}]")
        if ann["image_id"] not in references:
            raise ValueError(f"{captions_json}: item annotations[{index}] names image_id "
                             f"{ann['image_id']!r}, which is not in 'images'")
        references[ann["image_id"]].append(ann["caption"].strip())
    lookup = ImageLookup(image_dir, captions_json, on_missing)
    out = []
    for index, image in enumerate(data["images"]):
        path = lookup(image["file_name"], f"images[{index}]")
        if path is not None:
            out.append({"image_id": image["id"], "image_path": path, "references": references[image["id"]]})
    return lookup.items(out, len(data["images"]))


def load_karpathy_test(test_json: str, image_root: str, on_missing: str = "error") -> Items:
    """Karpathy test file of ARO / BLIP (``coco_karpathy_test.json``, ``flickr30k_test.json``):
    ``[{"image": "val2014/COCO_val2014_....jpg", "caption": [5 captions]}]``.

    Returns ``[{image_id, image_path, references}]`` as :func:`load_karpathy` does;
    ``image_id`` is the ``image`` field (unique in the file), ``image_path`` is
    ``image_root/image``; a single caption string counts as one reference.
    """
    data = read_json(test_json, root=list)
    lookup = ImageLookup(image_root, test_json, on_missing)
    out, seen = [], set()
    for index, record in enumerate(data):
        require(record, ["image", "caption"], test_json, index)
        captions = [record["caption"]] if isinstance(record["caption"], str) else record["caption"]
        if not isinstance(captions, list) or not captions or not all(isinstance(c, str) for c in captions):
            raise ValueError(f"{test_json}: item {index!r} field 'caption' must be a caption or a non-empty "
                             f"list of captions; got {record['caption']!r}")
        if record["image"] in seen:
            raise ValueError(f"{test_json}: item {index!r} repeats image {record['image']!r}")
        seen.add(record["image"])
        path = lookup(record["image"], index)
        if path is not None:
            out.append({"image_id": record["image"], "image_path": path, "references": [c.strip() for c in captions]})
    return lookup.items(out, len(data))


# --------------------------------------------------------------------------- linear probes
class WdsClassification(IterableDataset):
    """CLIP_benchmark's ``wds/<name>`` folder: ``{split}/nshards.txt``, ``{split}/0.tar ..``
    (image member + ``.cls`` integer label), ``classnames.txt`` at the root (optional).

    Iterates ``(transform(image) or PIL image, label)`` in shard order; ``classnames`` is
    the list from ``classnames.txt`` (None without one).
    """

    def __init__(self, root: str, split: str, transform: Callable | None = None):
        nshards_file = os.path.join(root, split, "nshards.txt")
        if not os.path.isfile(nshards_file):
            raise ValueError(f"{nshards_file}: file not found (not a CLIP_benchmark wds folder?)")
        with open(nshards_file) as f:
            text = f.read().strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{nshards_file}: expected a positive shard count, got {text!r}")
        self.urls = [os.path.join(root, split, f"{i}.tar") for i in range(int(text))]
        missing = [u for u in self.urls if not os.path.isfile(u)]
        if missing:
            raise ValueError(f"{nshards_file}: lists {len(self.urls)} shards but {missing[0]} is missing")
        classnames_file = os.path.join(root, "classnames.txt")
        self.classnames = None
        if os.path.isfile(classnames_file):
            with open(classnames_file, encoding="utf-8") as f:
                self.classnames = [line.strip() for line in f if line.strip()]
        self.transform = transform

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        import webdataset as wds

        pipeline = wds.DataPipeline(wds.SimpleShardList(self.urls), wds.split_by_worker, wds.tarfile_to_samples())
        for sample in pipeline:
            ext = next((e for e in ("webp", "png", "jpg", "jpeg") if e in sample), None)
            for name, value in (("image", ext), ("label", "cls" if "cls" in sample else None)):
                if value is None:
                    raise ValueError(f"{sample['__url__']}: item {sample['__key__']!r} has no {name} member")
            with Image.open(io.BytesIO(sample[ext])) as im:
                image = im.convert("RGB")
            yield (self.transform(image) if self.transform else image), int(sample["cls"].decode().strip())


def load_wds_classification(root: str, split: str, transform: Callable | None = None) -> WdsClassification:
    """Open a CLIP_benchmark ``wds/<name>`` folder split (see :class:`WdsClassification`)."""
    return WdsClassification(root, split, transform)


class ImageFolder(Dataset):
    """``root/<class>/<image>``: classes are the sorted sub-folder names, labels their indices.

    Items are ``(transform(image) or PIL image, label)``; ``classnames`` lists the folders.
    """

    def __init__(self, root: str, transform: Callable | None = None):
        if not os.path.isdir(root):
            raise ValueError(f"{root}: image folder not found")
        self.classnames = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), label)
                        for label, c in enumerate(self.classnames)
                        for f in sorted(os.listdir(os.path.join(root, c)))
                        if f.lower().endswith(IMAGE_SUFFIXES)]
        if not self.samples:
            raise ValueError(f"{root}: no images in <class>/<image> sub-folders")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        image = load_image({"image_path": path})
        return (self.transform(image) if self.transform else image), label


def load_image_folder(root: str, transform: Callable | None = None) -> ImageFolder:
    """Open a plain ``root/<class>/<image>`` folder (see :class:`ImageFolder`)."""
    return ImageFolder(root, transform)


def build_probe_dataset(name: str, root: str, split: str, transform: Callable | None = None):
    """A linear-probe dataset as CLIP_benchmark lays it out, never downloading.

    ``imagenet1k, food101, cifar10, cifar100, pets`` go through CLIP_benchmark's
    ``build_dataset(name, root=root, transform=transform, split=split, download=False,
    task="linear_probe")`` (torchvision layouts; pets' ``train`` split is ``trainval``);
    ``wds/<name>`` reads the webdataset folder ``root`` with :class:`WdsClassification`.
    The returned dataset has ``classes`` (CLIP_benchmark) or ``classnames`` (wds).
    """
    if name.startswith("wds/"):
        return load_wds_classification(root, split, transform)
    if name not in CLIP_BENCHMARK_DATASETS:
        raise ValueError(f"unknown probe dataset {name!r}; expected one of {CLIP_BENCHMARK_DATASETS} or wds/<name>")
    if not os.path.isdir(root):
        raise ValueError(f"probe dataset {name}: root {root} not found (downloads are disabled; "
                         f"place the torchvision/CLIP_benchmark layout there)")
    if name == "pets" and split == "train":
        split = "trainval"
    patch_torchvision()
    from clip_benchmark.datasets.builder import build_dataset

    try:
        return build_dataset(name, root=root, transform=transform, split=split, download=False, task="linear_probe")
    except (RuntimeError, FileNotFoundError, OSError) as exn:
        raise ValueError(f"probe dataset {name}: could not read split {split!r} under {root}: {exn}") from exn
