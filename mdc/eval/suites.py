"""The compositionality suites (paper Table 2): every benchmark file read into items and their
candidate captions, the true caption first.

Suites (``SUITES``): ARO VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order and the seven
SugarCrepe sub-files, read as published (:mod:`mdc.data.aro_sugarcrepe`) or from the synthetic
sets of :mod:`mdc.world.evalsets` (same formats), whose items are written in templates ("unseen
phrasing" for a model trained on descriptive captions); and ``OWN_SUITES``, the in-distribution
analogues of VG-Relation, VG-Attribution and the SugarCrepe sub-files, each scene's own descriptive
caption edited (:mod:`mdc.world.caption_edits`), read from the synthetic sets' ``own/`` folder. :mod:`mdc.eval.compositionality` scores them.
"""
from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from dataclasses import dataclass, fields

import numpy as np

from mdc.data import aro_sugarcrepe as comp
from mdc.base.options import with_options
from mdc.world.evalsets import write_evalsets

SUGARCREPE = tuple(f"sugarcrepe/{s}" for s in comp.SUGARCREPE_SUBSETS)
TEMPLATE_SUITES = ("aro_relation", "aro_attribute", "aro_coco_order", "aro_flickr30k_order", *SUGARCREPE)
#: the in-distribution suites (mdc.world.caption_edits): the scene's own descriptive caption, edited
OWN_SUGARCREPE = tuple(f"own_sugarcrepe/{s}" for s in comp.SUGARCREPE_SUBSETS)
OWN_SUITES = ("own_relation", "own_attribute", *OWN_SUGARCREPE)
SUITES = (*TEMPLATE_SUITES, *OWN_SUITES)
ALIASES = {"sugarcrepe": SUGARCREPE, "own_sugarcrepe": OWN_SUGARCREPE, "own": OWN_SUITES}


@dataclass(frozen=True)
class LoadOptions:
    """Where :func:`load_suites` finds the real benchmarks ("" = not evaluated) and how it reads
    every suite (one default each). A benchmark's file and its images are given together."""

    sugarcrepe_dir: str = ""  # SugarCrepe's <subset>.json files
    coco_val2017_dir: str = ""  # their images: COCO val2017
    aro_dir: str = ""  # ARO's visual_genome_relation.json and visual_genome_attribution.json
    vg_image_dir: str = ""  # their Visual Genome images
    coco_order_json: str = ""  # COCO-Order: ARO's Karpathy test file
    coco_image_dir: str = ""  # its images
    flickr_order_json: str = ""  # Flickr30k-Order: ARO's Karpathy test file
    flickr_image_dir: str = ""  # its images
    on_missing: str = "error"  # an item whose image is absent: "error" or "skip" it
    attribute_min_count: int = 25  # VG-Attribution keeps attribute pairs with at least this many items (ARO)
    order_seed: int = 0  # the order suites' perturbations
    order_images: int | None = None  # the order suites: the captions of the file's first N images (None: all)
    own_items: int | None = None  # the in-distribution suites: each file's first N items (None: all)
    tagger: str = "auto"  # nouns and adjectives of the order suites: "spacy" | "builtin" | "auto"


# The real benchmarks: (suites, LoadOptions field of their file or folder, field of their images).
REAL_DATA = ((("aro_relation", "aro_attribute"), "aro_dir", "vg_image_dir"),
             (("aro_coco_order",), "coco_order_json", "coco_image_dir"),
             (("aro_flickr30k_order",), "flickr_order_json", "flickr_image_dir"),
             (SUGARCREPE, "sugarcrepe_dir", "coco_val2017_dir"))


@dataclass
class Suite:
    """One benchmark file ready to score: items, their candidate captions (true first) and groups."""
    name: str  # one of SUITES (OWN_SUITES: in the training captions' words)
    data: str  # "synthetic" | "real"
    items: list  # [N] dicts with image_path (+ bbox) and id
    candidates: list  # [N][K] captions, the true caption first
    groups: list  # [N] aggregation group: relation, attribute pair, or "" (micro average)
    sources: list
    total: int
    missing: int = 0  # items skipped: image absent (order suites: the captions of absent images)
    excluded: int = 0  # items the suite's rule leaves out
    chance: float = 0.5
    identical: np.ndarray | None = None  # [N, K] order suites: candidate == true caption
    tagger: str | None = None
    clusters: list | None = None  # [N] the item's image (path relative to the image folder): the bootstrap's unit

    def __post_init__(self):
        if self.clusters is None:  # default: each item its own image
            self.clusters = [str(item["id"]) for item in self.items]

    def keys(self) -> list[str]:
        """Per item [N] its name, ``<suite>/<id>``: which items a reading of the suite holds, in order, to compare
        two readings by. Nothing is keyed by it: the ELBO's noise is keyed by the item's image's pixels
        (``suite_scoring.image_keys``)."""
        return [f"{self.name}/{item['id']}" for item in self.items]


def image_ids(items, image_dir: str | None) -> list[str]:
    """Per item, its image as a path relative to ``image_dir`` (items that share an image share it);
    an item without an image path (order suites read without images) by its caption's image index."""
    return [os.path.relpath(it["image_path"], image_dir or ".") if it.get("image_path") is not None
            else f"image {str(it['id']).split('.')[0]}" for it in items]


def _pairs(name, data, loaded, kept, true, false, groups, image_dir) -> Suite:
    """A two-caption suite of the ``kept`` items out of the ``loaded`` ones (:class:`Items`)."""
    return Suite(name, data, list(kept), [[it[true], it[false]] for it in kept], groups, [loaded.source],
                 loaded.total, loaded.total - len(loaded), len(loaded) - len(kept),
                 clusters=image_ids(kept, image_dir))


def _suite(name: str, data: str, path: str, image_dir: str | None, o: LoadOptions) -> Suite:
    """Read one suite's file; ``path`` is the JSON file (a SugarCrepe folder for sugarcrepe/*)."""
    if name in ("own_relation", "own_attribute"):  # micro averages: the first own_items items, no group filter
        items = (comp.load_vg_relation if name == "own_relation" else comp.load_vg_attribution)(
            path, image_dir, o.on_missing)
        kept = items[:o.own_items]
        groups = [it["relation_name"] if name == "own_relation" else "_".join(it["attributes"]) for it in kept]
        return _pairs(name, data, items, kept, "true_caption", "false_caption", groups, image_dir)
    if name == "aro_relation":
        items = comp.load_vg_relation(path, image_dir, o.on_missing)
        kept = [it for it in items if it["relation_name"] not in comp.ARO_SYMMETRIC_RELATIONS]
        return _pairs(name, data, items, kept, "true_caption", "false_caption", [it["relation_name"] for it in kept],
                      image_dir)
    if name == "aro_attribute":
        items = comp.load_vg_attribution(path, image_dir, o.on_missing)
        pair = [f"{it['attributes'][0]}_{it['attributes'][1]}" for it in items]
        counts = Counter(pair)  # ARO's filter, once, on the file's items
        keep = [i for i, g in enumerate(pair) if counts[g] >= o.attribute_min_count]
        return _pairs(name, data, items, [items[i] for i in keep], "true_caption", "false_caption",
                      [pair[i] for i in keep], image_dir)
    if name in ("aro_coco_order", "aro_flickr30k_order"):
        items = comp.load_order_suite(path, image_dir, o.order_seed, on_missing=o.on_missing, tagger=o.tagger)
        clusters = image_ids(items, image_dir)
        first = set(list(dict.fromkeys(clusters))[:o.order_images]) if o.order_images is not None else set(clusters)
        kept = [i for i, c in enumerate(clusters) if c in first]  # [M] the first images' captions, in file order
        identical = np.array([[False, *items[i]["identical"]] for i in kept], dtype=bool).reshape(len(kept), 5)
        return Suite(name, data, [items[i] for i in kept],
                     [[items[i]["caption"], *items[i]["perturbed"]] for i in kept], [""] * len(kept), [path],
                     items.total, items.total - len(items), len(items) - len(kept), 0.2, identical, items.tagger,
                     [clusters[i] for i in kept])
    subset = name.split("/")[1]
    items = comp.load_sugarcrepe(path, image_dir, [subset], o.on_missing)[subset]
    kept = items[:o.own_items] if name.startswith("own_") else items
    return _pairs(name, data, items, kept, "caption", "negative_caption", [""] * len(kept), image_dir)


def _expand(suites) -> list[str]:
    names = SUITES if suites == "all" else [suites] if isinstance(suites, str) else list(suites)
    out = [s for n in names for s in ALIASES.get(n, [n])]
    unknown = [n for n in out if n not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; choose from {SUITES + tuple(ALIASES)} or 'all'")
    return out


def _sources(data_dir: str | None, o: LoadOptions) -> dict[str, list[tuple]]:
    """Per suite, its data: [(data "synthetic" | "real", path, image folder)]; paths checked to exist."""
    real_paths = {name for _, *pair in REAL_DATA for name in pair}  # the options that are paths
    for f in fields(LoadOptions):
        path = getattr(o, f.name)
        if f.name in real_paths and path and not os.path.exists(path):
            raise ValueError(f"{f.name}: {path} does not exist")
    sources: dict[str, list[tuple]] = {}
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise ValueError(f"data_dir: {data_dir} is not a folder of synthetic evaluation sets")
        aro, sugar = os.path.join(data_dir, "aro"), os.path.join(data_dir, "sugarcrepe")
        for name, file in (("aro_relation", "visual_genome_relation.json"), ("aro_coco_order", "coco_order_test.json"),
                           ("aro_attribute", "visual_genome_attribution.json")):
            sources.setdefault(name, []).append(("synthetic", os.path.join(aro, file), aro))
        for name in SUGARCREPE:
            sources.setdefault(name, []).append(("synthetic", sugar, os.path.join(sugar, "images")))
        own = os.path.join(data_dir, "own")
        if os.path.isdir(own):  # sets written before the in-distribution suites have none
            for name, file in (("own_relation", "visual_genome_relation.json"),
                               ("own_attribute", "visual_genome_attribution.json")):
                sources.setdefault(name, []).append(("synthetic", os.path.join(own, file), own))
            for name in OWN_SUGARCREPE:
                sources.setdefault(name, []).append(("synthetic", os.path.join(own, "sugarcrepe"),
                                                     os.path.join(own, "images")))
    files = {"aro_relation": "visual_genome_relation.json", "aro_attribute": "visual_genome_attribution.json"}
    for names, data_field, image_field in REAL_DATA:
        data_path, image_dir = getattr(o, data_field), getattr(o, image_field)
        if bool(data_path) != bool(image_dir):
            given, needed = (data_field, image_field) if data_path else (image_field, data_field)
            raise ValueError(f"{given} is set but {needed} is empty; both are needed")
        for name in names if data_path else ():
            path = os.path.join(data_path, files[name]) if name in files else data_path
            sources.setdefault(name, []).append(("real", path, image_dir))
    return sources


def load_suites(data_dir: str | None = None, suites="all", options: LoadOptions | None = None,
                **kw) -> dict[str, Suite]:
    """The suites to evaluate: the synthetic sets under ``data_dir`` (None: none) and the real
    benchmarks whose paths ``options`` give (a :class:`LoadOptions`, or its fields as keywords:
    ``aro_dir=..., vg_image_dir=...``). ``suites``: "all" (every suite with data) or names from
    ``SUITES`` ("sugarcrepe" = its seven sub-files, "own_sugarcrepe" = theirs in the training captions'
    words, "own" = every in-distribution suite). An unknown option, a given path that does not
    exist, a path without its partner, a suite asked for without data, or a suite given both
    synthetic and real data is a ValueError naming it."""
    o = with_options(LoadOptions, options, kw, "load_suites")
    for field, unit in (("order_images", "image"), ("own_items", "item")):
        if getattr(o, field) is not None and getattr(o, field) < 1:
            raise ValueError(f"{field}: at least 1 {unit} (None: all); got {getattr(o, field)}")
    sources = _sources(data_dir, o)
    out = {}
    for name in _expand(suites):
        found = sources.get(name, [])
        if len(found) > 1:
            raise ValueError(f"suite {name!r} has both synthetic (data_dir) and real data; "
                             f"set data_dir=None to evaluate the real benchmark")
        if not found:
            if suites == "all":
                continue
            raise ValueError(f"suite {name!r} was asked for but has no data: set data_dir or its real-data paths")
        out[name] = _suite(name, *found[0], o)
    return out


def reference_images(suite: Suite, K: int, seed: int = 0) -> tuple[list[int], np.ndarray]:
    """The image-free baseline's reference images: items [P] showing P = K + 1 distinct images (the
    first item of each new image in a ``seed``-ed shuffle of the suite; fewer if the suite has fewer),
    and per item [N, K'] the first K' = min(K, P - 1) of them that are not the item's own image."""
    order, seen, pool = np.random.default_rng(seed).permutation(len(suite.items)), set(), []
    for i in order:
        if len(pool) > K:
            break
        if suite.clusters[i] not in seen:
            seen.add(suite.clusters[i])
            pool.append(int(i))
    k = min(K, len(pool) - 1)
    chosen = [[j for j, p in enumerate(pool) if suite.clusters[p] != own][:k] for own in suite.clusters]
    return pool, np.array(chosen, dtype=np.int64).reshape(len(suite.items), max(k, 0))


def shuffled_images(suite: Suite, seed: int = 0) -> np.ndarray:
    """The shuffled-image control's pairing: per item [N] the item whose image it is shown instead, a fixed
    derangement of the suite's distinct images (one random cycle through them, drawn from ``seed`` and the
    suite's name), so no item sees its own image; each item gets the first item of the next image. A suite
    of one image has none to give: every entry is -1."""
    distinct = list(dict.fromkeys(suite.clusters))
    first = {c: suite.clusters.index(c) for c in distinct}
    if len(distinct) < 2:
        return np.full(len(suite.items), -1, dtype=np.int64)
    cycle = np.random.default_rng([seed, zlib.crc32(suite.name.encode())]).permutation(len(distinct))
    after = {distinct[cycle[k]]: distinct[cycle[(k + 1) % len(cycle)]] for k in range(len(cycle))}
    return np.array([first[after[c]] for c in suite.clusters], dtype=np.int64)


def describe(suites: dict[str, Suite]) -> str:
    """One line per suite: data, items evaluated out of the file's, skipped and excluded items."""
    return "\n".join(f"{n}: {s.data}, {len(s.items)} of {s.total} items evaluated ({s.missing} missing images, "
                     f"{s.excluded} excluded by the suite's rule), {len(s.candidates[0]) if s.candidates else 0} "
                     f"captions each" + (f", {s.tagger} tagger" if s.tagger else "") for n, s in suites.items())


def synthetic_data(out_dir: str, seed: int, image_size: int, n_items: int) -> str:
    """The synthetic ARO/SugarCrepe sets (:func:`mdc.world.evalsets.write_evalsets`, ``n_items``
    per file; its probe and captioning sets kept tiny) under ``out_dir``, written unless there."""
    summary = os.path.join(out_dir, "summary.json")
    if os.path.isfile(summary):
        with open(summary) as f:
            s = json.load(f)
        if (s["seed"], s["image_size"], s["aro"]["vg_relation"], s.get("own", {}).get("relation")) == (
                seed, image_size, n_items, n_items):
            return out_dir
    write_evalsets(out_dir, seed, image_size, n_probe_train=1, n_probe_test=1, n_items=n_items, n_caption_train=1)
    return out_dir
