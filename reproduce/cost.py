"""What the paper profile costs, before a GPU is asked for: ``python -m reproduce --profile paper --dry-run``.

For every run of every artifact: the command it would execute, the data variables it needs (and
whether each is set), the model's parameter count, the run's FLOPs, the activation memory per GPU
at the micro-batch (training runs) and the GPU-hours at a stated model FLOPs utilisation (MFU) of
an H100's dense bf16 peak; then a total per artifact and for the whole paper (a run that feeds
several artifacts is counted in each artifact's total and once in the paper's). What differs between
the objectives (the towers that run, the supervised positions, how captions are scored and generated)
is one :class:`ObjectiveCost` each (:data:`OBJECTIVES`), chosen once per run.

- Parameters: the model built on the ``meta`` device (shapes only: ViT-L/14 costs no memory).
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over a meta-device forward (and, for
  training, backward) of the model's modules, called in the order the loss calls them (the loss
  itself picks its masked positions from data, which meta tensors do not hold): the vision tower,
  the image projection and every decoder block's cross-attention keys/values, the decoder at the
  caption length and the vocabulary head at the supervised positions (captioners); both towers and
  their projections (CLIP). Matrix products and attention only, as MFU counts them.
  ``tests/test_cost.py`` checks this count against the real loss of a small model and against
  :func:`analytic_forward_flops`.
- Activation memory: the bytes autograd saves for backward in that meta pass at the preset's
  micro-batch, with the model in bf16 (what autocast feeds the matrix products) and attention as a
  fused kernel (memory-efficient SDPA keeps no [L, S] matrix); parameters excluded. Autocast also
  keeps LayerNorm and the loss in fp32: the figure shown is that times ``AUTOCAST_FACTOR`` (1.15,
  measured under CPU autocast). The model state (fp32 weights and gradients, AdamW's two moments,
  autocast's bf16 weight copies: 18 bytes per parameter) is shown apart.
- GPU-hours: FLOPs / (MFU x 989 TFLOP/s) / 3600, with the same MFU for every run (evaluation too).
  ``python -m benchmarks --only gpu`` measures the MFU of ViT-B/32 MDC on the GPU at hand; give it
  with ``--mfu``.

Sizes the registry does not fix are the published ones (:data:`NOMINAL_SAMPLES`,
:data:`PROBE_IMAGES`, :data:`COMPOSITIONALITY_ITEMS`, :data:`COCO_TEST_IMAGES`) unless a data
variable says otherwise (``MDC_CC12M_SAMPLES`` ...), and caption lengths are assumptions
(:data:`CAPTION_TOKENS`): the decoder runs at the full 77-token context in pretraining (a batch of
128 is trimmed to its longest caption, which is near the context), the head at the mean caption
length times the masked share.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from mdc.factory import create_model, get_tokenizer
from mdc.optim import preset_values
from mdc.tokenizer import Tokenizer
from mdc.world.scenes import scene_captions
from reproduce.paper import PER_GPU_BATCH, data_vars
from reproduce.cluster import torchrun_command
from reproduce.graph import Run

H100_BF16 = 989e12  # FLOP/s, H100 SXM dense bf16 tensor cores (benchmarks/gpu.py: PEAK_BF16)
MFU = 0.35  # the utilisation assumed unless --mfu is given
CONTEXT = 77  # tokens per caption in pretraining (paper Sec. 4.1)
# Activations autograd saves per sample under autocast (fp32 weights) / with the model in bf16: 1.11-1.17
# measured on CPU autocast for ViT-B/32, ViT-B/16 (depth cut) and tiny (tests/test_cost.py re-measures it).
AUTOCAST_FACTOR = 1.15
# Bytes per parameter held through a step: fp32 weights and gradients, AdamW's two fp32 moments, and
# the bf16 copy of each weight that autocast keeps from the forward to the backward.
STATE_BYTES = 4 + 4 + 8 + 2
GiB = 2**30

# Epoch sizes when the *_SAMPLES variable is unset: the datasets as published (a download holds fewer).
NOMINAL_SAMPLES = {"MDC_CC12M": 12_423_374, "MDC_RECAP10M": 10_000_000, "MDC_CC3M": 3_318_333}
# Mean caption tokens per pretraining set, an assumption at the scale of the paper's Fig. 3.
CAPTION_TOKENS = {"MDC_CC12M": 22, "MDC_RECAP10M": 64, "MDC_RECAP_SUBSETS": 64, "MDC_CC3M": 12}
# Linear probe: train + test images (CLIP_benchmark's splits; ImageNet: train + val).
PROBE_IMAGES = {"imagenet1k": 1_281_167 + 50_000, "food101": 75_750 + 25_250, "cifar10": 60_000,
                "cifar100": 60_000, "pets": 3_680 + 3_669}
# Compositionality suites: (items, candidate captions per item).
COMPOSITIONALITY_ITEMS = {"SugarCrepe": (7_511, 2), "VG-Relation": (23_937, 2), "VG-Attribution": (28_748, 2),
                          "COCO-Order": (25_010, 5), "Flickr30k-Order": (5_000, 5)}
EVAL_CAPTION = (12, 20)  # compositionality / COCO captions: (caption tokens, row length after trimming)
COCO_TEST_IMAGES = 5_000  # Karpathy test split


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
    train_positions: Callable[[int, dict], int]  # head positions per caption of N tokens in pretraining (run params)
    # forward FLOPs of scoring one candidate caption of N tokens (run params) from a caption row's and the
    # head's: the decoder row (captioners) or CLIP's text tower, with and without the image where scored so
    score: Callable[[float, float, int, dict], float]
    finetune_positions: Callable[[int], int] | None = None  # head positions per caption of N tokens, fine-tuning
    # forward FLOPs of captioning ``images`` test images: (images, decoder FLOPs of a row of k tokens, head, params)
    generate: Callable[[int, Callable[[int], float], float, dict], float] | None = None


def _mdc_train_positions(tokens: int, p: dict) -> int:
    """The expected masked share E[t] of the caption (a fixed ratio for BERT)."""
    lo, hi = p.get("t_interval") or (0.5, 1.0)
    share = p["mask_ratio"] if p.get("mask_ratio") is not None else (lo + hi) / 2
    return max(1, round(share * tokens))


def _mdc_score(row: float, head: float, n: int, p: dict) -> float:
    """ELBO (all ratios, trained ratios) and heuristic, each with and without the image."""
    S = int(p.get("num_samples", 1024))
    elbo = S * (row + (n + 1) / 2 * head) + S * (row + 0.75 * n * head)
    heuristic = n * row + n * (n + 1) / 2 * head
    return 2 * (elbo + heuristic)


def _mdc_generate(images: int, decoder: Callable[[int], float], head: float, p: dict) -> float:
    """MDC-10/15/20: N steps of N + 2 tokens, the head at the masked ones."""
    return images * sum(k * decoder(k + 2) + k * (k + 1) / 2 * head for k in p.get("lengths", (10, 15, 20)))


def _arc_generate(images: int, decoder: Callable[[int], float], head: float, p: dict) -> float:
    """Beam 6 over 20 tokens, KV-cached: a token's share of a 22-token row, and the head."""
    beam, k = int(p.get("beam_size", 6)), 20
    return images * beam * k * (decoder(k + 2) / (k + 2) + head)


OBJECTIVES = {
    "mdc": ObjectiveCost(True, _image_context, _mdc_train_positions, _mdc_score, lambda n: round(0.75 * n),
                         _mdc_generate),
    "arc": ObjectiveCost(True, _image_context, lambda tokens, p: tokens + 1,  # the caption and [EOT]
                         lambda row, head, n, p: 2 * (row + (n + 1) * head),  # exact, with and without the image
                         lambda n: n + 1, _arc_generate),
    "clip": ObjectiveCost(False, _image_embedding, lambda tokens, p: 0, lambda row, head, n, p: row),  # text tower
}


# ----------------------------------------------------------------------------- meta-device measurements
@functools.lru_cache(maxsize=None)
def meta_model(name: str, objective: str):
    """The named model built on the meta device (no memory) in bf16, what autocast feeds the matrix
    products (the FLOP counts do not depend on the dtype)."""
    with torch.device("meta"):
        model = create_model(name, objective)
    return model.to(torch.bfloat16)


def _fused_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as the GPU's memory-efficient kernel (on meta the dispatcher picks the math path, which
    saves the [B, h, L, S] attention matrix no GPU kernel keeps)."""
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, -1e4)
        bias = attn_mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal,
                                                                  scale=scale)[0]


@contextmanager
def fused_attention():
    """F.scaled_dot_product_attention (called by the model and timm at run time) as :func:`_fused_sdpa`."""
    real = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


def training_forward(model, batch: int, length: int, positions: int, device="meta") -> torch.Tensor:
    """The training loss's matrix products on ``batch`` samples, in the loss's order: captioners run the
    decoder on ``length`` tokens and the head at ``positions`` per sample (MDC: the masked tokens; ARC:
    the caption and [EOT]); CLIP runs both towers (text: ``length`` tokens) and the similarity matrix."""
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


class _Saved:
    """A saved-tensors pack hook that adds up the bytes of each storage autograd keeps, parameters' excluded."""

    def __init__(self, model):
        self.params = {p.untyped_storage()._cdata for p in model.parameters()}
        self.seen: dict[int, int] = {}

    def __call__(self, t):
        storage = t.untyped_storage()
        if storage._cdata not in self.params:
            self.seen[storage._cdata] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def measure_training(model, batch: int, length: int, positions: int, backward: bool = True) -> tuple[float, float]:
    """(FLOPs, saved activation bytes) of :func:`training_forward` (and its backward) on ``model``'s
    device, parameters' storages excluded; attention fused on the meta device."""
    device = next(model.parameters()).device
    saved = _Saved(model)
    with fused_attention() if device.type == "meta" else contextlib.nullcontext(), \
            FlopCounterMode(display=False) as counter:
        with torch.autograd.graph.saved_tensors_hooks(saved, lambda t: t):
            loss = training_forward(model, batch, length, positions, device=device)
        if backward:
            loss.backward()
    for p in model.parameters():
        p.grad = None
    return float(counter.get_total_flops()), float(saved.total)


@functools.lru_cache(maxsize=None)
def training_pass(name: str, objective: str, length: int = CONTEXT, batch: int = 2) -> TrainingPass:
    """One training step's cost per sample for the named model (meta device, bf16, fused attention):
    the step without the vocabulary head, and the head's forward and backward per position."""
    model = meta_model(name, objective)
    flops, saved = measure_training(model, batch, length, 0)
    if not OBJECTIVES[objective].captioner:
        return TrainingPass(flops / batch, saved / batch)
    hidden = torch.zeros(batch, 1, model.config.text_width, device="meta", dtype=torch.bfloat16, requires_grad=True)
    head_saved = _Saved(model)
    with FlopCounterMode(display=False) as counter:
        with torch.autograd.graph.saved_tensors_hooks(head_saved, lambda t: t):
            loss = model.head(hidden).float().logsumexp(-1).mean()
        loss.backward()
    model.head.weight.grad = None
    return TrainingPass(flops / batch, saved / batch, counter.get_total_flops() / batch,
                        head_saved.total / batch)


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
    with torch.no_grad(), fused_attention(), FlopCounterMode(display=False) as counter:
        parts[part]()
    return float(counter.get_total_flops())


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


# ----------------------------------------------------------------------------- the plan
@dataclass
class Cost:
    """One run's cost. ``flops``: the whole run (training: forward + backward; evaluation: forward)."""

    run: str
    notebook: str
    artifacts: tuple[str, ...]
    command: str
    data: dict[str, bool]  # variable -> set in the environment
    gpus: int = 1
    params: int | None = None
    flops: float = 0.0
    act_bytes: float | None = None  # per GPU at the micro-batch
    state_bytes: float | None = None  # fp32 weights, gradients, AdamW moments
    micro_batch: int | None = None
    notes: list[str] = field(default_factory=list)

    def gpu_hours(self, mfu: float) -> float:
        return self.flops / (mfu * H100_BF16) / 3600


def _samples(var: str, params: dict, notes: list[str]) -> int:
    given = params.get("samples_per_epoch")
    if given:
        return int(given)
    notes.append(f"{var}_SAMPLES unset: {NOMINAL_SAMPLES[var] / 1e6:.1f}M pairs as published")
    return NOMINAL_SAMPLES[var]


def _pretrain(run: Run, cost: Cost) -> None:
    p = run.params
    name, objective = p["model"], p["objective"]
    var = next(v for v in data_vars(run) if not v.endswith("_SAMPLES"))
    recipe = preset_values(p.get("preset") or name, objective)
    global_batch = p.get("global_batch") or recipe["global_batch"]
    per_epoch = _samples(var, p, cost.notes) if var in NOMINAL_SAMPLES else int(p["samples_per_epoch"])
    steps = p.get("steps") or (p.get("epochs") or recipe["epochs"]) * max(1, per_epoch // global_batch)
    tokens, captioner = CAPTION_TOKENS[var], OBJECTIVES[objective].captioner
    positions = OBJECTIVES[objective].train_positions(tokens, p)
    flops, saved = training_pass(name, objective).at(positions)
    cost.params = num_params(name, objective)
    cost.flops = flops * steps * global_batch
    cost.micro_batch = p.get("batch_size") or PER_GPU_BATCH[name]
    cost.act_bytes = saved * cost.micro_batch * AUTOCAST_FACTOR
    cost.state_bytes = STATE_BYTES * cost.params
    cost.gpus = run.gpus or 1
    cost.notes.insert(0, f"{steps:,} steps x {global_batch} = {steps * global_batch / 1e6:.0f}M samples"
                      + (f"; {tokens} caption tokens, head at {positions}" if captioner else ""))


@functools.lru_cache(maxsize=None)
def synthetic_caption_tokens(style: str, model: str, n: int = 512) -> float:
    """Mean caption tokens of ``n`` captions of the synthetic world in ``style``, under ``model``'s tokenizer."""
    tok = get_tokenizer(model)
    return float((tok(scene_captions(n, style)) != tok.pad_id).sum(1).float().mean()) - 2  # less [SOT] and [EOT]


def synthetic_pretrain_flops(run: Run) -> float:
    """FLOPs of a pretraining run on the synthetic world (smoke, mini): steps x batch x one sample's forward
    and backward at its caption style's mean length (matmuls, convolutions, attention; not the optimizer)."""
    p = run.params
    tokens = synthetic_caption_tokens(run.labels.get("style", "alt"), p["model"])
    flops, _ = training_pass(p["model"], p["objective"], round(tokens) + 2).at(
        OBJECTIVES[p["objective"]].train_positions(round(tokens), p))
    return flops * p["steps"] * p["batch_size"]


def _checkpoint_model(runs: dict[str, Run], path: str) -> tuple[str, str]:
    """(backbone, objective) of the pretraining run a "{run:...}" checkpoint parameter names."""
    r = runs[path[len("{run:"):-1]]
    return r.params["model"], r.params["objective"]


def _probe(run: Run, cost: Cost, runs: dict[str, Run]) -> None:
    name, objective = _checkpoint_model(runs, run.params["checkpoint"])
    roots = run.params.get("real_datasets") or {}
    names = [n.removeprefix("wds/") for n in roots] or list(PROBE_IMAGES)
    unknown = [n for n in names if n not in PROBE_IMAGES]
    images = sum(PROBE_IMAGES.get(n, 0) for n in names)
    cost.params = num_params(name, objective)
    cost.flops = 2 * images * forward_flops(name, objective, "image")  # and the random-initialisation floor
    cost.notes.append(f"features of {images / 1e6:.2f}M images, trained and at random init"
                      + (f"; no size known for {unknown}" if unknown else ""))


def _compositionality(run: Run, cost: Cost, runs: dict[str, Run]) -> None:
    name, objective = _checkpoint_model(runs, run.params["checkpoint"])
    n, length = EVAL_CAPTION
    items = sum(i for i, _ in COMPOSITIONALITY_ITEMS.values())
    captions = sum(i * k for i, k in COMPOSITIONALITY_ITEMS.values())
    scorer = OBJECTIVES[objective]
    row = forward_flops(name, objective, "decoder" if scorer.captioner else "text", length)
    head = forward_flops(name, objective, "head") if scorer.captioner else 0.0
    f = items * forward_flops(name, objective, "image")
    f += captions * scorer.score(row, head, n, run.params)
    cost.params = num_params(name, objective)
    cost.flops = f
    cost.notes.append(f"{captions:,} captions of {items:,} items")


def _captioning(run: Run, cost: Cost, runs: dict[str, Run]) -> None:
    p = run.params
    n, length = EVAL_CAPTION
    steps, batch = int(p.get("finetune_steps", 0)), int(p.get("finetune_batch_size", 32))
    f = 0.0
    for key in ("mdc_checkpoint", "arc_checkpoint"):
        name, objective = _checkpoint_model(runs, p[key])
        captioner = OBJECTIVES[objective]
        f += steps * batch * training_pass(name, objective, length).at(captioner.finetune_positions(n))[0]
        f += COCO_TEST_IMAGES * forward_flops(name, objective, "image")
        decoder = functools.partial(forward_flops, name, objective, "decoder")  # a row of k tokens
        f += captioner.generate(COCO_TEST_IMAGES, decoder, forward_flops(name, objective, "head"), p)
        cost.params = num_params(name, objective)
    cost.flops = f
    cost.notes.append(f"fine-tunes MDC and ARC ({steps} steps x {batch}), captions {COCO_TEST_IMAGES:,} test images")


def plan(runs: list[Run], out: str, environ=None) -> list[Cost]:
    """The cost of each run (``runs`` of the paper profile, as ``reproduce.registry.build`` gives them)."""
    environ = os.environ if environ is None else environ
    by_name = {r.name: r for r in runs}
    costs = []
    for r in runs:
        command = (torchrun_command(r, out, r.gpus) if r.gpus else
                   f"python -m reproduce --profile paper --out {shlex.quote(os.path.dirname(out) or '.')} "
                   f"--run {shlex.quote(r.name)}")
        cost = Cost(r.name, r.notebook, tuple(r.artifacts), command,
                    {v: bool(environ.get(v)) for v in data_vars(r)})
        if r.notebook == "pretrain":
            _pretrain(r, cost)
        elif r.notebook == "linear_probe":
            _probe(r, cost, by_name)
        elif r.notebook == "compositionality":
            _compositionality(r, cost, by_name)
        elif r.notebook == "captioning":
            _captioning(r, cost, by_name)
        else:
            cost.gpus = 0
            cost.notes.append("CPU only" if r.notebook == "data" else "CPU only: rebuilds the tables and figures")
        costs.append(cost)
    return costs


def totals(costs: list[Cost], mfu: float) -> dict[str, float]:
    """GPU-hours per artifact (a run counted in every artifact it feeds; the figures run left out) and
    "total": every run once (the whole paper when no --only selects artifacts)."""
    out: dict[str, float] = {}
    for c in costs:
        if c.notebook == "figures":
            continue
        for a in c.artifacts:
            out[a] = out.get(a, 0.0) + c.gpu_hours(mfu)
    out["total"] = sum(c.gpu_hours(mfu) for c in costs)
    return out


def _si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def render(costs: list[Cost], mfu: float, out: str = "") -> str:
    """The plan as text: per artifact its runs (figures, command, data) and total; then the paper's total."""
    lines = [f"Cost of the plan at MFU {mfu:.0%} of an H100's {H100_BF16 / 1e12:.0f} TFLOP/s (dense bf16); "
             f"FLOPs: matrix products and attention, counted on the meta device (reproduce/cost.py).",
             f"Activation memory: per GPU at the micro-batch, under bf16 autocast; model state = fp32 weights, "
             f"gradients, AdamW moments and bf16 weight copies (18 B/parameter)."]
    head = f"  {'run':46s} {'GPUs':>4s} {'params':>7s} {'FLOPs':>8s} {'act/GPU':>9s} {'state':>7s} {'GPU-h':>8s}"
    total = totals(costs, mfu)
    artifacts = sorted({a for c in costs if c.notebook != "figures" for a in c.artifacts},
                       key=lambda a: (a[:3] != "tab", a))
    for artifact in artifacts:
        mine = [c for c in costs if artifact in c.artifacts and c.notebook != "figures"]
        lines += ["", f"== {artifact}: {len(mine)} runs, {total[artifact]:,.0f} GPU-hours", head]
        for c in mine:
            act = f"{c.act_bytes / GiB:.1f}GiB" if c.act_bytes is not None else "-"
            state = f"{c.state_bytes / GiB:.1f}GiB" if c.state_bytes is not None else "-"
            batch = f" @{c.micro_batch}" if c.micro_batch else ""
            lines.append(f"  {c.run:46s} {c.gpus:4d} {_si(c.params):>7s} {_si(c.flops):>8s} "
                         f"{act + batch:>9s} {state:>7s} {c.gpu_hours(mfu):8.1f}")
            data = ", ".join(f"{v} {'set' if ok else 'UNSET'}" for v, ok in c.data.items())
            lines.append(f"      data: {data or 'none'}" + (f"; {'; '.join(c.notes)}" if c.notes else ""))
            lines.append(f"      $ {c.command}")
    unset = sorted({v for c in costs for v, ok in c.data.items() if not ok})
    gpus = max((c.gpus for c in costs), default=8) or 8
    lines += ["", f"== total: {len(costs)} runs, {total['total']:,.0f} GPU-hours at MFU {mfu:.0%} "
                  f"(= {total['total'] / gpus / 24:,.1f} days on one node of {gpus} H100s); per artifact: "
                  + ", ".join(f"{a} {total[a]:,.0f}" for a in artifacts)]
    if unset:
        lines.append(f"   data variables not set: {', '.join(unset)} (reproduce/registry.py: PAPER_ENV)")
    return "\n".join(lines)
