"""What a training run reports at each read of the device (:func:`read`, every ``log_every`` steps and at each
save): the loss (a NaN stops the run), the images/s of its steps, the share of the interval it waited for data and
the loader's own images/s beside them, the skip and caption counts, summed over ranks; rank 0 shows them
(:func:`show`: the progress bar, ``metrics.jsonl``, one warning per cause) and sums the run up (:func:`summary`).

Waiting for data. A rank's loop asks its stream for each micro-batch (:meth:`~mdc.train.stream.DataStream.next`);
the seconds it waits there are the data's share of the interval (``data_wait``, the mean over ranks), the wait for
a pass's first batch (its workers starting) counted apart (``data_start_s``) and left out of the share. The loader's
images/s (``loader_images_per_s``, summed over ranks) is what its workers deliver together, from the seconds they
spent assembling batches (:class:`~mdc.data.accounting.LoadStats`). Past :data:`DATA_WAIT_WARN` of an interval the
run says once that it waits on its data, naming ``--workers`` and the stored size of its images.
"""
from __future__ import annotations

import json
import logging
import os
import time

import numpy as np
import torch

from mdc.base.errors import RunError
from mdc.data.accounting import SKIP_REASONS, SkipStats
from mdc.tokenizer import TextStats
from mdc.train.distributed import all_sum

logger = logging.getLogger(__name__)

# One warning when more than UNK_WARN_RATE of the caption tokens seen so far (at least
# UNK_WARN_MIN_TOKENS of them) fall outside a compact vocabulary and become [UNK].
UNK_WARN_RATE, UNK_WARN_MIN_TOKENS = 0.01, 250
DATA_WAIT_WARN = 0.10  # the share of an interval spent waiting for data past which the run says so, once
TEXT_FIELDS = tuple(TextStats().as_dict())  # captions, tokens, unknown, truncated
DATA_FIELDS = ("waited", "started", "loader", "source_px", "images")  # summed over ranks at a read


class NonFiniteLossError(RunError):
    """The loss became NaN or infinite; the message names the step and the last good checkpoint."""


def read(run) -> dict:
    """At a log or save step: the last step's loss, the data's share of the interval and the loader's images/s,
    the skip and caption counts, summed over ranks; the images/s since the last read. A loss that was NaN or
    infinite at any step since then, on any rank, stops the run before a checkpoint holds its weights."""
    waited, started = run.stream.take_wait()
    load = run.stream.load.take()
    data = [waited, started, load.rate(run.cfg.workers) if load.images else 0.0, load.source_px, load.images]
    values = [float(run.pending), float(~run.finite)]  # waits for the device: once per log_every steps
    report = all_sum(values + data + _skip_counts(run.stream.stats) + _text_counts(run.stream.text), run.world,
                     run.device)
    run.loss, bad = report[0] / run.world, report[1]
    if bad or not np.isfinite(run.loss):
        when = f"step {run.step}" if run.step - run.read_step == 1 else f"a step of {run.read_step + 1}-{run.step}"
        raise NonFiniteLossError(f"loss is NaN or infinite at {when}; last good checkpoint: "
                                 f"{run.last_ckpt or 'none written yet'}")
    now = time.perf_counter()
    d = dict(zip(DATA_FIELDS, report[2 : 2 + len(DATA_FIELDS)]))
    steady = (now - run.read_time) - d["started"] / run.world  # the interval without the passes' first batches
    share = min(1.0, d["waited"] / run.world / steady) if steady > 0 else 0.0
    steps = run.step - run.read_step
    run.speeds.append(run.global_batch * (run.step - run.read_step) / (now - run.read_time))
    run.waits.append(share)
    run.read_step, run.read_time, run.finite = run.step, now, torch.ones((), dtype=torch.bool, device=run.device)
    counts = report[2 + len(DATA_FIELDS):]
    return {"loss": report[0], "steps": steps, "skipped": _skip_dict(counts[: len(SKIP_REASONS)]),
            "text": _text_stats(counts[len(SKIP_REASONS):]), "data_wait": share,
            "data_start_s": d["started"] / run.world, "loader_images_per_s": d["loader"] or None,
            "side": d["source_px"] / d["images"] if d["images"] else None}


def show(run, bar, log, report: dict, lr: float) -> None:
    """Rank 0, at a read: the progress bar's figures, a metrics line (``log``, every ``log_every`` steps), and one
    warning each when many caption tokens fall outside a compact vocabulary or the run waits on its data."""
    text, share = report["text"], report["data_wait"]
    bar.set_postfix(loss=f"{run.loss:.4f}", img_s=f"{run.speeds[-1]:.1f}", lr=f"{lr:.2e}", wait=f"{share:.0%}",
                    **({"unk": f"{text.unknown_rate:.1%}"} if run.model.tokenizer.vocab is not None else {}))
    if log is not None:
        log.write({"step": run.step, "epoch": run.stream.epoch, "loss": run.loss, "lr": lr,
                   "images_per_s": run.speeds[-1], "data_wait": share, "data_start_s": report["data_start_s"],
                   "loader_images_per_s": report["loader_images_per_s"], "skipped": report["skipped"],
                   "unk_rate": text.unknown_rate, "truncated": text.truncated})
    if not run.warned and text.tokens >= UNK_WARN_MIN_TOKENS and text.unknown_rate > UNK_WARN_RATE:
        run.warned = True
        logger.warning("%.1f%% of the caption tokens so far (%d of %d) are unknown to the model's compact "
                       "vocabulary and became [UNK]; build the vocabulary from the training captions "
                       "with --vocab-from-data (vocab_from_data=True)", 100 * text.unknown_rate,
                       text.unknown, text.tokens)
    if not run.data_warned and share > DATA_WAIT_WARN:
        run.data_warned = True
        logger.warning(data_wait_message(run, report))


def data_wait_message(run, report: dict) -> str:
    """The one line a run starved of data prints: the share, both rates, and the two remedies."""
    loader, side = report["loader_images_per_s"], report["side"]
    fed = run.speeds[-1] / max(1e-9, 1 - report["data_wait"])  # what the steps alone would take
    return (f"the last {report['steps']} steps waited for data "
            f"{report['data_wait']:.0%} of the time: the loader delivers about "
            f"{f'{loader:,.0f}' if loader else 'an unmeasured number of'} images/s with --workers {run.cfg.workers} "
            f"a process, the steps alone would take about {fed:,.0f}; raise --workers (a core each), or store the "
            f"shards nearer the training resolution ({run.model.config.image_size} px; these images are "
            f"{f'{side:,.0f}' if side else 'of unknown'} px on their longer side): `python -m mdc.data.convert "
            f"--image-size 256`, or img2dataset's --image_size 256")


def summary(run) -> dict:
    """The run's results: its last checkpoint and loss (from metrics.jsonl when no step was left to run), the
    skip and caption counts of all ranks, the mean speed and data wait."""
    metrics = os.path.join(run.cfg.output_dir, "metrics.jsonl")
    loss = run.loss
    if not run.speeds:  # nothing left to do: report the finished run's last logged loss
        with open(metrics) as f:
            loss = json.loads(f.readlines()[-1])["loss"]
    totals = all_sum(_skip_counts(run.stream.stats) + _text_counts(run.stream.text), run.world, run.device)
    skipped, text = _skip_dict(totals), _text_stats(totals[len(SKIP_REASONS):])
    return {"checkpoint": run.last_ckpt, "steps": run.step, "final_loss": loss, "metrics": metrics,
            "skipped": skipped, "unk_rate": text.unknown_rate, "truncated": text.truncated,
            "images_per_s": float(np.mean(run.speeds)) if run.speeds else None,
            "data_wait": float(np.mean(run.waits)) if run.waits else None, "world_size": run.world,
            "global_batch": run.global_batch, "output_dir": run.cfg.output_dir}


def _skip_counts(stats: SkipStats) -> list[int]:
    return [stats.counts.get(reason, 0) for reason in SKIP_REASONS]


def _skip_dict(counts: list[float]) -> dict[str, int]:
    return {reason: int(n) for reason, n in zip(SKIP_REASONS, counts) if n}


def _text_counts(text: TextStats) -> list[int]:
    return [getattr(text, name) for name in TEXT_FIELDS]


def _text_stats(counts: list[float]) -> TextStats:
    return TextStats(**{name: int(n) for name, n in zip(TEXT_FIELDS, counts)})
