"""What a pretraining run is: :class:`TrainConfig` (every field documented once, in its metadata:
the command line's ``--help`` is generated from it) and the check that a resumed run is the same run."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Literal

from mdc import checkpoint, optim
from mdc.train.stream import count_samples, vocab_from_captions


def option(default=dataclasses.MISSING, help: str | None = None, **cli) -> dataclasses.Field:
    """A :class:`TrainConfig` field documented by ``help``; ``cli`` adds command-line settings
    (``choices``, ``metavar``, ``one_of``: the name of a group of mutually exclusive flags)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass
class TrainConfig:
    """Arguments of :func:`mdc.train.train` (the CLI flags, with dashes as underscores).

    Every checkpoint stores the resolved configuration (``train_config.json``, plus the model's
    ``config.json``). ``resume`` continues only the same run: any difference outside
    ``RESUME_FREE`` (bookkeeping that does not change what is trained: resume, force_resume,
    save_every, log_every, keep_last, tensorboard, progress, compile, and output_dir, so that a run
    folder may be moved) is refused with a ``ValueError`` naming each field and both values;
    ``force_resume`` continues anyway and logs the differences.
    """

    # data and output
    train_data: str = option(help="shard pattern, e.g. 'DIR/{000000..000009}.tar' ('::' joins several), "
                                  "or a folder of .tar shards")
    output_dir: str = option(help="run folder: checkpoints/, metrics.jsonl, train_config.json")
    # model and objective
    model: str | None = option(None, "registry name (default: the preset's backbone, else tiny)")
    objective: Literal["mdc", "arc", "clip"] = option("mdc", "masked diffusion captioning, autoregressive "
                                                             "captioning or contrastive (CLIP)")
    model_overrides: dict | None = option(None, "extra ModelConfig fields (JSON on the command line), "
                                                "e.g. '{\"image_size\": 32}'")
    vocab_from_data: bool = option(False, "compact vocabulary = the BPE ids of the training captions (local "
                                          "shards), e.g. to train tiny on real data")
    # length, batch and optimizer
    preset: str | None = option(None, "paper hyperparameters of this backbone, or mini (the synthetic mini profile)",
                                choices=sorted(optim.PRESETS))
    steps: int | None = option(None, "optimizer steps (or give epochs)", one_of="length")
    epochs: int | None = option(None, "passes of samples_per_epoch samples (a preset's default: 32)", one_of="length")
    samples_per_epoch: int | None = option(None, "epoch size (default: counted in local shards)")
    resampled: bool = option(False, "draw shards with replacement (an infinite stream)")
    batch_size: int | None = option(None, "per process and micro-batch (default: the preset's, else 32)")
    global_batch: int | None = option(None, "batch x processes x accumulation (default: the preset's); "
                                            "e.g. CLIP-LB = 2x")
    accum_steps: int | None = option(None, "micro-batches per step (preset: global batch 1024 / "
                                           "(batch x processes))")
    lr: float | None = option(None, "peak learning rate (default: preset, else 5e-4)")
    weight_decay: float | None = option(None, "AdamW decay of weight matrices (default: preset, else 0.1)")
    warmup_steps: int | None = option(None, "linear warm-up steps (default: preset's 10000, else 5% of the steps)")
    grad_clip_norm: float | None = option(None, "gradient-norm clip (default: 1.0 for ARC with the vit-l-14 "
                                                "preset, else off)")
    # the MDC objective (None: the model's default)
    t_interval: tuple[float, float] | None = option(None, "MDC: t ~ U[W_L, W_U] (model default: 0.5 1.0)",
                                                    metavar=("W_L", "W_U"))
    time_weighting: bool = option(True, "MDC: the 1/t loss weight; off (--no-time-weighting) is the 'w/o t' ablation")
    mask_ratio: float | None = option(None, "MDC: fixed mask ratio (image-conditioned BERT)")
    t_sampling: Literal["uniform", "stratified"] | None = option(None, "MDC: how t is drawn across a batch")
    # randomness and data loading
    seed: int = option(0, "seed of the initial weights, the masks and noise, and the data order")
    workers: int = option(2, "DataLoader workers per process")
    shuffle_buffer: int = option(1000, "samples in each worker's shuffle buffer")
    # checkpoints and logs
    save_every: int = option(1000, "checkpoint every N steps (and at the end)")
    keep_last: int | None = option(None, "keep only the K newest checkpoints (default: all)", metavar="K")
    log_every: int = option(1, "metrics.jsonl / TensorBoard line every N steps")
    resume: bool = option(False, "continue from checkpoints/latest.json if present (the same run only)")
    force_resume: bool = option(False, "resume even if the checkpoint's run configuration differs (logs the "
                                       "differences)")
    # execution
    precision: Literal["auto", "fp32", "bf16"] = option("auto", "auto: bf16 autocast on CUDA, fp32 on CPU")
    compile: bool = option(False, "torch.compile the loss computation")
    tensorboard: bool = option(False, "also log to output_dir/tensorboard (if tensorboard is installed)")
    progress: bool = option(True, "a progress bar (rank 0); off (--no-progress) keeps notebooks' stored "
                                  "outputs short")

    def resolved(self, world_size: int) -> "TrainConfig":
        """A copy with every default filled in from the preset and checked against the world size.

        A warm-up as long as the run or longer (e.g. a preset's 10,000 steps in a short run) is an
        error, not silently clipped: the schedule would never reach its peak LR nor decay, so the
        caller must choose ``warmup_steps`` explicitly.
        """
        c = dataclasses.replace(self)
        if not c.train_data:
            raise ValueError("train_data is empty: give a shard pattern such as 'DIR/{000000..000009}.tar'")
        if os.path.isdir(c.train_data):  # a folder of shards: every .tar in it, in name order
            tars = sorted(glob.glob(os.path.join(c.train_data, "*.tar")))
            if not tars:
                raise ValueError(f"train_data {c.train_data!r} is a folder without .tar shards")
            c.train_data = "::".join(tars)
        if c.vocab_from_data:
            if "vocab" in (c.model_overrides or {}):
                raise ValueError("vocab_from_data builds the vocabulary from the training captions; "
                                 "drop 'vocab' from model_overrides or vocab_from_data")
            c.model_overrides = {**(c.model_overrides or {}), "vocab": vocab_from_captions(c.train_data)}
        paper = optim.preset_values(c.preset, c.objective) if c.preset else {}
        c.model = c.model or c.preset or "tiny"
        c.lr = c.lr if c.lr is not None else paper.get("lr", 5e-4)
        c.weight_decay = c.weight_decay if c.weight_decay is not None else paper.get("weight_decay", 0.1)
        if c.grad_clip_norm is None:
            c.grad_clip_norm = paper.get("grad_clip_norm")
        c.batch_size = c.batch_size or paper.get("batch_size", 32)
        per_step = c.batch_size * world_size
        target = c.global_batch or paper.get("global_batch")
        if target:
            what = f"preset {c.preset}" if c.preset and not c.global_batch else "global_batch"
            if target % per_step:
                raise ValueError(f"{what} needs a global batch of {target}, which is not "
                                 f"divisible by batch_size {c.batch_size} x world_size {world_size}")
            accum = target // per_step
            if c.accum_steps not in (None, accum):
                raise ValueError(f"{what}: batch_size {c.batch_size} x world_size {world_size} x "
                                 f"accum_steps {c.accum_steps} != global batch {target}; "
                                 f"use --accum-steps {accum} or leave it out")
            c.accum_steps = accum
        if c.preset and c.steps is None and c.epochs is None:  # the preset's length: steps or epochs
            c.steps, c.epochs = paper.get("steps"), paper.get("epochs") if "steps" not in paper else None
        c.accum_steps = c.accum_steps or 1
        if (c.steps is None) == (c.epochs is None):
            raise ValueError("give exactly one of steps or epochs")
        if c.epochs is not None:
            if c.samples_per_epoch is None:
                if c.resampled:
                    raise ValueError("a resampled stream has no epochs: give samples_per_epoch")
                c.samples_per_epoch = count_samples(c.train_data)
            c.steps = c.epochs * max(1, c.samples_per_epoch // (per_step * c.accum_steps))
        if c.warmup_steps is None:
            c.warmup_steps = paper.get("warmup_steps", round(0.05 * c.steps))
        if c.warmup_steps >= c.steps:  # the LR would never reach its peak nor decay
            raise ValueError(f"warmup_steps {c.warmup_steps} >= steps {c.steps}: the learning rate would never "
                             f"peak nor decay; give a shorter warm-up with --warmup-steps (e.g. "
                             f"{max(1, round(0.05 * c.steps))}) or train longer")
        if c.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16; got {c.precision!r}")
        if min(c.steps, c.batch_size, c.accum_steps, c.save_every, c.log_every) < 1:
            raise ValueError("steps, batch_size, accum_steps, save_every and log_every must be positive")
        if c.keep_last is not None and c.keep_last < 1:
            raise ValueError(f"keep_last must be at least 1 (or None to keep every checkpoint); got {c.keep_last}")
        return c


# TrainConfig fields that may differ between a run and its resumption (see TrainConfig).
RESUME_FREE = ("resume", "force_resume", "save_every", "log_every", "keep_last", "tensorboard", "progress",
               "compile", "output_dir")


def run_config(cfg: TrainConfig, world: int) -> dict:
    """What a checkpoint records of its run: the resolved config, the world size and the global batch."""
    return {**dataclasses.asdict(cfg), "world_size": world, "global_batch": cfg.batch_size * world * cfg.accum_steps}


def run_differences(saved: dict, now: dict) -> list[str]:
    """``"field: checkpoint A, now B"`` for every differing field outside ``RESUME_FREE``.

    Both sides are {"train": run_config, "model": ModelConfig fields}; dicts are compared per
    key (``model_overrides.text_layers``). A model-config field is only listed when no train
    field of the same name already explains it.
    """
    flat_saved, flat_now = (_flatten(json.loads(json.dumps(d))) for d in (saved, now))
    lines, named = [], set()
    for key in sorted(flat_saved.keys() | flat_now.keys(), key=lambda k: (k.startswith("model."), k)):
        a, b = flat_saved.get(key, "<unset>"), flat_now.get(key, "<unset>")
        leaf = key.split(".")[-1]
        if a == b or key.split(".")[1] in RESUME_FREE or (key.startswith("model.") and leaf in named):
            continue
        named.add(leaf)
        lines.append(f"{key.split('.', 1)[1] if key.startswith('train.') else key}: checkpoint {_show(a)}, now {_show(b)}")
    return lines


def _flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; model_overrides None counts as {} (no overrides)."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        elif not (key == "model_overrides" and value is None):
            out[prefix + key] = value
    return out


def _show(value) -> str:
    text = repr(value)
    if isinstance(value, (list, dict)) and len(text) > 60:
        text = f"{text[:50]}... ({len(value)} items)"
    return text


def check_same_run(cfg: TrainConfig, model_config, world: int, ckpt: str) -> list[str]:
    """Refuse to resume ``ckpt`` with a different run configuration (unless ``force_resume``).

    Returns the differences that ``force_resume`` lets through, for the caller to log.
    """
    saved = checkpoint.read_run_config(ckpt)
    hint = "pass force_resume=True (--force-resume) to continue it anyway, or use another output_dir"
    if saved is None:
        if cfg.force_resume:
            return [f"{ckpt} holds no train_config.json: its run configuration is unknown"]
        raise ValueError(f"cannot resume {ckpt}: it holds no train_config.json (written by an older version), "
                         f"so it cannot be checked to be the same run; {hint}")
    now = {"train": run_config(cfg, world), "model": json.loads(model_config.to_json())}
    diffs = run_differences(saved, now)
    if diffs and not cfg.force_resume:
        raise ValueError(f"{ckpt} belongs to a different run; resume continues only the same run. Differences:\n  "
                         + "\n  ".join(diffs) + f"\n{hint}")
    return diffs
