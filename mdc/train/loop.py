"""The pretraining loop (:func:`train`) and what it needs of torch.distributed: joining the torchrun
process group, one optimizer step over accumulated micro-batches (:func:`accumulate`), sums over ranks
and exact checkpoints (weights, optimizer, LR schedule, every rank's RNG and stream position)."""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import random
import re
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any process group: see setup_distributed
from torch import nn

from mdc import checkpoint, optim
from mdc.data.pipeline import SKIP_REASONS, SkipStats
from mdc.errors import ConfigError, RunError
from mdc.factory import create_model, load_weights
from mdc.lock import FolderInUseError, FolderLock
from mdc.tokenizer import TextStats
from mdc.train.config import TrainConfig, check_same_run, run_config
from mdc.train.stream import DataStream

logger = logging.getLogger(__name__)

# One warning when more than UNK_WARN_RATE of the caption tokens seen so far (at least
# UNK_WARN_MIN_TOKENS of them) fall outside a compact vocabulary and become [UNK].
UNK_WARN_RATE, UNK_WARN_MIN_TOKENS = 0.01, 250
TEXT_FIELDS = tuple(TextStats().as_dict())  # captions, tokens, unknown, truncated


class NonFiniteLossError(RunError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


class PeerLostError(RunError):
    """A distributed run lost a rank (it died, or hung past ``MDC_DIST_TIMEOUT``); the message names
    this rank, the step and the last checkpoint to resume from.

    The process should end after it: a collective may still be pending with the silent rank, and freeing
    the process group then deadlocks (gloo's worker thread needs the interpreter lock that the freeing
    thread holds while it joins it). ``python -m mdc.train`` exits at once (``os._exit``) after the message."""


DIST_TIMEOUT_ENV = "MDC_DIST_TIMEOUT"  # seconds a collective waits for the other ranks (default: torch's 1800)


def dist_timeout() -> datetime.timedelta:
    """How long a collective waits for a silent rank before the run gives up (``MDC_DIST_TIMEOUT``)."""
    raw = os.environ.get(DIST_TIMEOUT_ENV, "1800")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ConfigError(f"{DIST_TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}")
    return datetime.timedelta(seconds=seconds)


def _lost_peer(exn: BaseException) -> bool:
    """Is this a collective that failed because another rank is gone or silent?"""
    return isinstance(exn, dist.DistError) or bool(re.search(  # gloo often raises a plain RuntimeError
        r"gloo|nccl|connection|timed out|timeout|pair closure|by peer|processgroup|collective", str(exn), re.I))


def _peer_reason(exn: BaseException) -> str:
    """The backend's own words, without its source location: 'Read error ...: Connection reset by peer'."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exn).strip()).splitlines()[0] if str(exn).strip() else type(exn).__name__
    return text.split(". ")[0][:200]


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
    """(rank, world_size, device, created): joins the torchrun process group if the env defines one.

    ``torch.distributed.nn`` (imported by DDP) binds the default process group that exists when it is
    first imported as the default argument of its functions, so that ``destroy_process_group`` can no
    longer free it; its gloo threads then outlive the run and may abort the process (SIGABRT) while the
    interpreter shuts down. It is imported at the top of this module, before any group exists."""
    created = False
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=dist_timeout())
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
        cfg = TrainConfig(**kwargs).resolved(world)
        with own_folder(cfg.output_dir, rank, world):
            return _train(cfg, rank, world, device)
    finally:
        if created:
            dist.destroy_process_group()


RUN_LOCK = ".train.lock"  # in the run folder, held by rank 0 for the whole run (mdc.lock)


@contextlib.contextmanager
def own_folder(folder: str, rank: int, world: int):
    """Rank 0 holds the run folder's lock while the block runs; if another process holds it, every
    rank raises :class:`~mdc.lock.FolderInUseError` (naming the holder) before anything is written."""
    lock = FolderLock(folder, RUN_LOCK, "a training", "wait for it to end, or train into another output_dir "
                      "(--output-dir)") if rank == 0 else None
    refused = None
    if lock is not None:
        try:
            lock.acquire()
        except FolderInUseError as exn:
            refused = exn
    if world > 1:  # rank 0's answer, for every rank
        message = _gather(None if refused is None else str(refused), world)[0]
        if message is not None and refused is None:
            refused = FolderInUseError(message, folder, {})
    if refused is not None:
        raise refused
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


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
            lr = optimizer.param_groups[0]["lr"]
            optim.optimizer_step(model, optimizer, scheduler, cfg.grad_clip_norm)
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
    except RuntimeError as exn:
        if world > 1 and _lost_peer(exn) and not isinstance(exn, RunError):
            raise PeerLostError(f"rank {rank} of {world} lost contact with the other processes after step {step} "
                                f"({_peer_reason(exn)}); last checkpoint: {last_ckpt or 'none written yet'}; "
                                f"restart every process with --resume") from exn
        raise
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
