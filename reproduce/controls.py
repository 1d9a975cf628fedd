"""Table 2's positive controls on the shipped weights, without training::

    python -m reproduce.controls --out DIR [--items N] [--seed S] [--samples M] [--blind-images K]

writes ``DIR/controls.json``, ``DIR/controls.md`` (and the evaluation sets under ``DIR/evalsets``). The
computation, plain so that it can be redone independently:

- Items: :func:`mdc.world.evalsets.write_evalsets` of seed ``S`` (default 0) at 64 px, ``N`` items per
  file (default 20), read by :func:`mdc.eval.suites.load_suites` with ``attribute_min_count=1`` (every
  item kept). In-distribution suites (:mod:`mdc.world.caption_edits`, the scene's own descriptive caption
  edited): ``own_relation``, ``own_attribute`` and ``own_sugarcrepe/<sub-file>``; unseen-phrasing suites
  (templates): ``aro_relation``, ``aro_attribute`` and ``sugarcrepe/<sub-file>``. COCO-Order is left out
  (five candidates per item, no in-distribution analogue here).
- Models: ``mdc.create_model("mini", objective=o, pretrained="synthetic")`` for o in mdc, arc, clip, fp32.
- Scores (:func:`mdc.eval.suite_scoring.score_suite`): "mdc" the ELBO over t in [0, 1] with ``M`` masked
  copies per caption (default 16), stratified mask counts, the noise keyed by (seed ``S``, item key
  ``<suite>/<item id>``) and shared by an item's two captions (paired); "mdc_heuristic" the greedy
  heuristic; "arc" the exact log-likelihood; "clip" the cosine. Raw (summed) scores, not per token.
- Accuracy: the fraction of items whose true caption scores strictly higher than its false one (a tie
  is an error), an item average on every suite (ARO's official VG numbers macro-average instead).
  ``own``: each item with its image; ``shuffled``: with the image of item
  :func:`mdc.eval.suites.shuffled_images` ``(suite, S)[i]`` (a seeded derangement); ``no_image``: the
  scorer's image-free estimate, the log-mean-exp of its score over ``K`` other images of the suite
  (default 2, :func:`mdc.eval.suites.reference_images` with seed ``S``; none of these models learned a
  null condition); CLIP's cosine has none (null).
- Verdict (:mod:`mdc.eval.positive_controls`, the rule fixed before any model was scored): a suite's control
  passes when some model's own-image accuracy beats its shuffled-image accuracy by 2 sqrt(0.5 / N),
  rounded up to a whole point (N = 20: 32 points); else "control failed".

``controls.md`` also holds the binding diagnostic of the MDC model on the in-distribution swap suites
(:func:`mdc.eval.positive_controls.binding_accuracy`). The default run takes about 6 minutes on one CPU core
(``--items 60``: 16), nearly all of it the MDC scorers (the heuristic unmasks one token per forward pass).
"""
from __future__ import annotations

import json
import os
from argparse import ArgumentParser

import numpy as np

import mdc
from mdc.eval.positive_controls import binding_accuracy, control_margin, control_status
from mdc.eval.suite_scoring import SuiteOptions, score_suite
from mdc.eval.suites import OWN_SUITES, load_suites, shuffled_images, synthetic_data

#: name in controls.json -> (objective, score variant)
MODELS = {"mdc": ("mdc", "elbo"), "mdc_heuristic": ("mdc", "heuristic"), "arc": ("arc", "exact"),
          "clip": ("clip", "cosine")}
UNSEEN = ("aro_relation", "aro_attribute", "sugarcrepe")
BINDING = ("own_sugarcrepe/swap_att", "own_attribute", "own_sugarcrepe/swap_obj")


def accuracy(scores: np.ndarray) -> float | None:
    """Fraction of items [N, 2] whose true caption (column 0) scores strictly higher; None if NaN."""
    if np.isnan(scores).any():
        return None
    return float(np.mean(scores[:, 0] > scores[:, 1]))


def controls(out: str, n_items: int = 20, seed: int = 0, num_samples: int = 16, blind_images: int = 2,
             suites=("own", *UNSEEN)) -> dict:
    """Score every suite with the shipped models (module docstring); returns the controls.json object
    and the binding diagnostic."""
    data = load_suites(synthetic_data(os.path.join(out, "evalsets"), seed, 64, n_items), list(suites),
                       attribute_min_count=1)
    options = SuiteOptions(num_samples=num_samples, seed=seed, elbo_trained_t=False, blind=True, shuffled=True,
                           blind_images=blind_images)
    result = {"suites": {name: {"kind": "in-distribution" if name in OWN_SUITES else "unseen phrasing",
                                "models": {}} for name in data}}
    binding = {}
    for objective in ("mdc", "arc", "clip"):
        model = mdc.create_model("mini", objective=objective, pretrained="synthetic").eval()
        transform = mdc.image_transform(model)
        names = {m: v for m, (o, v) in MODELS.items() if o == objective}
        for name, suite in data.items():
            scored = score_suite(model, transform, suite, list(names.values()), options)
            for m, v in names.items():
                result["suites"][name]["models"][m] = {
                    "own": accuracy(scored.scores[v]), "shuffled": accuracy(scored.scores[f"{v}_shuffled"]),
                    "no_image": accuracy(scored.scores[f"{v}_blind"]) if f"{v}_blind" in scored.scores else None}
            if objective == "mdc" and name in BINDING:
                binding[name] = binding_accuracy(model, transform, suite, shuffled_images(suite, seed))
    return result, binding


def markdown(result: dict, binding: dict, n_items: int) -> str:
    """controls.md: per suite each model's own / shuffled / no-image accuracy (%) and the control's verdict."""
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}"  # noqa: E731
    models = list(MODELS)
    lines = [f"Accuracy (%) with the item's own image / another item's image / no image, {n_items} items per suite; "
             f"control margin {100 * control_margin(n_items):.0f} points (own - shuffled, some model).", "",
             "| suite | kind | " + " | ".join(models) + " | control |", "|---|---|" + "---|" * (len(models) + 1)]
    for name, s in result["suites"].items():
        cells = [s["models"][m] for m in models if m in s["models"]]
        lines.append(f"| {name} | {s['kind']} | " + " | ".join(
            " / ".join(pct(c[k]) for k in ("own", "shuffled", "no_image")) for c in cells) +
            f" | {control_status(cells, n_items)} |")
    if binding:
        lines += ["", "Binding (MDC): the swapped words masked, the rest visible; % of items whose true assignment "
                  "wins, own image / another item's image / no image (items with equal token counts).", "",
                  "| suite | own / shuffled / no image | items |", "|---|---|---|"]
        lines += [f"| {n} | {pct(b['own'])} / {pct(b['shuffled'])} / {pct(b['no_image'])} | {b['items']} |"
                  for n, b in binding.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = ArgumentParser(description="Table 2's positive controls on the shipped mini weights (no training).")
    parser.add_argument("--out", required=True, help="folder for controls.json, controls.md and the evaluation sets")
    parser.add_argument("--items", type=int, default=20, help="items per suite")
    parser.add_argument("--seed", type=int, default=0, help="evaluation sets, ELBO noise, shuffled images")
    parser.add_argument("--samples", type=int, default=16, help="ELBO masked copies per caption")
    parser.add_argument("--blind-images", type=int, default=2, help="images of the image-free estimate")
    parser.add_argument("--suites", nargs="+", default=["own", *UNSEEN], help="suites or aliases (load_suites)")
    args = parser.parse_args(argv)
    result, binding = controls(args.out, args.items, args.seed, args.samples, args.blind_images, args.suites)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "controls.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result, binding, args.items)
    with open(os.path.join(args.out, "controls.md"), "w") as f:
        f.write(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
