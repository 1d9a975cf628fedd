"""Every random stream of the synthetic world, named in one place.

Item ``i`` of stream ``k`` under world seed ``s`` draws from ``np.random.default_rng([s, k, i])``
(:func:`stream_rng`). Each use of the world below has streams of its own, so a held-out set
never shares a draw with the training shards, even under the same seed, and adding items to
one set changes no other. A new use takes a free block of numbers and is named here.
"""
from __future__ import annotations

import numpy as np

# Training shards (mdc.world.scenes.write_shards): sample i's scene, caption and references.
STREAM_SCENE = 0  # the scene graph (objects, background); also the VQ-VAE's scene images
STREAM_CAPTION = 1  # its caption in the shard's style
STREAM_REFERENCES = 2  # its reference captions in the JSON record

# Evaluation sets (mdc.world.evalsets), 1000-4999.
STREAM_PROBE = 1000  # probe task t, split s: stream STREAM_PROBE + 16 t + s (its labels: [seed, stream])
STREAM_ARO = 2000  # ARO's scenes; STREAM_ARO + 1: the items drawn from them
STREAM_SUGARCREPE = 3000  # SugarCrepe's scenes; STREAM_SUGARCREPE + 1 + k: sub-file k's items
STREAM_CAPTIONS = 4000  # the captioning sets' scenes; STREAM_CAPTIONS + 1: their references
STREAM_OWN = 3500  # in-distribution suites' scenes; + 1: each scene's caption; + 2 + k: sub-task k's edits

# Instruments (mdc.eval), 5000-5999.
STREAM_NEIGHBOURS = 5000  # neighbour use (mdc.eval.neighbours): scenes, + 1 captions, + 2 substitutions, + 3 + k masks
STREAM_REPETITION = 5100  # descriptive repetition (mdc.eval.repetition): scenes, + 1 captions, + 2 a second
# rendering of each caption (the decoding study's ceiling, reproduce/studies/decoding.py)

# Tutorials (mdc.tutorial), 6000-6199: stream + 1 captions the scenes of stream; + 50 (and + 51)
# are the scenes (and captions) of write_example_dataset.
STREAM_TUTORIAL_TRAIN = 6000  # training scenes
STREAM_TUTORIAL_HELD_OUT = 6100  # held-out scenes

# Benchmarks (benchmarks/), 9000-.
STREAM_BENCHMARK_ITEMS = 9000  # the two-object scenes of the scoring benchmark's items


def stream_rng(seed: int, stream: int, index: int) -> np.random.Generator:
    """Independent generator for item ``index`` of random stream ``stream`` under ``seed``."""
    return np.random.default_rng([seed, stream, index])
