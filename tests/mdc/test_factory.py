"""mdc.factory: the registry, create_model, load and the extensions' configs."""
import json

import pytest
import torch

import mdc
from conftest import CAPTIONS, SMALL, small_model


BIG = ["vit-b-32", "vit-b-16", "vit-l-14"]


def test_list_models():
    assert set(mdc.list_models()) >= {"tiny", *BIG}


@pytest.mark.parametrize("name", BIG)
def test_named_configs_build(name):
    m = mdc.create_model(name, objective="mdc")
    cfg = m.config
    assert (cfg.image_size, cfg.context_length, m.tokenizer.vocab_size) == (224, 77, 49409)
    width = {"vit-l-14": 768}.get(name, 512)
    assert (cfg.text_layers, cfg.text_width) == (12, width)
    assert m.decoder.blocks[0].self_attn.heads == {"vit-l-14": 12}.get(name, 8)
    assert m.visual.patch_embed.proj.kernel_size[0] == int(name.split("-")[-1])


def test_save_load_round_trip(tmp_path, images):
    for objective in ("mdc", "clip"):
        m = small_model(objective, t_interval=(0.3, 0.8)).eval()
        tok = m.tokenizer(CAPTIONS)
        m.save(tmp_path / objective)
        files = sorted(p.name for p in (tmp_path / objective).iterdir())
        assert files == ["config.json", "model.safetensors"]
        assert json.loads((tmp_path / objective / "config.json").read_text())["t_interval"] == [0.3, 0.8]
        m2 = mdc.load(tmp_path / objective).eval()
        assert m2.config == m.config
        with torch.no_grad():
            a, b = m(images, tok), m2(images, tok)
        for x, y in zip(a if objective == "clip" else [a], b if objective == "clip" else [b]):
            assert torch.equal(x, y)


def test_load_missing_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        mdc.load(tmp_path)


def test_create_model_and_transforms_binds_the_eval_transform():
    from PIL import Image

    model, preprocess = mdc.create_model_and_transforms("tiny", objective="arc", **SMALL)
    x = preprocess(Image.new("RGB", (50, 40), (200, 30, 30)))
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert model.encode_image(x[None]).shape == (1, 64)


def test_load_accepts_a_run_folder(tmp_path):
    from mdc.base.checkpoint import LATEST

    m = small_model()
    m.save(tmp_path / "run" / "checkpoints" / "step_000007")
    (tmp_path / "run" / "checkpoints" / LATEST).write_text(json.dumps({"step": 7, "path": "step_000007"}))
    assert mdc.load(tmp_path / "run").config == m.config
    with pytest.raises(FileNotFoundError, match="latest.json"):
        mdc.load(tmp_path / "elsewhere")


# ------------------------------------------------------------ the extensions bring their own configs
def test_flat_overrides_are_filed_under_their_extension():
    cfg = mdc.model_config("tiny", cond_drop_prob=0.1, noise="mask_replace", diffusion_steps=10)
    assert cfg.extensions == {"guidance": {"cond_drop_prob": 0.1}, "mask_replace": {"diffusion_steps": 10}}
    assert mdc.model_config("tiny", cond_drop_prob=0.0, noise="absorbing").extensions == {}  # all off: plain MDC
    assert not {"cond_drop_prob", "noise", "diffusion_steps", "vqvae"} & set(vars(cfg))  # the core holds the core


def test_a_config_written_before_the_split_loads_with_its_extensions(tmp_path):
    model = small_model(cond_drop_prob=0.2)
    model.save(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    flat = {k: v for k, v in saved.items() if k != "extensions"}
    flat |= dict(cond_drop_prob=0.2, cond_mask_prob=0.0, cond_mask_select_prob=0.1, noise="absorbing",
                 diffusion_steps=100, replace_prob=0.1, aux_loss_weight=0.01, vqvae=None)  # the old file's fields
    (tmp_path / "config.json").write_text(json.dumps(flat))
    loaded = mdc.load(tmp_path)
    assert loaded.config == model.config and loaded.condition_variants == model.condition_variants
    torch.testing.assert_close(loaded.cond_null, model.cond_null)


@pytest.mark.parametrize("kw, match", [
    (dict(diffusion_steps=10), "belong to noise='mask_replace'"),
    (dict(noise="gaussian"), "noise must be one of"),
    (dict(cond_drop_prob=1.5), "cond_drop_prob must lie in"),
    (dict(extensions={"lora": {}}), r"unknown extension\(s\) \['lora'\]"),
])
def test_bad_extension_options_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        mdc.model_config("tiny", **kw)


def test_the_extension_parameters_come_after_the_core_ones():
    """Attached by the factory after the captioner is built: the core's initial weights are the same with or
    without the extension, and the state dict keeps its names (``cond_null``, ``cond_mask_token``)."""
    torch.manual_seed(0)
    plain = mdc.create_model("tiny", **SMALL)
    torch.manual_seed(0)
    guided = mdc.create_model("tiny", cond_drop_prob=0.1, cond_mask_prob=0.1, **SMALL)
    extra = set(guided.state_dict()) - set(plain.state_dict())
    assert extra == {"cond_null", "cond_mask_token"}
    assert all(torch.equal(v, guided.state_dict()[k]) for k, v in plain.state_dict().items())
