"""What one model costs per sample, measured on the meta device: the numbers the costed plan
(:mod:`reproduce.cost.paper_cost`) multiplies by a run's steps, images and captions.

What differs between the objectives (the towers that run, the supervised positions, how captions
are scored and generated) is one :class:`ObjectiveCost` each (:data:`OBJECTIVES`), chosen once per run.

- Parameters: the model built on the ``meta`` device (shapes only: ViT-L/14 costs no memory).
- FLOPs: the meter of :mod:`mdc.base.flops` over a meta-device forward (and, for training, backward) of
  the model's modules, called in the order the loss calls them: the vision tower, the image projection and
  every decoder block's cross-attention keys/values, the decoder at the caption length and the
  vocabulary head at every position the dense loss reads (captioners); both towers and their projections
  (CLIP). Matrix products and attention only, as MFU counts them. ``tests/reproduce/test_cost.py`` checks this
  count against the real loss of a small model and against :func:`analytic_forward_flops`.
- Activation memory: the bytes autograd saves for backward in that meta pass, with the model in bf16
  (what autocast feeds the matrix products) and attention as a fused kernel (memory-efficient SDPA
  keeps no [L, S] matrix); parameters excluded.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from mdc.absorbing import ElboOptions
from mdc.factory import create_model
from mdc.base.flops import Meter
from mdc.tokenizer import Tokenizer

CONTEXT = 77  # tokens per caption in pretraining (paper Sec. 4.1)


# ----------------------------------------------------------------------------- what each objective costs
def _image_context(model, images):
    """Captioners' image part: the vision tower, the projection and every decoder block's cross-attention K/V."""
    return model.kv_context(model.image_proj(model.visual.forward_features(images)))


def _image_embedding(model, images):
    """CLIP's image part: the vision tower's pooled output, projected."""
    return model.image_proj(model.visual.forward_head(model.visual.forward_features(images), pre_logits=True))


@dataclass(frozen=True)
class ObjectiveCost:
    """What differs between the objectives' costs. Captioners (MDC, ARC) run the image part, the decoder and
    the vocabulary head; CLIP runs the image part, the text tower, both projections and the similarity
    matrix, and has no head."""

    captioner: bool
    image: Callable  # (model, images) -> the image part of the forward
    # head positions of a training row of L tokens: the losses are dense (one static graph), so the head runs at
    # every position the loss reads, masked or not (MDC: L; ARC: its L - 1 inputs; CLIP: none)
    positions: Callable[[int], int]
    # forward FLOPs of scoring one candidate caption of N tokens (run params) from a caption row's and the
    # head's: the decoder row (captioners) or CLIP's text tower, with and without the image where scored so
    score: Callable[[float, float, int, dict], float]
    # forward FLOPs of captioning ``images`` test images: (images, decoder FLOPs of a row of k tokens, head, params)
    generate: Callable[[int, Callable[[int], float], float, dict], float] | None = None


def _mdc_score(row: float, head: float, n: int, p: dict) -> float:
    """ELBO (all ratios, trained ratios) and heuristic, each with and without the image."""
    S = int(p.get("num_samples", ElboOptions.num_samples))
    elbo = S * (row + (n + 1) / 2 * head) + S * (row + 0.75 * n * head)
    heuristic = n * row + n * (n + 1) / 2 * head
    return 2 * (elbo + heuristic)


MATCHED_TOKENS = 12  # the sets at matched length (ARC's, the references'): a COCO caption's tokens


def _mdc_generate(images: int, decoder: Callable[[int], float], head: float, p: dict) -> float:
    """MDC-10/15/20 and, matched, two sets of about a caption's length: N steps of N + 2 tokens, the head at
    the masked ones."""
    ks = list(p.get("lengths", (10, 15, 20))) + [MATCHED_TOKENS] * 2 * bool(p.get("matched_length", True))
    return images * sum(k * decoder(k + 2) + k * (k + 1) / 2 * head for k in ks)


def _arc_generate(images: int, decoder: Callable[[int], float], head: float, p: dict) -> float:
    """Beam 6 (and, matched, beam 6 again with [EOT] held back) and greedy over 20 tokens, KV-cached: a
    token's share of a 22-token row, and the head."""
    beams = int(p.get("beam_size", 6)) * (1 + bool(p.get("matched_length", True))) + bool(p.get("arc_greedy", True))
    k = 20
    return images * beams * k * (decoder(k + 2) / (k + 2) + head)


OBJECTIVES = {
    "mdc": ObjectiveCost(True, _image_context, lambda length: length, _mdc_score, _mdc_generate),
    "arc": ObjectiveCost(True, _image_context, lambda length: length - 1,
                         lambda row, head, n, p: 2 * (row + (n + 1) * head),  # exact, with and without the image
                         _arc_generate),
    "clip": ObjectiveCost(False, _image_embedding, lambda length: 0, lambda row, head, n, p: row),  # text tower
}


# ----------------------------------------------------------------------------- meta-device measurements
@functools.lru_cache(maxsize=None)
def meta_model(name: str, objective: str):
    """The named model built on the meta device (no memory) in bf16, what autocast feeds the matrix
    products (the FLOP counts do not depend on the dtype)."""
    with torch.device("meta"):
        model = create_model(name, objective)
    return model.to(torch.bfloat16)


def training_forward(model, batch: int, length: int, positions: int, device="meta") -> torch.Tensor:
    """The training loss's matrix products on ``batch`` samples, in the loss's order: captioners run the
    decoder on ``length`` tokens and the head at ``positions`` per sample (dense losses: MDC every position,
    ARC every input position); CLIP runs both towers (text: ``length`` tokens) and the similarity matrix."""
    cfg, dtype = model.config, next(model.parameters()).dtype
    images = torch.zeros(batch, 3, cfg.image_size, cfg.image_size, device=device, dtype=dtype)
    tokens = torch.zeros(batch, length, dtype=torch.long, device=device)
    table = OBJECTIVES[cfg.objective]
    if not table.captioner:
        img = F.normalize(table.image(model, images), dim=-1)
        txt = F.normalize(model.text_proj(model.text(tokens, causal=True)[:, -1]), dim=-1)
        return (model.scale() * img @ txt.t()).float().logsumexp(-1).mean()
    context = table.image(model, images)
    mask = None if model.causal else torch.ones(batch, 1, 1, length, dtype=torch.bool, device=device)
    hidden = model.decoder(tokens, mask=mask, causal=model.causal, context=context)
    return model.head(hidden[:, :positions]).float().logsumexp(-1).mean()


@dataclass(frozen=True)
class TrainingPass:
    """Per sample of one training step: FLOPs (forward + backward) and the activation bytes autograd
    saves for backward; ``head_*``: what each supervised position adds (captioners)."""

    flops: float
    saved_bytes: float
    head_flops: float = 0.0
    head_saved_bytes: float = 0.0

    def at(self, positions: int) -> tuple[float, float]:
        """(FLOPs, saved bytes) per sample with the head at ``positions`` positions."""
        return self.flops + positions * self.head_flops, self.saved_bytes + positions * self.head_saved_bytes


def measure_training(model, batch: int, length: int, positions: int, backward: bool = True) -> tuple[float, float]:
    """(FLOPs, saved activation bytes) of :func:`training_forward` (and its backward) on ``model``'s
    device, parameters' storages excluded; attention fused on the meta device."""
    device = next(model.parameters()).device
    with Meter(model, fused=device.type == "meta") as meter:
        loss = training_forward(model, batch, length, positions, device=device)
        if backward:
            loss.backward()
    for p in model.parameters():
        p.grad = None
    return meter.flops, meter.saved_bytes


@functools.lru_cache(maxsize=None)
def training_pass(name: str, objective: str, length: int = CONTEXT, batch: int = 2) -> TrainingPass:
    """One training step's cost per sample for the named model (meta device, bf16, fused attention):
    the step without the vocabulary head, and the head's forward and backward per position."""
    model = meta_model(name, objective)
    flops, saved = measure_training(model, batch, length, 0)
    if not OBJECTIVES[objective].captioner:
        return TrainingPass(flops / batch, saved / batch)
    hidden = torch.zeros(batch, 1, model.config.text_width, device="meta", dtype=torch.bfloat16, requires_grad=True)
    with Meter(model) as head:
        model.head(hidden).float().logsumexp(-1).mean().backward()
    model.head.weight.grad = None
    return TrainingPass(flops / batch, saved / batch, head.flops / batch, head.saved_bytes / batch)


@functools.lru_cache(maxsize=None)
def forward_flops(name: str, objective: str, part: str, length: int = 0) -> float:
    """Forward FLOPs on the meta device of one ``part``: "image" (per image: the vision tower, and the
    projection with every block's cross-attention keys/values for captioners, the pooled embedding for
    CLIP), "decoder" (per caption row of ``length`` tokens, no head), "head" (per position), "text"
    (CLIP's text tower and projection per caption)."""
    model = meta_model(name, objective)
    cfg, meta = model.config, dict(device="meta", dtype=torch.bfloat16)
    images = torch.zeros(1, 3, cfg.image_size, cfg.image_size, **meta)
    tokens = torch.zeros(1, length, dtype=torch.long, device="meta")
    if part == "decoder":  # the image's keys/values are its part, computed once per image
        grid = (cfg.image_size // cfg.patch_size) ** 2
        context = model.kv_context(torch.zeros(1, grid, cfg.text_width, **meta))
    parts = {
        "image": lambda: OBJECTIVES[objective].image(model, images),
        "decoder": lambda: model.decoder(tokens, causal=model.causal, context=context),
        "head": lambda: model.head(torch.zeros(1, cfg.text_width, **meta)),
        "text": lambda: model.text_proj(model.text(tokens, causal=True)[:, -1]),
    }
    with torch.no_grad(), Meter(fused=True) as meter:
        parts[part]()
    return meter.flops


def num_params(name: str, objective: str) -> int:
    return sum(p.numel() for p in meta_model(name, objective).parameters())


def analytic_forward_flops(cfg, length: int, positions: int) -> float:
    """Matrix-product FLOPs of one training sample's forward, from the config alone (2 per multiply-add):
    the ViT (patch embedding, per layer 24 T D^2 + 4 T^2 D), then for captioners the projection,
    cross-attention keys/values, decoder layers (28 L W^2 + 4 L^2 W + 4 L T W) and the head at
    ``positions``; for CLIP the text tower (24 L W^2 + 4 L^2 W per layer) and both projections."""
    grid, captioner = (cfg.image_size // cfg.patch_size) ** 2, OBJECTIVES[cfg.objective].captioner
    T, D, W, L = grid + (not captioner), cfg.vision_width, cfg.text_width, length  # CLIP: and the CLS token
    mlp = cfg.mlp_ratio
    f = 2 * grid * 3 * cfg.patch_size**2 * D  # patch embedding (a convolution)
    f += cfg.vision_layers * (2 * T * D * D * (4 + 2 * mlp) + 4 * T * T * D)
    if not captioner:
        f += 2 * D * cfg.embed_dim + 2 * W * cfg.embed_dim
        return f + cfg.text_layers * (2 * L * W * W * (4 + 2 * mlp) + 4 * L * L * W)
    vocab = Tokenizer(cfg.context_length, cfg.vocab).vocab_size
    f += 2 * grid * D * W + cfg.text_layers * 4 * grid * W * W  # projection, cross-attention keys/values
    f += cfg.text_layers * (2 * L * W * W * (6 + 2 * mlp) + 4 * L * L * W + 4 * L * grid * W)
    return f + 2 * W * vocab * positions
