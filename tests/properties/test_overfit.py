"""End to end: tiny MDC and ARC memorise four image-caption pairs, then caption and rank them."""
import pytest
import torch

import mdc
from conftest import CAPTIONS, small_model


def _overfit(objective, images, steps):
    torch.manual_seed(0)
    model = small_model(objective)  # default t ~ U[0.5, 1]
    tokens = model.tokenizer(CAPTIONS)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    for _ in range(steps):
        loss = model.loss(images, tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), loss.item()


@pytest.mark.parametrize("objective, steps", [("mdc", 300), ("arc", 150)])
def test_overfit_then_caption_and_rank(objective, steps, images):
    model, loss = _overfit(objective, images, steps)
    assert loss < 0.05
    tok = model.tokenizer
    for i, cap in enumerate(CAPTIONS):
        n = len(tok.encode(cap))
        assert mdc.generate(model, images[i : i + 1], length=n)[0] == cap
    methods = ["exact"] if objective == "arc" else ["heuristic", "elbo"]
    for method in methods:
        # score every image against every caption: the true one must rank first
        grid = torch.stack([mdc.score(model, images, [c] * 4, method=method, num_samples=64) for c in CAPTIONS], 1)
        assert torch.equal(grid.argmax(1), torch.arange(4)), (method, grid)
