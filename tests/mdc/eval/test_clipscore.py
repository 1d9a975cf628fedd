"""CLIPScore / RefCLIPScore (Hessel et al. 2021) against their formulas, CLIP loading, CLIP reranking."""
import math
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import CAPTIONS, small_model
from mdc.eval.clipscore import clip_rerank, clip_score, clip_scores, load_clip, ref_clip_score


def test_clipscore_formula_on_hand_made_embeddings():
    image = torch.tensor([[1.0, 0.0]]).repeat(4, 1)
    text = torch.tensor([[3.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]])  # cos 1, 0, -1, 1/sqrt(2)
    expected = torch.tensor([2.5, 0.0, 0.0, 2.5 / math.sqrt(2)])
    assert torch.allclose(clip_score(image, text), expected)
    assert torch.allclose(clip_score(image, text, w=1.0), expected / 2.5)


def test_refclipscore_is_the_harmonic_mean():
    image = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    text = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    refs = [torch.tensor([[0.0, 1.0], [1.0, 0.0]]),  # best reference cos 1/sqrt(2)
            torch.tensor([[-1.0, 0.0]]),  # reference term max(-1, 0) = 0
            torch.tensor([[1.0, 0.0]])]  # CLIPScore 0 (orthogonal image)
    a, b = 2.5 / math.sqrt(2), 1 / math.sqrt(2)
    assert torch.allclose(ref_clip_score(image, text, refs), torch.tensor([2 * a * b / (a + b), 0.0, 0.0]))


def _pil(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture
def clip_dir(tmp_path):
    small_model("clip").save(tmp_path / "clip")
    return str(tmp_path / "clip")


def test_clip_scores_with_a_package_clip(clip_dir):
    clip = load_clip(clip_dir)
    assert clip.kind == "mdc" and clip.prefix == ""
    images, refs = _pil(4), [[c, CAPTIONS[0]] for c in CAPTIONS]
    got = clip_scores(clip, images, CAPTIONS, refs)
    model, x = clip.model, torch.stack([clip.preprocess(im) for im in images])
    with torch.no_grad():
        img, txt = model.image_embedding(x), model.text_embedding(model.tokenizer(CAPTIONS))
    assert torch.allclose(got["clipscore"], 2.5 * (img * txt).sum(-1).clamp(min=0), atol=1e-5)
    assert got["refclipscore"].shape == (4,) and ((got["refclipscore"] >= 0) & (got["refclipscore"] <= 2.5)).all()


def test_load_clip_names_bad_specs(tmp_path, clip_dir):
    with pytest.raises(ValueError, match="never downloaded"):
        load_clip("open_clip:ViT-B-32:openai")  # a pretrained tag, not a local file
    with pytest.raises(ValueError, match="not a checkpoint folder"):
        load_clip(str(tmp_path))
    small_model("mdc").save(tmp_path / "mdc")
    with pytest.raises(ValueError, match="holds an 'mdc' model; CLIPScore needs objective 'clip'"):
        load_clip(str(tmp_path / "mdc"))


def test_open_clip_weights_come_from_the_local_file(tmp_path, monkeypatch):
    """open_clip is asked for the user's file (no hub name); the OpenAI prefix is applied."""
    weights = tmp_path / "vit.bin"
    weights.write_bytes(b"0")
    seen = {}

    class Fake(torch.nn.Module):
        def encode_image(self, x):
            return x.flatten(1)[:, :4]

        def encode_text(self, t):
            return t[:, :4].float()

    def create(arch, pretrained=None, **kw):
        seen.update(arch=arch, pretrained=pretrained)
        return Fake(), None, lambda im: torch.ones(3, 2, 2)

    fake = types.SimpleNamespace(create_model_and_transforms=create,
                                 get_tokenizer=lambda arch: lambda texts: torch.tensor([[len(t), 1, 2, 3] for t in texts]))
    monkeypatch.setitem(sys.modules, "open_clip", fake)
    clip = load_clip(f"open_clip:ViT-B-32:{weights}")
    assert seen == {"arch": "ViT-B-32", "pretrained": str(weights)} and clip.prefix == "A photo depicts "
    assert clip.texts(["a"])[0, 0] > 0 and clip.images(_pil(2)).shape == (2, 4)


def test_clip_rerank_keeps_the_best_candidate(clip_dir):
    clip, model = load_clip(clip_dir), small_model().eval()
    images = _pil(3)
    best, candidates, scores = clip_rerank(model, clip, images, k=4, length=5, seed=1)
    assert scores.shape == (3, 4) and [len(c) for c in candidates] == [4, 4, 4]
    again = clip_scores(clip, [im for im in images for _ in range(4)], [c for cs in candidates for c in cs])
    assert torch.allclose(again["clipscore"].view(3, 4), scores, atol=1e-5)
    assert best == [cs[int(i)] for cs, i in zip(candidates, scores.argmax(1))]
    assert clip_rerank(model, clip, images, k=4, length=5, seed=1)[1] == candidates  # seeded
    with pytest.raises(ValueError, match="got objective 'arc'"):
        clip_rerank(small_model("arc"), clip, images)
