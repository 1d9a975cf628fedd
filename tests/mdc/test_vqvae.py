"""VQ-VAE image tokens (MC-Diffusion's discrete-to-discrete setup) and a captioner conditioned on them."""
import json

import pytest
import torch

import mdc
from conftest import CAPTIONS, SMALL
from mdc.condition import num_image_tokens
from mdc.base.optim import param_groups
from mdc.mc_diffusion.vqvae import VQConfig, VQVAE, load_vqvae, main, synthetic_images, train_vqvae

TINY_VQ = dict(image_size=32, downsample=4, channels=32, code_dim=32, codebook_size=64)


@pytest.fixture(scope="module")
def scenes():
    return synthetic_images(64, 32, seed=0), synthetic_images(32, 32, seed=1)  # train, held out


@pytest.fixture(scope="module")
def vq_folder(tmp_path_factory, scenes):
    vq, _ = train_vqvae(scenes[0], VQConfig(**TINY_VQ, ema=True), steps=20, batch_size=16, lr=1e-3)
    path = tmp_path_factory.mktemp("vq")
    vq.save(path)
    return path


@pytest.mark.parametrize("ema, lr", [(False, 2e-4), (True, 1e-3)])
def test_short_training_beats_the_mean_image(scenes, ema, lr):
    train, test = scenes
    vq, log = train_vqvae(train, VQConfig(**TINY_VQ, ema=ema), steps=100, batch_size=16, lr=lr, seed=0)
    mean_image = train.mean((0, 2, 3), keepdim=True)  # the per-channel mean: a fixed baseline
    baseline = (test - mean_image).pow(2).mean()
    with torch.no_grad():
        recon, losses, codes = vq(test)
    assert (recon - test).pow(2).mean() < (0.5 if ema else 0.75) * baseline
    assert codes.shape == (32, 64) and codes.min() >= 0 and codes.max() < 64
    assert losses["perplexity"] > 8  # many codes in use, not a collapsed codebook
    assert torch.allclose(vq.decode(vq.encode(test)), recon, atol=1e-5)
    assert len(log["loss"]) == 100 and all(torch.isfinite(torch.tensor(log["loss"])))


def test_encode_never_moves_the_codebook(scenes):
    vq = VQVAE(VQConfig(**TINY_VQ, ema=True)).train()
    vq(scenes[1][:8])  # initialises the codebook (training forward)
    before = vq.codebook.detach().clone()
    vq.encode(scenes[1])
    assert torch.equal(vq.codebook, before)


def test_trains_from_any_image_folder(tmp_path):
    from mdc.world.render import render
    from mdc.world.scenes import sample_scene, stream_rng

    for i in range(6):  # nested folders, like CUB's images/<class>/<image>.jpg
        folder = tmp_path / "images" / f"{i % 2:03d}.class"
        folder.mkdir(parents=True, exist_ok=True)
        render(sample_scene(stream_rng(0, 0, i)), 40).save(folder / f"img_{i}.jpg")
    vq, log = train_vqvae(str(tmp_path / "images"), VQConfig(**TINY_VQ), steps=3, batch_size=4)
    assert len(log["loss"]) == 3 and vq.encode(synthetic_images(2, 32)).shape == (2, 64)
    with pytest.raises(ValueError, match="no images found"):
        train_vqvae(str(tmp_path / "empty"), VQConfig(**TINY_VQ), steps=1)


def test_save_load_and_cli(tmp_path, vq_folder, scenes):
    vq = load_vqvae(vq_folder)
    assert torch.equal(load_vqvae(vq_folder).encode(scenes[1]), vq.encode(scenes[1]))
    summary = main(["--out", str(tmp_path / "cli"), "--synthetic", "8", "--steps", "2", "--batch-size", "4",
                    "--config", json.dumps(TINY_VQ)])
    assert summary["steps"] == 2 and load_vqvae(tmp_path / "cli").config.codebook_size == 64


def test_captioner_on_vq_tokens(tmp_path, vq_folder, scenes):
    overrides = {k: v for k, v in SMALL.items() if k != "image_size"}  # the VQ-VAE's size (32) is taken
    model = mdc.create_model("tiny", vqvae=str(vq_folder), cond_mask_prob=0.1, **overrides)
    images, tokens = scenes[1][:4], model.tokenizer(CAPTIONS)
    assert model.config.image_size == 32 and model.config.extensions["vqvae"] == {**TINY_VQ, "beta": 0.25, "ema": True,
                                                                     "ema_decay": 0.99}
    assert num_image_tokens(model) == 64 and model.forward_features(images).shape == (4, 64, 64)
    vq_state = load_vqvae(vq_folder).state_dict()
    assert all(torch.equal(model.visual.vq.state_dict()[k], v) for k, v in vq_state.items())  # weights copied in
    model.train()
    assert not model.visual.vq.training  # frozen: stays in eval mode
    loss = model.loss(images, tokens, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss) and model.visual.embed.weight.grad is not None
    assert all(p.grad is None and not p.requires_grad for p in model.visual.vq.parameters())
    trained = {id(p) for g in param_groups(model, 0.1) for p in g["params"]}
    assert not any(id(p) in trained for p in model.visual.vq.parameters())
    caps = mdc.generate(model, images, 5, guidance="mcs", guidance_scale=2.0)
    assert len(caps) == 4
    model.eval().save(tmp_path / "cap")  # the VQ-VAE lives in the captioner's checkpoint
    loaded = mdc.load(tmp_path / "cap")
    with torch.no_grad():
        assert torch.equal(loaded(images, tokens), model(images, tokens))


def test_vq_mask_is_the_mask_code_at_its_position(vq_folder, scenes):
    """MCS on VQ codes: a masked code becomes [MASK] (id K), embedded by the code embedding like any
    code, then its position embedding is added; the same mask at two positions gives two different
    decoder inputs, and the other (local) tokens stay as they were. Without the option: K codes only."""
    overrides = {k: v for k, v in SMALL.items() if k != "image_size"}
    plain = mdc.create_model("tiny", vqvae=str(vq_folder), **overrides)
    assert plain.visual.embed.num_embeddings == 64 and not any(k.startswith("cond_") for k in plain.state_dict())
    model = mdc.create_model("tiny", vqvae=str(vq_folder), cond_mask_prob=0.1, **overrides).eval()
    vis = model.visual
    assert vis.embed.num_embeddings == 65 and vis.mask_id == 64 and getattr(model, "cond_mask_token", None) is None
    images, (i, j) = scenes[1][:2], (5, 40)
    mask_i, mask_j = (torch.zeros(2, 64, dtype=torch.bool) for _ in range(2))
    mask_i[:, i], mask_j[:, j] = True, True
    keys = lambda m=None: model.context(images, token_mask=m)[0][0].transpose(1, 2).flatten(2)  # noqa: E731
    with torch.no_grad():
        at_i, at_j, full = keys(mask_i), keys(mask_j), keys()
        assert not torch.allclose(at_i[:, i], at_j[:, j], atol=1e-4)
        others = [k for k in range(64) if k not in (i, j)]
        assert torch.equal(at_i[:, others], full[:, others])  # codes are local tokens
        expected = model.image_proj(vis.norm(vis.embed.weight[64] + vis.pos[i]))
        assert torch.allclose(model.condition(images, token_mask=mask_i)[:, i], expected.expand(2, -1), atol=1e-6)
    model.train()
    g = torch.Generator().manual_seed(0)
    loss = mdc.create_model("tiny", vqvae=str(vq_folder), cond_mask_prob=0.5, cond_mask_select_prob=0.9, **overrides)
    loss.loss(scenes[1][:4], loss.tokenizer(CAPTIONS), generator=g).backward()
    assert loss.visual.embed.weight.grad[64].abs().sum() > 0  # training reaches the [MASK] code


def test_bad_vqvae_input_is_named(tmp_path, vq_folder):
    with pytest.raises(ValueError, match="downsample must be a power of 2 .* got 3"):
        VQConfig(downsample=3)
    with pytest.raises(ValueError, match="not a VQ-VAE folder"):
        mdc.create_model("tiny", vqvae=str(tmp_path))
    with pytest.raises(ValueError, match="the VQ-VAE takes 32 px images but the model's image_size is 64"):
        mdc.create_model("tiny", vqvae=str(vq_folder), image_size=64)
    with pytest.raises(ValueError, match="apply to 'mdc' captioners only"):
        mdc.create_model("tiny", objective="arc", vqvae=str(vq_folder))
