"""What the paper profile costs, before a GPU is asked for: ``python -m reproduce --profile paper --dry-run``.

For every run of every artifact: the command it would execute, the data variables it needs (and
whether each is set), the model's parameter count, the run's FLOPs, the activation memory per GPU
at the micro-batch (training runs) and the GPU-hours at a stated model FLOPs utilisation (MFU) of
an H100's dense bf16 peak; then a total per artifact and for the whole paper (a run that feeds
several artifacts is counted in each artifact's total and once in the paper's). This module plans
(:func:`plan`, :func:`totals`); :mod:`reproduce.cost.cost_table` prints the plan; the per-sample
numbers it multiplies come from :mod:`reproduce.cost.model_cost` (parameters, FLOPs and saved activations
measured on the meta device).

- Activation memory: the bytes autograd saves for backward at the preset's micro-batch, with the
  model in bf16 and attention as a fused kernel (:mod:`reproduce.cost.model_cost`). Autocast also keeps
  LayerNorm and the loss in fp32: the figure shown is that times ``AUTOCAST_FACTOR`` (1.15, measured
  under CPU autocast). The model state (fp32 weights and gradients, AdamW's two moments, autocast's
  bf16 weight copies: 18 bytes per parameter) is shown apart.
- GPU-hours: FLOPs / (MFU x 989 TFLOP/s) / 3600, with the same MFU for every run (evaluation too).
  The default, :data:`MFU`, is what ``python -m benchmarks --only gpu`` measured on an H200 for ViT-B/32's
  training step as the paper profile runs it (compiled whole, replayed as CUDA graphs); give another measurement
  with ``--mfu``. The evaluation runs, eager, are 0.4% of the plan's FLOPs, so costing them at the same MFU
  understates the total by about 1%.

Sizes the registry does not fix are the published ones (:data:`NOMINAL_SAMPLES`,
:data:`PROBE_IMAGES`, :data:`COMPOSITIONALITY_ITEMS`, :data:`COCO_TEST_IMAGES`) unless a data
variable says otherwise (``MDC_CC12M_SAMPLES`` ...), and caption lengths are assumptions
(:data:`CAPTION_TOKENS`): the decoder runs at the full 77-token context in pretraining (a batch of
128 is trimmed to its longest caption, which is near the context), and the head at every position the
dense loss reads.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from mdc.factory import get_tokenizer
from mdc.base.optim import preset_values
from mdc.world.scenes import scene_captions
from reproduce.running.cluster import run_command, torchrun_command
from reproduce.graph import Run
from reproduce.cost.model_cost import CONTEXT, OBJECTIVES, forward_flops, num_params, training_pass
from reproduce.paper_profile import PER_GPU_BATCH, data_vars

H100_BF16 = 989e12  # FLOP/s, H100 SXM dense bf16 tensor cores (benchmarks/gpu.py: PEAK_BF16)
# The utilisation used unless --mfu is given, per pretraining step (python -m reproduce --step), measured by
# `python -m benchmarks gpu` on an NVIDIA H200 for ViT-B/32 at the paper's micro-batch of 128 in bf16
# (docs/benchmarks.md, 2026-11-29 and 2026-12-04), the lower of MDC's and ARC's, rounded down: graphs (compiled
# whole, replayed as CUDA graphs; the default) MDC 0.186, ARC 0.184 (CLIP 0.21); eager 0.058-0.059 (CLIP 0.117);
# compiled without graphs not measured as MFU: eager's scaled by the images/s the loop reached (1,694 against
# 1,610, docs/paper_scale.md).
STEP_MFU = {"eager": 0.058, "compiled": 0.061, "graphs": 0.18}
MFU = STEP_MFU["graphs"]
# Activations autograd saves per sample under autocast (fp32 weights) / with the model in bf16: 1.11-1.17
# measured on CPU autocast for ViT-B/32, ViT-B/16 (depth cut) and tiny (tests/reproduce/test_cost.py re-measures it).
AUTOCAST_FACTOR = 1.15
# Bytes per parameter held through a step: fp32 weights and gradients, AdamW's two fp32 moments, and
# the bf16 copy of each weight that autocast keeps from the forward to the backward.
STATE_BYTES = 4 + 4 + 8 + 2

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
    positions = OBJECTIVES[objective].positions(CONTEXT)  # the row: a batch trimmed to its longest caption
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
    length = round(tokens) + 2
    flops, _ = training_pass(p["model"], p["objective"], length).at(OBJECTIVES[p["objective"]].positions(length))
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
        f += steps * batch * training_pass(name, objective, length).at(captioner.positions(length))[0]
        f += COCO_TEST_IMAGES * forward_flops(name, objective, "image")
        decoder = functools.partial(forward_flops, name, objective, "decoder")  # a row of k tokens
        f += captioner.generate(COCO_TEST_IMAGES, decoder, forward_flops(name, objective, "head"), p)
        cost.params = num_params(name, objective)
    cost.flops = f
    cost.notes.append(f"fine-tunes MDC and ARC (at most {steps} steps x {batch}: the stopping rule may end it sooner), "
                      f"captions {COCO_TEST_IMAGES:,} test images")


def plan(runs: list[Run], out: str, environ=None, step: str | None = None) -> list[Cost]:
    """The cost of each run (``runs`` of the paper profile, as ``reproduce.registry.build`` gives them with
    ``step``, which the notebooks' commands pass on)."""
    environ = os.environ if environ is None else environ
    by_name = {r.name: r for r in runs}
    costs = []
    for r in runs:
        command = torchrun_command(r, out, r.gpus) if r.gpus else run_command(r, out, "paper", step)
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
