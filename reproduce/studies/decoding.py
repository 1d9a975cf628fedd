"""Which decoder should MDC caption with? The pre-registered decoding study on kept weights (issue 102).

Its plan, fixed before any caption was read, is ``reproduce/studies/decoding/PLAN.md``: the models, the splits,
the decoders, the lengths and the rule. ``--split validation`` measures every decoder and writes the choice
(``choice.json``); ``--split test`` refuses to run without it and reports every decoder, the chosen one's paired
difference to the paper's, and the controls. Results go to ``decoding/<split>.json`` and ``<split>.md``.

    OMP_NUM_THREADS=1 python -m reproduce.studies.decoding --split validation [--scenes 300]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from torch.utils.data import TensorDataset

import mdc
from mdc.eval.metrics import evaluate_captions
from mdc.eval.neighbours import paired_interval
from mdc.eval.probe import extract_features
from mdc.eval.repetition import make_scenes, scene_captions, view_measures
from mdc.world.streams import STREAM_REPETITION, stream_rng
from mdc.world.text import descriptive_plan, render_descriptive

HERE = os.path.dirname(os.path.abspath(__file__))
MDCS = {"mdc-x1": ("words", "words-paper-mdc-descriptive-s0", "arc-x1"),
        "mdc-x2": ("ladder", "ladder-x2-mdc-descriptive-s0", "arc-x2"),
        "mdc-x4": ("ladder", "ladder-x4-mdc-descriptive-s0", "arc-x4"),
        "mdc-rotary-x4": ("ladder", "ladder-rotary-x4-mdc-descriptive-s0", "arc-x4"),
        "mdc-hidden-x1": ("words", "words-hidden-mdc-descriptive-s0", "arc-x1")}  # (study, run, ARC beside)
ARCS = {"arc-x1": ("words", "words-paper-arc-descriptive-s0"), "arc-x2": ("ladder", "ladder-x2-arc-descriptive-s0"),
        "arc-x4": ("ladder", "ladder-x4-arc-descriptive-s0")}
RULE_MODELS = ("mdc-x1", "mdc-x2", "mdc-x4", "mdc-rotary-x4")  # the choice averages over these (PLAN.md)
DECODERS = {"confidence": {}, "margin": {"decoder": "margin"}, "ancestral": {"decoder": "ancestral"},
            "semi-autoregressive": {"decoder": "semi-autoregressive"},
            "blocks-2": {"decoder": "semi-autoregressive", "blocks": 2}, "remask": {"decoder": "remask"},
            "remask-16": {"decoder": "remask", "refine": 16}}  # in the rule's tie order: the paper's first
ARC_BEAMS = {"beam6": 6, "greedy": 1}
SPLITS = {"validation": 1, "test": 2}  # the world seed of each split's scenes
TIE = 0.005  # CIDEr-D (a fraction) within which the first decoder in order wins: 0.5 points
VIEWS = {"own": 0, "other_image": 1}  # the image of scene i + shift
HEAD = {"seed": 3, "scenes": 1000, "ridge": 1.0}  # the length head's training scenes and its L2 penalty


def kept(study: str, run: str):
    return mdc.load(os.path.join(HERE, study, "weights", "pretrain", run)).eval()


def second_rendering(seed: int, scenes: list[dict]) -> list[str]:
    """Each scene's caption rendered again from another draw of its plan (the ceiling); ``scenes`` are
    :func:`make_scenes`' with none dropped, so scene i is stream item i."""
    return [render_descriptive(descriptive_plan(scene, stream_rng(seed, STREAM_REPETITION + 2, i)))
            for i, scene in enumerate(scenes)]


def pooled(model, images) -> np.ndarray:
    """``model``'s pooled image features [S, D], as the probes extract them."""
    return extract_features(model, TensorDataset(images, torch.zeros(len(images))))[0].double().numpy()


def length_head(model):
    """A ridge regression from ``model``'s pooled image features (standardised) to the true caption length, fit on
    :data:`HEAD`'s scenes (their own world seed: none is a split's); returns images -> lengths (rounded, at least
    one token, at most the context's)."""
    tok = model.tokenizer
    train = make_scenes(tok, HEAD["scenes"], HEAD["seed"], model.config.image_size, tok.context_length)
    x = pooled(model, train["images"])
    mean, std = x.mean(0), x.std(0) + 1e-8
    z = np.c_[(x - mean) / std, np.ones(len(x))]  # [N, D + 1]
    w = np.linalg.solve(z.T @ z + HEAD["ridge"] * np.eye(z.shape[1]), z.T @ np.array(train["lengths"], float))

    def predict(images) -> list[int]:
        y = np.c_[(pooled(model, images) - mean) / std, np.ones(len(images))] @ w
        return [int(v) for v in np.clip(np.rint(y), 1, tok.context_length - 2)]
    return predict


def caption_sets(mdcs: dict, arcs: dict, data: dict, seed: int, decoders: dict = DECODERS) -> dict:
    """{(model, length, decoder, view): (captions [S], token counts [S], the lengths asked [S])}: every MDC with
    every decoder and ARC with each beam, at the true length, the length its ARC writes (beam 6, its own [EOT]; at
    least one token), its length head's (:func:`length_head`) and (a hidden-length MDC) its own (None)."""
    images, true, began = data["images"], data["lengths"], time.monotonic()
    arc_length = {a: [max(1, n) for n in scene_captions(m, images, [None] * len(true))[1]] for a, m in arcs.items()}
    out = {}
    for name, (model, arc) in mdcs.items():
        lengths = {"true": true, "arc": arc_length[arc], "head": length_head(model)(images)} | (
            {} if model.config.length_visible else {"own": [None] * len(true)})
        for length, per_scene in lengths.items():
            for d, decoding in decoders.items():
                for view, shift in VIEWS.items():
                    out[name, length, d, view] = (*scene_captions(model, images, per_scene, shift=shift, seed=seed,
                                                                  **decoding), per_scene)
                print(f"decoding: {name}, {length} length, {d}: {time.monotonic() - began:.0f} s", flush=True)
    for a, model in arcs.items():
        for length, per_scene in {"true": true, "arc": arc_length[a]}.items():
            for beam, size in ARC_BEAMS.items():
                for view, shift in VIEWS.items():
                    out[a, length, beam, view] = (*scene_captions(model, images, per_scene, shift=shift,
                                                                  beam_size=size), per_scene)
    return out


def length_errors(sets: dict, true: list[int]) -> dict:
    """{model: {length source: mean absolute error to the true length, share exactly right}} of the lengths each
    MDC was given (ARC's, its head's) or wrote (its own), and ARC's own (the ``arc`` rows of ARC)."""
    out = {}
    for (model, length, decoder, view), (_, counts, asked) in sets.items():
        if view == "own" and length != "true" and decoder in ("confidence", "beam6"):
            got = np.array([c if a is None else a for c, a in zip(counts, asked)])
            out.setdefault(model, {})[length] = {"mae": float(np.abs(got - np.array(true)).mean()),
                                                 "exact": float(np.mean(got == np.array(true)))}
    return out


def measure(sets: dict, data: dict, ceiling: list[str]) -> list[dict]:
    """One row per caption set: CIDEr-D against each scene's true caption (its mean and per scene), the repetition
    instrument's measures against the scene; then the ceiling's row (a second rendering)."""
    refs = {f"{i:04d}": [t] for i, t in enumerate(data["texts"])}
    named = {"|".join(k): {f"{i:04d}": c for i, c in enumerate(v[0])} for k, v in sets.items()}
    named["ceiling"] = {f"{i:04d}": c for i, c in enumerate(ceiling)}
    scores = evaluate_captions(named, refs, metrics=("cider",))
    rows = []
    for key, (captions, counts, asked) in list(sets.items()) + [(("ceiling", "true", "references", "own"),
                                                                  (ceiling, None, None))]:
        name = "|".join(key) if key[0] != "ceiling" else "ceiling"
        if scores[name]["cider"] is None:
            raise RuntimeError(f"CIDEr-D unavailable: {scores[name]['unavailable'].get('cider')}")
        target = None if asked is None else [n if a is None else a for n, a in zip(counts, asked)]
        m, _ = view_measures(captions, data["scenes"], counts, target)
        rows.append({"model": key[0], "length": key[1], "decoder": key[2], "view": key[3],
                     "cider": scores[name]["cider"], "cider_per_scene": scores[name]["cider_per_image"],
                     "shape_twice": m["shape_twice"], "pairs_exist_caption": m["pairs_exist_caption"],
                     "exact_length": m["exact_length"], "example": captions[0]})
    return rows


def choose(rows: list[dict]) -> dict:
    """PLAN.md's rule: the decoder with the highest CIDEr-D at the true length averaged over RULE_MODELS, the
    first in DECODERS' order within TIE of the best."""
    means = {d: float(np.mean([r["cider"] for r in rows if r["decoder"] == d and r["model"] in RULE_MODELS
                               and r["length"] == "true" and r["view"] == "own"])) for d in DECODERS}
    best = max(means.values())
    return {"decoder": next(d for d in DECODERS if means[d] >= best - TIE), "means": means, "tie": TIE}


def _row(rows: list[dict], **where) -> dict:
    return next(r for r in rows if all(r[k] == v for k, v in where.items()))


def paired(a: dict, b: dict, seed: int) -> dict:
    """Mean of a - b per scene (CIDEr-D) with its 95% bootstrap interval over scenes."""
    diff = np.array(a["cider_per_scene"]) - np.array(b["cider_per_scene"])
    return {"difference": float(diff.mean()), "interval": paired_interval(diff, np.arange(len(diff)), seed)}


def contrasts(rows: list[dict], chosen: str, seed: int) -> list[dict]:
    """Per model and length: the chosen decoder (ARC: beam 6) minus the paper's (ARC: greedy), and own minus
    another scene's image for each."""
    out = []
    for r in (r for r in rows if r["view"] == "own" and r["model"] != "ceiling"):
        other = _row(rows, model=r["model"], length=r["length"], decoder=r["decoder"], view="other_image")
        base = "confidence" if r["model"].startswith("mdc") else "greedy"
        first = _row(rows, model=r["model"], length=r["length"], decoder=base, view="own")
        out.append({"model": r["model"], "length": r["length"], "decoder": r["decoder"],
                    "minus_other_image": paired(r, other, seed),
                    f"minus_{base}": paired(r, first, seed) if r["decoder"] in (chosen, "beam6") else None})
    return out


def markdown(rows: list[dict], split: str, choice: dict, extra: list[dict], errors: dict) -> str:
    lines = [f"# Decoding study, {split} split ({len(rows[0]['cider_per_scene'])} scenes)", "",
             f"Chosen on the validation split: **{choice['decoder']}** (mean CIDEr-D at the true length over "
             f"{', '.join(RULE_MODELS)}: " + ", ".join(f"{d} {100 * v:.1f}" for d, v in choice["means"].items()) + ")",
             "", "| model | length | decoder | CIDEr-D own [95%] | other image | own - other [95%] | shape twice | "
             "pairs exist (own / other) |", "|---|---|---|---|---|---|---|---|"]
    for c in extra:
        own = _row(rows, model=c["model"], length=c["length"], decoder=c["decoder"], view="own")
        other = _row(rows, model=c["model"], length=c["length"], decoder=c["decoder"], view="other_image")
        lo, hi = (100 * v for v in paired_interval(np.array(own["cider_per_scene"]), np.arange(
            len(own["cider_per_scene"]))))
        d = c["minus_other_image"]
        pairs = "/".join("-" if x["pairs_exist_caption"] is None else f"{100 * x['pairs_exist_caption']:.1f}"
                         for x in (own, other))
        lines.append(f"| {c['model']} | {c['length']} | {c['decoder']} | {100 * own['cider']:.1f} [{lo:.1f}, "
                     f"{hi:.1f}] | {100 * other['cider']:.1f} | {100 * d['difference']:+.1f} "
                     f"[{100 * d['interval'][0]:+.1f}, {100 * d['interval'][1]:+.1f}] | "
                     f"{100 * own['shape_twice']:.1f} | {pairs} |")
    ceiling = _row(rows, model="ceiling")
    lines += ["", "Lengths against the true length: mean absolute error in tokens (share exactly right)", ""]
    lines += [f"- {m}: " + ", ".join(f"{src} {e['mae']:.2f} ({100 * e['exact']:.0f}%)" for src, e in by.items())
              for m, by in errors.items()]
    lines += ["", f"Ceiling (a second rendering of each scene against the first): CIDEr-D {100 * ceiling['cider']:.1f}.",
              "", "Paired differences (CIDEr-D, per scene): the chosen decoder minus confidence (MDC), beam 6 minus "
              "greedy (ARC)", ""]
    for c in extra:
        for key in ("minus_confidence", "minus_greedy"):
            if c.get(key):
                d = c[key]
                lines.append(f"- {c['model']}, {c['length']} length, {c['decoder']} {key.replace('_', ' ')}: "
                             f"{100 * d['difference']:+.1f} [{100 * d['interval'][0]:+.1f}, "
                             f"{100 * d['interval'][1]:+.1f}]")
    return "\n".join(lines) + "\n"


def run(split: str, scenes: int, out: str) -> dict:
    seed = SPLITS[split]
    choice_path = os.path.join(out, "choice.json")
    if split == "test" and not os.path.isfile(choice_path):
        raise SystemExit(f"the test split reads the decoder chosen on the validation split: {choice_path} is "
                         f"missing (run --split validation first)")
    began = time.monotonic()
    mdcs = {n: (kept(s, r), arc) for n, (s, r, arc) in MDCS.items()}
    arcs = {n: kept(s, r) for n, (s, r) in ARCS.items()}
    tok = mdcs["mdc-x1"][0].tokenizer
    data = make_scenes(tok, scenes, seed, mdcs["mdc-x1"][0].config.image_size, tok.context_length)
    if data["dropped"]:
        raise RuntimeError(f"{data['dropped']} scenes do not fit the context: the ceiling's renderings would "
                           "not line up with the scenes")
    sets = caption_sets(mdcs, arcs, data, seed)
    rows, errors = measure(sets, data, second_rendering(seed, data["scenes"])), length_errors(sets, data["lengths"])
    if split == "validation":
        choice = choose(rows)
        os.makedirs(out, exist_ok=True)
        with open(choice_path, "w") as f:
            json.dump({**choice, "scenes": scenes}, f, indent=1)
    with open(choice_path) as f:
        choice = json.load(f)
    extra = contrasts(rows, choice["decoder"], seed)
    result = {"split": split, "seed": seed, "scenes": scenes, "seconds": round(time.monotonic() - began, 1),
              "load_average": os.getloadavg()[0], "choice": choice, "rows": rows, "contrasts": extra, "length_errors": errors}
    with open(os.path.join(out, f"{split}.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out, f"{split}.md"), "w") as f:
        f.write(markdown(rows, split, choice, extra, errors))
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", required=True, choices=tuple(SPLITS))
    p.add_argument("--scenes", type=int, default=300)
    p.add_argument("--out", default=os.path.join(HERE, "decoding"))
    args = p.parse_args(argv)
    result = run(args.split, args.scenes, args.out)
    print(open(os.path.join(args.out, f"{args.split}.md")).read() + f"\n{result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
