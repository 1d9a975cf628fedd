"""Training-loader throughput (images/s) with 0 and 2 DataLoader workers.

    python benchmarks/bench_loader.py                       # writes temporary 64x64 PNG shards
    python benchmarks/bench_loader.py --shards 'DIR/{000000..000003}.tar' --image-size 224

Each setting is run once to warm up (tokenizer BPE, page cache) and then timed over one
full pass of the shards.
"""
from __future__ import annotations

import argparse
import io
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from mdc import get_tokenizer
from mdc.data.pipeline import SkipStats, iterate_batches, make_loader


def write_shards(out: Path, num_shards: int, per_shard: int, size: int = 64, seed: int = 0) -> str:
    """Write ``num_shards`` img2dataset-style tars of random ``size`` px PNGs + captions."""
    rng = np.random.default_rng(seed)
    words = "a red blue green small large circle square star left right of above below the".split()
    for s in range(num_shards):
        with tarfile.open(out / f"{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
                caption = " ".join(rng.choice(words, size=int(rng.integers(5, 15))))
                for name, data in ((f"{s:04d}{i:05d}.png", buf.getvalue()), (f"{s:04d}{i:05d}.txt", caption.encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(out / f"{{000000..{num_shards - 1:06d}}}.tar")


def throughput(urls: str, image_size: int, batch_size: int, num_workers: int, context_length: int) -> float:
    tokenizer = get_tokenizer(context_length=context_length)
    best = 0.0
    for _ in range(2):  # warm-up pass, then the timed pass
        loader = make_loader(urls, tokenizer, image_size, batch_size, num_workers=num_workers, shuffle_buffer=256)
        start, n = time.perf_counter(), 0
        for images, _ in iterate_batches(loader, SkipStats()):
            n += len(images)
        best = n / (time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", help="brace pattern of existing shards (default: write temporary ones)")
    parser.add_argument("--num-shards", type=int, default=4)
    parser.add_argument("--per-shard", type=int, default=512)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--context-length", type=int, default=77)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls = args.shards or write_shards(Path(tmp), args.num_shards, args.per_shard)
        for workers in (0, 2):
            rate = throughput(urls, args.image_size, args.batch_size, workers, args.context_length)
            print(f"num_workers={workers}: {rate:8.1f} images/s (image_size {args.image_size}, batch {args.batch_size})")


if __name__ == "__main__":
    main()
