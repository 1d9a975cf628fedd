"""mdc.sampler.generate: the one entry point for captions."""
import pytest
import torch

import mdc
from conftest import small_model
from mdc.distribution import banned_ids


def test_generate_api_and_errors(images):
    model = small_model()
    caps = mdc.generate(model, images, length=5)
    assert len(caps) == 4 and all(isinstance(c, str) for c in caps)
    assert model.training  # mode restored
    with pytest.raises(ValueError, match="length"):
        mdc.generate(model, images, length=0)
    with pytest.raises(ValueError, match="23"):
        mdc.generate(model, images, length=23)  # context 24 - SOT/EOT = 22
    with pytest.raises(ValueError, match="CLIP"):
        mdc.generate(small_model("clip"), images)


def test_generate_never_returns_banned_ids(images):
    model = small_model().eval()
    tok = model.tokenizer
    with torch.no_grad():
        model.head.weight[banned_ids(tok)] += 5.0 * model.head.weight.norm(dim=1).max()  # banned ids dominate
    for objective_model in (model,):
        out = mdc.generate(objective_model, images, length=6, return_tokens=True)
        assert not torch.isin(out[:, 1:-1], torch.tensor(banned_ids(tok))).any()
    arc = small_model("arc").eval()
    with torch.no_grad():
        arc.head.weight[banned_ids(tok)] += 5.0 * arc.head.weight.norm(dim=1).max()
    for beam in (1, 3):
        out = mdc.generate(arc, images, length=6, beam_size=beam, return_tokens=True)
        body = [r[1 : r.index(tok.eot_id)] for r in out.tolist()]
        assert not any(set(b) & set(banned_ids(tok)) for b in body)


def test_min_length_holds_arcs_end_back_and_is_refused_for_mdc(images):
    arc = small_model("arc").eval()
    eot = arc.tokenizer.eot_id
    out = mdc.generate(arc, images, length=8, beam_size=2, min_length=[6, 7, 8, 6], return_tokens=True)
    assert all(r.index(eot) - 1 >= m for r, m in zip(out.tolist(), [6, 7, 8, 6]))
    with pytest.raises(ValueError, match="min_length.*ARC"):
        mdc.generate(small_model(), images, length=5, min_length=3)  # MDC writes exactly `length` tokens
