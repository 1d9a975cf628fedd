"""Registry of named architectures (open_clip style): list_models, create_model, load, and the
trained weights shipped with the package (list_pretrained; ``create_model(..., pretrained=tag)``).

The factory is where the extensions are wired in, as open_clip's factory picks a model's loss.
The core config (:class:`mdc.model.ModelConfig`) holds what the core uses; each extension brings its
own config, kept in ``ModelConfig.extensions`` under its name (as open_clip keeps CoCa's multimodal
config beside the vision and text configs):

- "guidance": :class:`mdc.mc_diffusion.guidance.ConditionVariants` (``cond_drop_prob``, ``cond_mask_prob``,
  ``cond_mask_select_prob``), attached to the captioner with the parameters it learns;
- "mask_replace": :class:`mdc.mc_diffusion.mask_replace.MaskReplace` (``diffusion_steps``, ``replace_prob``,
  ``aux_loss_weight``), the captioner's noise process instead of :data:`mdc.absorbing.ABSORBING`;
- "vqvae": :class:`mdc.mc_diffusion.vqvae.VQConfig` fields, the captioner's visual tower (:class:`mdc.mc_diffusion.vqvae.VQImageTokens`).

Overrides stay flat (``create_model("tiny", cond_drop_prob=0.1)``, ``noise="mask_replace"``,
``vqvae=folder``): :func:`config_fields` files each under its owner, and reads a ``config.json`` written
before the split (flat fields) the same way. The core never imports the extensions; the model
carries what was chosen here (``model.noise``, ``model.condition_variants``, ``model.visual``).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import fields

from safetensors.torch import load_file

from mdc.base.checkpoint import latest
from mdc.absorbing import ABSORBING
from mdc.mc_diffusion.mask_replace import MaskReplace
from mdc.data.transforms import image_transform as _transform
from mdc.base.errors import ConfigError, WeightsError
from mdc.mc_diffusion.guidance import ConditionVariants
from mdc.model import CLIP, Captioner, ModelConfig
from mdc.tokenizer import Tokenizer
from mdc.mc_diffusion.vqvae import VQConfig, VQImageTokens, read_config
from mdc.world.text import vocabulary

# ViT-B: decoder 12 x 512 x 8 heads; ViT-L: 12 x 768 x 12 heads (paper Sec. 4.1).
_VIT_B = dict(image_size=224, vision_width=768, vision_layers=12, vision_heads=12,
              text_width=512, text_layers=12, text_heads=8, embed_dim=512)
# CPU-sized model for the synthetic scene world: 64 px images, compact vocabulary.
_TINY = dict(image_size=64, patch_size=8, vision_width=128, vision_layers=4, vision_heads=4,
             text_width=128, text_layers=4, text_heads=4, embed_dim=128, context_length=64, vocab="scenes")
_ARCHS: dict[str, dict] = {
    "tiny": _TINY,
    # tiny with a convolutional stem (64 px, 64 image tokens): the `mini` reproduction profile's model, the
    # encoder with the highest supervised ceiling in the learnability study (reproduce/studies/learnability.md),
    # trained with the preset file reproduce/presets/mini.json.
    "mini": dict(_TINY, vision_stem="conv"),
    "vit-b-32": dict(_VIT_B, patch_size=32),
    "vit-b-16": dict(_VIT_B, patch_size=16),
    "vit-l-14": dict(image_size=224, patch_size=14, vision_width=1024, vision_layers=24, vision_heads=16,
                     text_width=768, text_layers=12, text_heads=12, embed_dim=768),
}
# ModelConfig.extensions: an extension's name -> its config class, whose fields are the flat overrides it takes
EXTENSIONS = {"guidance": ConditionVariants, "mask_replace": MaskReplace, "vqvae": VQConfig}
_OWNER = {f.name: name for name, cls in EXTENSIONS.items() if name != "vqvae" for f in fields(cls)}
NOISES = ("absorbing", "mask_replace")  # the values of the flat ``noise`` override

# Trained weights inside the package, mdc/pretrained/<model>-<objective>-<tag>/ (config.json, model.safetensors
# in float16, record.json: the ledger record of the run that trained them), by (model, objective, tag) -> the
# sha256 (16 hex) of model.safetensors. "synthetic": the `mini` reference run's seed-0 models on the synthetic
# world's descriptive captions (python -m reproduce.pretrained writes them from the run's kept checkpoints).
PRETRAINED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained")
_PRETRAINED = {
    ("mini", "mdc", "synthetic"): "22ccdc1f9c55c895",
    ("mini", "arc", "synthetic"): "d9d8532c98cefc96",
    ("mini", "clip", "synthetic"): "3c61f0d141fed6f3",
}


def list_models() -> list[str]:
    return list(_ARCHS)


def list_pretrained() -> list[tuple[str, str, str]]:
    """``(model, objective, tag)`` of every set of trained weights the package ships, e.g.
    ``("mini", "mdc", "synthetic")``: ``create_model(model, objective, pretrained=tag)`` loads it."""
    return list(_PRETRAINED)


def pretrained_folder(name: str, objective: str, tag: str) -> str:
    """The folder of shipped weights ``tag`` of ``name`` trained with ``objective``."""
    if (name, objective, tag) not in _PRETRAINED:
        raise ConfigError(f"no pretrained weights {tag!r} for model {name!r} with objective {objective!r}; "
                          f"shipped: {list_pretrained()}", "pretrained")
    return os.path.join(PRETRAINED_DIR, f"{name}-{objective}-{tag}")


def _resolve_vocab(vocab):
    if vocab == "scenes":  # the embedded synthetic world's closed vocabulary
        return vocabulary()
    return vocab


def config_fields(flat: dict) -> dict:
    """ModelConfig arguments from flat fields (overrides, or a config.json of any version): the core's as
    they are, each extension's under ``extensions[name]``. An extension is on when a field of it differs
    from its default or, for mask-and-replace noise, when ``noise="mask_replace"``; ValueError names a
    field that belongs to no one, or an option of an extension that is off."""
    args, ext = {}, {name: dict(cfg) for name, cfg in (flat.get("extensions") or {}).items()}
    core = {f.name for f in fields(ModelConfig)} - {"extensions"}
    for key, value in flat.items():
        if key in core:
            args[key] = value
        elif key in _OWNER:
            ext.setdefault(_OWNER[key], {})[key] = value
        elif key == "vqvae" and value is not None:
            ext["vqvae"] = read_config(value) if isinstance(value, (str, os.PathLike)) else dict(value)
        elif key not in ("vqvae", "noise", "extensions"):
            raise ValueError(f"unknown config field {key!r}")
    noise = flat.get("noise", "mask_replace" if "mask_replace" in (flat.get("extensions") or {}) else "absorbing")
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}; got {noise!r}")
    if noise == "absorbing" and MaskReplace(**ext.pop("mask_replace", {})) != MaskReplace():
        raise ValueError("diffusion_steps, replace_prob and aux_loss_weight belong to noise='mask_replace'")
    if noise == "mask_replace":
        ext.setdefault("mask_replace", {})
    if "guidance" in ext and not ConditionVariants(**ext["guidance"]).active:
        del ext["guidance"]  # all off: plain MDC, written as such
    for name in set(ext) & {"guidance", "mask_replace"}:  # an option at its default is not written: one form per config
        defaults = EXTENSIONS[name]()
        ext[name] = {k: v for k, v in ext[name].items() if v != getattr(defaults, k, object())}
    return {**args, "extensions": ext}


def model_config(name: str, objective: str = "mdc", **overrides) -> ModelConfig:
    if name not in _ARCHS:
        raise ValueError(f"unknown model {name!r}; available: {list_models()}")
    unknown = set(overrides) - ({f.name for f in fields(ModelConfig)} | set(_OWNER) | {"noise", "vqvae"}) \
        - {"name", "objective", "extensions"}
    if unknown:
        raise ValueError(f"unknown config override(s) {sorted(unknown)} for model {name!r}")
    args = config_fields({**_ARCHS[name], **overrides})
    args["vocab"] = _resolve_vocab(args.get("vocab"))
    if "vqvae" in args["extensions"] and "image_size" not in overrides:  # a VQ-VAE's own size (mdc/mc_diffusion/vqvae.py)
        args["image_size"] = args["extensions"]["vqvae"]["image_size"]
    cfg = ModelConfig(name=name, objective=objective, **args)
    _extensions(cfg)  # each extension checks its own options
    return cfg


def _extensions(cfg: ModelConfig) -> tuple[ConditionVariants, MaskReplace | None, VQConfig | None]:
    """The extensions ``cfg`` names, as their configs; ValueError for an unknown one or a conflict."""
    unknown = set(cfg.extensions) - set(EXTENSIONS)
    if unknown:
        raise ValueError(f"unknown extension(s) {sorted(unknown)}; known: {sorted(EXTENSIONS)}")
    ext = cfg.extensions
    noise = MaskReplace(**ext["mask_replace"]) if "mask_replace" in ext else None
    if noise is not None and cfg.mask_ratio is not None:
        raise ValueError(f"mask_ratio = {cfg.mask_ratio} belongs to the absorbing noise; drop it for 'mask_replace'")
    vq = VQConfig(**ext["vqvae"]) if "vqvae" in ext else None
    return ConditionVariants(**ext.get("guidance", {})), noise, vq


def build(cfg: ModelConfig):
    """The model of ``cfg``, with the extensions its config names wired in (module docstring)."""
    if cfg.objective == "clip":
        return CLIP(cfg)
    variants, noise, vq = _extensions(cfg)
    visual = VQImageTokens(cfg, vq, mask_code=variants.cond_mask_prob > 0) if vq is not None else None
    model = Captioner(cfg, visual=visual, noise=noise or ABSORBING)  # an ARC captioner has none and ignores it
    if variants.active:
        variants.attach(model)
    return model


def create_model(name: str, objective: str = "mdc", pretrained: str | None = None, **overrides):
    """Build a named architecture from scratch, e.g. create_model("tiny", objective="arc", mask_ratio=None),
    or with the trained weights ``pretrained`` (a tag of :func:`list_pretrained`), in eval mode:
    create_model("mini", objective="mdc", pretrained="synthetic"); those fix the config (no overrides).
    ``vqvae=folder``: condition on that frozen VQ-VAE's codes, its weights copied in (mdc/mc_diffusion/vqvae.py)."""
    if pretrained is not None:
        if overrides:
            raise ConfigError(f"pretrained weights fix the model's config; got overrides {sorted(overrides)} "
                              f"with pretrained={pretrained!r}", "pretrained")
        return _load_pretrained(name, objective, pretrained)
    model = build(model_config(name, objective, **overrides))
    if isinstance(overrides.get("vqvae"), (str, os.PathLike)):
        model.visual.load_vqvae(overrides["vqvae"])
    return model


def image_transform(model, train: bool = False):
    """The image transform of a model (or an image size): PIL image -> normalised FloatTensor
    [3, S, S]. Eval: resize the shorter side to S, centre crop. Train: a mild random-resized
    crop. Both normalise with CLIP's mean/std (see :class:`mdc.data.transforms.ImageTransform`)."""
    return _transform(model if isinstance(model, int) else model.config.image_size, train)


def create_model_and_transforms(name: str, objective: str = "mdc", pretrained: str | None = None, **overrides):
    """(model, preprocess): the model and its evaluation transform, as open_clip pairs them."""
    model = create_model(name, objective, pretrained, **overrides)
    return model, image_transform(model)


def get_tokenizer(model: str | None = None, *, context_length: int | None = None, vocab=None,
                  **overrides) -> Tokenizer:
    """The tokenizer of a named model (open_clip's ``get_tokenizer(model_name)``), e.g. ``get_tokenizer("tiny")``.

    Without a name: CLIP's BPE with [MASK], 77 tokens. ``context_length`` / ``vocab`` (BPE ids
    of a compact vocabulary) override the model's; ``overrides`` are other ModelConfig fields.
    """
    if model is None:
        return Tokenizer(context_length or 77, vocab)
    cfg = model_config(model, **overrides)
    return Tokenizer(context_length or cfg.context_length, cfg.vocab if vocab is None else vocab)


def load_weights(model, path: str | os.PathLike, map_location="cpu") -> None:
    """Load `path/model.safetensors` into `model` in place (16-bit files are cast to the model's dtype);
    a file that does not parse is a WeightsError naming it."""
    weights = os.path.join(path, "model.safetensors")
    try:
        state = load_file(weights, device=str(map_location))
    except FileNotFoundError:
        raise WeightsError(f"weights file missing: {weights}") from None
    except Exception as e:  # safetensors' own error types: a bad header, a truncated file
        raise WeightsError(f"weights file is corrupt: {weights} ({e})") from None
    model.load_state_dict(state)


def checkpoint_folder(path: str | os.PathLike) -> str:
    """The checkpoint folder ``path`` is, or the newest checkpoint of the run folder ``path``
    (``checkpoints/latest.json``, as mdc.train writes it); FileNotFoundError naming what is missing."""
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "config.json")) and os.path.isdir(path):
        path = latest(path) or path  # a run folder
    for name in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(path, name)):
            raise FileNotFoundError(f"checkpoint file missing: {os.path.join(path, name)} (give a checkpoint "
                                    f"folder or a run folder with checkpoints/latest.json)")
    return path


def load(path: str | os.PathLike, map_location="cpu"):
    """Rebuild a model from `path/config.json` and load `path/model.safetensors` (no pickle);
    ``path`` may also be a pretraining run folder (its newest checkpoint is loaded)."""
    path = checkpoint_folder(path)
    with open(os.path.join(path, "config.json")) as f:
        model = build(ModelConfig(**config_fields(json.load(f))))
    load_weights(model, path, map_location)
    return model


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, its first 16 hex digits (a checkpoint's ``checkpoint_id``)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _load_pretrained(name: str, objective: str, tag: str):
    folder = pretrained_folder(name, objective, tag)
    for file in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(folder, file)):
            raise WeightsError(f"pretrained file missing: {os.path.join(folder, file)} (reinstall mdc)")
    weights, expected = os.path.join(folder, "model.safetensors"), _PRETRAINED[name, objective, tag]
    if (found := file_digest(weights)) != expected:
        raise WeightsError(f"pretrained weights file is corrupt: {weights} (sha256 {found}..., expected "
                           f"{expected}...; reinstall mdc)")
    return load(folder).eval()
