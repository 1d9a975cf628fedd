"""What pretraining needs of torch.distributed: joining the torchrun process group, seeding, sums and
gathers over ranks, and telling a lost peer (a rank that died or went silent) from other errors."""
from __future__ import annotations

import datetime
import os
import random
import re

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any process group: see setup_distributed

from mdc.base.errors import ConfigError, RunError


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


def lost_peer(exn: BaseException) -> bool:
    """Is this a collective that failed because another rank is gone or silent?"""
    return isinstance(exn, dist.DistError) or bool(re.search(  # gloo often raises a plain RuntimeError
        r"gloo|nccl|connection|timed out|timeout|pair closure|by peer|processgroup|collective", str(exn), re.I))


def peer_reason(exn: BaseException) -> str:
    """The backend's own words, without its source location: 'Read error ...: Connection reset by peer'."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(exn).strip()).splitlines()[0] if str(exn).strip() else type(exn).__name__
    return text.split(". ")[0][:200]


def setup_distributed() -> tuple[int, int, torch.device, bool]:
    """(rank, world_size, device, created): joins the torchrun process group if the env defines one.

    ``torch.distributed.nn`` (imported by DDP) binds the default process group that exists when it is
    first imported as the default argument of its functions, so that ``destroy_process_group`` can no
    longer free it; its gloo threads then outlive the run and may abort the process (SIGABRT) while the
    interpreter shuts down. It is imported at the top of this module, before any group exists."""
    created = False
    cuda = local_cuda_device(int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()) \
        if torch.cuda.is_available() else None
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=dist_timeout())
        created = True
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = cuda if cuda is not None else torch.device("cpu")
    if cuda is not None:
        torch.cuda.set_device(cuda)
    return rank, world, device, created


def local_cuda_device(local_rank: int, count: int) -> torch.device:
    """This process's GPU, ``cuda:LOCAL_RANK``; more processes on a node than it has GPUs is refused before any
    process group forms (CUDA's own word for it is 'invalid device ordinal', raised mid-start)."""
    if not 0 <= local_rank < count:
        raise RuntimeError(f"LOCAL_RANK {local_rank} has no GPU: this node has {count} CUDA device(s) visible; "
                           f"start at most {count} process(es) per node (torchrun --nproc_per_node {count}), or "
                           f"hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU with gloo")
    return torch.device("cuda", local_rank)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def gather(obj, world: int) -> list:
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def all_sum(values: list[float], world: int, device: torch.device) -> list[float]:
    """Element-wise sum over ranks (one small all_reduce)."""
    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def host_group():
    """The process group for agreements the host makes alone (a CPU tensor: no wait on the device): the default
    group under gloo, else a gloo group beside NCCL's. Every rank calls it at the same point (it is collective)."""
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
