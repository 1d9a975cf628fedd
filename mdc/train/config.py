"""What a pretraining run is: :class:`TrainConfig` (every field documented once, in its metadata:
the command line's ``--help`` is generated from it) and the check that a resumed run is the same run."""
from __future__ import annotations

import dataclasses
import glob
import json
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

from mdc.absorbing import Masking
from mdc.base import checkpoint, optim
from mdc.base.errors import ConfigError, must
from mdc.factory import list_models, model_config
from mdc.train.stream import count_samples, vocab_from_captions


def option(default=dataclasses.MISSING, help: str | None = None, **cli) -> dataclasses.Field:
    """A :class:`TrainConfig` field documented by ``help``; ``cli`` adds command-line settings
    (``choices``, ``metavar``, ``one_of``: the name of a group of mutually exclusive flags) and
    the bound a given value must meet (``ge``: at least; ``gt``: more than)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass
class TrainConfig:
    """Arguments of :func:`mdc.train.train` (the CLI flags, with dashes as underscores).

    Every checkpoint stores the resolved configuration (``train_config.json``, plus the model's
    ``config.json``). ``resume`` continues only the same run: any difference outside
    ``RESUME_FREE`` (bookkeeping that does not change what is trained: resume, force_resume,
    save_every, log_every, keep_last, tensorboard, progress, compile, compile_mode and output_dir, so that a run
    folder may be moved; resume_from and stop_at, so that one run may be trained in pieces) is refused with a
    ``ValueError`` naming each field and both values;
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
    preset: str | None = option(None, "the paper's hyperparameters of a backbone ("
                                + ", ".join(sorted(optim.PRESETS)) + ") or the path of a preset JSON file "
                                "(mdc.base.optim.read_preset), e.g. reproduce/presets/mini.json", metavar="NAME_OR_FILE")
    steps: int | None = option(None, "optimizer steps (or give epochs)", one_of="length", ge=1)
    epochs: int | None = option(None, "passes of samples_per_epoch samples (a preset's default: 32)", one_of="length",
                                ge=1)
    samples_per_epoch: int | None = option(None, "epoch size (default: counted in local shards)", ge=1)
    resampled: bool = option(False, "draw shards with replacement (an infinite stream)")
    batch_size: int | None = option(None, "per process and micro-batch (default: the preset's, else 32)", ge=1)
    global_batch: int | None = option(None, "batch x processes x accumulation (default: the preset's); "
                                            "e.g. CLIP-LB = 2x", ge=1)
    accum_steps: int | None = option(None, "micro-batches per step (preset: global batch 1024 / "
                                           "(batch x processes))", ge=1)
    lr: float | None = option(None, "peak learning rate (default: preset, else 5e-4)", gt=0)
    weight_decay: float | None = option(None, "AdamW decay of weight matrices (default: preset, else 0.1)", ge=0)
    warmup_steps: int | None = option(None, "linear warm-up steps (default: preset's 10000, else 5% of the steps)",
                                      ge=0)
    grad_clip_norm: float | None = option(None, "gradient-norm clip (default: 1.0 for ARC with the vit-l-14 "
                                                "preset, else off)", gt=0)
    # the MDC objective (None: the model's default)
    t_interval: tuple[float, float] | None = option(None, "MDC: t ~ U[W_L, W_U] (model default: 0.5 1.0)",
                                                    metavar=("W_L", "W_U"))
    time_weighting: bool = option(True, "MDC: the 1/t loss weight; off (--no-time-weighting) is the 'w/o t' ablation")
    mask_ratio: float | None = option(None, "MDC: fixed mask ratio (image-conditioned BERT)")
    t_sampling: Literal["uniform", "antithetic", "stratified"] | None = option(None, "MDC: how t is drawn across a batch")
    # randomness and data loading
    seed: int = option(0, "seed of the initial weights, the masks and noise, and the data order", ge=0)
    workers: int = option(2, "DataLoader workers per process (0: load in the training process)", ge=0)
    shuffle_buffer: int = option(1000, "samples in each worker's shuffle buffer (1: no shuffling)", ge=1)
    draft_decode: bool = option(True, "decode a JPEG at the smallest DCT scale its training crop allows (PIL's "
                                      "draft mode); off (--no-draft-decode) decodes every JPEG whole")
    # checkpoints and logs
    save_every: int = option(1000, "checkpoint every N steps (and at the end)", ge=1)
    keep_last: int | None = option(None, "keep only the K newest checkpoints (default: all)", metavar="K", ge=1)
    log_every: int = option(1, "metrics.jsonl / TensorBoard line every N steps", ge=1)
    resume: bool = option(False, "continue from checkpoints/latest.json if present (the same run only)")
    resume_from: str | None = option(None, "continue the same run from this checkpoint (or run) folder of another "
                                           "output_dir, where output_dir has none of its own (with --resume)",
                                     metavar="FOLDER")
    stop_at: int | None = option(None, "end the run after this step of its schedule (a checkpoint there); "
                                       "--resume-from continues it in another folder", ge=1)
    force_resume: bool = option(False, "resume even if the checkpoint's run configuration differs (logs the "
                                       "differences)")
    # execution
    precision: Literal["auto", "fp32", "bf16"] = option("auto", "auto: bf16 autocast on CUDA, fp32 on CPU")
    compile: bool = option(False, "torch.compile each step's forward and backward whole (one graph: a graph break is "
                                  "an error); caption lengths come in multiples of 16")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = option(
        "default", "with --compile: inductor's mode; reduce-overhead replays CUDA graphs of the step (CUDA)")
    tensorboard: bool = option(False, "also log to output_dir/tensorboard (if tensorboard is installed)")
    progress: bool = option(True, "a progress bar (rank 0); off (--no-progress) keeps notebooks' stored "
                                  "outputs short")

    def captures_graphs(self) -> bool:
        """Does the step replay CUDA graphs? inductor captures them with ``reduce-overhead`` and with
        ``max-autotune`` alike."""
        return self.compile and self.compile_mode in ("reduce-overhead", "max-autotune")

    def resolved(self, world_size: int) -> "TrainConfig":
        """A copy with every default filled in from the preset and checked against the world size.

        Every value given is checked first and a bad one is refused with a :class:`ConfigError`
        naming the option and the value (see :func:`check_values`); a default never replaces a
        value the caller gave (``batch_size=0`` is an error, not 32). A warm-up as long as the run
        or longer (e.g. a preset's 10,000 steps in a short run) is an error, not silently clipped:
        the schedule would never reach its peak LR nor decay, so the caller must choose
        ``warmup_steps`` explicitly.
        """
        c = dataclasses.replace(self)
        check_values(c)
        _fill_data(c)
        paper = optim.preset_values(c.preset, c.objective) if c.preset else {}
        c.model = c.model or paper.get("model") or "tiny"
        check_model(c)
        c.lr = c.lr if c.lr is not None else paper.get("lr", 5e-4)
        c.weight_decay = c.weight_decay if c.weight_decay is not None else paper.get("weight_decay", 0.1)
        if c.grad_clip_norm is None:
            c.grad_clip_norm = paper.get("grad_clip_norm")
        _fill_batch(c, paper, world_size)
        _fill_length(c, paper, world_size)
        return c


def _fill_data(c: TrainConfig) -> None:
    """A folder of shards becomes its .tar files in name order; ``vocab_from_data`` becomes the
    ``vocab`` model override."""
    if os.path.isdir(c.train_data):
        tars = sorted(glob.glob(os.path.join(c.train_data, "*.tar")))
        if not tars:
            raise ConfigError(f"train_data {c.train_data!r} is a folder without .tar shards", "train_data")
        c.train_data = "::".join(tars)
    if c.vocab_from_data:
        if "vocab" in (c.model_overrides or {}):
            raise ConfigError("vocab_from_data builds the vocabulary from the training captions; "
                              "drop 'vocab' from model_overrides or vocab_from_data",
                              "vocab_from_data", "model_overrides")
        c.model_overrides = {**(c.model_overrides or {}), "vocab": vocab_from_captions(c.train_data)}


def _fill_batch(c: TrainConfig, paper: dict, world_size: int) -> None:
    """``batch_size`` and ``accum_steps``: a global batch (given, or the preset's) must be the batch x
    world size x accumulation steps."""
    if c.batch_size is None:
        c.batch_size = paper.get("batch_size", 32)
    per_step = c.batch_size * world_size
    target = c.global_batch if c.global_batch is not None else paper.get("global_batch")
    if target:
        what = f"preset {c.preset}" if c.preset and c.global_batch is None else "global_batch"
        names = ("global_batch", "batch_size", "accum_steps")
        if target % per_step:
            raise ConfigError(f"{what} needs a global batch of {target}, which is not "
                              f"divisible by batch_size {c.batch_size} x world_size {world_size}", *names)
        accum = target // per_step
        if c.accum_steps not in (None, accum):
            raise ConfigError(f"{what}: batch_size {c.batch_size} x world_size {world_size} x "
                              f"accum_steps {c.accum_steps} != global batch {target}; "
                              f"use --accum-steps {accum} or leave it out", *names)
        c.accum_steps = accum
    if c.accum_steps is None:
        c.accum_steps = 1


def _fill_length(c: TrainConfig, paper: dict, world_size: int) -> None:
    """``steps`` (given, from ``epochs``, or the preset's length) and the warm-up, which must be shorter."""
    if c.preset and c.steps is None and c.epochs is None:  # the preset's length: steps or epochs
        c.steps, c.epochs = paper.get("steps"), paper.get("epochs") if "steps" not in paper else None
    if (c.steps is None) == (c.epochs is None):
        raise ConfigError("give exactly one of steps or epochs", "steps", "epochs")
    if c.epochs is not None:
        if c.samples_per_epoch is None:
            if c.resampled:
                raise ConfigError("a resampled stream has no epochs: give samples_per_epoch",
                                  "samples_per_epoch")
            c.samples_per_epoch = count_samples(c.train_data)
        c.steps = c.epochs * max(1, c.samples_per_epoch // (c.batch_size * world_size * c.accum_steps))
    if c.warmup_steps is None:
        c.warmup_steps = paper.get("warmup_steps", round(0.05 * c.steps))
    if c.warmup_steps >= c.steps:  # the LR would never reach its peak nor decay
        raise ConfigError(f"warmup_steps {c.warmup_steps} >= steps {c.steps}: the learning rate would never "
                          f"peak nor decay; give a shorter warm-up with --warmup-steps (e.g. "
                          f"{max(1, round(0.05 * c.steps))}) or train longer", "warmup_steps", "steps")
    if c.stop_at is not None and c.stop_at > c.steps:
        raise ConfigError(f"stop_at {c.stop_at} is past the schedule's last step {c.steps}", "stop_at", "steps")


# model_overrides may not set what has an option of its own (or is the objective).
OWN_OPTIONS = ("objective", "name", "t_interval", "time_weighting", "mask_ratio", "t_sampling")


def check_values(c: TrainConfig) -> None:
    """Refuse (:class:`ConfigError`) any given value of the wrong type, outside its bound (the
    fields' ``ge`` / ``gt``), not among its choices, or contradicting another option."""
    if not c.train_data:
        raise ConfigError("train_data is empty: give a shard pattern such as 'DIR/{000000..000009}.tar'",
                          "train_data")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        name, value = f.name, getattr(c, f.name)
        hint = hints[name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            if type(None) in typing.get_args(hint):  # an optional value left out
                continue
            raise must(name, value, "given")
        kind = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
        choices = f.metadata.get("choices") or \
            (typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None)
        if choices is not None:
            if value not in choices:
                raise must(name, value, "one of " + ", ".join(map(repr, choices)))
        elif kind is bool and not isinstance(value, bool):
            raise must(name, value, "True or False")
        elif kind is int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise must(name, value, "an integer")
        elif kind is float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise must(name, value, "a number")
        elif kind is float and not math.isfinite(value):
            raise must(name, value, "a finite number")
        elif kind is str and not isinstance(value, str):
            raise must(name, value, "a string")
        elif kind is str and not value:
            raise ConfigError(f"{name} must not be empty", name)
        elif kind is dict and not isinstance(value, dict):
            raise must(name, value, "a dict (a JSON object)")
        if "ge" in f.metadata and value < f.metadata["ge"]:
            raise must(name, value, f">= {f.metadata['ge']}")
        if "gt" in f.metadata and not value > f.metadata["gt"]:
            raise must(name, value, f"> {f.metadata['gt']}")
    if c.preset is not None and c.preset not in optim.PRESETS and not os.path.isfile(c.preset):
        raise must("preset", c.preset, "one of " + ", ".join(map(repr, sorted(optim.PRESETS)))
                   + " or the path of a JSON file of training values")
    given = dict(interval=c.t_interval, ratio=c.mask_ratio, sampling=c.t_sampling)
    try:  # the masking ratio's own rules (mdc.absorbing.Masking), each message naming its option
        Masking(**{k: v for k, v in given.items() if v is not None})
    except ValueError as exn:
        raise ConfigError(str(exn), str(exn).split()[0]) from exn
    if c.force_resume and not c.resume:
        raise ConfigError("force_resume continues a run that resume finds; it needs resume", "force_resume",
                          "resume")
    clash = sorted(set(c.model_overrides or {}) & set(OWN_OPTIONS))
    if clash:
        raise ConfigError(f"model_overrides sets {clash[0]}, which has its own option: give it there",
                          "model_overrides")


def check_model(c: TrainConfig) -> None:
    """Refuse an unknown model or a model configuration it cannot build (widths that the head count
    does not divide, sizes below 1, ...), before anything runs."""
    if c.model not in list_models():
        raise must("model", c.model, "one of " + ", ".join(map(repr, list_models())))
    try:
        model_config(c.model, c.objective, **model_options(c))
    except (ValueError, TypeError) as exn:
        raise ConfigError(f"model_overrides: {exn}", "model_overrides") from exn


def model_options(c: TrainConfig) -> dict:
    """The ModelConfig fields a run sets: its objective options (those given) and model_overrides."""
    given = dict(t_interval=c.t_interval, mask_ratio=c.mask_ratio, t_sampling=c.t_sampling)
    return {"time_weighting": c.time_weighting, **{k: v for k, v in given.items() if v is not None},
            **(c.model_overrides or {})}


# TrainConfig fields that may differ between a run and its resumption (see TrainConfig).
RESUME_FREE = ("resume", "force_resume", "save_every", "log_every", "keep_last", "tensorboard", "progress",
               "compile", "compile_mode", "output_dir", "resume_from", "stop_at")


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
    defaults = {f.name: f.default for f in dataclasses.fields(model_config) if f.default is not dataclasses.MISSING}
    saved["model"] = json.loads(json.dumps(defaults)) | saved["model"]  # a field it predates: its default
    now = {"train": run_config(cfg, world), "model": json.loads(model_config.to_json())}
    diffs = run_differences(saved, now)
    if diffs and not cfg.force_resume:
        raise ValueError(f"{ckpt} belongs to a different run; resume continues only the same run. Differences:\n  "
                         + "\n  ".join(diffs) + f"\n{hint}")
    return diffs
