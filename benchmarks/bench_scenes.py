"""Synthetic scene world generation rate (images/s) in one process.

    python benchmarks/bench_scenes.py                   # 64x64, 4000 images
    python benchmarks/bench_scenes.py --num 10000 --image-size 32

Reports three rates: scene sampling alone, rendering alone (scenes sampled beforehand), and full
shard writing (sampling + rendering + captions + PNG/JSON encoding + tar) with
``mdc.data.scenes.write_shards``.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from mdc.data.scenes import render, sample_scene, stream_rng, write_shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=4000, help="images per measurement")
    parser.add_argument("--image-size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--style", default="descriptive", choices=["alt", "descriptive"], help="caption style")
    args = parser.parse_args()

    start = time.perf_counter()
    scenes = [sample_scene(stream_rng(0, 0, i)) for i in range(args.num)]
    sample_s = time.perf_counter() - start

    start = time.perf_counter()
    for scene in scenes:
        render(scene, args.image_size)
    render_s = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_shards(tmp, args.num, args.style, seed=0, image_size=args.image_size)
        full_s = time.perf_counter() - start

    print(f"{args.num} scenes at {args.image_size}x{args.image_size}, one process")
    print(f"sample only : {args.num / sample_s:8.0f} scenes/s")
    print(f"render only : {args.num / render_s:8.0f} images/s")
    print(f"full shards : {args.num / full_s:8.0f} images/s ({args.style} captions, PNG, tar)")


if __name__ == "__main__":
    main()
