"""Data: synthetic shard writing, the loader's decode rate and resume, beside what training consumes.

Writing: ``mdc.world.scenes.write_shards`` at 64 px, whole shards (scene sampling, rendering,
captions, references, JSON, image encoding, tar), PNG and npy image members, in one process
(= per core) and in one process per core; then what each stage of a sample costs alone (the
writer's own functions, each stage in a loop over the same scenes), and what the whole writer
spends beyond their sum (the stages taken in turn per sample rather than in loops, which costs
caches; generators and members; files). Loading: one full pass of ``make_loader`` over those
shards (tiny's tokenizer, batch 64, uint8 pixels as the training stream) with 0, 1 and 2 workers, each rate also
per worker, after an untimed pass (page cache,
tokenizer). Resume: time to the first batch when resuming three quarters into a pass, from tar
headers (the default) or by replaying the stream. Photographs: JPEG shards at 224 px and the workers per GPU
(:mod:`benchmarks.photos`). Training: images/s of a tiny MDC step.
"""
from __future__ import annotations

import json
import os
import tempfile
import time

from PIL import Image

import mdc
from mdc.base import optim
from mdc.data.pipeline import SkipStats, StreamPosition, iterate_batches, make_loader
from mdc.data.writer import npy_bytes, png_bytes, write_tar
from mdc.world.render import render_array
from mdc.world.graphs import scene_record
from mdc.world.scenes import NUM_REFERENCES, sample_scene, write_shards
from mdc.world.streams import STREAM_CAPTION, STREAM_REFERENCES, STREAM_SCENE, stream_rng
from mdc.world.text import caption, references

from benchmarks import photos
from benchmarks.common import Context, Section, batch, interleaved, median, speedup


def _write(folder: str, num: int, image_format: str, workers: int):
    def write():
        write_shards(os.path.join(folder, f"{image_format}-{workers}"), num, "descriptive", seed=0,
                     shard_size=num // 4, image_format=image_format, workers=workers)
    return write


def _stages(num: int, folder: str) -> dict[str, float]:
    """Seconds per image of each stage of a shard sample, the writer's functions one stage at a time."""
    out = {}

    def timed(name, fn):
        start = time.perf_counter()
        result = fn()
        out[name] = (time.perf_counter() - start) / num
        return result

    scenes = timed("scene sampling", lambda: [sample_scene(stream_rng(0, STREAM_SCENE, i)) for i in range(num)])
    texts = timed(f"caption and {NUM_REFERENCES} references", lambda: [
        (caption(s, "descriptive", stream_rng(0, STREAM_CAPTION, i)),
         references(s, stream_rng(0, STREAM_REFERENCES, i), NUM_REFERENCES)) for i, s in enumerate(scenes)])
    records = timed("JSON record", lambda: [json.dumps(scene_record(s, 64, key=f"{i:09d}", style="descriptive",
                                                                    caption=t, references=r), sort_keys=True,
                                                       separators=(",", ":")).encode() for i, (s, (t, r)) in
                                            enumerate(zip(scenes, texts))])
    pixels = timed("rendering", lambda: [render_array(s, 64) for s in scenes])
    images = {"png": timed("png: encoding (zlib level 3)", lambda: [png_bytes(Image.fromarray(p)) for p in pixels]),
              "npy": timed("npy: encoding", lambda: [npy_bytes(p) for p in pixels])}
    for fmt, encoded in images.items():
        members = [(f"{i:09d}.{ext}", data) for i, (image, (t, _), rec) in enumerate(zip(encoded, texts, records))
                   for ext, data in ((fmt, image), ("txt", t.encode()), ("json", rec))]
        timed(f"{fmt}: tar writing", lambda: write_tar(os.path.join(folder, "stages.tar"), members))
    return out


def _pass(urls: list[str], tok, workers: int):
    def one_pass():
        n = 0
        loader = make_loader(urls, tok, 64, 64, num_workers=workers, shuffle_buffer=256, uint8=True)  # as training
        for images, _ in iterate_batches(loader, SkipStats()):
            n += len(images)
        return n
    return one_pass


def _resume_time(urls: list[str], tok, fast: bool) -> float:
    """Seconds to the first batch after resuming three quarters into a pass (no workers)."""
    loader = list(make_loader(urls, tok, 64, 64, num_workers=0, shuffle_buffer=256))
    position = StreamPosition(0)
    for *_, meta in loader[: 3 * len(loader) // 4]:
        position.update(meta)
    start = time.perf_counter()
    next(iter(make_loader(urls, tok, 64, 64, num_workers=0, shuffle_buffer=256, resume=position.state_dict(),
                          fast_resume=fast)))
    return time.perf_counter() - start


def run(ctx: Context) -> Section:
    sec = Section("data", "Data (CPU): synthetic shards (64 px) written, loader decode and resume, training's "
                          "appetite; photographs (JPEG) to 224 px and the workers a GPU needs")
    num, cores = ctx.pick(2000, 100), os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        writers = {f"{fmt}, {w} process{'es' if w > 1 else ''}": _write(tmp, num, fmt, w)
                   for w in sorted({1, cores}) for fmt in ("png", "npy")}
        times = interleaved(writers, rounds=ctx.pick(3, 1), warmup=0)
        for name, t in times.items():
            workers = int(name.split(", ")[1].split()[0])
            per_core = num / median(t) / workers
            sec.add(f"shards written, {name}", round(num / median(t)), "images/s",
                    f"{per_core:.0f} per core", at_least=2000 if name == "npy, 1 process" else None)
        sec.add("npy / png writing speed, 1 process", round(speedup(times, "npy, 1 process", "png, 1 process"), 2), "x")
        stages = _stages(num, tmp)
        for name, seconds in stages.items():
            sec.add(f"per image: {name}", round(1e6 * seconds, 1), "us", f"{1 / seconds:,.0f} images/s alone")
        for fmt, other in (("png", "npy:"), ("npy", "png:")):
            alone = sum(t for name, t in stages.items() if not name.startswith(other))
            whole = median(times[f"{fmt}, 1 process"]) / num
            sec.add(f"per image: {fmt} shards, whole writer beyond its stages", round(1e6 * (whole - alone), 1),
                    "us", f"stages {1e6 * alone:.0f} us (at most {1 / alone:,.0f} images/s per core), whole "
                          f"{1e6 * whole:.0f} us")
        if cores > 1:
            gain = speedup(times, f"npy, {cores} processes", "npy, 1 process")
            sec.add(f"{cores} processes / 1, npy", round(gain, 2), "x", f"{cores} cores")

        tok = mdc.get_tokenizer("tiny")
        shards = {fmt: sorted(os.path.join(tmp, f"{fmt}-1", f) for f in os.listdir(os.path.join(tmp, f"{fmt}-1")))
                  for fmt in ("png", "npy")}
        passes = {f"{fmt}, {w} workers": _pass(shards[fmt], tok, w) for w in (0, 1, 2) for fmt in ("png", "npy")}
        times = interleaved(passes, rounds=ctx.pick(2, 1))
        for name, t in times.items():
            w = int(name.split(", ")[1].split()[0])
            sec.add(f"loader decode, {name}", round(num / median(t)), "images/s",
                    f"{num / median(t) / max(w, 1):.0f} per worker (0: in the training process); batch 64, "
                    f"train transform, uint8 pixels as the training stream")
        for fmt in ("png", "npy"):
            replay, fast = _resume_time(shards[fmt], tok, False), _resume_time(shards[fmt], tok, True)
            sec.add(f"resume 3/4 into a pass, {fmt}, from tar headers", round(1000 * fast), "ms to first batch",
                    f"replaying the stream: {1000 * replay:.0f} ms")

    photos.add_rows(sec, ctx.quick)
    model = mdc.create_model("tiny", "mdc")
    images, tokens = batch(model, 32)
    opt = optim.make_optimizer(model, 5e-4, 0.1)

    def step():
        model.loss(images, tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t = interleaved({"step": step}, rounds=ctx.pick(3, 1))["step"]
    sec.add("training consumes (tiny MDC step, batch 32)", round(32 / median(t), 1), "images/s",
            "the rate the loader and the writer must keep up with")
    sec.notes.append(f"Writing: {num} images in 4 whole shards per call, descriptive captions; 'per core' = "
                     f"images/s / processes. This machine has {cores} cores.")
    return sec
