"""Learnability of the synthetic world on a CPU: which (world, model, budget) lets the paper's
questions be answered before any method is compared (the study behind the `mini` profile).

    python -m reproduce.studies.learnability --configs s32 s48 --seeds 0 1 2 [--out DIR]
    python -m reproduce.studies.learnability --summary      # the table from the runs so far
    python -m reproduce.studies.learnability --probe runs/my-mini-mdc   # any run of mdc.train, e.g. of mini's preset
    python -m reproduce.studies.learnability --summary --write reproduce/studies/learnability  # into the record

Every run is real: synthetic shards -> ``mdc.train.train`` (the pretraining loop of the
notebooks) -> ``mdc.eval.probe`` (CLIP_benchmark's linear probe) on the synthetic probe tasks
at the run's resolution. Beside each trained encoder the same architecture is probed at its
random initialisation (same seed): the *gap* is trained minus random-init top-1, in points.
Wall and CPU time (this process and its data workers) are recorded per run. Rows go to the working
folder (``--out``); ``--write`` adds the ones the committed record lacks to it, and it only ever grows.

The rule that picks `mini` is fixed in ``RULE`` before any method is compared, and it is the
same for the three objectives: the cheapest configuration in which MDC, ARC and CLIP each
beat their random-init encoder by at least ``min_gap`` points on the mean of the four
informative tasks, with a seed standard deviation of that gap below ``max_std``, within
``max_minutes`` of wall time per pretraining run on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import resource
import time

import numpy as np

# Fixed before the first run was read. max_minutes: `mini` trains about 18 models per seed
# (Tables 1, 4, 5, Figs. 4, 5) and must fit in about an hour on 2 cores with its evaluations.
# The rule is applied to descriptive captions: complete captions pose the question "does the world
# teach visual features at this budget"; alt captions (partial by design) are then run at the chosen
# point. Fallback, fixed after five single-seed runs and before the remaining candidates were read,
# should no candidate pass: the candidate within max_minutes with the largest gap of its weakest
# objective (max over candidates of min over MDC/ARC/CLIP) -- still method-agnostic.
RULE = {"tasks": ("object", "shape", "texture", "count"), "min_gap": 20.0, "max_std": 1.5, "max_minutes": 3.0,
        "style": "descriptive", "fallback": "max-min gap over objectives within max_minutes"}
TASKS = ("object", "shape", "texture", "count", "relation", "shape_texture", "colour", "background")

# Candidate configurations: ModelConfig overrides of "tiny", the training recipe and the data.
BASE = dict(vision_width=128, vision_layers=4, vision_heads=4, text_width=128, text_layers=4, text_heads=4,
            embed_dim=128)
CONFIGS: dict[str, dict] = {
    # today's tiny at its measured operating point (descriptive captions, 400 x 64)
    "t64": dict(model=dict(BASE, image_size=64, patch_size=8), style="descriptive", steps=400, batch=64, lr=5e-4,
                warmup=20),
    # resolution and patch: the cost lever
    "s32": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=1000, batch=64, lr=1e-3,
                warmup=50),
    "s32a": dict(model=dict(BASE, image_size=32, patch_size=8), style="alt", steps=1000, batch=64, lr=1e-3,
                 warmup=50),
    "s48": dict(model=dict(BASE, image_size=48, patch_size=8), style="descriptive", steps=650, batch=64, lr=1e-3,
                warmup=30),
    # the same 16 image tokens as s32, each patch seeing 4x the pixels (textures resolved)
    "s64p16": dict(model=dict(BASE, image_size=64, patch_size=16), style="descriptive", steps=1000, batch=64,
                   lr=1e-3, warmup=50),
    "s64p16a": dict(model=dict(BASE, image_size=64, patch_size=16), style="alt", steps=1000, batch=64, lr=1e-3,
                    warmup=50),
    # the optimisation: a higher learning rate; twice the updates at the same pairs (smaller batches)
    "s32lr": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=1000, batch=64, lr=3e-3,
                  warmup=100),
    "s32b32": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=2000, batch=32,
                   lr=1e-3, warmup=100),
    # the cost of descriptive captions is mostly the text decoder (4 layers: ~75% of a step): a deeper
    # vision tower and a 2-layer decoder, for about the cost of s32
    "s32v6t2": dict(model=dict(BASE, image_size=32, patch_size=8, vision_layers=6, text_layers=2),
                    style="descriptive", steps=1400, batch=64, lr=2e-3, warmup=100),
    # within the rule's 3 minutes: s32lr's model and recipe cut to the steps that fit (the timing pass
    # measured s32lr at 0.27 / 0.31 / 0.31 s per step for MDC / ARC / CLIP on 2 cores; added after it,
    # when no measured candidate fitted, before this one was run)
    "s32q": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=560, batch=64, lr=3e-3,
                 warmup=56),
    # a convolutional stem in place of the patch projection (issue 19), s32q's recipe: at 32 px (16 tokens),
    # at 64 px (64 tokens) and at 64 px ending at 16 tokens (four convolutions)
    "c32": dict(model=dict(BASE, image_size=32, patch_size=8, vision_stem="conv"), style="descriptive", steps=560,
                batch=64, lr=3e-3, warmup=56),
    "c64": dict(model=dict(BASE, image_size=64, patch_size=8, vision_stem="conv"), style="descriptive", steps=560,
                batch=64, lr=3e-3, warmup=56),
    "c64p16": dict(model=dict(BASE, image_size=64, patch_size=16, vision_stem="conv"), style="descriptive",
                   steps=560, batch=64, lr=3e-3, warmup=56),
    # c64 with 4x the steps (lr 1e-3, chosen by the ceiling's training loss): what a 4x budget buys
    "c64x4": dict(model=dict(BASE, image_size=64, patch_size=8, vision_stem="conv"), style="descriptive", steps=2240,
                  batch=64, lr=1e-3, warmup=224),
    # finer patches at 32 px: 64 tokens
    "s32p4": dict(model=dict(BASE, image_size=32, patch_size=4), style="descriptive", steps=1000, batch=64, lr=1e-3,
                  warmup=50),
}


def cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (data workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def shards(root: str, style: str, image_size: int, num: int, seed: int = 0) -> str:
    """Synthetic training shards (written once per style, size and count); returns the brace pattern."""
    from mdc.world.scenes import write_shards

    out = os.path.join(root, f"train-{style}-{image_size}px-{num}")
    size = 1000
    n_shards = -(-num // size)
    if not os.path.isfile(os.path.join(out, f"{n_shards - 1:06d}.tar")):
        write_shards(out, num, style, seed=seed, image_size=image_size, shard_size=size)
    return os.path.join(out, f"{{000000..{n_shards - 1:06d}}}.tar")


def evalsets(root: str, image_size: int) -> str:
    """Held-out probe tasks at ``image_size`` (3,000 train / 1,000 test images each)."""
    from mdc.world.evalsets import write_evalsets

    out = os.path.join(root, f"eval-{image_size}px")
    if not os.path.isfile(os.path.join(out, "summary.json")):
        write_evalsets(out, seed=1, image_size=image_size, n_items=200, n_caption_train=100)
    return out


def probe(model, eval_dir: str, cache: str) -> dict[str, float]:
    """Top-1 (%) per synthetic probe task."""
    from mdc.data.transforms import image_transform
    from mdc.eval.probe import dataset_fns, probe_datasets

    size = model.config.image_size
    roots = {f"wds/{t}": os.path.join(eval_dir, "probe", t) for t in TASKS}
    res = probe_datasets(model, dataset_fns(roots, image_transform(size, train=False)), cache_dir=cache,
                         transform_key=f"eval{size}")
    return {name.split("/")[1]: 100 * r["top1"] for name, r in res["datasets"].items()}


def run(name: str, objective: str, seed: int, out: str, workers: int = 1, lr: float | None = None) -> dict:
    """Pretrain ``objective`` with ``CONFIGS[name]`` (``lr`` in place of its recipe's) and probe it at 25%,
    50% and 100% of its steps (the learning curve) beside its random initialisation."""
    import torch

    import mdc
    from mdc.train import train

    cfg = _recipe(name, lr)
    data = shards(os.path.join(out, "data"), cfg["style"], cfg["model"]["image_size"], cfg["steps"] * cfg["batch"])
    eval_dir = evalsets(os.path.join(out, "data"), cfg["model"]["image_size"])
    run_dir = os.path.join(out, "runs", f"{name}-{objective}-s{seed}" + (f"-lr{lr:g}" if lr is not None else ""))
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    result = train(train_data=data, output_dir=run_dir, model="tiny", objective=objective,
                   model_overrides=cfg["model"], steps=cfg["steps"], batch_size=cfg["batch"], lr=cfg["lr"],
                   warmup_steps=cfg["warmup"], seed=seed, workers=workers, save_every=cfg["steps"] // 4,
                   shuffle_buffer=2000)
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    torch.manual_seed(seed)
    random_init = mdc.create_model("tiny", objective, **cfg["model"])
    cache = os.path.join(out, "features")
    row = {"config": name if lr is None else f"{name}@{lr:g}", "objective": objective, "seed": seed, "wall_s": wall,
           "cpu_s": cpu, "final_loss": result["final_loss"], "recipe": {k: v for k, v in cfg.items()},
           **beside_random_init(mdc.load(result["checkpoint"]), random_init, eval_dir, cache)}
    row["curve"] = {}  # fraction of the steps -> gap on the rule's tasks
    for quarter in (1, 2):
        step = cfg["steps"] // 4 * quarter
        early = probe(mdc.load(os.path.join(run_dir, "checkpoints", f"step_{step:06d}")), eval_dir, cache)
        row["curve"][quarter / 4] = float(np.mean([early[t] - row["random_init"][t] for t in RULE["tasks"]]))
    row["curve"][1.0] = row["gap_mean4"]
    with open(os.path.join(out, "runs.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def beside_random_init(trained, random_init, eval_dir: str, cache: str) -> dict:
    """{"trained", "random_init": top-1 per task, "gap": their difference, "gap_mean4": its mean on the
    rule's tasks}."""
    row = {"trained": probe(trained, eval_dir, cache), "random_init": probe(random_init, eval_dir, cache)}
    row["gap"] = {t: row["trained"][t] - row["random_init"][t] for t in TASKS}
    row["gap_mean4"] = float(np.mean([row["gap"][t] for t in RULE["tasks"]]))
    return row


def probe_checkpoint(path: str, out: str) -> dict:
    """The study's probe of a model trained elsewhere, e.g. by
    ``python -m mdc.train --preset reproduce/presets/mini.json``: ``path`` (a checkpoint or run folder)
    beside its architecture at random initialisation (seeded with the run's training seed), on the
    held-out tasks at its resolution. Appends to ``probes.jsonl``."""
    import mdc
    from mdc.checkpoint import read_run_config
    from mdc.eval.probe import random_init_like
    from mdc.factory import checkpoint_folder

    folder = checkpoint_folder(path)
    trained = mdc.load(folder)
    run = read_run_config(folder) or {}
    seed = run.get("train", {}).get("seed", 0)
    random_init = random_init_like(trained, seed)
    eval_dir = evalsets(os.path.join(out, "data"), trained.config.image_size)
    row = {"checkpoint": folder, "model": trained.config.name, "objective": trained.config.objective, "seed": seed,
           "train": {k: run.get("train", {}).get(k) for k in ("train_data", "preset", "steps", "batch_size", "lr")},
           **beside_random_init(trained, random_init, eval_dir, os.path.join(out, "features"))}
    with open(os.path.join(out, "probes.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


# The supervised ceiling: the encoder trained on the probe's own labels (a linear head per label on its
# GAP features), with the objectives' budget, data stream and probe -- what this encoder and world allow.
# Fixed before the first ceiling was read (issue 19): the encoder and the world's rendering are chosen by
# the ceiling alone -- the cheapest candidate (seconds per step of its slowest objective, timing pass)
# whose ceiling reaches `target` points on the rule's tasks; if none does, the highest ceiling.
CEILING_RULE = {"tasks": RULE["tasks"], "target": 50.0, "budget": "the candidate's own recipe (steps, batch, lr)",
                "choice": "cheapest candidate with ceiling >= target, else the highest ceiling"}


def scene_labels(scene: dict) -> list[int]:
    """The ceiling's targets of a scene: shape, colour and texture of its largest object, and its count."""
    from mdc.world.render import COLOURS, SHAPES, TEXTURES

    big = max(scene["objects"], key=lambda o: o["radius"])
    return [list(SHAPES).index(big["shape"]), list(COLOURS).index(big["colour"]),
            list(TEXTURES).index(big["texture"]), len(scene["objects"]) - 1]


def ceiling_run(name: str, seed: int, out: str, lr: float | None = None) -> dict:
    """Train ``CONFIGS[name]``'s vision tower on the labels of the training scenes (the same scenes as
    the objectives' shards: world seed 0, rendered at the model's size and passed through the training
    transform), with its recipe (``lr`` in place of the recipe's: the ceiling's learning rate is chosen by
    its own training loss); probe it beside its random initialisation."""
    import torch
    from PIL import Image

    import mdc
    from mdc.data.transforms import image_transform
    from mdc.optim import fit
    from mdc.world.render import COLOURS, SHAPES, TEXTURES, render_array
    from mdc.world.scenes import sample_scene
    from mdc.world.streams import STREAM_SCENE, stream_rng
    from mdc.world.text import MAX_OBJECTS

    cfg = _recipe(name, lr)
    size = cfg["model"]["image_size"]
    eval_dir = evalsets(os.path.join(out, "data"), size)
    torch.manual_seed(seed)
    model = mdc.create_model("tiny", "mdc", **cfg["model"])  # a captioner's tower: GAP features, no CLS token
    random_init = copy.deepcopy(model)
    heads = torch.nn.ModuleList(torch.nn.Linear(cfg["model"]["vision_width"], n)
                                for n in (len(SHAPES), len(COLOURS), len(TEXTURES), MAX_OBJECTS))
    transform = image_transform(size, train=True, seed=seed)
    order = iter(np.random.default_rng(seed).permutation(cfg["steps"] * cfg["batch"]).reshape(cfg["steps"], -1))

    def next_batch():  # the next batch of training scenes: images [B, 3, S, S] and labels [B, 4]
        scenes = [sample_scene(stream_rng(0, STREAM_SCENE, int(i))) for i in next(order)]
        images = torch.stack([transform(Image.fromarray(render_array(sc, size))) for sc in scenes])
        return images, torch.tensor([scene_labels(sc) for sc in scenes])

    def loss_fn(images, labels):  # a linear head per label on the GAP features [B, Dv]
        feats = model.encode_image(images)
        return sum(torch.nn.functional.cross_entropy(h(feats), labels[:, k]) for k, h in enumerate(heads))

    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    losses = fit(torch.nn.ModuleList([model.visual, heads]), next_batch, cfg["steps"], cfg["lr"], 0.1,
                 cfg["warmup"], loss_fn=loss_fn)  # the tower and the heads trained, the text decoder left
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    row = {"config": name, "objective": "labels", "seed": seed, "wall_s": wall, "cpu_s": cpu,
           "final_loss": losses[-1], "recipe": cfg,
           **beside_random_init(model, random_init, eval_dir, os.path.join(out, "features"))}
    with open(os.path.join(out, "ceiling.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def timing(name: str, out: str, steps: int = 40, workers: int = 1, compile: bool = False, skip: int = 5,
           objectives=("mdc", "arc", "clip")) -> dict:
    """Seconds per optimizer step of a configuration through the real loader, per objective, measured
    on its own (the machine otherwise idle): what a run of the full length would cost on 2 cores.

    A step's time is the median of the run's own per-step times (data wait, forward, backward, update)
    after its first ``skip`` steps: start-up (workers, the first batches, compilation) is left out."""
    import shutil

    import torch

    from mdc.train import train

    cfg = CONFIGS[name]
    data = shards(os.path.join(out, "data"), cfg["style"], cfg["model"]["image_size"], cfg["steps"] * cfg["batch"])
    row = {"config": name, "workers": workers, "compile": compile, "threads": torch.get_num_threads(),
           "loader_images_per_s": loader_rate(name, out, workers)}
    for objective in objectives:
        run_dir = os.path.join(out, "timing", f"{name}-{objective}-w{workers}{'-compiled' if compile else ''}")
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
        train(train_data=data, output_dir=run_dir, model="tiny", objective=objective, model_overrides=cfg["model"],
              steps=skip + steps, batch_size=cfg["batch"], lr=cfg["lr"], warmup_steps=1, workers=workers,
              save_every=10**6, shuffle_buffer=2000, compile=compile)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rates = [json.loads(line)["images_per_s"] for line in f][skip:]
        row[objective] = cfg["batch"] / float(np.median(rates))
        row[f"{objective}_run_min"] = row[objective] * cfg["steps"] / 60
        row[f"{objective}_images_per_s"] = cfg["batch"] / row[objective]
    with open(os.path.join(out, "timing.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def loader_rate(name: str, out: str, workers: int, batches: int = 60) -> float:
    """Images per second of the real training loader alone (PNG decoding, tar parsing, crop, tokenizing)."""
    from mdc.data.pipeline import make_loader
    from mdc.tokenizer import Tokenizer
    from mdc.world.text import vocabulary

    cfg = CONFIGS[name]
    data = shards(os.path.join(out, "data"), cfg["style"], cfg["model"]["image_size"], cfg["steps"] * cfg["batch"])
    loader = iter(make_loader(data, Tokenizer(64, vocabulary()), cfg["model"]["image_size"], cfg["batch"],
                              num_workers=workers, shuffle_buffer=2000))
    next(loader)  # start-up (workers, the shuffle buffer's first fill) not counted
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return batches * cfg["batch"] / (time.perf_counter() - start)


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON-lines record; none if it does not exist."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_seconds(out: str) -> dict[str, float]:
    """{config: seconds per step of its slowest objective} from the timing passes; a configuration timed
    in several settings (workers, torch.compile) costs what its fastest setting costs."""
    timings: dict[str, float] = {}
    for t in read_rows(os.path.join(out, "timing.jsonl")):
        slowest = max(t.get(o, 0.0) for o in ("mdc", "arc", "clip"))
        timings[t["config"]] = min(timings.get(t["config"], slowest), slowest)
    return timings


def summary(out: str) -> str:
    """Markdown table: per config and objective, mean ± std over seeds of the gap and the times."""
    rows = read_rows(os.path.join(out, "runs.jsonl"))
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["config"], r["objective"]), []).append(r)
    lines = ["| config | objective | seeds | gap mean4 | " + " | ".join(f"gap {t}" for t in TASKS)
             + " | wall min | CPU min |", "|" + "---|" * (6 + len(TASKS))]
    for (name, objective), rs in sorted(groups.items()):
        def ms(values):
            return f"{np.mean(values):.1f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.1f}"
        lines.append(f"| {name} | {objective} | {len(rs)} | {ms([r['gap_mean4'] for r in rs])} | "
                     + " | ".join(ms([r["gap"][t] for r in rs]) for t in TASKS)
                     + f" | {np.mean([r['wall_s'] for r in rs]) / 60:.1f} | {np.mean([r['cpu_s'] for r in rs]) / 60:.1f} |")
    return "\n".join(lines)


def _recipe(config: str, lr: float | None = None) -> dict:
    """The recipe of ``config``, ``NAME`` or a row's ``NAME@LR`` (NAME's recipe at another learning
    rate), with ``lr`` in place of its learning rate if given."""
    name, _, at = config.partition("@")
    lr = lr if lr is not None else float(at) if at else None
    return CONFIGS[name] if lr is None else {**CONFIGS[name], "lr": lr}


def _step_seconds(name: str, timings: dict) -> float | None:
    """A configuration's measured seconds per step (slowest objective), or those of a timed one with
    the same model, caption style and batch (the step is the same; only lr or the step count differ)."""
    if name in timings:
        return timings[name]
    cfg = _recipe(name)
    same = [n for n in timings if n in CONFIGS and all(CONFIGS[n][k] == cfg[k] for k in ("model", "style", "batch"))]
    return timings[same[0]] if same else None


def decide(out: str) -> dict:
    """Apply ``RULE`` to the runs so far: per configuration, whether each objective passes, and the
    cheapest configuration that passes for all three (minutes from the idle-machine timing pass)."""
    rows = read_rows(os.path.join(out, "runs.jsonl"))
    timings = step_seconds(out)
    verdict = {}
    for name in dict.fromkeys(r["config"] for r in rows):
        per = {}
        for objective in ("mdc", "arc", "clip"):
            gaps = [r["gap_mean4"] for r in rows if r["config"] == name and r["objective"] == objective]
            std = float(np.std(gaps, ddof=1)) if len(gaps) > 1 else None
            per[objective] = {"seeds": len(gaps), "gap": float(np.mean(gaps)) if gaps else None, "std": std,
                              "passes": bool(gaps) and bool(np.mean(gaps) >= RULE["min_gap"])
                              and (std is not None and std < RULE["max_std"])}
        seconds = _step_seconds(name, timings)
        minutes = seconds * _recipe(name)["steps"] / 60 if seconds is not None else None
        verdict[name] = {"objectives": per, "minutes": minutes,
                         "passes": all(v["passes"] for v in per.values()) and minutes is not None
                         and minutes <= RULE["max_minutes"]}
    passing = [n for n, v in verdict.items() if v["passes"]]
    if passing:
        return {"rule": RULE, "configs": verdict, "choice": min(passing, key=lambda n: verdict[n]["minutes"]),
                "by": "rule"}
    affordable = [n for n, v in verdict.items() if v["minutes"] is not None and v["minutes"] <= RULE["max_minutes"]
                  and _recipe(n)["style"] == RULE["style"]
                  and all(o["gap"] is not None for o in v["objectives"].values())]
    weakest = {n: min(o["gap"] for o in verdict[n]["objectives"].values()) for n in affordable}
    return {"rule": RULE, "configs": verdict, "choice": max(weakest, key=weakest.get) if weakest else None,
            "by": "fallback", "weakest_gap": weakest}


def decide_ceiling(out: str) -> dict:
    """Apply ``CEILING_RULE`` to ``ceiling.jsonl``: each candidate at the learning rate with the lower
    final supervised loss, then the cheapest reaching the target (seconds per step from the timing pass),
    else the highest ceiling."""
    rows = read_rows(os.path.join(out, "ceiling.jsonl"))
    best: dict[str, dict] = {}
    for r in rows:
        if r["config"] not in best or r["final_loss"] < best[r["config"]]["final_loss"]:
            best[r["config"]] = r
    candidates = {n: {"lr": r["recipe"]["lr"], "final_loss": r["final_loss"], "ceiling": r["gap_mean4"]}
                  for n, r in best.items()}
    reaching = [n for n, c in candidates.items() if c["ceiling"] >= CEILING_RULE["target"]]
    timings = step_seconds(out)
    if reaching and all(n in timings for n in reaching):
        return {"rule": CEILING_RULE, "candidates": candidates, "choice": min(reaching, key=timings.get),
                "by": "target"}
    if reaching:
        raise ValueError(f"{reaching} reach the target but have no timing pass: run --timing first")
    return {"rule": CEILING_RULE, "candidates": candidates,
            "choice": max(candidates, key=lambda n: candidates[n]["ceiling"]) if candidates else None,
            "by": "highest ceiling (none reaches the target)"}


RECORDS = ("runs.jsonl", "timing.jsonl", "ceiling.jsonl", "probes.jsonl")  # one JSON row per line


def merge_records(src: str, dst: str) -> dict[str, int]:
    """Append to each record of ``dst`` (the committed one, ``reproduce/studies/learnability``) the rows of
    ``src`` (a working folder) it lacks, in ``src``'s order; returns the rows added per file. Rows already in
    ``dst`` stay, those of earlier sessions whose working folders are gone included: a record only grows."""
    os.makedirs(dst, exist_ok=True)
    added = {}
    for name in RECORDS:
        mine, theirs = (os.path.join(folder, name) for folder in (src, dst))
        if not os.path.isfile(mine):
            continue
        have = {json.dumps(r, sort_keys=True) for r in read_rows(theirs)}
        new = [r for r in read_rows(mine) if json.dumps(r, sort_keys=True) not in have]
        with open(theirs, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in new)
        added[name] = len(new)
    return added


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="*", default=[], choices=sorted(CONFIGS))
    p.add_argument("--objectives", nargs="+", default=["mdc", "arc", "clip"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--out", default=os.path.join("runs", "studies", "learnability"))
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--compile", action="store_true", help="with --timing: torch.compile the loss")
    p.add_argument("--summary", action="store_true", help="print the table of the runs so far")
    p.add_argument("--ceiling", action="store_true", help="the supervised ceiling of the configurations' encoders")
    p.add_argument("--lr", type=float, nargs="*", help="learning rates in place of the recipe's, each in turn")
    p.add_argument("--probe", nargs="+", metavar="RUN", help="probe checkpoints (or run folders) trained "
                                                                "elsewhere beside their random init")
    p.add_argument("--timing", action="store_true", help="time the configurations (on an otherwise idle machine)")
    p.add_argument("--write", metavar="DIR", help="with --summary: add the runs' rows to the record in DIR (rows "
                                                  "it lacks, appended) and write its decisions from it")
    args = p.parse_args(argv)
    if args.summary and args.write:
        added = merge_records(args.out, args.write)
        with open(os.path.join(args.write, "decision.json"), "w") as f:
            json.dump(decide(args.write), f, indent=1)
        with open(os.path.join(args.write, "ceiling_decision.json"), "w") as f:
            json.dump(decide_ceiling(args.write), f, indent=1)
        print(summary(args.write))
        print(f"rows added to {args.write}: " + (", ".join(f"{name} {n}" for name, n in added.items())
                                                  or f"none ({args.out} holds no record)"))
        return
    if args.probe:
        for path in args.probe:
            row = probe_checkpoint(path, args.out)
            print(json.dumps({k: row[k] for k in ("checkpoint", "objective", "seed", "gap_mean4")} |
                             {"gap": {t: round(row["gap"][t], 1) for t in RULE["tasks"]}}), flush=True)
        return
    if args.ceiling:
        for seed in args.seeds:
            for name in args.configs:
                for lr in args.lr or [None]:
                    row = ceiling_run(name, seed, args.out, lr)
                    print(json.dumps({k: row[k] for k in ("config", "seed", "wall_s", "final_loss", "gap_mean4")}
                                     | {"lr": row["recipe"]["lr"]}), flush=True)
        return
    if args.timing:
        for name in args.configs:
            print(json.dumps(timing(name, args.out, workers=args.workers, compile=args.compile,
                                    objectives=args.objectives)), flush=True)
        return
    for seed in args.seeds:
        for name in args.configs:
            for objective, lr in itertools.product(args.objectives, args.lr or [None]):
                row = run(name, objective, seed, args.out, args.workers, lr)
                print(json.dumps({k: row[k] for k in ("config", "objective", "seed", "wall_s", "gap_mean4")}),
                      flush=True)
    print(summary(args.out))


if __name__ == "__main__":
    main()
