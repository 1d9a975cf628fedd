"""Does MDC catch ARC with compute? The compute ladder on the study driver (its plan: reproduce/studies/ladder/PLAN.md).

Rungs (:data:`RUNGS`): MDC and ARC pretrained on descriptive captions at half to twice ``mini``'s 2,240 steps
over the same pairs (warm-up scaled, cosine to the end). Beside them: ``dense``, MDC pretrained at t ~ U[0, 1] at
1x. Optional (``--with-optional``; left out for the budget, PLAN.md): the ``x4`` rung, also on alt captions,
captioned pretrained and fine-tuned as the reference's Table 3, and ``rotary-x1`` and ``rotary-x4``, MDC with rotary
positions (ARC's partner: the rung's ARC). Every descriptive model gets its probe (pooled and grid, the random-init
floor), its binding part (the reference's ``own`` part on :data:`BINDING_SUITES`, own / another item's / no image)
and the step ``repetition/<arm>-<objective>-descriptive-s<seed>`` (:func:`mdc.eval.repetition.descriptive_repetition`:
captions at each scene's true length, with the references and another item's image as controls); every captioning
run the step ``caption_words/...``.
The tables, figure and verdicts: :mod:`reproduce.studies.ladder.report`.
"""
from __future__ import annotations

import glob
import json
import math
import os
from statistics import NormalDist

import numpy as np

from reproduce import power, registry
from reproduce.claims.stats import TASKS, difference, t_quantile
from reproduce.graph import ROOT, Run
from reproduce.running import ledger
from reproduce.studies.driver.steps import caption_words, repetition
from reproduce.studies.driver.study import Arm, Study, pretrain_run, probe_and_binding, records_of, seeds_of
from reproduce.studies.ladder import report

BINDING_SUITES = ("own_attribute", "own_sugarcrepe/swap_att", "own_sugarcrepe/swap_obj")
OWN_ITEMS = 60  # images a file, as the words study's power rule asked (59 for own_swap, MDC - ARC)
REPETITION_SCENES = {"mini": 300, "smoke": 8}
# seconds of a step with no record: the repetition instrument on the reference's kept weights, one thread on the
# 2-core machine beside a test suite (MDC 150-180 s, ARC 78-112 s), rounded up
STEP_SECONDS = {"mdc": 180.0, "arc": 120.0, "caption_words": 15.0}
RUNGS = (0.5, 1, 2)  # times mini's steps: the ladder (1/4 and 4 were dropped before any rung was read: the budget)
AFFORDED = 3  # seeds a model the budget affords (PLAN.md: the dry run at 3 seeds, measured on this machine's runs)
STAGES = ("pretrained", "finetuned")  # the 4x captions: as the reference's Table 3 (its cap, its stopping rule)

ARMS = tuple(Arm(f"x{m:g}", ("mdc", "arc"), ("descriptive",), steps=m) for m in RUNGS) + (
    Arm("dense", ("mdc",), ("descriptive",), params=(("t_interval", [0.0, 1.0]),)),
    Arm("x4", ("mdc", "arc"), ("descriptive", "alt"), steps=4, optional=True),
    Arm("rotary-x1", ("mdc",), ("descriptive",), (("positions", "rotary"),), optional=True),
    Arm("rotary-x4", ("mdc",), ("descriptive",), (("positions", "rotary"),), steps=4, optional=True),
)
KEPT = ("x2", "dense", "x4", "rotary-x4")  # seed 0's descriptive models kept in float16 (the top rungs)


def descriptive_runs(ref: dict, arm: Arm, objective: str, seed: int, scale: str) -> list[Run]:
    """Pretraining on descriptive captions, its probe, its binding part and its repetition step."""
    pre = pretrain_run("ladder", ref[f"pretrain/{objective}-descriptive-s{seed}"], ref["data/descriptive"], arm,
                       objective, "descriptive", seed)
    probe, binding = probe_and_binding("ladder", ref, pre, BINDING_SUITES, OWN_ITEMS)
    step = Run(f"repetition/{probe.name.split('/', 1)[1].removeprefix('ladder-')}", "repetition",
               dict(checkpoint=f"{{run:{pre.name}}}", n_scenes=REPETITION_SCENES[scale], seed=0),
               deps=(pre.name,), labels=dict(pre.labels))
    return [pre, probe, binding, step]


def caption_runs(ref: dict, pre: dict[str, Run], seed: int) -> list[Run]:
    """The 4x alt models captioned (the reference's captioning run: pretrained, and fine-tuned at its cap) and
    their caption-word steps."""
    t, runs = ref[f"captioning/alt-s{seed}"], []
    for stage in STAGES:
        name = f"captioning/ladder-x4-alt-{stage}-s{seed}"
        p = {**t.params, "output_dir": f"{{run:{name}}}", "mdc_checkpoint": f"{{run:{pre['mdc'].name}}}",
             "arc_checkpoint": f"{{run:{pre['arc'].name}}}",
             "finetune_steps": 0 if stage == "pretrained" else t.params["finetune_steps"]}
        labels = dict(arm="x4", style="alt", stage=stage, seed=seed)
        runs.append(Run(name, "captioning", p, deps=(pre["mdc"].name, pre["arc"].name, "data/evalsets"),
                        labels=labels, timeout_s=t.timeout_s))
        runs.append(Run(f"caption_words/x4-alt-{stage}-s{seed}", "caption_words",
                        dict(captioning=f"{{run:{name}}}", captions_json=t.params["captions_json"]),
                        deps=(name, "data/evalsets"), labels=dict(labels)))
    return runs


def study_runs(scale: str = "mini", plan: dict | None = None, with_optional: bool = False) -> list[Run]:
    """Every run of the study (its steps included; the optional arms' where asked), seed by seed, in the order the
    selection reads."""
    plan = plan or {"default": 3, "seeds": {}}
    arms = [a for a in ARMS if with_optional or not a.optional]
    most = max(seeds_of(plan, a.name, o) for a in arms for o in a.objectives)
    ref = {r.name: r for r in registry.build(scale, most)}
    runs = [ref[f"data/{style}"] for style in ("descriptive", "alt") if any(style in a.styles for a in arms)]
    runs.append(ref["data/evalsets"])
    for seed in range(most):
        for arm in arms:
            wanted = [o for o in arm.objectives if seed < seeds_of(plan, arm.name, o)]
            for objective in wanted:
                runs += descriptive_runs(ref, arm, objective, seed, scale)
            if "alt" in arm.styles and wanted == ["mdc", "arc"]:
                pre = {o: pretrain_run("ladder", ref[f"pretrain/{o}-alt-s{seed}"], ref["data/alt"], arm, o, "alt",
                                       seed) for o in wanted}
                runs += list(pre.values()) + caption_runs(ref, pre, seed)
    return runs


def repetition_step(p: dict) -> dict:
    """Repetition of descriptive captions at each scene's true length (:mod:`mdc.eval.repetition`)."""
    import mdc
    from mdc.eval.repetition import descriptive_repetition, format_repetition
    from mdc.factory import checkpoint_folder

    out = descriptive_repetition(mdc.load(checkpoint_folder(p["checkpoint"])).eval(), p["n_scenes"], p["seed"])
    print(format_repetition(out))  # the instrument's table with its controls, in the part's log
    return out


# ------------------------------------------------------------------------------------------------ the seed plan
def _probe_gaps(folder: str, pattern: str) -> dict | None:
    """The claims' difference (:func:`reproduce.claims.stats.difference`) of mean4, MDC - ARC, paired by seed, over
    the probe records ``pattern`` (``{o}``: objective, ``{s}``: seed) in ``folder``."""
    def correct(o, s):
        r = ledger.read(folder, pattern.format(o=o, s=s))
        res = r and r["results"]["results"]["datasets"]
        return res and {t: np.frombuffer(res[f"wds/{t}"]["correct"].encode(), np.uint8) - ord("0") for t in TASKS}
    pairs = [(correct("mdc", s), correct("arc", s)) for s in range(10)]
    pairs = [(m, a) for m, a in pairs if m and a]
    return difference(pairs) if pairs else None


def _binding_gaps(reference: str) -> dict:
    """own_swap accuracy, MDC's ELBO - ARC's exact, per reference seed, with one seed's items' variance."""
    acc = {o: [100 * r["results"]["results"]["columns"]["own_swap"]["scores"][v]["accuracy"] for s in range(10)
               if (r := ledger.read(reference, f"compositionality/{o}-descriptive-own-s{s}"))]
           for o, v in (("mdc", "elbo"), ("arc", "exact"))}
    gaps = [m - a for m, a in zip(acc["mdc"], acc["arc"])]
    items = 2 * OWN_ITEMS  # own_swap: swap_att and swap_obj at the study's items
    v = sum(np.mean(acc[o]) * (100 - np.mean(acc[o])) / items for o in acc)
    return {"per_seed": gaps, "mean": float(np.mean(gaps)), "v_items": float(v)}


def _reference_repetition(weights: str, path: str) -> dict:
    """:func:`mdc.eval.repetition.descriptive_repetition` of the reference's kept descriptive MDC and ARC (seeds
    0-7, ``reproduce/weights/mini``): measured once into ``path``, the instrument's seed spread before any rung."""
    if not os.path.isfile(path):
        import mdc
        from mdc.eval.repetition import descriptive_repetition

        out = {os.path.relpath(f, weights): descriptive_repetition(mdc.load(f).eval(), REPETITION_SCENES["mini"], 0)
               for f in sorted(glob.glob(os.path.join(weights, "pretrain", "*-descriptive-s*")))
               if os.path.basename(f).split("-")[0] in ("mdc", "arc")}
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
    with open(path) as f:
        found = json.load(f)
    own = {o: [r["views"]["own"] for n, r in sorted(found.items()) if n.split("/")[1].startswith(o)]
           for o in ("mdc", "arc")}
    gaps = [100 * (m["shape_twice"] - a["shape_twice"]) for m, a in zip(own["mdc"], own["arc"])]
    v = sum(100**2 * np.mean([x["shape_twice"] for x in own[o]]) * (1 - np.mean([x["shape_twice"] for x in own[o]]))
            / REPETITION_SCENES["mini"] for o in own)
    return {"per_seed": gaps, "mean": float(np.mean(gaps)), "v_items": float(v)}


def slope_rows(name: str, gap: dict, rungs=RUNGS, seeds: int = AFFORDED) -> list[dict]:
    """Power rows for the gap's slope per doubling of steps: "closes" (it differs from 0, at the slope that closes
    the 1x gap over the ladder's span) and "holds" (two one-sided tests at +-m, m half the gap's seed SD, at a true
    slope of 0), with the seeds for 80% power and the power at ``seeds``. The per-seed slope of an OLS fit over the
    rungs has the gap's seed SD and items' variance over Sxx = sum (log2 rung - mean)^2."""
    x = np.log2(rungs)
    sxx, span = float(((x - x.mean()) ** 2).sum()), float(x.max() - x.min())
    sd, v = float(np.std(gap["per_seed"], ddof=1)), gap["v_items"] / sxx
    rows = []
    for test, e, p in (("closes", abs(gap["mean"]) / span, 0.975), ("holds", sd / 2, 0.95)):
        s, z = sd / math.sqrt(sxx), NormalDist().inv_cdf(p)
        h = math.sqrt(z**2 * v + t_quantile(p, seeds - 1) ** 2 * s**2 / seeds)
        rows.append({"quantity": name, "test": test, "reference seeds": len(gap["per_seed"]), "gap": gap["mean"],
                     "seed SD": sd, "slope effect": e, "margin m": sd / 2, "seeds": power.needed_seeds(e, s, v, p),
                     "power": NormalDist().cdf((e - h) / math.sqrt(v + s**2 / seeds))})
    return rows


def plan_seeds(args) -> str:
    """Seeds per ladder model before any rung is read (:func:`slope_rows` per instrument, from the reference):
    the most any resolvable row (at most ``power.MAX_SEEDS``) asks, at least ``power.FLOOR_SEEDS``, and at most
    :data:`AFFORDED`; the other arms the floor. A sensitivity row (the probe's seed SD pooled with the words study's
    arms) decides nothing. Writes ``args.seeds``; returns the table."""
    study = os.path.dirname(args.seeds)
    words = records_of("words")
    probe = _probe_gaps(args.reference, "probe/{o}-descriptive-s{s}")
    rows = slope_rows("probe gap (mean4)", probe) + slope_rows("binding gap (own_swap)", _binding_gaps(args.reference))
    weights = os.path.join(ROOT, "reproduce", "weights", "mini")
    rows += slope_rows("repetition gap (shape named twice)",
                       _reference_repetition(weights, os.path.join(study, "reference_repetition.json")))
    arms = [_probe_gaps(words, f"probe/words-{a}-{{o}}-descriptive-s{{s}}")
            for a in ("paper", "rotary", "quarter", "x2")]
    pooled = [g - np.mean(d["per_seed"]) for d in (probe, *arms) for g in d["per_seed"]]
    dof = sum(len(d["per_seed"]) - 1 for d in (probe, *arms))
    sensitivity = {**probe, "per_seed": list(np.asarray(pooled) * math.sqrt((len(pooled) - 1) / dof))}
    rows += [{**r, "quantity": "probe gap, seed SD pooled with the words study's arms (sensitivity)"}
             for r in slope_rows("", sensitivity)]
    asked = max([power.FLOOR_SEEDS] + [r["seeds"] for r in rows if "sensitivity" not in r["quantity"]
                                       and r["seeds"] is not None and r["seeds"] <= power.MAX_SEEDS])
    k = min(asked, AFFORDED)
    ladder = {f"{a.name}-{o}": k for a in ARMS if a.name.startswith("x") for o in a.objectives}
    plan = {"about": "python -m reproduce.studies.ladder --plan-seeds: reproduce.power's seeds for the slope of each "
                     "gap per doubling, from the reference before any rung was read", "default": power.FLOOR_SEEDS,
            "seeds": ladder, "rows": rows}
    with open(args.seeds, "w") as f:
        json.dump(plan, f, indent=1, default=float)
        f.write("\n")
    head = (f"| quantity | test | reference seeds | 1x gap | seed SD | slope effect / doubling | margin m | seeds for "
            f"80% | power at {AFFORDED} |")
    return "\n".join([head, "|---|---|---|---|---|---|---|---|---|"] + [
        f"| {r['quantity']} | {r['test']} | {r['reference seeds']} | {r['gap']:.1f} | {r['seed SD']:.2f} | "
        f"{r['slope effect']:.2f} | {r['margin m']:.2f} | {r['seeds'] or 'never'} | {100 * r['power']:.0f}% |"
        for r in rows]) + (f"\n\nseeds: {k} for every rung's MDC and ARC (power asks {asked}, the budget affords "
                          f"{AFFORDED}), {power.FLOOR_SEEDS} for the other arms")


STUDY = Study(
    "ladder", ARMS, study_runs, steps={"repetition": repetition_step, "caption_words": caption_words},
    step_code=(repetition,),
    step_seconds=lambda run: STEP_SECONDS["caption_words" if run.notebook == "caption_words"
                                          else run.labels.get("objective", "mdc")],
    keep=lambda run: not run.labels.get("seed") and run.labels.get("arm") in KEPT
    and run.labels.get("style") == "descriptive",
    report=report.build, plan_seeds=plan_seeds, budget_run_hours=45.0)
