"""Pretraining: one loop for MDC, ARC and CLIP, from a laptop CPU to multi-node DDP.

    python -m mdc.train --model tiny --objective mdc --train-data 'DIR/{000000..000009}.tar' \\
        --steps 200 --batch-size 32 --lr 5e-4 --output-dir runs/x [--resume]
    torchrun --nproc_per_node=8 -m mdc.train --preset vit-b-16 --objective mdc ...   # same flags

or from Python / a notebook: ``mdc.train.train(train_data=..., steps=200, output_dir=...)``.

One optimizer step consumes ``accum_steps`` micro-batches of ``batch_size`` images on each of
``world_size`` processes (global batch = their product), with one mask draw per micro-batch.
Resuming (``--resume``) is exact: the checkpoint holds the optimizer, the LR schedule, every
rank's RNG states and data-stream position, and the loader replays the stream from the next
batch (see :mod:`mdc.data.pipeline`), so a killed and resumed run ends with the same weights
as an uninterrupted one (bitwise on CPU; on GPU up to the kernels' own nondeterminism). It
continues only the same run: a different configuration is refused (see :class:`TrainConfig`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import logging
import os
import random
import tarfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from mdc import checkpoint, optim
from mdc.data.pipeline import SKIP_REASONS, SkipStats, StreamPosition, iterate_batches, make_loader
from mdc.factory import create_model, load_weights
from mdc.tokenizer import TextStats, Tokenizer

logger = logging.getLogger(__name__)

# One warning when more than UNK_WARN_RATE of the caption tokens seen so far (at least
# UNK_WARN_MIN_TOKENS of them) fall outside a compact vocabulary and become [UNK].
UNK_WARN_RATE, UNK_WARN_MIN_TOKENS = 0.01, 250
TEXT_FIELDS = tuple(TextStats().as_dict())  # captions, tokens, unknown, truncated


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


@dataclass
class TrainConfig:
    """Arguments of :func:`train` (the CLI flags, with dashes as underscores).

    Every checkpoint stores the resolved configuration (``train_config.json``, plus the model's
    ``config.json``). ``resume`` continues only the same run: any difference outside
    ``RESUME_FREE`` (bookkeeping that does not change what is trained: resume, force_resume,
    save_every, log_every, keep_last, tensorboard, progress, compile, and output_dir, so that a run
    folder may be moved) is refused with a ``ValueError`` naming each field and both values;
    ``force_resume`` continues anyway and logs the differences.
    """

    train_data: str  # shard pattern "DIR/{000000..000009}.tar" ("::" joins several), or a folder of .tar shards
    output_dir: str  # checkpoints/, metrics.jsonl, train_config.json
    model: str | None = None  # registry name; default: the preset's backbone, else "tiny"
    objective: str = "mdc"  # "mdc" | "arc" | "clip"
    model_overrides: dict | None = None  # extra ModelConfig fields, e.g. {"image_size": 32}
    vocab_from_data: bool = False  # compact vocabulary = the BPE ids of the training captions (local shards)
    preset: str | None = None  # paper hyperparameters of a backbone (vit-b-32 | vit-b-16 | vit-l-14), or mini
    steps: int | None = None  # optimizer steps; or give epochs
    epochs: int | None = None  # passes of samples_per_epoch samples (preset default: 32)
    samples_per_epoch: int | None = None  # default: counted in the (local) shards
    resampled: bool = False  # draw shards with replacement (an infinite stream)
    batch_size: int | None = None  # per process and micro-batch (default: the preset's, else 32)
    global_batch: int | None = None  # batch x world x accumulation (default: the preset's); e.g. CLIP-LB = 2x
    accum_steps: int | None = None  # micro-batches per step; preset: global batch 1024 / (batch x world)
    lr: float | None = None  # peak learning rate (default: preset, else 5e-4)
    weight_decay: float | None = None  # AdamW decay of weight matrices (default: preset, else 0.1)
    warmup_steps: int | None = None  # linear warmup (default: preset's 10,000, else 5% of the steps)
    grad_clip_norm: float | None = None  # default: 1.0 for ARC with the vit-l-14 preset, else none
    t_interval: tuple[float, float] | None = None  # MDC: t ~ U[w_l, w_u] (model default (0.5, 1.0))
    time_weighting: bool = True  # MDC: 1/t loss weight; False = the "w/o t" ablation
    mask_ratio: float | None = None  # MDC: fixed mask ratio (image-conditioned BERT)
    t_sampling: str | None = None  # MDC: "uniform" | "stratified"
    seed: int = 0
    workers: int = 2  # DataLoader workers per process
    shuffle_buffer: int = 1000  # samples in each worker's shuffle buffer
    save_every: int = 1000  # checkpoint every N steps (and at the end)
    keep_last: int | None = None  # keep only the K newest checkpoints (None: all)
    log_every: int = 1  # metrics.jsonl / TensorBoard line every N steps
    resume: bool = False  # continue from checkpoints/latest.json if present (the same run only)
    force_resume: bool = False  # resume even if the checkpoint's run configuration differs (warns)
    precision: str = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU) | "fp32" | "bf16"
    compile: bool = False  # torch.compile the loss computation
    tensorboard: bool = False  # also log to output_dir/tensorboard (if tensorboard is installed)
    progress: bool = True  # the progress bar (rank 0); False keeps notebooks' stored outputs short

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


def vocab_from_captions(urls: str) -> list[int]:
    """The sorted BPE ids of every ``.txt`` caption in local shards (no image is read).

    Under this compact vocabulary no training caption has an unknown token: the ids come
    from the model tokenizer's own ``encode`` (so a caption's literal "<end_of_text>" counts
    as text, as in training). Used as the ``vocab`` model override by ``vocab_from_data``:
    the way to train ``tiny`` (whose default vocabulary is the synthetic world's) on real
    captions. Every process reads all captions once.
    """
    import webdataset as wds

    from mdc.data.stats import iter_captions

    paths = wds.shardlists.expand_urls(urls)
    for url in paths:
        if not os.path.isfile(url):
            raise ValueError(f"vocab_from_data reads the captions of local shards; {url!r} is not a local file")
    bpe, ids = Tokenizer(), set()
    for text in iter_captions(paths):
        ids.update(bpe.encode(text.strip()))
    return sorted(ids)


def count_samples(urls: str) -> int:
    """Samples in local tar shards: the epoch size when none is given.

    A shard with img2dataset's ``NAME_stats.json`` beside ``NAME.tar`` counts its ``successes``
    (the samples img2dataset wrote) without opening the tar; any other counts the distinct member
    keys in its tar headers. Under DDP rank 0 counts and broadcasts the number (or its error).
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return _count_local(urls)
    result = [None]
    if dist.get_rank() == 0:
        try:
            result = [_count_local(urls)]
        except Exception as exn:  # every rank raises it, none waits for a number
            result = [exn]
    dist.broadcast_object_list(result, src=0)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _count_local(urls: str) -> int:
    import webdataset as wds
    from webdataset.tariterators import base_plus_ext

    total = 0
    for url in wds.shardlists.expand_urls(urls):
        if not os.path.isfile(url):
            raise ValueError(f"cannot count the samples of {url!r} (not a local file): give samples_per_epoch")
        stats = os.path.splitext(url)[0] + "_stats.json"
        if os.path.isfile(stats):
            with open(stats) as f:
                total += int(json.load(f)["successes"])
            continue
        with tarfile.open(url) as tar:
            total += len({base_plus_ext(m.name)[0] for m in tar if m.isfile()})
    return total


class DataStream:
    """A rank's endless batch stream: pass after pass (data epochs) over the shards.

    ``state_dict()`` (epoch, loader position, skip and caption counts) restores the stream so that the
    next batch is exactly the one that would have come next. Loaders are created under
    ``fork_rng`` because a DataLoader iterator draws its base seed from the global torch
    RNG, which must stay a function of the training steps alone.

    Under DDP the ranks' splits of a pass may hold different numbers of batches; the ranks
    still change data epochs together: for every micro-batch they agree (one all_reduce,
    MIN) that each of them has one, and when any rank's pass has ended all of them start
    the next epoch, dropping what the others had left of that pass (as ``drop_last`` does).
    The epoch counter is therefore the same on all ranks, and no shard is read twice in an
    epoch. (A resampled stream never ends: no agreement is needed.)
    """

    def __init__(self, cfg: TrainConfig, tokenizer, image_size: int, state: dict | None = None, world: int = 1,
                 device: torch.device = torch.device("cpu")):
        self.cfg, self.tokenizer, self.image_size = cfg, tokenizer, image_size
        self.world, self.device = world, device
        self.epoch = state["epoch"] if state else 0
        self.stats = SkipStats(dict(state["skipped"])) if state else SkipStats()
        self.text = TextStats(**state["text"]) if state and "text" in state else TextStats()  # running totals
        self._open(state["position"] if state else None)
        self._fresh = state is None  # no batch taken from this pass yet

    def _open(self, position: dict | None) -> None:
        c = self.cfg
        loader = make_loader(c.train_data, self.tokenizer, self.image_size, c.batch_size, num_workers=c.workers,
                             train=True, seed=c.seed, epoch=self.epoch, resampled=c.resampled,
                             shuffle_buffer=c.shuffle_buffer, partial=False, resume=position,
                             pin_memory=torch.cuda.is_available())
        self.position = StreamPosition.from_state_dict(position) if position else StreamPosition(c.workers)
        with torch.random.fork_rng(devices=[]):
            self._batches = iterate_batches(iter(loader), self.stats, self.position, self.text)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(images [B, 3, H, W], tokens [B, L]); all ranks start the next data epoch when one's pass ends."""
        while True:
            batch = next(self._batches, None)
            if self._all_have(batch is not None):
                self._fresh = False
                return batch
            if self._fresh:
                raise RuntimeError(f"a full pass over {self.cfg.train_data!r} gave a process no batch of "
                                   f"{self.cfg.batch_size} good samples (this process skipped: "
                                   f"{self.stats.as_dict()}); each process x worker needs at least that many")
            self.epoch += 1
            self._open(None)
            self._fresh = True

    def _all_have(self, have: bool) -> bool:
        """Does every rank have a batch? (MIN over ranks; the same answer on all of them.)"""
        if self.world == 1 or self.cfg.resampled:
            return have
        flag = torch.tensor([int(have)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position.state_dict(), "skipped": self.stats.as_dict(),
                "text": self.text.as_dict()}


class LossModule(nn.Module):
    """``forward`` = ``model.loss``, so that DDP's gradient hooks fire on the training objective."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, **kw) -> torch.Tensor:
        return self.model.loss(images, tokens, **kw)


def accumulate(net: nn.Module, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
               ddp: nn.Module | None = None, autocast=contextlib.nullcontext) -> torch.Tensor:
    """Forward and backward of one optimizer step over K micro-batches; returns the step's loss.

    ``net`` is the (DDP-wrapped, compiled) :class:`LossModule` of ``model``; with ``ddp``,
    gradients are all-reduced only in the last micro-step (``no_sync`` before).

    Captioners: each micro-batch loss is backpropagated divided by K (gradient of the mean);
    the returned loss is the mean. CLIP (K > 1): the global batch is contrasted, as open_clip's
    ``accum_freq``: first the embeddings of all micro-batches are computed without gradient
    and cached; then for each micro-batch j its embeddings are recomputed with gradient and
    spliced into the cache, the loss over all of them (gathered across ranks) is
    backpropagated *undivided*: micro-step j yields exactly the part of the full-batch
    gradient that flows through micro-batch j, so the K parts sum to the one-big-batch
    gradient. Unlike open_clip, the learned temperature gets its gradient once: it is live in
    the last micro-step (the one DDP synchronises, where every parameter must take part) and
    detached in the others. The returned loss is that full-batch loss. Recomputation assumes
    a deterministic forward (no dropout). ``batches`` are [(images [B,3,H,W], tokens [B,L])].
    """
    K = len(batches)

    def sync(j: int):
        return ddp.no_sync() if ddp is not None and j < K - 1 else contextlib.nullcontext()

    if getattr(model.config, "objective", None) == "clip" and K > 1:
        with torch.no_grad(), autocast():
            cached = list(zip(*(model(images, tokens)[:2] for images, tokens in batches)))  # 2 x K x [B, E]
        for j, (images, tokens) in enumerate(batches):
            with sync(j):
                with autocast():
                    loss = net(images, tokens, cached=cached, index=j, live_scale=j == K - 1)
                loss.backward()
        return loss.detach().float()
    total = torch.zeros((), device=batches[0][0].device)
    for j, (images, tokens) in enumerate(batches):
        with sync(j):
            with autocast():
                loss = net(images, tokens)
            (loss / K).backward()
        total += loss.detach().float()
    return total / K


def setup_distributed() -> tuple[int, int, torch.device, bool]:
    """(rank, world_size, device, created): joins the torchrun process group if the env defines one."""
    created = False
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        created = True
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return rank, world, device, created


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _gather(obj, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def train(**kwargs) -> dict:
    """Pretrain a model; returns {checkpoint, steps, final_loss, metrics, skipped, ...}.

    Keyword arguments are the fields of :class:`TrainConfig`. Every process of a torchrun job
    calls it; rank 0 writes the checkpoints and logs.
    """
    rank, world, device, created = setup_distributed()
    try:
        return _train(TrainConfig(**kwargs).resolved(world), rank, world, device)
    finally:
        if created:
            dist.destroy_process_group()


def _train(cfg: TrainConfig, rank: int, world: int, device: torch.device) -> dict:
    from tqdm.auto import tqdm

    os.makedirs(cfg.output_dir, exist_ok=True)
    seed_everything(cfg.seed)  # identical initial weights on every rank
    objective_opts = dict(t_interval=cfg.t_interval, mask_ratio=cfg.mask_ratio, t_sampling=cfg.t_sampling)
    overrides = {k: v for k, v in objective_opts.items() if v is not None}
    model = create_model(cfg.model, cfg.objective, time_weighting=cfg.time_weighting,
                         **overrides, **(cfg.model_overrides or {})).to(device)
    optimizer = optim.make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = optim.make_scheduler(optimizer, cfg.warmup_steps, cfg.steps)

    last_ckpt = checkpoint.latest(cfg.output_dir) if cfg.resume else None
    state, step = None, 0
    if last_ckpt:
        state = checkpoint.load_trainer_state(last_ckpt)
        if state["world_size"] != world:
            raise ValueError(f"{last_ckpt} was written by {state['world_size']} processes; resuming exactly "
                             f"needs the same number, not {world}")
        forced = check_same_run(cfg, model.config, world, last_ckpt)
        if forced and rank == 0:
            logger.warning("force_resume: continuing %s despite these differences:\n  %s", last_ckpt,
                           "\n  ".join(forced))
        load_weights(model, last_ckpt)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
    stream = DataStream(cfg, model.tokenizer, model.config.image_size, state["data"][rank] if state else None,
                        world, device)
    if state:
        checkpoint.set_rng_state(state["rng"][rank])
    else:  # a different mask/noise stream per rank
        seed_everything(int(np.random.SeedSequence([cfg.seed, rank]).generate_state(1)[0]))

    net = ddp = LossModule(model)
    if world > 1:
        net = ddp = nn.parallel.DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:  # caption lengths bucketed to multiples of 16: a handful of shapes, not one per batch
        model.trim_multiple = 16
        net = torch.compile(net)
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    global_batch = cfg.batch_size * world * cfg.accum_steps
    if rank == 0:
        checkpoint.atomic_write_text(os.path.join(cfg.output_dir, "train_config.json"),
                                     json.dumps(run_config(cfg, world), indent=1))
    log = checkpoint.MetricsLog(cfg.output_dir, step, cfg.tensorboard) if rank == 0 else None
    bar = tqdm(total=cfg.steps, initial=step, disable=rank != 0 or not cfg.progress, desc=f"{cfg.objective} {cfg.model}",
               dynamic_ncols=True)
    loss_value, speeds, warned = float("nan"), [], False
    model.train()
    try:
        while step < cfg.steps:
            start = time.perf_counter()
            batches = [tuple(x.to(device, non_blocking=True) for x in stream.next()) for _ in range(cfg.accum_steps)]
            loss = accumulate(net, model, batches, ddp if world > 1 else None, autocast)
            # the step's loss averaged over ranks, the skip and caption counts of all ranks: [1 + reasons + text]
            report = _all_sum([loss.item()] + _skip_counts(stream.stats) + _text_counts(stream.text), world, device)
            text = _text_stats(report[1 + len(SKIP_REASONS):])
            loss_value = report[0] / world
            step += 1
            if not np.isfinite(loss_value):
                raise NonFiniteLossError(f"loss is {loss_value} at step {step}; last good checkpoint: "
                                         f"{last_ckpt or 'none written yet'}")
            if cfg.grad_clip_norm:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip_norm)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            speeds.append(global_batch / (time.perf_counter() - start))
            if rank == 0:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", img_s=f"{speeds[-1]:.1f}", lr=f"{lr:.2e}",
                                **({"unk": f"{text.unknown_rate:.1%}"} if model.tokenizer.vocab is not None else {}))
                if step % cfg.log_every == 0 or step == cfg.steps:
                    log.write({"step": step, "epoch": stream.epoch, "loss": loss_value, "lr": lr,
                               "images_per_s": speeds[-1], "skipped": _skip_dict(report[1 : 1 + len(SKIP_REASONS)]),
                               "unk_rate": text.unknown_rate, "truncated": text.truncated})
                if not warned and text.tokens >= UNK_WARN_MIN_TOKENS and text.unknown_rate > UNK_WARN_RATE:
                    warned = True
                    logger.warning("%.1f%% of the caption tokens so far (%d of %d) are unknown to the model's compact "
                                   "vocabulary and became [UNK]; build the vocabulary from the training captions "
                                   "with --vocab-from-data (vocab_from_data=True)", 100 * text.unknown_rate,
                                   text.unknown, text.tokens)
            if step % cfg.save_every == 0 or step == cfg.steps:
                last_ckpt = _save(cfg, step, model, optimizer, scheduler, stream, rank, world)
    finally:
        bar.close()
        if log is not None:
            log.close()
    metrics = os.path.join(cfg.output_dir, "metrics.jsonl")
    if not speeds:  # nothing left to do: report the finished run's last logged loss
        with open(metrics) as f:
            loss_value = json.loads(f.readlines()[-1])["loss"]
    totals = _all_sum(_skip_counts(stream.stats) + _text_counts(stream.text), world, device)
    skipped, text = _skip_dict(totals), _text_stats(totals[len(SKIP_REASONS):])
    return {"checkpoint": last_ckpt, "steps": step, "final_loss": loss_value, "metrics": metrics, "skipped": skipped,
            "unk_rate": text.unknown_rate, "truncated": text.truncated,
            "images_per_s": float(np.mean(speeds)) if speeds else None, "world_size": world,
            "global_batch": global_batch, "output_dir": cfg.output_dir}


def _skip_counts(stats: SkipStats) -> list[int]:
    return [stats.counts.get(reason, 0) for reason in SKIP_REASONS]


def _skip_dict(counts: list[float]) -> dict[str, int]:
    return {reason: int(n) for reason, n in zip(SKIP_REASONS, counts) if n}


def _text_counts(text: TextStats) -> list[int]:
    return [getattr(text, name) for name in TEXT_FIELDS]


def _text_stats(counts: list[float]) -> TextStats:
    return TextStats(**{name: int(n) for name, n in zip(TEXT_FIELDS, counts)})


def _all_sum(values: list[float], world: int, device: torch.device) -> list[float]:
    """Element-wise sum over ranks (one small all_reduce)."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _save(cfg, step, model, optimizer, scheduler, stream, rank, world) -> str:
    """Collect every rank's RNG and stream state; rank 0 writes the checkpoint. Returns its folder."""
    rngs = _gather(checkpoint.rng_state(), world)
    data = _gather(stream.state_dict(), world)
    path = os.path.join(cfg.output_dir, "checkpoints", f"step_{step:06d}")
    if rank == 0:
        path = checkpoint.save(cfg.output_dir, step, model, {
            "step": step, "world_size": world, "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "rng": rngs, "data": data},
            run_config=run_config(cfg, world), keep_last=cfg.keep_last)
    if world > 1:
        dist.barrier()
    return path


def parse_args(argv: list[str] | None = None) -> dict:
    """CLI flags (open_clip style) -> keyword arguments of :func:`train`."""
    p = argparse.ArgumentParser(prog="python -m mdc.train", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train-data", required=True,
                   help="shard pattern, e.g. 'DIR/{000000..000009}.tar', or a folder of .tar shards")
    p.add_argument("--output-dir", required=True, help="run folder: checkpoints/, metrics.jsonl")
    p.add_argument("--model", help="registry name (default: the preset's backbone, else tiny)")
    p.add_argument("--objective", default="mdc", choices=["mdc", "arc", "clip"])
    p.add_argument("--model-overrides", type=json.loads, help='JSON of ModelConfig fields, e.g. \'{"image_size": 32}\'')
    p.add_argument("--vocab-from-data", action="store_true",
                   help="compact vocabulary from the training captions (local shards), e.g. to train tiny on real data")
    p.add_argument("--preset", choices=sorted(optim.PRESETS),
                   help="paper hyperparameters of this backbone, or mini (the synthetic mini profile)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="optimizer steps")
    length.add_argument("--epochs", type=int, help="epochs of --samples-per-epoch samples")
    p.add_argument("--samples-per-epoch", type=int, help="epoch size (default: counted in local shards)")
    p.add_argument("--resampled", action="store_true", help="draw shards with replacement (infinite stream)")
    p.add_argument("--batch-size", type=int, help="per process and micro-batch (default: the preset's, else 32)")
    p.add_argument("--global-batch", type=int, help="batch x processes x accumulation (default: the preset's)")
    p.add_argument("--accum-steps", type=int, help="micro-batches per step (preset: from global batch 1024)")
    p.add_argument("--lr", type=float, help="peak learning rate (default: preset, else 5e-4)")
    p.add_argument("--weight-decay", type=float, help="default: preset, else 0.1")
    p.add_argument("--warmup-steps", type=int, help="default: preset's 10000, else 5%% of the steps")
    p.add_argument("--grad-clip-norm", type=float, help="default: 1.0 for ARC with vit-l-14, else off")
    p.add_argument("--t-interval", type=float, nargs=2, metavar=("W_L", "W_U"), help="MDC: t ~ U[W_L, W_U]")
    p.add_argument("--no-time-weighting", dest="time_weighting", action="store_false",
                   help="MDC: drop the 1/t weight (the 'w/o t' ablation)")
    p.add_argument("--mask-ratio", type=float, help="MDC: fixed mask ratio (image-conditioned BERT)")
    p.add_argument("--t-sampling", choices=["uniform", "stratified"], help="MDC: how t is drawn across a batch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    p.add_argument("--shuffle-buffer", type=int, default=1000, help="samples per worker shuffle buffer")
    p.add_argument("--save-every", type=int, default=1000, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int, metavar="K", help="keep only the K newest checkpoints (default: all)")
    p.add_argument("--log-every", type=int, default=1, help="metrics line every N steps")
    p.add_argument("--resume", action="store_true", help="continue from checkpoints/latest.json if present (the same run only)")
    p.add_argument("--force-resume", action="store_true",
                   help="resume even if the checkpoint's run configuration differs (logs the differences)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                   help="auto: bf16 autocast on CUDA, fp32 on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss computation")
    p.add_argument("--tensorboard", action="store_true", help="also log to OUTPUT_DIR/tensorboard")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    args = vars(p.parse_args(argv))
    if args["t_interval"] is not None:
        args["t_interval"] = tuple(args["t_interval"])
    return args


def main(argv: list[str] | None = None) -> dict:
    results = train(**parse_args(argv))
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
