"""How many reference images does Table 2's image-free score need? Its decisions at K = 1, 2 against K = 4.

MDC's image-free score of a caption is log p(t) ~ log (1/K) sum_k p(t | i_k) over K reference images of the
suite (``mdc.eval.suites.reference_images``: the same K + 1 images for every item of a suite, nested: K = 2's
are the first of K = 4's), each term an ELBO of the profile's 32 paired copies, or the heuristic score. At
``mini`` it costs K times a scoring with the image (``reproduce/cost/units.py``). This study scores the
first ``--items`` items of each suite kind (ARO's order task, the template suites, the in-distribution
``own`` suites) on the shipped weights at K = 1, 2 and 4 and reports, per variant, the image-free accuracy and
the share of items whose chosen candidate (the highest score, ties to the first) is K = 4's.

    OMP_NUM_THREADS=1 python -m reproduce.studies.blind_images --evalsets DIR [--items 60] [--out FOLDER]
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

import mdc
from mdc.eval import compositionality as comp
from reproduce.cost.units import KINDS, OPTIONS, sample

KS = (1, 2, 4)


def blind_decisions(evalsets: str, items: int) -> dict:
    """{kind: {variant: {K: chosen candidate per item}}}."""
    model = mdc.create_model("mini", objective="mdc", pretrained="synthetic").eval()
    transform = mdc.image_transform(model)
    suites = comp.load_suites(evalsets, "all", attribute_min_count=5)
    out = {}
    for kind, names in KINDS.items():
        parts, out[kind] = sample(suites, names, items), {}
        for k in KS:
            options = comp.suite_options(**{**OPTIONS, "blind_images": k, "shuffled": False})
            scoring = {v: kw for v, kw in comp.method_variants(model, "auto", options).items() if v.endswith("_blind")}
            for s in parts:
                scored = comp.score_variants(model, transform, s, scoring, options)
                for v, scores in scored.scores.items():
                    out[kind].setdefault(v, {}).setdefault(k, []).extend(np.argmax(scores, 1).tolist())
        print(kind, {v: {k: f"{np.mean(np.array(c) == 0):.3f}" for k, c in d.items()} for v, d in out[kind].items()},
              flush=True)
    return out


def summary(decisions: dict) -> dict:
    """Per kind and variant: items, the image-free accuracy at each K, and each K's agreement with K = 4."""
    rows = {}
    for kind, by_variant in decisions.items():
        for v, by_k in by_variant.items():
            ref = np.array(by_k[max(KS)])
            rows[f"{kind}/{v}"] = {"items": len(ref),
                                   **{f"accuracy_K{k}": float(np.mean(np.array(c) == 0)) for k, c in by_k.items()},
                                   **{f"agree_K{k}": float(np.mean(np.array(c) == ref)) for k, c in by_k.items()
                                      if k != max(KS)}}
    return rows


def markdown(rows: dict) -> str:
    head = ["suite kind / variant", "items", *[f"accuracy K={k}" for k in KS], *[f"same choice as K=4, K={k}"
                                                                                for k in KS[:-1]]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        cells = [name, str(r["items"]), *[f"{100 * r[f'accuracy_K{k}']:.1f}" for k in KS],
                 *[f"{100 * r[f'agree_K{k}']:.1f}" for k in KS[:-1]]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--evalsets", required=True)
    p.add_argument("--items", type=int, default=60, help="items per suite kind")
    p.add_argument("--out", default=os.path.join("reproduce", "studies", "blind_images"))
    args = p.parse_args(argv)
    rows = summary(blind_decisions(args.evalsets, args.items))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"items_per_kind": args.items, "load_average": os.getloadavg()[0], "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
