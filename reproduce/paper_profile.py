"""The `paper` profile: the paper's backbones, data and hyperparameters on GPU nodes.

Data paths come from the environment (``reproduce.registry.PAPER_ENV`` lists them); a run whose
data is not configured fails with a message naming the variable. Pretraining uses the presets
of ``mdc.base.optim`` (Tables 6-8) with the paper's per-GPU batch of 128 (64 for ViT-L/14, with
accumulation), and executes under torchrun when ``python -m reproduce`` gets ``--gpus-per-node``, its step compiled
whole and replayed as CUDA graphs (``--step``: :data:`STEPS`).
"""
from __future__ import annotations

import functools
import json
import os

from mdc.absorbing import ElboOptions
from reproduce.graph import Run

ELBO_SAMPLES = ElboOptions.num_samples  # the paper's masked copies per caption

BACKBONES = ("vit-b-32", "vit-b-16", "vit-l-14")
DATA = {"alt": ("MDC_CC12M", "CC12M"), "descriptive": ("MDC_RECAP10M", "Recap-DataComp-10M")}
PER_GPU_BATCH = {"vit-b-32": 128, "vit-b-16": 128, "vit-l-14": 64}
DAY = 24 * 3600
# the pretraining step -> its compile_mode: eager, compiled whole, or compiled and replayed as CUDA graphs (the default)
STEPS = {"eager": None, "compiled": "default", "graphs": "reduce-overhead"}
# loader workers a GPU for each step: the measured need at 128 images a GPU from 256-px shards (docs/benchmarks.md,
# the H200 machine: 4 / 4 / 11 workers feed the eager, compiled and graphed steps). They set the data order, so they
# are part of a run's parameters; each GPU's job asks for one core more than its workers (reproduce.running.cluster)
WORKERS = {"eager": 4, "compiled": 4, "graphs": 11}
PROBE_VARS = ("MDC_PROBE_ROOTS",)
COMPOSITIONALITY_VARS = ("MDC_SUGARCREPE", "MDC_COCO_VAL2017", "MDC_ARO", "MDC_VG_IMAGES", "MDC_COCO_ORDER",
                         "MDC_COCO_IMAGES", "MDC_FLICKR_ORDER", "MDC_FLICKR_IMAGES")
CAPTIONING_VARS = ("MDC_COCO_KARPATHY", "MDC_COCO_IMAGES")


def env(name: str) -> str:
    """The value of a data variable, or a placeholder that makes the run fail with the variable's name."""
    return os.environ.get(name) or f"<set {name}>"


def recap_subsets() -> dict[str, str]:
    """Fig. 5's random Recap-DataComp-1B subsets {pairs: shards}: MDC_RECAP_SUBSETS, else the paper's
    5M/10M/20M/30M with placeholders that fail naming the variable."""
    given = json.loads(os.environ.get("MDC_RECAP_SUBSETS") or "{}")
    return given or {str(n * 10**6): "<set MDC_RECAP_SUBSETS>" for n in (5, 10, 20, 30)}


def data_vars(run: Run) -> tuple[str, ...]:
    """The environment variables a run of :func:`build_paper` reads its data from (``reproduce.cost.paper_cost``
    reports whether each is set)."""
    kind, _, tag = run.name.partition("/")
    if kind == "data":
        return ("MDC_CC3M",) if tag == "cc3m" else (DATA[run.params["style"]][0],)
    if kind == "pretrain":
        if "-cc3m-" in tag:
            return "MDC_CC3M", "MDC_CC3M_SAMPLES"
        if "-recap" in tag:
            return ("MDC_RECAP_SUBSETS",)
        var = DATA[run.labels["style"]][0]
        return var, f"{var}_SAMPLES"
    return {"probe": PROBE_VARS, "compositionality": COMPOSITIONALITY_VARS, "captioning": CAPTIONING_VARS}.get(kind, ())


def _pretrain(name, backbone, objective, style, seed, artifacts, labels, step="graphs", **extra) -> Run:
    var, data = DATA[style]
    params = dict(objective=objective, model=backbone, preset=backbone, train_data=env(var),
                  samples_per_epoch=int(os.environ.get(f"{var}_SAMPLES", "0")) or None, epochs=None, steps=None,
                  batch_size=PER_GPU_BATCH[backbone], workers=WORKERS[step], save_every=2000, keep_last=3, seed=seed,
                  output_dir=f"{{run:pretrain/{name}-s{seed}}}", lr=None, weight_decay=None,
                  compile_mode=STEPS[step], **extra)
    return Run(f"pretrain/{name}-s{seed}", "pretrain", params, artifacts=tuple(artifacts),
               labels={**labels, "data": data, "backbone": backbone, "seed": seed}, timeout_s=7 * DAY, gpus=8)


def build_paper(seeds: int = 1, step: str = "graphs") -> list[Run]:
    """Runs of the paper profile (every backbone for Table 1; ViT-B/16 for the rest), pretraining with ``step``
    (:data:`STEPS`)."""
    probe_roots = json.loads(os.environ.get("MDC_PROBE_ROOTS", "{}"))
    runs = _data_runs()
    for seed in range(seeds):
        pre = _pretrain_runs(seed, step)
        runs += pre + _evaluation_runs(pre, seed, probe_roots)
    return runs


def _data_runs() -> list[Run]:
    """Fig. 3's caption statistics of each pretraining set."""
    runs = []
    for style in ("alt", "descriptive"):
        var, data = DATA[style]
        runs.append(Run(f"data/{style}", "data", dict(kind="shards", style=style, shards=env(var), max_samples=200_000,
                                                      output_dir=f"{{run:data/{style}}}"),
                        artifacts=("fig3",), labels=dict(style=style, data=data)))
    runs.append(Run("data/cc3m", "data", dict(kind="shards", shards=env("MDC_CC3M"), max_samples=200_000,
                                              output_dir="{run:data/cc3m}"), artifacts=("fig3",),
                    labels=dict(data="CC3M")))
    return runs


def _pretrain_runs(seed: int, step: str) -> list[Run]:
    """Every pretraining run of one seed: Table 1's backbones, objectives and caption styles (and CLIP-LB),
    then Table 4's, Table 5's, Fig. 4's and Fig. 5's ablations on ViT-B/32, each with ``step``."""
    pretrain = functools.partial(_pretrain, step=step)
    pre = []
    for backbone in BACKBONES:
        for style in ("alt", "descriptive"):
            for objective in ("clip", "arc", "mdc"):
                arts = ["table1"] + (["table2"] if backbone == "vit-b-16" and style == "alt" else [])
                arts += ["table3", "fig6"] if backbone == "vit-b-16" and style == "alt" and objective != "clip" else []
                pre.append(pretrain(f"{backbone}-{objective}-{style}", backbone, objective, style, seed, arts,
                                     dict(method=objective.upper(), style=style)))
            if style == "descriptive":  # CLIP-LB: twice the global batch
                pre.append(pretrain(f"{backbone}-cliplb-{style}", backbone, "clip", style, seed, ["table1"],
                                     dict(method="CLIP-LB", style=style), global_batch=2048))
    for style in ("alt", "descriptive"):  # Table 4 (ViT-B/32)
        pre.append(pretrain(f"vit-b-32-mdc-wot-{style}", "vit-b-32", "mdc", style, seed, ["table4"],
                             dict(method="MDC (w/o t)", style=style), time_weighting=False))
    for lo, hi in ((0.0, 1.0), (0.3, 0.8), (0.4, 0.9), (0.5, 1.0)):
        run = pretrain(f"vit-b-32-mdc-t{lo:.1f}-{hi:.1f}-cc3m", "vit-b-32", "mdc", "alt", seed, ["table5"],
                        dict(method="MDC", style="alt", t_interval=[lo, hi]), t_interval=[lo, hi])
        run.params["train_data"] = env("MDC_CC3M")
        run.params["samples_per_epoch"] = int(os.environ.get("MDC_CC3M_SAMPLES", "0")) or None
        pre.append(run)
    for ratio in (0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0):
        pre.append(pretrain(f"vit-b-32-bert-r{ratio:.2f}-alt", "vit-b-32", "mdc", "alt", seed, ["fig4"],
                             dict(method="BERT", style="alt", mask_ratio=ratio), mask_ratio=ratio))
    subsets = recap_subsets()
    for pairs, shards in sorted(subsets.items(), key=lambda kv: int(kv[0])):
        run = pretrain(f"vit-b-32-mdc-recap{int(pairs) // 10**6}m", "vit-b-32", "mdc", "descriptive", seed,
                        ["fig5"], dict(method="MDC", style="descriptive", pairs=int(pairs)))
        run.params.update(train_data=shards, samples_per_epoch=int(pairs))
        pre.append(run)
    return pre


def _evaluation_runs(pre: list[Run], seed: int, probe_roots: dict) -> list[Run]:
    """One seed's evaluations: a linear probe of every pretraining run in ``pre``, Table 2's
    compositionality and Table 3's captioning of the ViT-B/16 models trained on alt captions."""
    runs = []
    for r in pre:
        tag = r.name.split("/", 1)[1]
        runs.append(Run(f"probe/{tag}", "linear_probe",
                        dict(checkpoint=f"{{run:{r.name}}}", synthetic_tasks=[], real_datasets=probe_roots,
                             device="cuda", seed=seed, output_dir=f"{{run:probe/{tag}}}"),
                        deps=(r.name,), artifacts=r.artifacts, labels=r.labels, timeout_s=DAY))
    for objective in ("clip", "arc", "mdc"):
        tag = f"vit-b-16-{objective}-alt-s{seed}"
        runs.append(Run(f"compositionality/{tag}", "compositionality",
                        dict(checkpoint=f"{{run:pretrain/{tag}}}", data_dir=None, num_samples=ELBO_SAMPLES, device="cuda",
                             sugarcrepe_dir=env("MDC_SUGARCREPE"), coco_val2017_dir=env("MDC_COCO_VAL2017"),
                             aro_dir=env("MDC_ARO"), vg_image_dir=env("MDC_VG_IMAGES"),
                             coco_order_json=env("MDC_COCO_ORDER"), coco_image_dir=env("MDC_COCO_IMAGES"),
                             flickr_order_json=env("MDC_FLICKR_ORDER"), flickr_image_dir=env("MDC_FLICKR_IMAGES"),
                             seed=seed, output_dir=f"{{run:compositionality/{tag}}}"),
                        deps=(f"pretrain/{tag}",), artifacts=("table2",),
                        labels=dict(method=objective.upper(), seed=seed), timeout_s=DAY))
    runs.append(Run(f"captioning/coco-s{seed}", "captioning",
                    dict(mdc_checkpoint=f"{{run:pretrain/vit-b-16-mdc-alt-s{seed}}}",
                         arc_checkpoint=f"{{run:pretrain/vit-b-16-arc-alt-s{seed}}}",
                         captions_json=env("MDC_COCO_KARPATHY"), captions_format="karpathy",
                         image_root=env("MDC_COCO_IMAGES"), train_split=["train", "restval"],
                         finetune_steps=5000, finetune_eval_every=250, finetune_val_images=1000, device="cuda",
                         seed=seed,
                         output_dir=f"{{run:captioning/coco-s{seed}}}"),
                    deps=(f"pretrain/vit-b-16-mdc-alt-s{seed}", f"pretrain/vit-b-16-arc-alt-s{seed}"),
                    artifacts=("table3", "fig6"), labels=dict(seed=seed), timeout_s=DAY))
    return runs
