"""Learnability of the synthetic world on a CPU, the study behind the `mini` profile: its candidates and rules,
and the decisions the rules take from its records (``reproduce/studies/learnability/``, ``learnability.md``).

    python -m reproduce.studies.learnability    # the table of its runs and both decisions, from the records

Candidates (:data:`CONFIGS`): ModelConfig overrides of "tiny", a training recipe and the caption style.
:data:`RULE` picks the `mini` configuration from the objectives' runs (``runs.jsonl``, ``timing.jsonl``):
the cheapest configuration in which MDC, ARC and CLIP each beat their random-init encoder by at least
``min_gap`` points on the mean of the four informative tasks, with a seed standard deviation of that gap
below ``max_std``, within ``max_minutes`` of wall time per pretraining run on 2 CPU cores.
:data:`CEILING_RULE` picks the encoder and the world's rendering from the supervised ceiling
(``ceiling.jsonl``). Both were fixed before any method was compared. The records are JSON lines, one
row per run (synthetic shards -> ``mdc.train.train`` -> ``mdc.eval.probe`` beside the same architecture at its
random initialisation; the supervised ceiling; timing passes). The study is finished and ``decision.json`` and
``ceiling_decision.json`` recompute from its records; the study's own driver that made them
(``learnability_runs.py`` and its command line) was retired after commit ce8bb91, where it can be read and run.
"""
from __future__ import annotations

import json
import os

import numpy as np

# Fixed before the first run was read. max_minutes: `mini` trains about 18 models per seed
# (Tables 1, 4, 5, Figs. 4, 5) and must fit in about an hour on 2 cores with its evaluations.
# The rule is applied to descriptive captions: complete captions pose the question "does the world
# teach visual features at this budget"; alt captions (partial by design) are then run at the chosen
# point. Fallback, fixed after five single-seed runs and before the remaining candidates were read,
# should no candidate pass: the candidate within max_minutes with the largest gap of its weakest
# objective (max over candidates of min over MDC/ARC/CLIP) -- still method-agnostic.
RULE = {"tasks": ("object", "shape", "texture", "count"), "min_gap": 20.0, "max_std": 1.5, "max_minutes": 3.0,
        "style": "descriptive", "fallback": "max-min gap over objectives within max_minutes"}
TASKS = ("object", "shape", "texture", "count", "relation", "shape_texture", "colour", "background")

# Candidate configurations: ModelConfig overrides of "tiny", the training recipe and the data.
BASE = dict(vision_width=128, vision_layers=4, vision_heads=4, text_width=128, text_layers=4, text_heads=4,
            embed_dim=128)
CONFIGS: dict[str, dict] = {
    # today's tiny at its measured operating point (descriptive captions, 400 x 64)
    "t64": dict(model=dict(BASE, image_size=64, patch_size=8), style="descriptive", steps=400, batch=64, lr=5e-4,
                warmup=20),
    # resolution and patch: the cost lever
    "s32": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=1000, batch=64, lr=1e-3,
                warmup=50),
    "s32a": dict(model=dict(BASE, image_size=32, patch_size=8), style="alt", steps=1000, batch=64, lr=1e-3,
                 warmup=50),
    "s48": dict(model=dict(BASE, image_size=48, patch_size=8), style="descriptive", steps=650, batch=64, lr=1e-3,
                warmup=30),
    # the same 16 image tokens as s32, each patch seeing 4x the pixels (textures resolved)
    "s64p16": dict(model=dict(BASE, image_size=64, patch_size=16), style="descriptive", steps=1000, batch=64,
                   lr=1e-3, warmup=50),
    "s64p16a": dict(model=dict(BASE, image_size=64, patch_size=16), style="alt", steps=1000, batch=64, lr=1e-3,
                    warmup=50),
    # the optimisation: a higher learning rate; twice the updates at the same pairs (smaller batches)
    "s32lr": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=1000, batch=64, lr=3e-3,
                  warmup=100),
    "s32b32": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=2000, batch=32,
                   lr=1e-3, warmup=100),
    # the cost of descriptive captions is mostly the text decoder (4 layers: ~75% of a step): a deeper
    # vision tower and a 2-layer decoder, for about the cost of s32
    "s32v6t2": dict(model=dict(BASE, image_size=32, patch_size=8, vision_layers=6, text_layers=2),
                    style="descriptive", steps=1400, batch=64, lr=2e-3, warmup=100),
    # within the rule's 3 minutes: s32lr's model and recipe cut to the steps that fit (the timing pass
    # measured s32lr at 0.27 / 0.31 / 0.31 s per step for MDC / ARC / CLIP on 2 cores; added after it,
    # when no measured candidate fitted, before this one was run)
    "s32q": dict(model=dict(BASE, image_size=32, patch_size=8), style="descriptive", steps=560, batch=64, lr=3e-3,
                 warmup=56),
    # a convolutional stem in place of the patch projection (issue 19), s32q's recipe: at 32 px (16 tokens),
    # at 64 px (64 tokens) and at 64 px ending at 16 tokens (four convolutions)
    "c32": dict(model=dict(BASE, image_size=32, patch_size=8, vision_stem="conv"), style="descriptive", steps=560,
                batch=64, lr=3e-3, warmup=56),
    "c64": dict(model=dict(BASE, image_size=64, patch_size=8, vision_stem="conv"), style="descriptive", steps=560,
                batch=64, lr=3e-3, warmup=56),
    "c64p16": dict(model=dict(BASE, image_size=64, patch_size=16, vision_stem="conv"), style="descriptive",
                   steps=560, batch=64, lr=3e-3, warmup=56),
    # c64 with 4x the steps (lr 1e-3, chosen by the ceiling's training loss): what a 4x budget buys
    "c64x4": dict(model=dict(BASE, image_size=64, patch_size=8, vision_stem="conv"), style="descriptive", steps=2240,
                  batch=64, lr=1e-3, warmup=224),
    # finer patches at 32 px: 64 tokens
    "s32p4": dict(model=dict(BASE, image_size=32, patch_size=4), style="descriptive", steps=1000, batch=64, lr=1e-3,
                  warmup=50),
}


# The supervised ceiling: the encoder trained on the probe's own labels (a linear head per label on its
# GAP features), with the objectives' budget, data stream and probe -- what this encoder and world allow.
# Fixed before the first ceiling was read (issue 19): the encoder and the world's rendering are chosen by
# the ceiling alone -- the cheapest candidate (seconds per step of its slowest objective, timing pass)
# whose ceiling reaches `target` points on the rule's tasks; if none does, the highest ceiling.
CEILING_RULE = {"tasks": RULE["tasks"], "target": 50.0, "budget": "the candidate's own recipe (steps, batch, lr)",
                "choice": "cheapest candidate with ceiling >= target, else the highest ceiling"}


def read_rows(path: str) -> list[dict]:
    """The rows of a JSON-lines record; none if it does not exist."""
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def step_seconds(out: str) -> dict[str, float]:
    """{config: seconds per step of its slowest objective} from the timing passes; a configuration timed
    in several settings (workers, torch.compile) costs what its fastest setting costs."""
    timings: dict[str, float] = {}
    for t in read_rows(os.path.join(out, "timing.jsonl")):
        slowest = max(t.get(o, 0.0) for o in ("mdc", "arc", "clip"))
        timings[t["config"]] = min(timings.get(t["config"], slowest), slowest)
    return timings


def summary(out: str) -> str:
    """Markdown table: per config and objective, mean ± std over seeds of the gap and the times."""
    rows = read_rows(os.path.join(out, "runs.jsonl"))
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["config"], r["objective"]), []).append(r)
    lines = ["| config | objective | seeds | gap mean4 | " + " | ".join(f"gap {t}" for t in TASKS)
             + " | wall min | CPU min |", "|" + "---|" * (6 + len(TASKS))]
    for (name, objective), rs in sorted(groups.items()):
        def ms(values):
            return f"{np.mean(values):.1f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.1f}"
        lines.append(f"| {name} | {objective} | {len(rs)} | {ms([r['gap_mean4'] for r in rs])} | "
                     + " | ".join(ms([r["gap"][t] for r in rs]) for t in TASKS)
                     + f" | {np.mean([r['wall_s'] for r in rs]) / 60:.1f} | {np.mean([r['cpu_s'] for r in rs]) / 60:.1f} |")
    return "\n".join(lines)


def recipe(config: str, lr: float | None = None) -> dict:
    """The recipe of ``config``, ``NAME`` or a row's ``NAME@LR`` (NAME's recipe at another learning
    rate), with ``lr`` in place of its learning rate if given."""
    name, _, at = config.partition("@")
    lr = lr if lr is not None else float(at) if at else None
    return CONFIGS[name] if lr is None else {**CONFIGS[name], "lr": lr}


def _step_seconds(name: str, timings: dict) -> float | None:
    """A configuration's measured seconds per step (slowest objective), or those of a timed one with
    the same model, caption style and batch (the step is the same; only lr or the step count differ)."""
    if name in timings:
        return timings[name]
    cfg = recipe(name)
    same = [n for n in timings if n in CONFIGS and all(CONFIGS[n][k] == cfg[k] for k in ("model", "style", "batch"))]
    return timings[same[0]] if same else None


def decide(out: str) -> dict:
    """Apply ``RULE`` to the runs so far: per configuration, whether each objective passes, and the
    cheapest configuration that passes for all three (minutes from the idle-machine timing pass)."""
    rows = read_rows(os.path.join(out, "runs.jsonl"))
    timings = step_seconds(out)
    verdict = {}
    for name in dict.fromkeys(r["config"] for r in rows):
        per = {}
        for objective in ("mdc", "arc", "clip"):
            gaps = [r["gap_mean4"] for r in rows if r["config"] == name and r["objective"] == objective]
            std = float(np.std(gaps, ddof=1)) if len(gaps) > 1 else None
            per[objective] = {"seeds": len(gaps), "gap": float(np.mean(gaps)) if gaps else None, "std": std,
                              "passes": bool(gaps) and bool(np.mean(gaps) >= RULE["min_gap"])
                              and (std is not None and std < RULE["max_std"])}
        seconds = _step_seconds(name, timings)
        minutes = seconds * recipe(name)["steps"] / 60 if seconds is not None else None
        verdict[name] = {"objectives": per, "minutes": minutes,
                         "passes": all(v["passes"] for v in per.values()) and minutes is not None
                         and minutes <= RULE["max_minutes"]}
    passing = [n for n, v in verdict.items() if v["passes"]]
    if passing:
        return {"rule": RULE, "configs": verdict, "choice": min(passing, key=lambda n: verdict[n]["minutes"]),
                "by": "rule"}
    affordable = [n for n, v in verdict.items() if v["minutes"] is not None and v["minutes"] <= RULE["max_minutes"]
                  and recipe(n)["style"] == RULE["style"]
                  and all(o["gap"] is not None for o in v["objectives"].values())]
    weakest = {n: min(o["gap"] for o in verdict[n]["objectives"].values()) for n in affordable}
    return {"rule": RULE, "configs": verdict, "choice": max(weakest, key=weakest.get) if weakest else None,
            "by": "fallback", "weakest_gap": weakest}


def decide_ceiling(out: str) -> dict:
    """Apply ``CEILING_RULE`` to ``ceiling.jsonl``: each candidate at the learning rate with the lower
    final supervised loss, then the cheapest reaching the target (seconds per step from the timing pass),
    else the highest ceiling."""
    rows = read_rows(os.path.join(out, "ceiling.jsonl"))
    best: dict[str, dict] = {}
    for r in rows:
        if r["config"] not in best or r["final_loss"] < best[r["config"]]["final_loss"]:
            best[r["config"]] = r
    candidates = {n: {"lr": r["recipe"]["lr"], "final_loss": r["final_loss"], "ceiling": r["gap_mean4"]}
                  for n, r in best.items()}
    reaching = [n for n, c in candidates.items() if c["ceiling"] >= CEILING_RULE["target"]]
    timings = step_seconds(out)
    if reaching and all(n in timings for n in reaching):
        return {"rule": CEILING_RULE, "candidates": candidates, "choice": min(reaching, key=timings.get),
                "by": "target"}
    if reaching:
        raise ValueError(f"{reaching} reach the target but have no timing pass: run --timing first")
    return {"rule": CEILING_RULE, "candidates": candidates,
            "choice": max(candidates, key=lambda n: candidates[n]["ceiling"]) if candidates else None,
            "by": "highest ceiling (none reaches the target)"}


FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "learnability")  # the committed records


if __name__ == "__main__":
    print(summary(FOLDER))
    for name, decision in (("decision.json", decide(FOLDER)), ("ceiling_decision.json", decide_ceiling(FOLDER))):
        print(f"\n{name}: {decision['choice']} (by {decision['by']})")
