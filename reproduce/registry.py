"""The experiment registry: every table and figure of the paper, the notebook runs that feed it
(per profile) and the builder that writes it from their results (:mod:`reproduce.artifacts.paper_tables`,
:mod:`reproduce.artifacts.compositionality_table`, :mod:`reproduce.artifacts.paper_figures`, :mod:`reproduce.claims.claim_rows`).

Profiles:
- ``smoke``: every artifact wired end to end with a handful of steps on tiny data (CI).
- ``mini``: the synthetic scene world with the model config ``mini`` and the recipe
  ``reproduce/presets/mini.json`` (``--preset reproduce/presets/mini.json``) fixed by the
  learnability study (``reproduce/studies/learnability.md``); 8.4 to 9.3 run-hours per seed, 5 hours
  on 2 CPU cores at two runs at a time (``--dry-run`` estimates them).
- ``paper``: the paper's backbones, data and hyperparameters on GPU nodes. Data paths come from
  environment variables (see :data:`PAPER_ENV`); pretraining runs execute under torchrun when
  the runner is given ``--gpus-per-node``.

Runs shared between artifacts are registered once: the MDC run on alt captions serves Table 1,
Tables 4 and 5 (its [0.5, 1] column), Fig. 4 and the captioning of Table 3; every pretraining
run is probed once.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

from mdc.factory import model_config
from mdc.base.optim import preset_values
from reproduce.artifacts import compositionality_table, paper_figures, paper_tables
from reproduce.claims import claim_rows
from reproduce.running import ledger
from reproduce.graph import Run
from reproduce.paper_profile import build_paper


@dataclass(frozen=True)
class Artifact:
    """A table or figure of the paper: what it shows, and the builder that writes it from the runs'
    records (``builder(runs, paper_dir, out)`` -> the files written; runs as :func:`reproduce.running.ledger.for_build`
    gives them)."""

    description: str
    builder: Callable[[list[dict], str, str], list[str]]


# The one artifact table: runs name the artifacts they feed (Run.artifacts), the figures run builds them.
ARTIFACTS = {
    "table1": Artifact("Linear probe: CLIP, ARC, MDC per caption style (and CLIP-LB on descriptive captions)",
                       paper_tables.table1),
    "table2": Artifact("Compositionality: ARO and SugarCrepe for CLIP, ARC, MDC (Monte Carlo, heuristic)",
                       compositionality_table.table2),
    "table3": Artifact("Captioning: ARC beam 6 vs MDC-10/15/20 (BLEU-4, METEOR, CIDEr, SPICE, ROUGE-L, LLM judge)",
                       paper_tables.table3),
    "table4": Artifact("Ablation of the 1/t weight, both caption styles", paper_tables.table4),
    "table5": Artifact("Noise schedules t ~ U[w_l, w_u] on alt captions", paper_tables.table5),
    "tables6-8": Artifact("Pretraining hyperparameters per backbone (the presets)", paper_tables.tables6_8),
    "fig3": Artifact("Caption length distributions of the pretraining sets", paper_figures.fig3),
    "fig4": Artifact("Image-conditioned BERT at fixed masking ratios vs MDC", paper_figures.fig4),
    "fig5": Artifact("Linear probe vs number of pretraining pairs", paper_figures.fig5),
    "fig6": Artifact("Qualitative captions: MDC-10/15/20 and ARC", paper_figures.fig6),
    "guidance": Artifact("MC-Diffusion: reference metrics vs CLIPScore across guidance strengths, CFG vs MCS "
                         "(as printed, mirrored)", paper_tables.guidance),
    "claims": Artifact("The paper's probe claims on the synthetic world: each difference, its 95% interval over "
                       "seeds and test items, and the verdict", claim_rows.build),
}
PROBED = {"table1", "table4", "table5", "fig4", "fig5"}  # artifacts made of linear probes
STYLES = ("alt", "descriptive")  # the CC12M and Recap-DataComp analogues
T_INTERVALS = ((0.0, 1.0), (0.3, 0.8), (0.4, 0.9))  # Table 5 besides the default (0.5, 1.0)
# Table 2 of the synthetic world in two runs per model, joined by the report: ARO's order task (five captions
# an item: 7,500 of mini's 12,686 candidates) apart from the pair tasks (VG-Relation, VG-Attribution and
# SugarCrepe). MDC's Monte-Carlo ELBO over all of them, estimated at 146 minutes on one core, would not have
# followed its pretraining run inside a time-boxed part; measured, its parts took 48 and 11 minutes (seed 0),
# side by side (before the in-distribution suites and the shuffled-image controls joined the pairs part: each
# roughly doubles it). With them, and the order task on 20 images (order_images below), the in-distribution
# suites (mdc.world.caption_edits) are a part of their own, about 100 minutes for MDC: beside them the pair part
# would have made one run of about 115, which with its 34-minute pretraining run barely fits a 150-minute part.
# Per suite, the numbers are those of one run over all suites (each suite is scored and resampled on its own,
# from the same seed).
TABLE2_PARTS = {"order": ("aro_coco_order",), "pairs": ("aro_relation", "aro_attribute", "sugarcrepe"),
                "own": ("own",)}
# The compositionality settings one part reads alone: the others run without them, so resizing a part re-keys
# (and re-scores) that part only
PART_SIZES = {"order": ("order_images",), "own": ("own_items",)}

# Environment variables of the paper profile (shard patterns and evaluation data roots).
PAPER_ENV = {
    "MDC_CC12M": "CC12M webdataset shards, e.g. /data/cc12m/{00000..01242}.tar",
    "MDC_CC12M_SAMPLES": "samples in the CC12M shards (epoch size)",
    "MDC_RECAP10M": "Recap-DataComp-10M shards",
    "MDC_RECAP10M_SAMPLES": "samples in those shards",
    "MDC_CC3M": "CC3M shards (Table 5)",
    "MDC_CC3M_SAMPLES": "samples in the CC3M shards",
    "MDC_PROBE_ROOTS": "JSON {dataset: root}, e.g. {\"imagenet1k\": \"/data/imagenet\", \"cifar10\": \"/data/cifar10\"}",
    "MDC_SUGARCREPE": "folder of SugarCrepe's *.json", "MDC_COCO_VAL2017": "COCO val2017 images",
    "MDC_ARO": "folder of ARO's visual_genome_*.json", "MDC_VG_IMAGES": "Visual Genome images",
    "MDC_COCO_ORDER": "ARO's coco_karpathy_test.json", "MDC_COCO_IMAGES": "COCO images root (val2014/...)",
    "MDC_FLICKR_ORDER": "ARO's flickr30k_test.json", "MDC_FLICKR_IMAGES": "Flickr30k images",
    "MDC_COCO_KARPATHY": "dataset_coco.json (captioning)",
    "MDC_RECAP_SUBSETS": "Fig. 5: JSON {pairs: shards}, e.g. {\"5000000\": \"/data/recap5m/{00000..00499}.tar\", ...}",
}

PAPER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper")  # the paper's numbers (CSV)
# The recipe the learnability study froze for mini (mdc.base.optim.read_preset reads it).
MINI_PRESET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "presets", "mini.json")

# Per profile: data sizes, the pretraining recipe and the evaluation budgets.
PROFILES = {
    "smoke": dict(data=dict(num=192, image_size=32, shard_size=64), evalsets=dict(n_probe_train=48, n_probe_test=24,
                  n_items=8, n_caption_train=16), model="tiny",
                  model_overrides=dict(image_size=32, patch_size=8, vision_width=32, vision_layers=1, vision_heads=2,
                                       text_width=32, text_layers=1, text_heads=2, embed_dim=32, context_length=64),
                  train=dict(steps=3, batch_size=16, lr=1e-3), workers=0, probe=dict(epochs=2),
                  compositionality=dict(num_samples=4, max_samples=16, batch_size=16, attribute_min_count=1,
                                        blind_images=2),
                  captioning=dict(finetune_steps=2, finetune_eval_every=1, finetune_val_images=4, max_images=4,
                                  metrics=["bleu", "rouge_l", "cider"]),
                  guidance=dict(max_images=4, strengths=[1.0, 2.0], metrics=["bleu", "cider"], composition_items=4),
                  bert_ratios=(0.15, 1.0), fig5_fractions=(0.5,), timeout_s=600),
    "mini": dict(data=dict(num=None, image_size=None, shard_size=1000), evalsets=dict(n_probe_train=3000,
                 n_probe_test=None, n_items=300, n_caption_train=1000), model="mini", model_overrides={},
                 train={}, workers=1, probe=dict(epochs=10),
                 # probe test images: None, mdc.world.evalsets.PROBE_TEST_ITEMS (2,560 on the claims' tasks, 1,000 else)
                 # attribute pairs: ARO drops those under 25 items of real VG; 300 synthetic items spread
                 # over ~70 pairs, so the synthetic suite keeps pairs of at least 5. ELBO samples: 32 paired
                 # (stratified, common random numbers), doubled up to 256 where an item's decision with the
                 # image is within 3 standard errors: continued to 256, 32 alone changes 8.3% of the decisions,
                 # the rule none (reproduce/studies/elbo_budget.py, docs/evaluation.md)
                 # ARO's order task on its first 20 images (100 captions): the most any Table 2 difference needs by
                 # the probe's rule (python -m reproduce.power: 19 for MDC - ARC on the three-seed reference).
                 # The in-distribution suites on each file's first 129 items (own_items): first 60, the size of
                 # the controls' and the binding study's, fixed from cost before any seed spread of theirs was
                 # known, with the rule that the own part grows to what reproduce.power asks; at three seeds of
                 # the second reference run it asks 129 (own_relation, MDC - CLIP; docs/reproduction.md)
                 compositionality=dict(num_samples=32, max_samples=256, batch_size=64, attribute_min_count=5,
                                       blind_images=4, order_images=20, own_items=129),
                 # captioning fine-tunes until the validation loss stops improving (docs/evaluation.md): every 100
                 # steps on 100 validation images (500 pairs), 3 evaluations without a 0.5% gain, at most 3,000
                 # steps; lr 1e-4, a tenth of pretraining's (300 steps at 1e-5 left ARC at its alt-text length)
                 captioning=dict(finetune_steps=3000, finetune_lr=1e-4, finetune_eval_every=100, finetune_patience=3,
                                 finetune_tolerance=0.005, finetune_val_images=100, max_images=500,
                                 metrics=["bleu", "meteor", "rouge_l", "cider"]),
                 # guided compositionality (composition_items) off: about 55 of the sweep's 69 minutes per seed, and
                 # no artifact reads it (the guidance table and figure read the captions' metrics)
                 guidance=dict(max_images=300, strengths=[1.0, 2.0, 3.0, 4.0], metrics=["bleu", "meteor", "cider"],
                               composition_items=0),
                 bert_ratios=(0.15, 0.4, 0.7, 1.0), fig5_fractions=(0.25, 0.5), timeout_s=5 * 3600),
}


def _mini_recipe() -> dict:
    """The recipe the learnability study froze (:data:`MINI_PRESET`) and the data it needs; each
    run gets its values as parameters, its objective's lr among them."""
    r = preset_values(MINI_PRESET, "mdc")
    lr = {objective: preset_values(MINI_PRESET, objective)["lr"] for objective in ("mdc", "arc", "clip")}
    return dict(train=dict(steps=r["steps"], batch_size=r["global_batch"], lr=lr, weight_decay=r["weight_decay"],
                           warmup_steps=r["warmup_steps"]),
                data=dict(num=r["steps"] * r["global_batch"], image_size=model_config(r["model"]).image_size))


def _train_params(p: dict, objective: str, frac: float = 1.0, batch_scale: int = 1) -> dict:
    """Pretraining parameters of a run: the profile's recipe (its lr: one, or one per objective); ``frac``
    of its steps (Fig. 5 trains on a fraction of the pairs for as many epochs), ``batch_scale`` x the batch
    for as many pairs (CLIP-LB). Checkpoints every tenth of the run, the two newest kept: the runner
    resumes a stopped run from them."""
    t = dict(p["train"])
    if isinstance(t.get("lr"), dict):
        t["lr"] = t["lr"][objective]
    t["steps"] = max(1, round(t["steps"] * frac / batch_scale))
    t["batch_size"] = t["batch_size"] * batch_scale
    if t.get("warmup_steps"):
        t["warmup_steps"] = max(1, round(t["warmup_steps"] * frac / batch_scale))
    t["save_every"] = max(1, -(-t["steps"] // 10))  # a stopped run loses at most a tenth of its steps
    t["keep_last"] = 2
    return t


@dataclass(frozen=True)
class Pretraining:
    """One pretraining run of a seed, before the seed is known: its name (``pretrain/<name>-s<seed>``), objective
    and caption style, the notebook parameters beside the recipe's (``extra``), the fraction of the pairs it
    trains on (Fig. 5), its batch as a multiple of the recipe's (CLIP-LB), the artifacts it feeds, its labels."""

    name: str
    objective: str
    style: str
    artifacts: tuple[str, ...]
    labels: dict
    extra: dict = field(default_factory=dict)
    fraction: float = 1.0
    batch_scale: int = 1


def pretrainings(p: dict) -> list[Pretraining]:
    """Every pretraining run of one seed (shared between artifacts: each is registered once)."""
    specs = []
    for style in STYLES:
        for objective in ("clip", "arc", "mdc"):
            artifacts = ["table1"] + (["table4"] if objective == "mdc" else [])
            if style == "alt" and objective == "mdc":
                artifacts += ["table5", "fig4"]
            if style == "descriptive" and objective == "mdc":
                artifacts += ["fig5"]
            specs.append(Pretraining(f"{objective}-{style}", objective, style, tuple(artifacts),
                                     dict(method=objective.upper(), style=style)))
    specs.append(Pretraining("cliplb-descriptive", "clip", "descriptive", ("table1",),
                             dict(method="CLIP-LB", style="descriptive"), batch_scale=2))
    for style in STYLES:
        specs.append(Pretraining(f"mdc-wot-{style}", "mdc", style, ("table4",), dict(method="MDC (w/o t)", style=style),
                                 extra={"time_weighting": False}))
    for lo, hi in T_INTERVALS:
        specs.append(Pretraining(f"mdc-t{lo:.1f}-{hi:.1f}-alt", "mdc", "alt", ("table5",),
                                 dict(method="MDC", style="alt", t_interval=[lo, hi]), extra={"t_interval": [lo, hi]}))
    for ratio in p["bert_ratios"]:
        specs.append(Pretraining(f"bert-r{ratio:.2f}-alt", "mdc", "alt", ("fig4",),
                                 dict(method="BERT", style="alt", mask_ratio=ratio), extra={"mask_ratio": ratio}))
    for frac in p["fig5_fractions"]:
        specs.append(Pretraining(f"mdc-descriptive-n{frac:.2f}", "mdc", "descriptive", ("fig5",),
                                 dict(method="MDC", style="descriptive"), fraction=frac))
    # MC-Diffusion's training options (P_cond = P_mask = 0.1 as there), for the guidance artifact
    specs.append(Pretraining("mdc-guided-alt", "mdc", "alt", ("guidance",),
                             dict(method="MDC (CFG/MCS training)", style="alt"),
                             extra={"model_overrides": {**p["model_overrides"], "cond_drop_prob": 0.1,
                                                        "cond_mask_prob": 0.1}}))
    return specs


def run_name(kind: str, seed: int, *tag: str) -> str:
    """A run's name as :func:`build` gives it and its record holds it: ``<kind>/<tag joined by ->-s<seed>``, e.g.
    ``run_name("compositionality", 0, "mdc", "descriptive", "own")`` is ``compositionality/mdc-descriptive-own-s0``."""
    return f"{kind}/{'-'.join(tag)}-s{seed}"


def pretrain_runs(p: dict, seed: int) -> list[Run]:
    """Every pretraining run of one seed (:func:`pretrainings`) as the runner executes it."""
    num, shard = p["data"]["num"], p["data"]["shard_size"]
    runs = []
    for spec in pretrainings(p):
        shards = -(-round(num * spec.fraction) // shard)  # the first shards hold the fraction's pairs
        data = (f"{{run:data/{spec.style}}}/shards"
                + ("" if spec.fraction == 1.0 else "/{000000..%06d}.tar" % (shards - 1)))
        params = dict(objective=spec.objective, model=p["model"], model_overrides=p["model_overrides"],
                      train_data=data, seed=seed, output_dir=f"{{run:{run_name('pretrain', seed, spec.name)}}}",
                      workers=p["workers"], **_train_params(p, spec.objective, spec.fraction, spec.batch_scale))
        params.update(spec.extra)
        labels = {**spec.labels, "seed": seed, "pairs": min(num, shards * shard) if spec.fraction < 1 else num,
                  "fraction": spec.fraction}
        runs.append(Run(run_name("pretrain", seed, spec.name), "pretrain", params, deps=(f"data/{spec.style}",),
                        artifacts=spec.artifacts, labels=labels, timeout_s=p["timeout_s"]))
    return runs


def build(profile: str, seeds: int = 1, step: str = "graphs") -> list[Run]:
    """All runs of a profile for ``seeds`` seeds (0 .. seeds-1); the paper profile's pretraining with ``step``
    (``reproduce.paper_profile.STEPS``)."""
    if profile == "paper":
        return build_paper(seeds, step)
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES) + ['paper']}")
    p = PROFILES[profile]
    if profile == "mini":
        recipe = _mini_recipe()
        p = {**p, "train": {**p["train"], **recipe["train"]}, "data": {**p["data"], **recipe["data"]}}
    runs = _data_runs(p)
    for seed in range(seeds):
        pre = pretrain_runs(p, seed)
        runs += pre + evaluation_runs(p, seed, pre)
    return runs


def _data_runs(p: dict) -> list[Run]:
    """The synthetic world's pretraining shards per caption style and its evaluation sets."""
    data = p["data"]
    runs = [Run(f"data/{style}", "data", dict(kind="shards", style=style, seed=0, output_dir=f"{{run:data/{style}}}",
                                              **data), artifacts=("fig3",), labels=dict(style=style),
                timeout_s=p["timeout_s"]) for style in STYLES]
    runs.append(Run("data/evalsets", "data", dict(kind="evalsets", seed=1, image_size=data["image_size"],
                                                   output_dir="{run:data/evalsets}", **p["evalsets"]),
                    timeout_s=p["timeout_s"]))
    return runs


def evaluation_runs(p: dict, seed: int, pre: list[Run]) -> list[Run]:
    """One seed's evaluations: a linear probe of each probed pretraining run in ``pre``, Table 2's parts per
    objective, the captioning of Table 3 and Fig. 6, and the guidance sweep."""
    runs = []
    evalsets = "{run:data/evalsets}"
    for r in pre:
        if not set(r.artifacts) & PROBED:
            continue
        tag = r.name.split("/", 1)[1]
        runs.append(Run(f"probe/{tag}", "linear_probe",
                        dict(checkpoint=f"{{run:{r.name}}}", evalsets_dir=evalsets, seed=seed,
                             output_dir=f"{{run:probe/{tag}}}", random_init_cache="{run:cache/random-init}",
                             **p["probe"]),
                        deps=(r.name, "data/evalsets"), artifacts=r.artifacts + ("claims",), labels=r.labels,
                        timeout_s=p["timeout_s"]))
    for objective in ("clip", "arc", "mdc"):
        model = run_name("pretrain", seed, objective, "descriptive")
        for part, suites in TABLE2_PARTS.items():
            name = run_name("compositionality", seed, objective, "descriptive", part)
            others = {k for sizes in PART_SIZES.values() for k in sizes} - set(PART_SIZES.get(part, ()))
            settings = {k: v for k, v in p["compositionality"].items() if k not in others}
            runs.append(Run(name, "compositionality",
                            dict(checkpoint=f"{{run:{model}}}", data_dir=evalsets, suites=list(suites), seed=seed,
                                 output_dir=f"{{run:{name}}}", **settings),
                            deps=(model, "data/evalsets"), artifacts=("table2",),
                            labels=dict(method=objective.upper(), style="descriptive", seed=seed, part=part),
                            timeout_s=p["timeout_s"]))
    mdc, arc, captioning = (run_name("pretrain", seed, "mdc", "alt"), run_name("pretrain", seed, "arc", "alt"),
                            run_name("captioning", seed, "alt"))
    runs.append(Run(captioning, "captioning",
                    dict(mdc_checkpoint=f"{{run:{mdc}}}", arc_checkpoint=f"{{run:{arc}}}",
                         captions_json=os.path.join(evalsets, "captions", "dataset_scenes.json"),
                         image_root=os.path.join(evalsets, "captions"), seed=seed,
                         output_dir=f"{{run:{captioning}}}", **p["captioning"]),
                    deps=(mdc, arc, "data/evalsets"),
                    artifacts=("table3", "fig6", "claims"), labels=dict(style="alt", seed=seed),  # claims: claim 8
                    timeout_s=p["timeout_s"]))
    runs.append(Run(f"guidance/alt-s{seed}", "guidance",
                    dict(checkpoint=f"{{run:pretrain/mdc-guided-alt-s{seed}}}",
                         clip_checkpoint=f"{{run:pretrain/clip-descriptive-s{seed}}}",  # the best-trained CLIP
                         captions_json=os.path.join(evalsets, "captions", "dataset_scenes.json"),
                         image_root=os.path.join(evalsets, "captions"), seed=seed,
                         output_dir=f"{{run:guidance/alt-s{seed}}}", **p["guidance"]),
                    deps=(f"pretrain/mdc-guided-alt-s{seed}", f"pretrain/clip-descriptive-s{seed}", "data/evalsets"),
                    artifacts=("guidance",), labels=dict(style="alt", seed=seed), timeout_s=p["timeout_s"]))
    return runs


def with_figures(runs: list[Run], figures_dir: str, profile: str, records: str) -> list[Run]:
    """The figures run, after every other run: rebuilds all artifacts from their records in ``records``."""
    return runs + [Run("figures", "figures", dict(records=records, runs=[r.name for r in runs], figures_dir=figures_dir,
                                                 profile=profile, output_dir="{run:figures}"),
                       deps=tuple(r.name for r in runs), artifacts=tuple(ARTIFACTS), timeout_s=1800)]


def _check_artifacts(names) -> None:
    unknown = set(names or ()) - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"unknown artifact(s) {sorted(unknown)}; choose from {sorted(ARTIFACTS)}")


def select(runs: list[Run], only: list[str] | None) -> list[Run]:
    """The runs feeding the artifacts in ``only`` plus everything they depend on."""
    if not only:
        return runs
    _check_artifacts(only)
    by_name = {r.name: r for r in runs}
    keep: set[str] = set()

    def add(name: str):
        if name not in keep:
            keep.add(name)
            for d in by_name[name].deps:
                add(d)

    for r in runs:
        if set(r.artifacts) & set(only) and r.notebook != "figures":
            add(r.name)
    out = [r for r in runs if r.name in keep]
    figures = [r for r in runs if r.notebook == "figures"]
    return out + [Run(f.name, f.notebook, dict(f.params, only=list(only), runs=[r.name for r in out]),
                      deps=tuple(r.name for r in out), artifacts=tuple(only), timeout_s=f.timeout_s) for f in figures]


def build_artifacts(records: str, out: str, paper_dir: str = PAPER_DIR, only: Sequence[str] | None = None,
                    runs: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Rebuild the artifacts (all, or ``only``) into ``out`` from the ledger folder ``records`` (the figures
    run's work: reproduce.running.execute); ``runs``: the records to read (default: all). Returns {artifact: files
    written}."""
    found = ledger.read_all(records)
    return build_from_records(found if runs is None else {n: found[n] for n in runs if n in found}, out, paper_dir,
                              only)


def build_from_records(records: dict[str, dict], out: str, paper_dir: str = PAPER_DIR,
                       only: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The artifacts (all, or ``only``) from ``records`` ({run name: record}); every Markdown table ends
    with the line that names the code its records came from (:func:`reproduce.running.ledger.provenance`)."""
    _check_artifacts(only)
    runs = ledger.for_build(records)
    os.makedirs(out, exist_ok=True)
    files = {}
    for name, artifact in ARTIFACTS.items():
        if only and name not in only:
            continue
        files[name] = artifact.builder(runs, paper_dir, out)
        feeding = {n: r for n, r in records.items() if name in r["artifacts"]}
        line = ledger.provenance(feeding, of=len(records))
        for path in files[name] if feeding else ():  # Tables 6-8 are the presets: no run feeds them
            if path.endswith(".md"):
                with open(path, "a") as f:
                    f.write(f"\n{line}\n")
    return files
