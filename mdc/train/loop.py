"""The pretraining loop (:func:`train`): one optimizer step over accumulated micro-batches
(:func:`accumulate`), DDP (:mod:`mdc.train.distributed`), and exact checkpoints (weights, optimizer,
LR schedule, every rank's RNG and stream position)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from mdc.base import checkpoint, optim
from mdc.data.transforms import normalize
from mdc.base.errors import RunError
from mdc.factory import create_model, load_weights
from mdc.base.lock import FolderInUseError, FolderLock
from mdc.model import uses_bf16
from mdc.train.config import TrainConfig, check_same_run, run_config
from mdc.train.distributed import PeerLostError, gather, lost_peer, peer_reason, seed_everything, setup_distributed
from mdc.train.progress import NonFiniteLossError, read, show, summary  # noqa: F401 (NonFiniteLossError re-exported)
from mdc.train.stream import DataStream, check_shards

logger = logging.getLogger(__name__)

class LossModule(nn.Module):
    """``forward`` = ``model.loss``, so that DDP's gradient hooks fire on the training objective."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, tokens: torch.Tensor, **kw) -> torch.Tensor:
        return self.model.loss(images, tokens, **kw)


def accumulate(net: nn.Module, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
               ddp: nn.Module | None = None, autocast=contextlib.nullcontext, graphs: bool = False) -> torch.Tensor:
    """Forward and backward of one optimizer step over K micro-batches; returns the step's loss.

    ``net`` is the (DDP-wrapped, compiled) :class:`LossModule` of ``model``; with ``ddp``,
    gradients are all-reduced only in the last micro-step (``no_sync`` before). ``graphs``: ``net`` replays
    CUDA graphs (:meth:`TrainConfig.captures_graphs`), so the step is marked as a new one first (the last
    replay's outputs may be overwritten) and the loss returned is a copy, not a graph's output.

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
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
        return _accumulate(net, model, batches, ddp, autocast).clone()
    return _accumulate(net, model, batches, ddp, autocast)


def _accumulate(net, model, batches, ddp, autocast) -> torch.Tensor:
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


def train(**kwargs) -> dict:
    """Pretrain a model; returns {checkpoint, steps, final_loss, metrics, skipped, ...}.

    Keyword arguments are the fields of :class:`TrainConfig`. Every process of a torchrun job
    calls it; rank 0 writes the checkpoints and logs. A bad value, missing local shards included
    (:func:`~mdc.train.stream.check_shards`), is refused before the run folder is created.
    """
    rank, world, device, created = setup_distributed()
    try:
        cfg = TrainConfig(**kwargs).resolved(world)
        check_shards(cfg.train_data)
        with own_folder(cfg.output_dir, rank, world):
            return _train(cfg, rank, world, device)
    finally:
        if created:
            dist.destroy_process_group()


RUN_LOCK = ".train.lock"  # in the run folder, held by rank 0 for the whole run (mdc.base.lock)


@contextlib.contextmanager
def own_folder(folder: str, rank: int, world: int):
    """Rank 0 holds the run folder's lock while the block runs; if another process holds it, every
    rank raises :class:`~mdc.base.lock.FolderInUseError` (naming the holder) before anything is written."""
    lock = FolderLock(folder, RUN_LOCK, "a training", "wait for it to end, or train into another output_dir "
                      "(--output-dir)") if rank == 0 else None
    refused = None
    if lock is not None:
        try:
            lock.acquire()
        except FolderInUseError as exn:
            refused = exn
    if world > 1:  # rank 0's answer, for every rank
        message = gather(None if refused is None else str(refused), world)[0]
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
    """The recipe: build the model and its optimizer, resume the last checkpoint or start, open the data
    stream, run the steps, summarise."""
    os.makedirs(cfg.output_dir, exist_ok=True)
    model, optimizer, scheduler = _build(cfg, device)
    state, last_ckpt = _resume(cfg, model, optimizer, scheduler, rank, world)
    stream = _open_stream(cfg, model, state, rank, world, device)
    net, ddp = _wrap(cfg, model, world, device)
    run = _Run(cfg, rank, world, device, model, optimizer, scheduler, stream, net, ddp,
               step=state["step"] if state else 0, last_ckpt=last_ckpt, read_step=state["step"] if state else 0)
    if rank == 0:
        checkpoint.atomic_write_text(os.path.join(cfg.output_dir, "train_config.json"),
                                     json.dumps(run_config(cfg, world), indent=1))
        if note := graphs_note(cfg, world):
            logger.warning(note)
    _run_steps(run)
    return summary(run)


def graphs_note(cfg: TrainConfig, world: int) -> str | None:
    """One line, at the start of a graphed step under several processes, on what its figures rest on."""
    if world == 1 or not cfg.captures_graphs():
        return None
    return (f"the step replays CUDA graphs ({cfg.compile_mode}) under DDP across {world} processes: its speed "
            f"(18-23% MFU) and its exact resume were measured on one GPU, never measured across several; without "
            f"--compile (or with --compile-mode default) the step is eager (or compiled without graphs)")


def _build(cfg: TrainConfig, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """(model, optimizer, LR schedule), the model's initial weights identical on every rank."""
    seed_everything(cfg.seed)
    objective_opts = dict(t_interval=cfg.t_interval, mask_ratio=cfg.mask_ratio, t_sampling=cfg.t_sampling)
    overrides = {k: v for k, v in objective_opts.items() if v is not None}
    model = create_model(cfg.model, cfg.objective, time_weighting=cfg.time_weighting,
                         **overrides, **(cfg.model_overrides or {})).to(device)
    optimizer = optim.make_optimizer(model, cfg.lr, cfg.weight_decay)
    return model, optimizer, optim.make_scheduler(optimizer, cfg.warmup_steps, cfg.steps)


def _resume(cfg: TrainConfig, model, optimizer, scheduler, rank: int, world: int) -> tuple[dict | None, str | None]:
    """(trainer state, its checkpoint) after loading the run's last checkpoint into the model, optimizer and
    schedule: output_dir's newest (with --resume), else ``resume_from``'s; (None, None) when the run starts."""
    given = _resume_from(cfg)
    last_ckpt = (checkpoint.latest(cfg.output_dir) if cfg.resume else None) or given
    if not last_ckpt:
        return None, None
    state = checkpoint.load_trainer_state(last_ckpt)
    if state["step"] > _last_step(cfg) or (state["step"] == _last_step(cfg) and last_ckpt == given):
        raise ValueError(f"{last_ckpt} is at step {state['step']}: nothing to train up to stop_at "
                         f"{_last_step(cfg)}")
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
    return state, last_ckpt


def _resume_from(cfg: TrainConfig) -> str | None:
    """The checkpoint ``resume_from`` names (a checkpoint folder, or a run folder's newest), with its trainer
    state; None without it."""
    if not cfg.resume_from:
        return None
    found = checkpoint.latest(cfg.resume_from) or cfg.resume_from
    if not os.path.isfile(os.path.join(found, "trainer.pt")):
        raise ValueError(f"resume_from {cfg.resume_from}: {found} holds no trainer.pt (weights alone, e.g. kept "
                         f"float16 weights): continuing a run exactly needs a checkpoint mdc.train wrote")
    return found


def _last_step(cfg: TrainConfig) -> int:
    """The step this run ends after: ``stop_at``, else the schedule's last."""
    return cfg.stop_at or cfg.steps


def _open_stream(cfg: TrainConfig, model, state: dict | None, rank: int, world: int,
                 device: torch.device) -> DataStream:
    """This rank's data stream (where the checkpoint left it) and its RNG: the checkpoint's, or a seed of its
    own when the run starts (a different mask/noise stream per rank)."""
    stream = DataStream(cfg, model.tokenizer, model.config.image_size, state["data"][rank] if state else None,
                        world, device)
    if state:
        checkpoint.set_rng_state(state["rng"][rank])
    else:
        seed_everything(int(np.random.SeedSequence([cfg.seed, rank]).generate_state(1)[0]))
    return stream


def _wrap(cfg: TrainConfig, model, world: int, device: torch.device) -> tuple[nn.Module, nn.Module | None]:
    """(net, ddp): the loss as a module, DDP-wrapped under several processes (``ddp``, else None) and compiled
    with ``compile``."""
    net = LossModule(model)
    if cfg.compile:  # the stream buckets caption lengths to multiples of 16: a handful of shapes, not one per batch
        # one graph of the whole loss (fullgraph: a break is an error, not a slow step), compiled inside DDP: DDP's
        # forward marks itself active, so Dynamo's DDP optimizer cuts the graph at DDP's gradient buckets and each
        # bucket's all-reduce starts while the rest of the backward runs (tests/mdc/train/test_distributed.py).
        # Compiled around DDP, the graph would break at DDP's own bookkeeping, which fullgraph refuses.
        net = torch.compile(net, fullgraph=True, mode=None if cfg.compile_mode == "default" else cfg.compile_mode)
    if world == 1:
        return net, None
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=device_ids)
    return ddp, ddp


@dataclasses.dataclass
class _Run:
    """What the steps of one process work with, and where they are (``step``, ``last_ckpt``, ``loss``, the
    images/s of each step run here, the share of each interval it waited for data)."""

    cfg: TrainConfig
    rank: int
    world: int
    device: torch.device
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    stream: DataStream
    net: nn.Module
    ddp: nn.Module | None
    step: int = 0
    last_ckpt: str | None = None
    loss: float = float("nan")
    speeds: list[float] = dataclasses.field(default_factory=list)  # images/s between reads of the device
    pending: torch.Tensor | None = None  # the last step's loss, on the device until the next read
    finite: torch.Tensor | bool = True  # every loss since the last read finite (a device bool once a step ran)
    read_step: int = 0  # the step of the last read, and its time
    read_time: float = dataclasses.field(default_factory=time.perf_counter)
    warned: bool = False  # the unknown-token warning was given
    data_warned: bool = False  # the data-wait warning was given
    waits: list[float] = dataclasses.field(default_factory=list)  # the share of each read's interval spent waiting

    @property
    def global_batch(self) -> int:
        return self.cfg.batch_size * self.world * self.cfg.accum_steps

    def autocast(self):
        """bf16 autocast with precision bf16, or auto on CUDA; else a no-op."""
        bf16 = uses_bf16(self.cfg.precision, self.device)
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16)


def _run_steps(run: _Run) -> None:
    """Steps until ``steps`` (or ``stop_at``), a checkpoint every ``save_every`` and at the end; rank 0 logs. A
    collective that fails because a peer is gone or silent becomes a :class:`PeerLostError` naming the step and
    checkpoint."""
    from tqdm.auto import tqdm

    cfg = run.cfg
    log = checkpoint.MetricsLog(cfg.output_dir, run.step, cfg.tensorboard) if run.rank == 0 else None
    bar = tqdm(total=cfg.steps, initial=run.step, disable=run.rank != 0 or not cfg.progress,
               desc=f"{cfg.objective} {cfg.model}", dynamic_ncols=True)
    run.model.train()
    try:
        end = _last_step(cfg)
        while run.step < end:
            lr = _step(run)
            logged = run.step % cfg.log_every == 0 or run.step == end
            saved = run.step % cfg.save_every == 0 or run.step == end
            if logged or saved:  # the loop's one read of the device: the loss, its finiteness, the counts
                report = read(run)
                if run.rank == 0:
                    show(run, bar, log if logged else None, report, lr)
            if run.rank == 0:
                bar.update(1)
            if saved:
                run.last_ckpt = _save(cfg, run.step, run.model, run.optimizer, run.scheduler, run.stream,
                                      run.rank, run.world)
    except RuntimeError as exn:
        if run.world > 1 and lost_peer(exn) and not isinstance(exn, RunError):
            raise PeerLostError(f"rank {run.rank} of {run.world} lost contact with the other processes after step "
                                f"{run.step} ({peer_reason(exn)}); last checkpoint: "
                                f"{run.last_ckpt or 'none written yet'}; restart every process with --resume") from exn
        raise
    finally:
        bar.close()
        if log is not None:
            log.close()


def _step(run: _Run) -> float:
    """One optimizer step, with no host synchronisation: the loss stays on the device (``run.pending``), and
    whether every loss since the last read was finite (``run.finite``); returns the step's LR."""
    batches = [_to_device(*run.stream.next(), run.device) for _ in range(run.cfg.accum_steps)]
    loss = accumulate(run.net, run.model, batches, run.ddp, run.autocast, run.cfg.captures_graphs())
    run.pending, run.finite = loss, run.finite & torch.isfinite(loss)
    run.step += 1
    lr = run.optimizer.param_groups[0]["lr"]
    optim.optimizer_step(run.model, run.optimizer, run.scheduler, run.cfg.grad_clip_norm)
    return lr


def _to_device(pixels: torch.Tensor, tokens: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A stream batch on the device: uint8 pixels [B, 3, H, W] copied, then normalised there; tokens [B, L]."""
    return normalize(pixels.to(device, non_blocking=True)), tokens.to(device, non_blocking=True)


def _save(cfg, step, model, optimizer, scheduler, stream, rank, world) -> str:
    """Collect every rank's RNG and stream state; rank 0 writes the checkpoint. Returns its folder."""
    rngs = gather(checkpoint.rng_state(), world)
    data = gather(stream.state_dict(), world)
    path = os.path.join(cfg.output_dir, "checkpoints", f"step_{step:06d}")
    if rank == 0:
        path = checkpoint.save(cfg.output_dir, step, model, {
            "step": step, "world_size": world, "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "rng": rngs, "data": data},
            run_config=run_config(cfg, world), keep_last=cfg.keep_last)
    if world > 1:
        dist.barrier()
    return path
