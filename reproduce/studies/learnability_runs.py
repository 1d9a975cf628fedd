"""What the learnability study runs: every run is real. Synthetic shards -> ``mdc.train.train`` (the
pretraining loop of the notebooks) -> ``mdc.eval.probe`` (CLIP_benchmark's linear probe) on the
synthetic probe tasks at the run's resolution, beside the same architecture probed at its random
initialisation (same seed): the *gap* is trained minus random-init top-1, in points. Also the
supervised ceiling (the vision tower trained on the scenes' own labels), the probe of a model trained
elsewhere, and the timing pass (seconds per step through the real loader). Wall and CPU time (this
process and its data workers) are recorded per run; each appends one row to its record in the
working folder (:mod:`reproduce.studies.learnability_rules` reads them).

Torch and the package are imported by the functions that train or probe, so the study's decisions
(:mod:`reproduce.studies.learnability_rules`) and ``--summary`` need neither.
"""
from __future__ import annotations

import copy
import json
import os
import resource
import time

import numpy as np

from reproduce.studies import learnability_rules as rules


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
        write_evalsets(out, seed=1, image_size=image_size, n_probe_test=1000, n_items=200, n_caption_train=100)
    return out


def probe(model, eval_dir: str, cache: str) -> dict[str, float]:
    """Top-1 (%) per synthetic probe task."""
    from mdc.data.transforms import image_transform
    from mdc.eval.probe import dataset_fns, probe_datasets

    size = model.config.image_size
    roots = {f"wds/{t}": os.path.join(eval_dir, "probe", t) for t in rules.TASKS}
    res = probe_datasets(model, dataset_fns(roots, image_transform(size, train=False)), cache_dir=cache,
                         transform_key=f"eval{size}")
    return {name.split("/")[1]: 100 * r["top1"] for name, r in res["datasets"].items()}


def run(name: str, objective: str, seed: int, out: str, workers: int = 1, lr: float | None = None) -> dict:
    """Pretrain ``objective`` with ``CONFIGS[name]`` (``lr`` in place of its recipe's) and probe it at 25%,
    50% and 100% of its steps (the learning curve) beside its random initialisation."""
    import torch

    import mdc
    from mdc.train import train

    cfg = rules.recipe(name, lr)
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
        row["curve"][quarter / 4] = float(np.mean([early[t] - row["random_init"][t] for t in rules.RULE["tasks"]]))
    row["curve"][1.0] = row["gap_mean4"]
    with open(os.path.join(out, "runs.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def beside_random_init(trained, random_init, eval_dir: str, cache: str) -> dict:
    """{"trained", "random_init": top-1 per task, "gap": their difference, "gap_mean4": its mean on the
    rule's tasks}."""
    row = {"trained": probe(trained, eval_dir, cache), "random_init": probe(random_init, eval_dir, cache)}
    row["gap"] = {t: row["trained"][t] - row["random_init"][t] for t in rules.TASKS}
    row["gap_mean4"] = float(np.mean([row["gap"][t] for t in rules.RULE["tasks"]]))
    return row


def probe_checkpoint(path: str, out: str) -> dict:
    """The study's probe of a model trained elsewhere, e.g. by
    ``python -m mdc.train --preset reproduce/presets/mini.json``: ``path`` (a checkpoint or run folder)
    beside its architecture at random initialisation (seeded with the run's training seed), on the
    held-out tasks at its resolution. Appends to ``probes.jsonl``."""
    import mdc
    from mdc.base.checkpoint import read_run_config
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


def scene_labels(scene: dict) -> list[int]:
    """The ceiling's targets of a scene: shape, colour and texture of its largest object, and its count."""
    from mdc.world.render import COLOURS, SHAPES, TEXTURES

    big = max(scene["objects"], key=lambda o: o["radius"])
    return [list(SHAPES).index(big["shape"]), list(COLOURS).index(big["colour"]),
            list(TEXTURES).index(big["texture"]), len(scene["objects"]) - 1]


def relation_label(scene: dict) -> int:
    """The relation ceiling's fifth target: where the largest object is relative to the smallest one
    (the relation probe's question, :data:`mdc.world.text.RELATIONS` index), -100 (ignored) for a scene
    of one object."""
    from mdc.world.text import RELATIONS, relation_of

    if len(scene["objects"]) < 2:
        return -100
    order = sorted(range(len(scene["objects"])), key=lambda k: scene["objects"][k]["radius"])
    return list(RELATIONS).index(relation_of(scene, order[-1], order[0]))


def ceiling_run(name: str, seed: int, out: str, lr: float | None = None, relation: bool = False) -> dict:
    """Train ``CONFIGS[name]``'s vision tower on the labels of the training scenes (the same scenes as
    the objectives' shards: world seed 0, rendered at the model's size and passed through the training
    transform), with its recipe (``lr`` in place of the recipe's: the ceiling's learning rate is chosen by
    its own training loss); probe it beside its random initialisation. ``relation`` adds a fifth head,
    :func:`relation_label` (the positive control of the relation probe): its row goes to
    ``ceiling_relation.jsonl`` and its weights to ``ceiling/NAME-sSEED-relation.pt`` (the tower of a
    ``mdc`` model of the config), so that other probes can read it."""
    import torch
    from PIL import Image

    import mdc
    from mdc.data.transforms import image_transform
    from mdc.base.optim import fit
    from mdc.world.render import COLOURS, SHAPES, TEXTURES, render_array
    from mdc.world.scenes import sample_scene
    from mdc.world.streams import STREAM_SCENE, stream_rng
    from mdc.world.text import MAX_OBJECTS, RELATIONS

    cfg = rules.recipe(name, lr)
    size = cfg["model"]["image_size"]
    eval_dir = evalsets(os.path.join(out, "data"), size)
    torch.manual_seed(seed)
    model = mdc.create_model("tiny", "mdc", **cfg["model"])  # a captioner's tower: GAP features, no CLS token
    random_init = copy.deepcopy(model)
    classes = (len(SHAPES), len(COLOURS), len(TEXTURES), MAX_OBJECTS) + ((len(RELATIONS),) if relation else ())
    heads = torch.nn.ModuleList(torch.nn.Linear(cfg["model"]["vision_width"], n) for n in classes)
    transform = image_transform(size, train=True, seed=seed)
    order = iter(np.random.default_rng(seed).permutation(cfg["steps"] * cfg["batch"]).reshape(cfg["steps"], -1))

    def next_batch():  # the next batch of training scenes: images [B, 3, S, S] and labels [B, 4]
        scenes = [sample_scene(stream_rng(0, STREAM_SCENE, int(i))) for i in next(order)]
        images = torch.stack([transform(Image.fromarray(render_array(sc, size))) for sc in scenes])
        labels = [scene_labels(sc) + ([relation_label(sc)] if relation else []) for sc in scenes]
        return images, torch.tensor(labels)

    def loss_fn(images, labels):  # a linear head per label on the GAP features [B, Dv]
        feats = model.encode_image(images)
        return sum(torch.nn.functional.cross_entropy(h(feats), labels[:, k]) for k, h in enumerate(heads))

    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    losses = fit(torch.nn.ModuleList([model.visual, heads]), next_batch, cfg["steps"], cfg["lr"], weight_decay=0.1,
                 warmup_steps=cfg["warmup"], loss_fn=loss_fn)  # the tower and the heads trained, the text decoder left
    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
    if relation:
        os.makedirs(os.path.join(out, "ceiling"), exist_ok=True)
        torch.save(model.state_dict(), os.path.join(out, "ceiling", f"{name}-s{seed}-relation.pt"))
    row = {"config": name, "objective": "labels+relation" if relation else "labels", "seed": seed, "wall_s": wall,
           "cpu_s": cpu, "final_loss": losses[-1], "losses_first_last10": [float(np.mean(losses[:10])),
                                                                           float(np.mean(losses[-10:]))],
           "recipe": cfg, **beside_random_init(model, random_init, eval_dir, os.path.join(out, "features"))}
    with open(os.path.join(out, "ceiling_relation.jsonl" if relation else "ceiling.jsonl"), "a") as f:
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

    cfg = rules.CONFIGS[name]
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

    cfg = rules.CONFIGS[name]
    data = shards(os.path.join(out, "data"), cfg["style"], cfg["model"]["image_size"], cfg["steps"] * cfg["batch"])
    loader = iter(make_loader(data, Tokenizer(64, vocabulary()), cfg["model"]["image_size"], cfg["batch"],
                              num_workers=workers, shuffle_buffer=2000))
    next(loader)  # start-up (workers, the shuffle buffer's first fill) not counted
    start = time.perf_counter()
    for _ in range(batches):
        next(loader)
    return batches * cfg["batch"] / (time.perf_counter() - start)
