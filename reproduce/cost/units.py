"""What a unit of each evaluation costs at ``mini``: the seconds behind :mod:`reproduce.cost.eval_cost`'s cost model.

Short timings on the shipped weights (``mdc.create_model("mini", objective, pretrained="synthetic")``, the
reference run's seed-0 models trained on descriptive captions), one thread, as the runner runs each run:

- compositionality: per objective, per suite kind (``order``: ARO's order task, five descriptive captions an
  item; ``template``: VG-Relation, VG-Attribution and SugarCrepe in template phrasing; ``own``: the
  in-distribution suites, the scene's own descriptive caption edited) and per group of score variants
  (:data:`GROUPS`: with the image, without it over ``blind_images`` reference images, with another item's
  image): seconds per candidate caption, an image-free group's per candidate and reference image, at the
  profile's ELBO budget (32 paired copies doubled up to 256 where a decision with the image is unsure);
- linear probe: seconds per image through the encoder (pooled and grid features in one pass) and per
  training row and epoch of the pooled (D) and grid (16 D) classifiers;
- guidance sweep: seconds per image and caption of each rule (unguided, CFG, MCS, mirrored MCS; the guided
  model's architecture, random weights: a caption's cost does not depend on them), of the reference metrics
  (BLEU, METEOR, CIDEr) per caption, and of its guided
  compositionality (heuristic, with and without the image) per candidate and setting, by suite kind
  (a quarter of ``--items``).

    OMP_NUM_THREADS=1 python -m reproduce.cost.units --evalsets DIR [--items 48] [--out FILE.json]

``DIR``: synthetic evaluation sets (``mdc.world.evalsets.write_evalsets``; the probe's need only a few hundred
images per task). The items are the first ``--items`` of each kind, spread evenly over its suites. The
file it writes, keyed by notebook, is what :mod:`reproduce.cost.eval_cost` reads
(``reproduce/cost/unit_seconds.json``); the machine's load average before and after goes with it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import torch

import mdc
from mdc.eval import captioning as cap
from mdc.eval import compositionality as comp
from mdc.eval import guidance_sweeps as gd
from mdc.eval.grid_probe import PooledAndGrid
from mdc.eval.probe import ProbeConfig, dataset_fns, extract_features, linear_probe, synthetic_roots
from mdc.eval.suites import OWN_SUITES, SUGARCREPE

KINDS = {"order": ("aro_coco_order",), "template": ("aro_relation", "aro_attribute", *SUGARCREPE),
         "own": OWN_SUITES}
# variant groups: (name, which variants of the full scoring dict, image-free)
GROUPS = (("image", lambda v: not v.endswith(("_blind", "_shuffled")), False),
          ("blind", lambda v: v.endswith("_blind"), True),
          ("shuffled", lambda v: v.endswith("_shuffled"), False))
OPTIONS = dict(num_samples=32, max_samples=256, blind_images=4, batch_size=64, shuffled=True, seed=0)


def sample(suites: dict, names, items: int) -> list:
    """The first ``items`` items of the named suites, spread evenly (at least one a suite)."""
    names = [n for n in names if n in suites]
    each = max(1, items // len(names))
    return [dataclasses.replace(s, items=s.items[:each], candidates=s.candidates[:each], groups=s.groups[:each],
                                clusters=s.clusters[:each],
                                identical=None if s.identical is None else s.identical[:each])
            for s in (suites[n] for n in names)]


def composition_costs(evalsets: str, items: int) -> dict:
    """{objective: {kind: {group: seconds per candidate (and reference image)}}}."""
    suites = comp.load_suites(evalsets, "all", attribute_min_count=5)
    out = {}
    for objective in ("mdc", "arc", "clip"):
        model = mdc.create_model("mini", objective=objective, pretrained="synthetic").eval()
        transform, methods = mdc.image_transform(model), comp.resolve_methods(objective)
        scoring = comp.method_variants(model, methods, comp.suite_options(**OPTIONS))
        out[objective] = {}
        for kind, names in KINDS.items():
            parts = sample(suites, names, items)
            candidates = sum(len(c) for s in parts for c in s.candidates)
            row = {}
            for group, chosen, blind in GROUPS:
                subset = {v: kw for v, kw in scoring.items() if chosen(v)}
                if not subset:
                    continue
                start = time.perf_counter()
                for s in parts:
                    comp.score_variants(model, transform, s, subset, comp.suite_options(**OPTIONS))
                per = (time.perf_counter() - start) / candidates
                row[group] = per / OPTIONS["blind_images"] if blind else per
            out[objective][kind] = row
            ms = {g: f"{s * 1e3:.2f} ms" for g, s in row.items()}
            print(objective, kind, candidates, "candidates", ms, flush=True)
    return out


def probe_costs(evalsets: str, images: int = 512, rows: int = 3000, epochs: int = 10) -> dict:
    """Seconds per image through the encoder (pooled + grid features), and per training row and epoch of the
    pooled and the grid classifier (features of the sizes the probe fits, 8 classes)."""
    model = mdc.create_model("mini", objective="mdc", pretrained="synthetic").eval()
    train_fn, _ = dataset_fns(synthetic_roots(evalsets, ["object"]), mdc.image_transform(model))["wds/object"]
    batch = [x for _, x in zip(range(images), train_fn())]
    start = time.perf_counter()
    feats, _ = extract_features(model, batch, 256, "cpu", PooledAndGrid(4))
    out = {"extract_per_image": (time.perf_counter() - start) / len(batch)}
    d = model.config.vision_width
    for name, dim in (("fit_pooled", d), ("fit_grid", 16 * d)):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(rows, dim, generator=g), torch.randint(0, 8, (rows,), generator=g)
        start = time.perf_counter()
        linear_probe((x, y), (x[:1000], y[:1000]), ProbeConfig(epochs=epochs))
        out[f"{name}_per_row_epoch"] = (time.perf_counter() - start) / (rows * epochs)
    print("probe", {k: f"{v * 1e3:.3f} ms" for k, v in out.items()}, flush=True)
    return out


def guidance_costs(evalsets: str, images: int, items: int) -> dict:
    """Seconds per image of one caption under each rule, and per candidate and setting of guided scoring."""
    model = mdc.create_model("mini", objective="mdc", cond_drop_prob=0.1, cond_mask_prob=0.1).eval()
    root = f"{evalsets}/captions"
    test = cap.load_caption_items(f"{root}/dataset_scenes.json", "karpathy", root, "test")
    test = list(test)[:images]
    out, captions = {}, {}
    for guidance in ("none", "cfg", "mcs", "mcs_mirror"):
        setting = [(None, None)] if guidance == "none" else [(guidance, 2.0)]
        start = time.perf_counter()
        captions.update(gd.caption_sweep(model, test, setting, length=15, batch_size=32))
        out[f"caption_{guidance}"] = (time.perf_counter() - start) / len(test)
    start = time.perf_counter()  # the sweep's reference metrics, every run's captions at once
    cap.evaluate_captions(captions, {it["image_id"]: it["references"] for it in test}, ["bleu", "meteor", "cider"])
    out["metrics_per_caption"] = (time.perf_counter() - start) / (len(test) * len(captions))
    suites = comp.load_suites(evalsets, "all", attribute_min_count=5)
    settings = gd.sweep_settings([2.0], list(gd.GUIDANCE))
    out["composition"] = {}
    for kind, names in KINDS.items():
        parts = {s.name: s for s in sample(suites, names, items)}
        candidates = sum(len(c) for s in parts.values() for c in s.candidates)
        start = time.perf_counter()
        gd.guided_compositionality(model, parts, settings, resamples=10)
        out["composition"][kind] = (time.perf_counter() - start) / (candidates * len(settings))
    print("guidance", json.dumps(out), flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--evalsets", required=True)
    p.add_argument("--items", type=int, default=24, help="items per suite kind")
    p.add_argument("--images", type=int, default=64, help="guidance: test images captioned per rule")
    p.add_argument("--only", nargs="+", default=["probe", "guidance", "compositionality"])
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    found = {"threads": torch.get_num_threads(), "items": args.items, "load_before": os.getloadavg()[0]}
    if "probe" in args.only:
        found["linear_probe"] = probe_costs(args.evalsets)
    if "guidance" in args.only:
        found["guidance"] = guidance_costs(args.evalsets, args.images, max(1, args.items // 4))
    if "compositionality" in args.only:
        found["compositionality"] = composition_costs(args.evalsets, args.items)
    found["load_after"] = os.getloadavg()[0]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)


if __name__ == "__main__":
    main()
