"""A study as data: :class:`Study` and its :class:`Arm` s. Its runs are the reference run's (``reproduce/registry.py``)
renamed and changed only where an arm says (:func:`pretrain_run`, :func:`reader`), plus *steps*: evaluations with no
notebook, a function of their parameters each, keyed by their code as a run is by its notebook's (:func:`plan_keys`).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Callable

from reproduce import registry
from reproduce.graph import ROOT, Run, keys
from reproduce.registry import run_name
from reproduce.studies.driver.compute import step_digest

REFERENCE = os.path.join(ROOT, "reproduce", "records", "mini")  # the reference run's ledger: estimates and seeds


@dataclass(frozen=True)
class Arm:
    """One arm: the objectives and caption styles it trains, its ModelConfig overrides and notebook parameters
    (pairs), its steps as a multiple of the recipe's (the warm-up scaled alike), its share of the pairs. A run
    trained in pieces has an arm a piece: each ends at ``stop`` (a multiple of the recipe's steps, on the schedule
    of ``steps``) and continues the run of the arm it comes ``after``."""

    name: str
    objectives: tuple[str, ...]
    styles: tuple[str, ...]
    overrides: tuple[tuple[str, object], ...] = ()
    steps: float = 1
    params: tuple[tuple[str, object], ...] = ()  # pretraining notebook parameters (e.g. t_interval)
    fraction: float = 1.0
    optional: bool = False  # built only when asked (--with-optional)
    stop: float | None = None  # where this piece of the run ends (None: the schedule's end)
    after: "Arm | None" = None  # the piece this one continues (from its checkpoint at after.stop)


@dataclass(frozen=True)
class Study:
    """A study as the driver runs it; its folder ``reproduce/studies/<name>/`` holds the plan (PLAN.md, pin.json,
    seeds.json), the ledger ``records/``, seed 0's float16 ``weights/`` and the report."""

    name: str  # the folder and the module: python -m reproduce.studies.<name>
    arms: tuple[Arm, ...]
    runs: Callable[[str, dict, bool], list[Run]]  # (scale, seed plan, with optional arms) -> every run, in plan order
    steps: dict[str, Callable[[dict], dict]] = field(default_factory=dict)  # step kind -> its function
    step_code: tuple[Callable, ...] = ()  # what the steps count with: hashed into their keys
    step_seconds: dict = field(default_factory=dict)  # a step's seconds at mini with no record: by kind or objective
    keep: Callable[[Run], bool] = lambda run: False  # the pretraining runs kept in float16 once recorded
    report: Callable[[str, str], str] | None = None  # (records, folder) -> the tables' text, written in folder
    plan_seeds: Callable | None = None  # (args) -> its table: seeds.json (args.seeds) from the reference, by power
    budget_run_hours: float = 30.0

    def step_estimate(self, run: Run) -> float:
        """A step's seconds at mini with no record: its kind's in :attr:`step_seconds`, else its model's objective's,
        else a minute."""
        return self.step_seconds.get(run.notebook, self.step_seconds.get(run.labels.get("objective"), 60.0))

    def path(self, *parts: str) -> str:
        return os.path.join(ROOT, "reproduce", "studies", self.name, *parts)


def records_of(name: str, studies: str = os.path.join(ROOT, "reproduce", "studies")) -> str:
    """The ledger of the study ``name`` among ``studies``' folders: how one study reads another's records (with
    reproduce.running.ledger), never through its code."""
    return os.path.join(studies, name, "records")


def read_seeds(path: str) -> dict:
    """The seed plan: ``{"default": 3, "seeds": {"<objective>" or "<arm>-<objective>": n}}`` (default 3 each)."""
    if not os.path.isfile(path):
        return {"default": 3, "seeds": {}}
    with open(path) as f:
        plan = json.load(f)
    return {"default": int(plan.get("default", 3)), "seeds": dict(plan.get("seeds", {}))}


def seeds_of(plan: dict, arm: str, objective: str) -> int:
    s = plan["seeds"]
    return int(s.get(f"{arm}-{objective}", s.get(objective, plan["default"])))


def pretrain_run(study: str, t: Run, data: Run, arm: Arm, objective: str, style: str, seed: int) -> Run:
    """``t`` (the reference's ``pretrain/<objective>-<style>-s<seed>``) as the arm trains it: its overrides, its
    steps and warm-up scaled (cosine to the end), its fraction of the pairs (the first shards); a piece of a run
    stops at its ``stop`` and continues its ``after`` piece's checkpoint."""
    name = f"pretrain/{study}-{arm.name}-{objective}-{style}-s{seed}"
    deps = (data.name,)
    p = dict(t.params, output_dir=f"{{run:{name}}}")
    p["model_overrides"] = {**p.get("model_overrides", {}), **dict(arm.overrides)}
    p.update(dict(arm.params))
    p["steps"] = round(p["steps"] * arm.steps)
    if p.get("warmup_steps"):
        p["warmup_steps"] = round(p["warmup_steps"] * arm.steps)
    p["save_every"] = max(1, -(-p["steps"] // 10))
    pairs = data.params["num"]
    if arm.fraction < 1:
        shards = -(-round(data.params["num"] * arm.fraction) // data.params["shard_size"])
        p["train_data"] = f"{{run:{data.name}}}/shards/{{000000..{shards - 1:06d}}}.tar"
        pairs = min(pairs, shards * data.params["shard_size"])
    labels = dict(arm=arm.name, method=objective.upper(), objective=objective, style=style, seed=seed, pairs=pairs,
                  fraction=arm.fraction, steps=p["steps"])
    if arm.stop is not None:
        p["stop_at"] = round(t.params["steps"] * arm.stop)
        labels.update(stop_at=p["stop_at"], from_step=round(t.params["steps"] * arm.after.stop) if arm.after else 0)
    if arm.after:
        before = f"pretrain/{study}-{arm.after.name}-{objective}-{style}-s{seed}"
        p["resume_from"], deps = f"{{run:{before}}}", deps + (before,)
    return Run(name, "pretrain", p, deps=deps, labels=labels, timeout_s=t.timeout_s * max(1, arm.steps))


def reader(t: Run, name: str, pre: Run, **params) -> Run:
    """``t`` (a reference evaluation of one pretraining run) reading ``pre`` instead, as ``name``."""
    p = {**t.params, **params, "output_dir": f"{{run:{name}}}", "checkpoint": f"{{run:{pre.name}}}"}
    labels = {**pre.labels, **({"part": t.labels["part"]} if "part" in t.labels else {})}  # the runner's estimate
    return Run(name, t.notebook, p, deps=(pre.name, "data/evalsets"), labels=labels, timeout_s=t.timeout_s)


def descriptive_models(study: str, ref: dict, arm: Arm, objective: str, seed: int, suites: tuple[str, ...],
                       items: int) -> list[Run]:
    """The arm's pretraining on descriptive captions (:func:`pretrain_run`), its probe and its binding part (the
    reference's ``own`` part on ``suites``, ``items`` a file)."""
    pre = pretrain_run(study, ref[run_name("pretrain", seed, objective, "descriptive")], ref["data/descriptive"], arm,
                       objective, "descriptive", seed)
    tag = pre.name.split("/", 1)[1][len(study) + 1:]
    own = ref[run_name("compositionality", seed, objective, "descriptive", "own")]
    sizes = {"own_items": items} if "own_items" in own.params else {}  # smoke: every item of its tiny sets
    return [pre, reader(ref[run_name("probe", seed, objective, "descriptive")], f"probe/{study}-{tag}", pre),
            reader(own, f"compositionality/{study}-{tag.removesuffix(f'-s{seed}')}-binding-s{seed}", pre,
                   suites=list(suites), **sizes)]


def repetition_run(study: str, pre: Run, n_scenes: int) -> Run:
    """The step ``repetition/<pre's tag>``: ``pre``'s descriptive captions at each scene's true length on
    ``n_scenes`` fresh scenes (:func:`~reproduce.studies.driver.steps.repetition_step`)."""
    return Run(f"repetition/{pre.name.split('/', 1)[1].removeprefix(f'{study}-')}", "repetition",
               dict(checkpoint=f"{{run:{pre.name}}}", n_scenes=n_scenes, seed=0), deps=(pre.name,),
               labels=dict(pre.labels))


def captioned(study: str, t: Run, arm: Arm, pre: dict[str, Run], stage: str, cap: int = 1, **params) -> list[Run]:
    """The reference's captioning run ``t`` of the arm's alt models ``pre`` (MDC, and ARC where given) at ``stage``
    (``pretrained``: not fine-tuned; else fine-tuned to ``cap`` times its cap), ``params`` changed, and its
    caption-word step."""
    seed = t.labels["seed"]
    name = f"captioning/{study}-{arm.name}-alt-{stage}-s{seed}"
    p = {**t.params, "output_dir": f"{{run:{name}}}", "mdc_checkpoint": f"{{run:{pre['mdc'].name}}}",
         "arc_checkpoint": f"{{run:{pre['arc'].name}}}" if "arc" in pre else "",
         "finetune_steps": 0 if stage == "pretrained" else t.params["finetune_steps"] * cap, **params}
    deps = tuple(d[len("{run:"):-1] for d in (p["mdc_checkpoint"], p["arc_checkpoint"]) if d) + ("data/evalsets",)
    labels = dict(arm=arm.name, style="alt", stage=stage, seed=seed)
    return [Run(name, "captioning", p, deps=deps, labels=labels, timeout_s=t.timeout_s * cap),
            Run(f"caption_words/{arm.name}-alt-{stage}-s{seed}", "caption_words",
                dict(captioning=f"{{run:{name}}}", captions_json=t.params["captions_json"]),
                deps=(name, "data/evalsets"), labels=dict(labels))]


def arm_runs(study: str, arms: tuple[Arm, ...], descriptive: Callable, captions: Callable) -> Callable:
    """A study's ``Study.runs`` from its arms: the reference's data runs its arms train on and its evaluation sets,
    then seed by seed (the order a part's selection reads), per arm, each objective the seed plan gives that seed
    (:func:`seeds_of`) on descriptive captions, ``descriptive(ref, arm, objective, seed, scale)``, and on alt
    captions, where MDC is among them, their pretraining runs and ``captions(ref, arm, {objective: run}, seed)``;
    ``ref``: the reference's runs by name (``reproduce.registry.build``)."""
    def runs(scale: str = "mini", plan: dict | None = None, with_optional: bool = False) -> list[Run]:
        plan = plan or {"default": 3, "seeds": {}}
        chosen = [a for a in arms if with_optional or not a.optional]
        most = max(seeds_of(plan, a.name, o) for a in chosen for o in a.objectives)
        ref = {r.name: r for r in registry.build(scale, most)}
        out = [ref[f"data/{s}"] for s in ("descriptive", "alt") if any(s in a.styles for a in chosen)]
        out.append(ref["data/evalsets"])
        for seed in range(most):
            for arm in chosen:
                wanted = [o for o in arm.objectives if seed < seeds_of(plan, arm.name, o)]
                for objective in wanted if "descriptive" in arm.styles else ():
                    out += descriptive(ref, arm, objective, seed, scale)
                if "alt" in arm.styles and "mdc" in wanted:
                    pre = {o: pretrain_run(study, ref[run_name("pretrain", seed, o, "alt")], ref["data/alt"], arm, o,
                                           "alt", seed) for o in wanted}
                    out += [*pre.values(), *captions(ref, arm, pre, seed)]
        return out

    return runs


def plan_keys(study: Study, runs: list[Run], pin: dict | None = None) -> dict[str, str]:
    """Every run's key: the runner's (:func:`reproduce.graph.keys`) and, for a step, the same hash over its code
    (:func:`~reproduce.studies.driver.compute.step_digest`), parameters and its dependencies' keys; the code's
    digests the ``pin``'s (:mod:`~reproduce.studies.driver.pin`) where given, else this tree's."""
    key = keys([r for r in runs if r.notebook not in study.steps], pin and pin["notebooks"])
    digest = pin["steps"] if pin else step_digest(study)
    for r in runs:
        if r.notebook in study.steps:
            payload = json.dumps([r.notebook, digest, r.params, [key[d] for d in r.deps]], sort_keys=True)
            key[r.name] = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return key


def reads_checkpoint(run: Run) -> bool:
    """A step that reads a pretraining run's checkpoint (its first dependency), not a run folder's files."""
    return "checkpoint" in run.params


def with_deps(runs: list[Run], by_name: dict) -> list[Run]:
    """``runs`` and every run they read (recorded or not): the runner takes a whole graph."""
    names: dict[str, None] = {}

    def add(r):
        for d in r.deps:
            add(by_name[d])
        names.setdefault(r.name)

    for r in runs:
        add(r)
    return [by_name[n] for n in names]


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
