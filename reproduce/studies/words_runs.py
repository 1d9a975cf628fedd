"""The words study's runs: its arms as data, each arm's runs per seed (the reference run's notebooks and recipe,
reproduce/registry.py's runs renamed and changed only where the arm says), the two evaluation steps the driver
adds, each run's estimate on the reference machine and the time-budget selection. reproduce/studies/words.py is
the command line; reproduce/studies/words/PLAN.md the plan.

Runs, per arm, objective and seed (``<arm>``: :data:`ARMS`; names as the ledger files them):

- ``pretrain/words-<arm>-<objective>-<style>-s<seed>``: the reference's pretraining run of that objective, style
  and seed (``pretrain/<objective>-<style>-s<seed>``) with the arm's model overrides, steps and pairs;
- descriptive: ``probe/words-...`` (the reference's probe: pooled and grid, random-init floor),
  ``compositionality/words-<arm>-<objective>-descriptive-binding-s<seed>`` (the reference's ``own`` part on
  :data:`BINDING_SUITES` at :data:`OWN_ITEMS` items a file) and ``neighbours/<arm>-<objective>-descriptive-s<seed>``
  (a step of the driver, no notebook: neighbour use and, for MDC, the binding diagnostic);
- alt: ``captioning/words-<arm>-alt-<stage>-s<seed>`` (the reference's captioning run of that seed with the arm's
  MDC and ARC, ``pretrained`` or ``finetuned`` at :data:`FINETUNE_CAP` times the reference's cap) and
  ``caption_words/<arm>-alt-<stage>-s<seed>`` (a step: repeated content words of every caption set).

The steps' code is here (:data:`STEP_FUNCTIONS`); a step's key hashes that code (:func:`step_digest`), its
parameters and its dependencies' keys, as the runner's key hashes a notebook's code cells.

The estimate of a run not yet recorded in the study's ledger is its reference run's record
(``reproduce/records/mini``) as :func:`reproduce.running.ledger.estimate` gives it (an evaluation scaled by its
cost model), a pretraining run's scaled by its images (steps x batch) and, with the caption length hidden, by the
context over the longest caption; a captioning run's split into fine-tuning (its steps at the alt pretraining
run's seconds per image) and the rest (:func:`caption_factor`). Once a run of the same stem is recorded in the
study's ledger, that record is the estimate.
"""
from __future__ import annotations

import glob
import hashlib
import inspect
import json
import math
import os
from dataclasses import dataclass

from mdc.factory import model_config
from reproduce import registry
from reproduce.cost import eval_cost
from reproduce.graph import ROOT, Run, keys
from reproduce.running import ledger
from reproduce.studies.words_report import repetition

STUDY = os.path.join(ROOT, "reproduce", "studies", "words")
RECORDS = os.path.join(STUDY, "records")
WEIGHTS = os.path.join(STUDY, "weights")
SEEDS = os.path.join(STUDY, "seeds.json")
REFERENCE = os.path.join(ROOT, "reproduce", "records", "mini")
BUDGET_RUN_HOURS = 30.0
BINDING_SUITES = ("own_attribute", "own_sugarcrepe/swap_att", "own_sugarcrepe/swap_obj")
OWN_ITEMS = 60  # images a file: reproduce.power's Table 2 rule asks 59 (own_swap, MDC - ARC), 22 (own_attribute)
NEIGHBOUR_ITEMS = {"mini": 1000, "smoke": 16}
FINETUNE_CAP = 2  # times the reference's cap: its MDC stopped at 2,600-2,700 of 3,000 steps, near where its
#                   cosine schedule had all but stopped it
STEPS = ("neighbours", "caption_words")  # the driver's evaluation steps (no notebook)
# seconds of a step with no record: neighbour use on 1,000 objects with the shipped mini weights, one thread on
# the 2-core machine at a load of about 5 (MDC 150 s and its binding diagnostic 3 s; ARC 21 s), rounded up
STEP_SECONDS = {"mdc": 180.0, "arc": 30.0, "caption_words": 15.0}


@dataclass(frozen=True)
class Arm:
    """One arm: the objectives and caption styles it trains, its ModelConfig overrides (pairs), its steps as a
    multiple of the recipe's (the warm-up scaled alike) and its share of the pairs at the recipe's steps."""

    name: str
    objectives: tuple[str, ...]
    styles: tuple[str, ...]
    overrides: tuple[tuple[str, object], ...] = ()
    steps: int = 1
    fraction: float = 1.0
    optional: bool = False  # built only when asked (--with-optional): the 4x arm, if the dry run fits
    about: str = ""


ARMS = (
    Arm("paper", ("mdc", "arc"), ("descriptive", "alt"), about="the reference run's setting, on the study's code"),
    Arm("rotary", ("mdc", "arc"), ("descriptive", "alt"), (("positions", "rotary"),),
        about="rotary position embeddings in the decoder's self-attention"),
    Arm("hidden", ("mdc",), ("descriptive", "alt"), (("length_visible", False),),
        about="EOT and the padding to the context maskable and predicted; captions of the model's own length"),
    Arm("quarter", ("mdc", "arc"), ("descriptive",), fraction=0.25,
        about="a quarter of the pairs seen four times at the recipe's 2,240 steps"),
    Arm("x2", ("mdc", "arc"), ("descriptive",), steps=2, about="twice the steps over the same pairs, warm-up x2"),
    Arm("x4", ("mdc", "arc"), ("descriptive",), steps=4, optional=True, about="four times the steps (optional)"),
)
STAGES = ("pretrained", "finetuned")


def arms(with_optional: bool = False) -> tuple[Arm, ...]:
    return tuple(a for a in ARMS if with_optional or not a.optional)


def read_seeds(path: str = SEEDS) -> dict:
    """The seed plan: ``{"default": 3, "seeds": {"<objective>" or "<arm>-<objective>": n}}`` (default 3 each)."""
    if not os.path.isfile(path):
        return {"default": 3, "seeds": {}}
    with open(path) as f:
        plan = json.load(f)
    return {"default": int(plan.get("default", 3)), "seeds": dict(plan.get("seeds", {}))}


def seeds_of(plan: dict, arm: str, objective: str) -> int:
    s = plan["seeds"]
    return int(s.get(f"{arm}-{objective}", s.get(objective, plan["default"])))


def _labels(arm: Arm, objective: str, style: str, seed: int, **more) -> dict:
    return dict(arm=arm.name, method=objective.upper(), objective=objective, style=style, seed=seed, **more)


def pretrain_run(t: Run, data: Run, arm: Arm, objective: str, style: str, seed: int) -> Run:
    """``t`` (the reference's ``pretrain/<objective>-<style>-s<seed>``) as the arm trains it."""
    name = f"pretrain/words-{arm.name}-{objective}-{style}-s{seed}"
    p = dict(t.params, output_dir=f"{{run:{name}}}")
    p["model_overrides"] = {**p.get("model_overrides", {}), **dict(arm.overrides)}
    p["steps"] = p["steps"] * arm.steps
    if p.get("warmup_steps"):
        p["warmup_steps"] = p["warmup_steps"] * arm.steps
    p["save_every"] = max(1, -(-p["steps"] // 10))
    pairs = data.params["num"]
    if arm.fraction < 1:  # the first shards hold the fraction's pairs, seen at the recipe's steps
        shards = -(-round(data.params["num"] * arm.fraction) // data.params["shard_size"])
        p["train_data"] = f"{{run:{data.name}}}/shards/{{000000..{shards - 1:06d}}}.tar"
        pairs = min(pairs, shards * data.params["shard_size"])
    labels = _labels(arm, objective, style, seed, pairs=pairs, fraction=arm.fraction, steps=p["steps"])
    return Run(name, "pretrain", p, deps=(data.name,), labels=labels, timeout_s=t.timeout_s * arm.steps)


def _reader(t: Run, name: str, pre: Run, **params) -> Run:
    """``t`` (a reference evaluation of one pretraining run) reading ``pre`` instead, as ``name``."""
    p = {**t.params, **params, "output_dir": f"{{run:{name}}}"}
    p["checkpoint"] = f"{{run:{pre.name}}}"
    labels = {**pre.labels, **({"part": t.labels["part"]} if "part" in t.labels else {})}  # the runner's estimate
    return Run(name, t.notebook, p, deps=(pre.name, "data/evalsets"), labels=labels, timeout_s=t.timeout_s)


def descriptive_runs(ref: dict, arm: Arm, objective: str, seed: int, scale: str) -> list[Run]:
    """Pretraining on descriptive captions, its probe, its binding part and its neighbour step."""
    pre = pretrain_run(ref[f"pretrain/{objective}-descriptive-s{seed}"], ref["data/descriptive"], arm, objective,
                       "descriptive", seed)
    tag = pre.name.split("/", 1)[1].removeprefix("words-")
    own = ref[f"compositionality/{objective}-descriptive-own-s{seed}"]
    sizes = {"own_items": OWN_ITEMS} if "own_items" in own.params else {}  # smoke: every item of its tiny sets
    binding = _reader(own, f"compositionality/words-{tag.removesuffix(f'-s{seed}')}-binding-s{seed}", pre,
                      suites=list(BINDING_SUITES), **sizes)
    step = Run(f"neighbours/{tag}", "neighbours",
               dict(checkpoint=f"{{run:{pre.name}}}", data_dir="{run:data/evalsets}", n_items=NEIGHBOUR_ITEMS[scale],
                    seed=0, binding=list(BINDING_SUITES) if objective == "mdc" else [],
                    attribute_min_count=own.params["attribute_min_count"], own_items=sizes.get("own_items")),
               deps=(pre.name, "data/evalsets"), labels=dict(pre.labels))
    return [pre, _reader(ref[f"probe/{objective}-descriptive-s{seed}"], f"probe/words-{tag}", pre), binding, step]


def t_interval_finetune() -> bool:
    """Whether the captioning notebook can fine-tune MDC at another t interval (``finetune_t_interval``)."""
    return "finetune_t_interval" in eval_cost.notebook_defaults("captioning")


def caption_runs(ref: dict, arm: Arm, pre: dict[str, Run], seed: int) -> list[Run]:
    """The arm's captioning runs on alt captions (pretrained; fine-tuned; the paper arm's MDC also fine-tuned at
    t ~ U[0, 1] where the notebook can) and their caption-word steps."""
    t = ref[f"captioning/alt-s{seed}"]
    stages = [(s, {}) for s in STAGES]
    if arm.name == "paper" and t_interval_finetune():
        stages.append(("finetuned-t0-1", {"finetune_t_interval": [0.0, 1.0], "arc_checkpoint": ""}))
    runs = []
    for stage, extra in stages:
        name = f"captioning/words-{arm.name}-alt-{stage}-s{seed}"
        p = {**t.params, "output_dir": f"{{run:{name}}}", "mdc_checkpoint": f"{{run:{pre['mdc'].name}}}",
             "arc_checkpoint": f"{{run:{pre['arc'].name}}}" if "arc" in pre else "",
             "finetune_steps": 0 if stage == "pretrained" else t.params["finetune_steps"] * FINETUNE_CAP}
        if not dict(arm.overrides).get("length_visible", True):
            p["lengths"] = [10, 15, 20, None]  # None: the model's own length
        p.update(extra)
        deps = tuple(d.removeprefix("{run:").removesuffix("}") for d in (p["mdc_checkpoint"], p["arc_checkpoint"])
                     if d) + ("data/evalsets",)
        labels = dict(arm=arm.name, style="alt", stage=stage, seed=seed)
        runs.append(Run(name, "captioning", p, deps=deps, labels=labels, timeout_s=t.timeout_s * FINETUNE_CAP))
        runs.append(Run(f"caption_words/{arm.name}-alt-{stage}-s{seed}", "caption_words",
                        dict(captioning=f"{{run:{name}}}", captions_json=t.params["captions_json"]),
                        deps=(name, "data/evalsets"), labels=dict(labels)))
    return runs


def study_runs(scale: str = "mini", plan: dict | None = None, with_optional: bool = False) -> list[Run]:
    """Every run of the study (the driver's steps included), seed by seed, in the order the selection reads."""
    plan = plan or read_seeds()
    chosen = arms(with_optional)
    most = max(seeds_of(plan, a.name, o) for a in chosen for o in a.objectives)
    ref = {r.name: r for r in registry.build(scale, most)}
    runs = [ref["data/descriptive"], ref["data/alt"], ref["data/evalsets"]]
    for seed in range(most):
        for arm in chosen:
            wanted = [o for o in arm.objectives if seed < seeds_of(plan, arm.name, o)]
            for objective in wanted:
                runs += descriptive_runs(ref, arm, objective, seed, scale)
            if "alt" in arm.styles and "mdc" in wanted:
                pre = {o: pretrain_run(ref[f"pretrain/{o}-alt-s{seed}"], ref["data/alt"], arm, o, "alt", seed)
                       for o in wanted}
                runs += list(pre.values()) + caption_runs(ref, arm, pre, seed)
    return runs


def step_digest() -> str:
    """sha256 of the steps' code (:data:`STEP_FUNCTIONS` and what they count with): part of a step's key."""
    code = "".join(inspect.getsource(f) for f in (*STEP_FUNCTIONS.values(), repetition))
    return hashlib.sha256(code.encode()).hexdigest()


def plan_keys(runs: list[Run]) -> dict[str, str]:
    """Every run's key: the runner's (:func:`reproduce.graph.keys`) and, for a step, the same hash over its code
    (:func:`step_digest`), parameters and its dependencies' keys."""
    key = keys([r for r in runs if r.notebook not in STEPS])
    digest = step_digest()
    for r in runs:
        if r.notebook in STEPS:
            payload = json.dumps([r.notebook, digest, r.params, [key[d] for d in r.deps]], sort_keys=True)
            key[r.name] = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return key


def neighbours_step(p: dict) -> dict:
    """Neighbour use (``mdc.eval.neighbours.neighbour_use``) of the checkpoint, and for MDC the binding diagnostic
    (:func:`mdc.eval.positive_controls.binding_accuracy`, own and another item's image) on the binding suites."""
    import mdc
    from mdc.eval.neighbours import neighbour_use
    from mdc.eval.positive_controls import binding_accuracy
    from mdc.eval.suites import load_suites, shuffled_images
    from mdc.factory import checkpoint_folder

    model = mdc.load(checkpoint_folder(p["checkpoint"])).eval()
    out = {"neighbours": neighbour_use(model, n_items=p["n_items"], seed=p["seed"]), "binding": {}}
    if p["binding"]:
        suites = load_suites(p["data_dir"], p["binding"], own_items=p["own_items"],
                             attribute_min_count=p["attribute_min_count"])
        transform = mdc.image_transform(model)
        out["binding"] = {name: binding_accuracy(model, transform, suite, shuffled_images(suite, p["seed"]))
                          for name, suite in suites.items()}
    return out


def caption_words_step(p: dict) -> dict:
    """Repetition (:func:`reproduce.studies.words_report.repetition`) of every caption set of a captioning run and
    of its test references."""
    with open(os.path.join(p["captioning"], "predictions.json")) as f:
        sets = json.load(f)
    with open(p["captions_json"]) as f:
        images = json.load(f)["images"]
    references = [s["raw"] for im in images if im.get("split") == "test" for s in im["sentences"]]
    return {"sets": {name: repetition(caps.values()) for name, caps in sets.items()},
            "references": repetition(references)}


STEP_FUNCTIONS = {"neighbours": neighbours_step, "caption_words": caption_words_step}


def reference_name(run: Run) -> str:
    """The reference run a study run is estimated from (the same seed; ledger.estimate falls back to others)."""
    kind, rest = run.name.split("/", 1)
    seed = run.labels.get("seed", 0)
    if kind == "captioning":
        return f"captioning/alt-s{seed}"
    if kind == "compositionality":
        return f"compositionality/{run.labels['objective']}-descriptive-own-s{seed}"
    if kind == "pretrain" and not run.params.get("model_overrides", {}).get("length_visible", True):
        return f"pretrain/{run.labels['objective']}-descriptive-s{seed}"  # the longest captions: the most positions
    if kind in ("pretrain", "probe"):
        return f"{kind}/{run.labels['objective']}-{run.labels['style']}-s{seed}"
    return run.name


def pretrain_factor(run: Run, record: dict, reference: str) -> tuple[float, str]:
    """A pretraining run's seconds against its reference record's: images (steps x batch), and with the caption
    length hidden (every caption padded to the context; its record the descriptive run's, whose captions are the
    longest) the context over the longest descriptive caption: the positions the decoder then reads. The reference
    runs on alt and descriptive captions (22 and 58 tokens at most) take about as long, so the decoder's positions
    are a small part of a step: this factor is an upper bound."""
    images = run.params["steps"] * run.params["batch_size"]
    then = record["params"]["steps"] * record["params"]["batch_size"]
    factor, notes = images / then, [f"images x {images / then:.2f}"]
    if not run.params.get("model_overrides", {}).get("length_visible", True):
        data = ledger.read(reference, "data/descriptive") or {}
        longest = (((data.get("results") or {}).get("results") or {}).get("lengths") or {}).get("max")
        if longest:
            tokens = model_config(run.params["model"]).context_length / (longest + 2)
            factor, notes = factor * tokens, notes + [f"tokens x {tokens:.2f} (context over SOT + {longest} + EOT)"]
    return factor, ", ".join(notes)


def caption_factor(run: Run, record: dict, reference: str) -> tuple[float, str]:
    """A captioning run's seconds against its reference record's: the record's fine-tuning (its steps taken x
    batch x the alt MDC pretraining run's seconds per image) taken out, the run's own put back (none pretrained;
    fine-tuned, the recorded steps times the cap's factor, for the models the run has)."""
    r = record["results"]["results"]
    pre = ledger.read(reference, f"pretrain/mdc-alt-s{record.get('seed') or 0}") or ledger.read(
        reference, "pretrain/mdc-alt-s0")
    per_image = ledger.run_seconds(pre) / (pre["params"]["steps"] * pre["params"]["batch_size"])
    tuned = {o: f["steps_taken"] * f["batch_size"] * per_image for o, f in (r.get("finetune") or {}).items() if f}
    seconds = ledger.run_seconds(record)
    rest = max(seconds - sum(tuned.values()), 0.1 * seconds)
    models = [o for o in ("mdc", "arc") if run.params.get(f"{o}_checkpoint")]
    new = rest * len(models) / 2 + (0 if not run.params["finetune_steps"] else
                                    sum(tuned.get(o, 0.0) * FINETUNE_CAP for o in models))
    return new / seconds, (f"fine-tuning {sum(tuned.values()):.0f} s of {seconds:.0f} s, now "
                           f"{new - rest * len(models) / 2:.0f} s ({'+'.join(models)})")


def estimate(run: Run, by_name: dict, records: str | None, reference: str | None, profile: str = "mini",
             ref_runs: dict | None = None) -> tuple[float, str]:
    """(seconds, where from) of ``run``: the study's own record of its stem, else its reference record scaled
    (module docstring), else the step's measured default or the profile's."""
    stem = run.name.rsplit("-s", 1)[0]
    if records and (ledger.read(records, run.name) or glob.glob(ledger.path(records, glob.escape(stem) + "-s*"))):
        return ledger.estimate(run, records, profile, by_name)
    if run.notebook in STEPS:
        key = "caption_words" if run.notebook == "caption_words" else run.labels.get("objective", "mdc")
        return STEP_SECONDS[key] * (1 if profile == "mini" else 0.1), "no record: the step's measured default"
    name = reference_name(run)
    record = ledger.read(reference, name) if reference else None
    if record is None and reference:
        found = glob.glob(ledger.path(reference, glob.escape(name.rsplit("-s", 1)[0]) + "-s*"))
        record = ledger.read(reference, os.path.relpath(sorted(found)[0], reference)[:-5]) if found else None
    if record is None:
        return ledger.estimate(run, None, profile, by_name)
    proxy = Run(record["run"], run.notebook, run.params, deps=run.deps, labels=run.labels)
    seconds, note = ledger.estimate(proxy, reference, profile, ref_runs or by_name)
    factor, why = {"pretrain": pretrain_factor, "captioning": caption_factor}.get(
        run.notebook, lambda *_: (1.0, ""))(run, record, reference)
    note = note if note.startswith(("the record of", "its record")) or not note else note.split(":")[0]
    return seconds * factor, f"reference {record['run']}" + (f" x {factor:.2f}: {why}" if why else "") + (
        f" ({note})" if note and "as recorded" not in note else "")


def select(runs: list[Run], seconds: dict[str, float], todo: set[str], budget_s: float,
           jobs: int = 2) -> tuple[list[str], list[str]]:
    """(runs to start, runs left) within ``budget_s`` of wall time at ``jobs`` runs at a time: the plan's runs
    that no run to do reads (its evaluations), in plan order, each with the runs to do it reads, while the chosen
    ones end within the budget in whatever order the runner starts them: W / jobs + (1 - 1 / jobs) L, with W
    their run-seconds and L their longest chain (a run and what it waits for), bounds every schedule that keeps
    ``jobs`` busy while a run is ready (Graham's list-scheduling bound). A pretraining run starts only with every
    reader it has to do, so no checkpoint is trained for nothing or trained again."""
    by_name = {r.name: r for r in runs}
    inputs = {d for r in runs if r.name in todo for d in r.deps}  # read by a run to do: chosen with its reader
    chosen: set[str] = set()
    used = longest = 0.0

    def closure(name: str) -> set[str]:  # name, the runs to do it reads, and a checkpoint's readers to do
        out, grow = set(), [name]
        while grow:
            x = grow.pop()
            if x in todo and x not in out and x not in chosen:
                out.add(x)
                grow += by_name[x].deps  # and a checkpoint's readers: the next part may run on another machine
                grow += [r.name for r in runs if x in r.deps and by_name[x].notebook == "pretrain"]
        return out

    def chain(name: str) -> float:
        return seconds[name] + max((chain(d) for d in by_name[name].deps if d in todo), default=0.0)

    for r in runs:
        if r.name not in todo or r.name in chosen or r.name in inputs:
            continue
        add = closure(r.name)
        cost, reach = sum(seconds[x] for x in add), max(longest, *(chain(x) for x in add))
        if (used + cost) / jobs + (1 - 1 / jobs) * reach <= budget_s:
            chosen |= add
            used, longest = used + cost, reach
    return [r.name for r in runs if r.name in chosen], [r.name for r in runs if r.name in todo - chosen]


def readers(runs: list[Run], name: str) -> list[str]:
    """Every run that reads ``name``, directly or through another, in plan order."""
    found, grew = {name}, True
    while grew:
        more = {r.name for r in runs if r.name not in found and found.intersection(r.deps)}
        found, grew = found | more, bool(more)
    return [r.name for r in runs if r.name in found - {name}]


def run_hours(runs: list[Run], seconds: dict[str, float]) -> dict[str, dict[str, float]]:
    """{arm: {style or "data": run-hours}} of ``runs``."""
    out: dict[str, dict[str, float]] = {}
    for r in runs:
        arm, style = r.labels.get("arm", "data"), r.labels.get("style", "data") if r.notebook != "data" else "data"
        by = out.setdefault(arm, {})
        by[style] = by.get(style, 0.0) + seconds[r.name] / 3600
    return out


def fits(total_hours: float, budget: float = BUDGET_RUN_HOURS) -> bool:
    return total_hours <= budget * (1 + 1e-9)


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}" if math.isfinite(seconds) else "?"
