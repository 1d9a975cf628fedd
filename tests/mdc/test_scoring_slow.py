"""Slow: on a briefly trained MDC, paired (common-random-number) ELBO differences are far less noisy."""
import numpy as np
import pytest
import torch

import mdc
from conftest import SMALL
from mdc.world.evalsets import _sugar_item
from mdc.data.transforms import image_transform
from mdc.world.scenes import caption, render, sample_scene, stream_rng, vocabulary

pytestmark = pytest.mark.slow


def _scenes(n, seed, size=32, **kw):
    scenes = [sample_scene(stream_rng(seed, 0, i), **kw) for i in range(n)]
    to_tensor = image_transform(size, train=False)
    return scenes, torch.stack([to_tensor(render(s, size)) for s in scenes])


def test_paired_elbo_differences_have_a_smaller_spread():
    torch.manual_seed(0)
    model = mdc.create_model("tiny", "mdc", **{**SMALL, "vocab": vocabulary(), "context_length": 32})
    scenes, images = _scenes(256, seed=0)
    tokens = model.tokenizer([caption(s, "alt", stream_rng(0, 1, i)) for i, s in enumerate(scenes)])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(150):
        batch = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(step))
        loss = model.loss(images[batch], tokens[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    held, images = _scenes(8, seed=1, n_objects=2)
    pairs = [list(_sugar_item("replace_att", s, stream_rng(1, 2, i))) for i, s in enumerate(held)]
    spread = {}
    for paired in (True, False):
        diffs = np.stack([(lambda x: (x[:, 0] - x[:, 1]).numpy())(
            mdc.score_candidates(model, images, pairs, "elbo", num_samples=32, seed=s, paired=paired))
            for s in range(12)])  # [seeds, items]
        spread[paired] = diffs.std(0).mean()
    assert spread[True] < 0.5 * spread[False], spread
