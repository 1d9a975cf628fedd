"""Models: an image captioner (MDC / ARC) and the CLIP baseline, both on a timm ViT trained from scratch.

Captioner (paper Sec. 3.2, following CapPa): image I -> ViT encoder f_phi -> tokens V [B, T, Dv]
-> linear projection to the decoder width -> decoder g_psi of N pre-LN blocks
[self-attention -> cross-attention to V -> MLP] -> logits over the vocabulary.
Self-attention is bidirectional for MDC (and image-conditioned BERT), causal for ARC.
The decoder is time-independent: t never enters the network, only the loss weight.

CLIP: the same vision tower with a class token; the text tower is the decoder's architecture
without cross-attention (causal, pooled at [EOT]); both project to a joint embedding.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import asdict, dataclass, field

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from mdc.base.torchvision_shim import patch_torchvision
from mdc.condition import ImageContext, masked_features, vary_condition
from mdc.absorbing import ABSORBING, Masking
from mdc.autoregressive import arc_loss
from mdc.contrastive import clip_loss
from mdc.noise import NoiseProcess
from mdc.tokenizer import Tokenizer, trim_padding, valid_mask
from mdc.transformer import Head, TextTransformer

__all__ = ["CLIP", "Captioner", "ModelConfig", "evaluating", "vision_tower"]

OBJECTIVES = ("mdc", "arc", "clip")
POSITIONS = ("learned", "rotary")  # the text transformer's positions: a learned embedding, or RoPE (mdc/transformer.py)


@dataclass
class ModelConfig:
    name: str = "custom"  # registry name it was built from
    objective: str = "mdc"  # "mdc" (and its BERT ablations) | "arc" | "clip"
    # vision tower: timm ViT, trained from scratch
    image_size: int = 224  # input resolution (square)
    patch_size: int = 16  # image tokens: (image_size / patch_size)^2
    vision_stem: str = "patch"  # "patch": a patch_size-stride projection | "conv": log2(patch_size) stride-2 convs
    vision_width: int = 768
    vision_layers: int = 12
    vision_heads: int = 12
    # text decoder (captioners) / text tower (CLIP)
    text_width: int = 512
    text_layers: int = 12
    text_heads: int = 8
    mlp_ratio: float = 4.0
    context_length: int = 77  # tokens per caption, SOT and EOT included
    positions: str = "learned"  # "learned" absolute embedding | "rotary" (RoPE on the self-attention's q and k)
    vocab: tuple[int, ...] | None = None  # compact vocabulary (BPE ids kept); None = full CLIP BPE
    embed_dim: int = 512  # CLIP joint embedding width
    # MDC objective (paper Alg. 1); ignored by ARC and CLIP
    t_interval: tuple[float, float] = (0.5, 1.0)  # t ~ U[w_l, w_u]
    time_weighting: bool = True  # weight by 1/t; False = the "w/o t" (CMLM) ablation
    mask_ratio: float | None = None  # fixed ratio = image-conditioned BERT; 1.0 = parallel decoding
    t_sampling: str = "uniform"  # "uniform" | "antithetic" | "stratified" (how t is drawn across a batch)
    length_visible: bool = True  # False: captions padded to the context, [EOT] and padding masked and predicted
    # extensions (MC-Diffusion's condition variants, mask-and-replace noise, VQ-VAE tokens): name -> its own
    # config fields, read by the extension alone; mdc.factory wires them in. {} is plain MDC / ARC / CLIP
    extensions: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {OBJECTIVES}")
        self.t_interval = self.masking.interval  # validated by Masking, stored as a tuple of floats
        for name in ("image_size", "patch_size", "vision_width", "vision_layers", "vision_heads", "text_width",
                     "text_layers", "text_heads", "embed_dim"):  # refused here, not as a bare assert deep in timm
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for width, heads in (("vision_width", "vision_heads"), ("text_width", "text_heads")):
            if getattr(self, width) % getattr(self, heads):
                raise ValueError(f"{width} {getattr(self, width)} is not divisible by {heads} {getattr(self, heads)} "
                                 f"(each attention head takes an equal share of the width)")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.vision_stem not in ("patch", "conv"):
            raise ValueError(f"vision_stem must be 'patch' or 'conv'; got {self.vision_stem!r}")
        if self.vision_stem == "conv" and (self.patch_size < 2 or self.patch_size & (self.patch_size - 1)):
            raise ValueError(f"a conv stem halves the resolution per convolution, so patch_size must be a power of 2 "
                             f">= 2; got {self.patch_size}")
        if self.positions not in POSITIONS or self.positions == "rotary" and self.text_width // self.text_heads % 2:
            raise ValueError(f"positions must be one of {POSITIONS} (rotary: an even text head width); got "
                             f"{self.positions!r}")
        if not self.length_visible and (self.objective != "mdc" or "mask_replace" in self.extensions):
            raise ValueError(f"length_visible=False applies to MDC's absorbing noise only; got objective "
                             f"{self.objective!r}{' with mask_replace noise' * ('mask_replace' in self.extensions)}")
        if self.vocab is not None:
            self.vocab = tuple(int(i) for i in self.vocab)
        if self.extensions and self.objective != "mdc":
            raise ValueError(f"extensions {sorted(self.extensions)} apply to 'mdc' captioners only; "
                             f"got objective {self.objective!r}")

    @property
    def masking(self) -> Masking:
        """MDC's masking ratio as one object (interval, sampling, fixed ratio, 1/t weighting)."""
        return Masking(self.t_interval, self.t_sampling, self.mask_ratio, self.time_weighting)

    def to_json(self) -> str:
        """Every field as JSON (a config.json written before a field existed loads it at its default)."""
        return json.dumps(asdict(self), indent=1)


PRECISIONS = ("auto", "fp32", "bf16")


def uses_bf16(precision: str, device: torch.device) -> bool:
    """The precision rule, for training and evaluation alike: bf16 autocast with "bf16", or "auto" on CUDA."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {precision!r}")
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


@contextlib.contextmanager
def evaluating(model: nn.Module, precision: str = "auto"):
    """Eval mode (the previous mode restored afterwards) under the evaluation precision:
    "auto" = bf16 autocast on CUDA and fp32 elsewhere, "fp32", or "bf16" (autocast on any
    device); an autocast the caller has entered is switched off for the model's device unless
    bf16 is asked for. Under bf16 the vocabulary head (:class:`Head`) still runs in fp32, and
    log-probabilities are always taken in fp32 (:func:`mdc.distribution.caption_log_probs`). The
    scorers default to "fp32" (:func:`mdc.scoring.score`), the sampler to "auto".
    Under fp32, TF32 is off for matmuls and cuDNN convolutions (``torch.backends.cuda.matmul.allow_tf32``,
    ``torch.backends.cudnn.allow_tf32``; PyTorch enables the latter by default, which would put the
    conv stem and patch embedding in TF32), and both flags are restored afterwards."""
    device = next(model.parameters()).device
    bf16 = uses_bf16(precision, device)
    was_training = model.training
    heads = [(m, m.fp32) for m in model.modules() if isinstance(m, Head)]
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    model.eval()
    try:
        for head, _ in heads:
            head.fp32 = True
        if not bf16:  # fp32 means fp32 through every matmul and convolution
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        for head, fp32 in heads:
            head.fp32 = fp32
        model.train(was_training)


def conv_stem(in_chans: int, width: int, patch_size: int) -> nn.Sequential:
    """A convolutional patch projection (Xiao et al., 2021, "Early convolutions help transformers see
    better"): log2(patch_size) 3x3 convolutions of stride 2, the channels doubling up to ``width``,
    BatchNorm and GELU between them; [B, 3, S, S] -> [B, width, S / patch_size, S / patch_size]."""
    n = patch_size.bit_length() - 1  # patch_size = 2^n
    chans = [in_chans] + [width >> (n - 1 - i) for i in range(n)]  # e.g. 3 -> 32 -> 64 -> 128
    layers: list[nn.Module] = []
    for i in range(n):
        layers.append(nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1, bias=i == n - 1))
        if i < n - 1:
            layers += [nn.BatchNorm2d(chans[i + 1]), nn.GELU()]
    return nn.Sequential(*layers)


def vision_tower(cfg: ModelConfig, class_token: bool) -> nn.Module:
    """timm ViT from scratch; tokens leave forward_features LayerNorm-ed (fc_norm off). With
    ``vision_stem="conv"`` the patch projection is :func:`conv_stem` (same tokens, same positions)."""
    patch_torchvision()
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(
        img_size=cfg.image_size, patch_size=cfg.patch_size, embed_dim=cfg.vision_width,
        depth=cfg.vision_layers, num_heads=cfg.vision_heads, mlp_ratio=cfg.mlp_ratio,
        num_classes=0, class_token=class_token, global_pool="token" if class_token else "avg",
        fc_norm=False,
    )
    if cfg.vision_stem == "conv":
        vit.patch_embed.proj = conv_stem(3, cfg.vision_width, cfg.patch_size)
    return vit


# ---------------------------------------------------------------------------- models
class _Model(nn.Module):
    """What every model shares: its config, its tokenizer, input checks and (safe) saving."""
    noise: NoiseProcess | None = None  # the caption noise process (mdc/noise.py); a diffusion captioner's only

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.tokenizer = Tokenizer(cfg.context_length, cfg.vocab)

    def check_images(self, images: torch.Tensor, sync: bool = True) -> None:
        """Shape [B, 3, S, S], the weights' float dtype, finite values; else a ValueError naming it. ``sync=False``
        (the training step): the values are checked by a device-side assert, which neither waits for the device
        nor breaks a compiled graph, and fails as a RuntimeError with the same message."""
        s = self.config.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (3, s, s):
            raise ValueError(f"images must have shape [B, 3, {s}, {s}] for model {self.config.name!r}; "
                             f"got {list(images.shape)}")
        dtype = self.image_proj.weight.dtype
        if images.dtype != dtype:
            hint = ("normalise them with the model's transform (mdc.create_model_and_transforms)"
                    if not images.is_floating_point() else f"convert them with images.to({dtype})")
            raise ValueError(f"images are {str(images.dtype).removeprefix('torch.')} but the model's weights are "
                             f"{str(dtype).removeprefix('torch.')}: {hint}")
        if not sync:
            torch._assert_async(torch.isfinite(images).all(), "images contain NaN or infinite values")
        elif not torch.isfinite(images).all():
            raise ValueError("images contain NaN or infinite values")

    def check_tokens(self, tokens: torch.Tensor, sync: bool = True) -> None:
        """Shape [B, L] with 1 <= L <= context, ids in [0, vocab_size); else a ValueError naming it (``sync``:
        as :meth:`check_images`)."""
        if tokens.dim() != 2 or not 1 <= tokens.shape[1] <= self.config.context_length:
            raise ValueError(f"tokens must have shape [B, L] with 1 <= L <= {self.config.context_length}; "
                             f"got {list(tokens.shape)}")
        V, use = self.tokenizer.vocab_size, f"tokenize with mdc.get_tokenizer({self.config.name!r}) or model.tokenizer"
        if not sync:
            torch._assert_async((tokens >= 0).all() & (tokens < V).all(),
                                f"token ids must lie in [0, {V}) for model {self.config.name!r} ({use})")
            return
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= V:
            raise ValueError(f"token ids must lie in [0, {V}) for model {self.config.name!r}; got "
                             f"{lo if lo < 0 else hi} ({use})")

    def check_inputs(self, images: torch.Tensor, tokens: torch.Tensor, sync: bool = True) -> None:
        """:meth:`check_images` and :meth:`check_tokens` of one (images, tokens) batch."""
        self.check_images(images, sync)
        self.check_tokens(tokens, sync)

    def check_length(self, length: int | None) -> None:
        """A caption of ``length`` tokens fits the context with [SOT] and [EOT], or ``length=None`` (predicted)
        for a model trained with its caption length hidden; else a ValueError naming it."""
        if length is None and self.config.length_visible:
            raise ValueError(f"model {self.config.name!r} ({self.config.objective}) was trained with its caption "
                             "length visible and needs a length; length=None needs length_visible=False (MDC)")
        if length is None:
            return
        if not 1 <= length <= self.config.context_length - 2:
            raise ValueError(f"length must lie in [1, {self.config.context_length - 2}] "
                             f"(context {self.config.context_length} minus SOT/EOT); got {length}")

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        """Unpooled, normalised encoder tokens [B, T, Dv] (timm convention)."""
        self.check_images(images)
        return self.visual.forward_features(images)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled features [B, Dv] for linear probing: GAP (captioners) or CLS (CLIP), pre-projection."""
        self.check_images(images)
        return self._pooled(images)

    def _pooled(self, images: torch.Tensor) -> torch.Tensor:  # encode_image of checked images
        return self.visual.forward_head(self.visual.forward_features(images), pre_logits=True)

    def save(self, path: str | os.PathLike) -> None:
        """Write `path/model.safetensors` and `path/config.json` (no pickle)."""
        os.makedirs(path, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        safetensors.torch.save_file(state, os.path.join(path, "model.safetensors"))  # looked up here: patchable
        with open(os.path.join(path, "config.json"), "w") as f:
            f.write(self.config.to_json())

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Captioner(_Model):
    """Image-conditioned text decoder: MDC (bidirectional) or ARC (causal).

    ``visual`` (default: a ViT from scratch), ``noise`` (default: MDC's absorbing process,
    :data:`mdc.absorbing.ABSORBING`) and ``condition_variants`` (default: none) are where extensions plug
    in; :func:`mdc.factory.build` passes the VQ-VAE tokens of :mod:`mdc.mc_diffusion.vqvae` and the mask-and-replace
    process of :mod:`mdc.mc_diffusion.mask_replace`, and attaches MC-Diffusion's condition variants (:mod:`mdc.mc_diffusion.guidance`), when
    ``config.extensions`` names them. ``model.noise`` trains, samples and scores an MDC captioner; ARC has none."""

    def __init__(self, cfg: ModelConfig, visual: nn.Module | None = None, noise: NoiseProcess | None = None):
        super().__init__(cfg)
        if cfg.extensions and (visual is None and noise is None):
            raise ValueError(f"extensions {sorted(cfg.extensions)} are wired in by mdc.create_model / "
                             "mdc.factory.build; build the model there")
        self.noise = None if self.causal else noise if noise is not None else ABSORBING
        self.visual = visual if visual is not None else vision_tower(cfg, class_token=False)
        self.image_proj = nn.Linear(cfg.vision_width, cfg.text_width)
        self.decoder = TextTransformer(cfg, self.tokenizer.vocab_size, cross=True)
        self.head = Head(cfg.text_width, self.tokenizer.vocab_size, bias=False)
        self.condition_variants = None  # an extension that varies the condition in training attaches itself here

    @property
    def causal(self) -> bool:
        return self.config.objective == "arc"

    def condition(self, images: torch.Tensor, token_mask=None) -> torch.Tensor:
        """The decoder's condition y: projected image tokens [B, T, W]. ``token_mask`` [B, T] (bool):
        MCS's partial condition, those tokens' content masked and their positions kept (mdc/condition.py)."""
        if token_mask is None:  # the entry points (forward, loss, generate, score) have checked the images
            return self.image_proj(self.visual.forward_features(images))
        return self.image_proj(masked_features(self, images, token_mask))

    def context(self, images: torch.Tensor, null=None, token_mask=None) -> ImageContext:
        """Encode once: every block's cross-attention keys/values of the projected image tokens.
        ``null`` [B] / ``token_mask`` [B, T] (bool): the condition's variants (mdc/condition.py)."""
        return self.kv_context(vary_condition(self, self.condition(images, token_mask), null))  # [B, T, W]

    def training_condition(self, batch: int, generator=None, device=None) -> dict:
        """:meth:`context` keywords for one training batch: {} (the full condition) unless an extension
        varies the condition in training (MC-Diffusion's null and partial conditions, :mod:`mdc.mc_diffusion.guidance`)."""
        return {} if self.condition_variants is None else self.condition_variants.draw(self, batch, generator, device)

    def kv_context(self, v: torch.Tensor) -> ImageContext:
        """The cross-attention keys/values of condition tokens ``v`` [B, T, W]."""
        return ImageContext([blk.cross_attn.keys_values(v) for blk in self.decoder.blocks])

    def hidden(self, tokens: torch.Tensor, context: ImageContext) -> torch.Tensor:
        """Decoder states [B, L, W]; bidirectional attention ignores padding after [EOT] (a visible length only)."""
        visible = self.config.length_visible and not self.causal
        mask = valid_mask(tokens, self.tokenizer.eot_id)[:, None, None, :] if visible else None
        return self.decoder(tokens, mask=mask, causal=self.causal, context=context)

    def logits(self, tokens: torch.Tensor, context: ImageContext) -> torch.Tensor:
        return self.head(self.hidden(tokens, context))  # [B, L, V]

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [B, L, V] at every position; `tokens` may hold [MASK]."""
        self.check_inputs(images, tokens)
        return self.logits(tokens, self.context(images))

    def loss(self, images, tokens, **kw):
        """ARC teacher forcing (no noise process), else the noise process's loss: MDC's (kw: t, u,
        generator) or, for a mask-and-replace captioner, the D3PM loss of mdc/mc_diffusion/mask_replace.py (kw: t,
        generator). No host synchronisation: the inputs' values are checked on the device; ``tokens`` as given
        (trim the padding on the host, :func:`mdc.tokenizer.trim_padding`, as the training loader does)."""
        self.check_inputs(images, tokens, sync=False)
        if self.noise is None:
            return arc_loss(self, images, tokens, **kw)
        return self.noise.loss(self, images, tokens, **kw)


class CLIP(_Model):
    """Contrastive baseline: ViT (CLS) and a causal text transformer pooled at [EOT]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.visual = vision_tower(cfg, class_token=True)
        self.text = TextTransformer(cfg, self.tokenizer.vocab_size, cross=False)
        self.image_proj = nn.Linear(cfg.vision_width, cfg.embed_dim, bias=False)
        self.text_proj = nn.Linear(cfg.text_width, cfg.embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def image_embedding(self, images):  # [B, E], unit norm
        self.check_images(images)
        return self._image(images)

    def text_embedding(self, tokens):  # [B, E], unit norm
        self.check_tokens(tokens)
        return self._text(trim_padding(tokens, self.tokenizer.eot_id))  # causal: padding cannot reach [EOT]

    def _image(self, images):  # [B, E] of checked images
        return F.normalize(self.image_proj(self._pooled(images)), dim=-1)

    def _text(self, tokens):  # [B, E] of checked tokens, pooled at [EOT]
        h = self.text(tokens, causal=True)  # [B, L, W]
        eot = (tokens == self.tokenizer.eot_id).int().argmax(-1)  # [B]
        return F.normalize(self.text_proj(h[torch.arange(len(tokens), device=tokens.device), eot]), dim=-1)

    def scale(self) -> torch.Tensor:
        """Learned temperature exp(logit_scale); kept at most 100 by :meth:`clamp_logit_scale`."""
        return self.logit_scale.exp()

    @torch.no_grad()
    def clamp_logit_scale(self) -> None:
        """Clamp the temperature to [1, 100] in place, as open_clip does after every optimizer step
        (:func:`mdc.base.optim.optimizer_step`). Not in the forward: there a clamp would give a temperature
        past 100 a zero gradient for ever."""
        self.logit_scale.clamp_(0, math.log(100))

    def forward(self, images, tokens):  # what the loss contrasts: the text as given (causal: padding cannot reach [EOT])
        self.check_inputs(images, tokens)
        return self._image(images), self._text(tokens), self.scale()

    def loss(self, images, tokens, cached=None, index=0, live_scale=True):
        """Symmetric InfoNCE over the batch (and every DDP rank's, see ``clip_loss``).

        Gradient accumulation (open_clip's ``accum_freq`` scheme): ``cached`` = (image
        embeddings, text embeddings), each a list of the K micro-batches' [B_k, E] embeddings
        computed without gradient; this call's micro-batch, number ``index``, is recomputed with
        gradient and spliced in, so the loss contrasts all K micro-batches. ``live_scale=False``
        detaches the temperature, which must receive its gradient in one micro-step only.
        """
        self.check_inputs(images, tokens, sync=False)
        img, txt, scale = self._image(images), self._text(tokens), self.scale()  # [B, E], [B, E], []
        if cached is not None:
            img = torch.cat([*cached[0][:index], img, *cached[0][index + 1 :]])  # [sum_k B_k, E]
            txt = torch.cat([*cached[1][:index], txt, *cached[1][index + 1 :]])
        return clip_loss(img, txt, scale if live_scale else scale.detach())
