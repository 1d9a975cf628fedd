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
A run owns its folder: rank 0 holds ``output_dir/.train.lock`` (:mod:`mdc.base.lock`) from start to end,
so a second training into the same folder is refused at once, naming the holder's pid and host
(a killed run leaves no stale lock). Every bad value, missing local shards included, is refused before
anything is written (:class:`mdc.base.errors.ConfigError`); the command line says so in one line and exits
with status 2.

The package, one module per concern (each importing only those before it):

- :mod:`mdc.train.stream`: the data stream of a rank, and what is counted in local shards;
- :mod:`mdc.train.config`: :class:`TrainConfig`, every option documented once, and the resume check;
- :mod:`mdc.train.distributed`: the torchrun process group, sums over ranks, a lost peer told apart;
- :mod:`mdc.train.progress`: what a run reports at each read: loss, speed, data wait, counts, warnings;
- :mod:`mdc.train.loop`: :func:`train`, gradient accumulation, DDP and checkpoints;
- :mod:`mdc.train.cli`: the command line, generated from :class:`TrainConfig`.
"""
from mdc.train.cli import main, make_parser, parse_args
from mdc.train.config import RESUME_FREE, TrainConfig, check_same_run, run_config, run_differences
from mdc.train.distributed import PeerLostError, seed_everything, setup_distributed
from mdc.train.loop import LossModule, NonFiniteLossError, accumulate, train
from mdc.train.stream import DataStream, check_shards, count_samples, vocab_from_captions

__all__ = ["RESUME_FREE", "DataStream", "LossModule", "NonFiniteLossError", "PeerLostError", "TrainConfig", "accumulate",
           "check_same_run", "check_shards", "count_samples", "main", "make_parser", "parse_args", "run_config", "run_differences",
           "seed_everything", "setup_distributed", "train", "vocab_from_captions"]
