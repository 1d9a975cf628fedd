"""Does MDC use its words? The words study on the study driver: its arms, runs and steps (the plan:
reproduce/studies/words/PLAN.md; the tables: :mod:`reproduce.studies.words.report`).

Per arm (:data:`ARMS`), objective and seed: ``pretrain/words-<arm>-<objective>-<style>-s<seed>``, the reference's
pretraining run with the arm's changes; on descriptive captions its probe, its binding part (the reference's ``own``
part on :data:`BINDING_SUITES`) and the step ``neighbours/...`` (neighbour use; for MDC the binding diagnostic); on
alt captions ``captioning/words-<arm>-alt-<stage>-s<seed>`` (MDC and ARC, pretrained or fine-tuned at
:data:`FINETUNE_CAP` times the reference's cap) and the step ``caption_words/...`` (repeated content words).
The seed plan (seeds.json) and reference_neighbours.json were made before the first record by the pinned commit's
``--plan-seeds`` and ``--reference-neighbours``.
"""
from __future__ import annotations

from reproduce.graph import Run
from reproduce.registry import run_name
from reproduce.studies.driver.study import Arm, Study, arm_runs, captioned, descriptive_models
from reproduce.studies.driver.steps import caption_words, repetition
from reproduce.studies.words import report

BINDING_SUITES = ("own_attribute", "own_sugarcrepe/swap_att", "own_sugarcrepe/swap_obj")
OWN_ITEMS = 60  # images a file: reproduce.power's Table 2 rule asks 59 (own_swap, MDC - ARC), 22 (own_attribute)
NEIGHBOUR_ITEMS = {"mini": 1000, "smoke": 16}
FINETUNE_CAP = 2  # times the reference's cap: its MDC stopped at 2,600-2,700 of 3,000 steps, near where its
#                   cosine schedule had all but stopped it
# seconds of a step with no record: neighbour use on 1,000 objects with the shipped mini weights, one thread on
# the 2-core machine at a load of about 5 (MDC 150 s and its binding diagnostic 3 s; ARC 21 s), rounded up
STEP_SECONDS = {"mdc": 180.0, "arc": 30.0, "caption_words": 15.0}
STAGES = ("pretrained", "finetuned")

ARMS = (  # PLAN.md's table says what each changes
    Arm("paper", ("mdc", "arc"), ("descriptive", "alt")),
    Arm("rotary", ("mdc", "arc"), ("descriptive", "alt"), (("positions", "rotary"),)),
    Arm("hidden", ("mdc",), ("descriptive", "alt"), (("length_visible", False),)),  # captions of their own length
    Arm("quarter", ("mdc", "arc"), ("descriptive",), fraction=0.25),  # a quarter of the pairs, four times
    Arm("x2", ("mdc", "arc"), ("descriptive",), steps=2),
    Arm("x4", ("mdc", "arc"), ("descriptive",), steps=4, optional=True),
)


def descriptive_runs(ref: dict, arm: Arm, objective: str, seed: int, scale: str) -> list[Run]:
    """Pretraining on descriptive captions, its probe, its binding part and its neighbour step."""
    pre, probe, binding = descriptive_models("words", ref, arm, objective, seed, BINDING_SUITES, OWN_ITEMS)
    step = Run(f"neighbours/{probe.name.split('/', 1)[1].removeprefix('words-')}", "neighbours",
               dict(checkpoint=f"{{run:{pre.name}}}", data_dir="{run:data/evalsets}", n_items=NEIGHBOUR_ITEMS[scale],
                    seed=0, binding=list(BINDING_SUITES) if objective == "mdc" else [],
                    **{k: binding.params.get(k) for k in ("attribute_min_count", "own_items")}),
               deps=(pre.name, "data/evalsets"), labels=dict(pre.labels))
    return [pre, probe, binding, step]


def caption_runs(ref: dict, arm: Arm, pre: dict[str, Run], seed: int) -> list[Run]:
    """The arm's captioning runs on alt captions (pretrained; fine-tuned to :data:`FINETUNE_CAP` times the
    reference's cap; the paper arm's MDC also fine-tuned at t ~ U[0, 1]) and their caption-word steps."""
    own = {} if dict(arm.overrides).get("length_visible", True) else {"lengths": [10, 15, 20, None]}  # None: its own
    stages = [(s, own) for s in STAGES]
    if arm.name == "paper":  # its MDC also fine-tuned at t ~ U[0, 1], alone
        stages.append(("finetuned-t0-1", {"finetune_t_interval": [0.0, 1.0], "arc_checkpoint": ""}))
    t = ref[run_name("captioning", seed, "alt")]
    return [r for stage, extra in stages for r in captioned("words", t, arm, pre, stage, FINETUNE_CAP, **extra)]


study_runs = arm_runs("words", ARMS, descriptive_runs, caption_runs)  # every run, seed by seed


def neighbours_step(p: dict) -> dict:
    """Neighbour use (``mdc.eval.neighbours.neighbour_use``) of the checkpoint, and for MDC the binding diagnostic
    (:func:`mdc.eval.positive_controls.binding_accuracy`, own and another item's image) on the binding suites."""
    import mdc
    from mdc.eval.neighbours import format_neighbour_use, neighbour_use
    from mdc.eval.positive_controls import binding_accuracy
    from mdc.eval.suites import load_suites, shuffled_images
    from mdc.factory import checkpoint_folder

    model = mdc.load(checkpoint_folder(p["checkpoint"])).eval()
    out = {"neighbours": neighbour_use(model, n_items=p["n_items"], seed=p["seed"]), "binding": {}}
    print(format_neighbour_use(out["neighbours"]))  # the instrument's own table, in the part's log
    if p["binding"]:
        suites = load_suites(p["data_dir"], p["binding"], own_items=p["own_items"],
                             attribute_min_count=p["attribute_min_count"])
        transform = mdc.image_transform(model)
        out["binding"] = {name: binding_accuracy(model, transform, suite, shuffled_images(suite, p["seed"]))
                          for name, suite in suites.items()}
    return out


STUDY = Study(
    "words", ARMS, study_runs, steps={"neighbours": neighbours_step, "caption_words": caption_words},
    step_code=(repetition,),
    step_seconds=STEP_SECONDS,
    keep=lambda run: not run.labels.get("seed") and run.labels.get("style") == "descriptive",
    report=report.build, budget_run_hours=30.0)
