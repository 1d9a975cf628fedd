"""Why does MDC score 100% on the synthetic SugarCrepe "add" suites? A control with wrong images.

In an "add" item the negative caption is the true one with something added: an attribute word
(add_att, one token longer) or a third object (add_obj, four tokens longer). MDC's scores are
likelihoods of a caption *of known length* (the ELBO and the heuristic both fix N), so a
preference for the shorter caption need not come from the image. The control scores every item
twice: with its own image and with another item's image (item i gets the image of item i + 1,
a different random scene). A scorer that reads the image loses accuracy under the swap; one
that ranks by length or text alone does not.

    python -m reproduce.studies.sugarcrepe_add --runs reproduce/runs/mini --out reproduce/studies/sugarcrepe_add

Writes ``results.json`` (accuracies and mean per-token scores per model, scorer, suite and
image condition) and the same as a Markdown table, ``results.md``. replace_att (equal lengths)
is scored too, as the check that the swap does hurt a scorer where the image matters.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

SUITES = ("sugarcrepe/add_att", "sugarcrepe/add_obj", "sugarcrepe/replace_att")
CONDITIONS = ("own image", "another item's image")


def shifted(suite):
    """The suite with item i shown the image of item i + 1 (the last item the first's): only each item's
    ``image_path`` changes. Its captions, id and any bbox stay, and so do the suite's clusters, which still
    name each item's own image (the image-free scores' reference draw reads them). The ELBO's noise follows
    the image shown: it is keyed by the pixels scored, so an item's copies differ between the conditions."""
    items = [{**item, "image_path": suite.items[(i + 1) % len(suite.items)]["image_path"]}
             for i, item in enumerate(suite.items)]
    return dataclasses.replace(suite, items=items)


def study(runs: str, num_samples: int, seed: int) -> dict:
    import mdc
    import mdc.eval.compositionality as comp
    from mdc.eval.accuracy import correct_and_ties
    from mdc.data.transforms import image_transform

    suites = comp.load_suites(os.path.join(runs, "data", "evalsets"), list(SUITES))
    rows = []
    for objective in ("mdc", "arc"):
        model = mdc.load(os.path.join(runs, "pretrain", f"{objective}-descriptive-s{seed}")).eval()
        transform = image_transform(model.config.image_size, train=False)
        methods = ["elbo", "heuristic"] if objective == "mdc" else ["exact"]
        for name, suite in suites.items():
            for condition, s in zip(CONDITIONS, (suite, shifted(suite))):
                start = time.time()
                scored = comp.score_suite(model, transform, s, methods, num_samples=num_samples, seed=seed,
                                          batch_size=64, elbo_trained_t=False)
                for v in methods:
                    raw, per_token = scored.scores[v], scored.normalised(v)  # [N, 2], the true caption first
                    rows.append(dict(model=objective.upper(), scorer=v, suite=name, images=condition,
                                     accuracy=100 * float(correct_and_ties(raw)[0].mean()),  # ties: errors
                                     accuracy_per_token=100 * float(correct_and_ties(per_token)[0].mean()),
                                     true_per_token=float(per_token[:, 0].mean()),
                                     negative_per_token=float(per_token[:, 1].mean()),
                                     extra_tokens=float((scored.tokens[:, 1] - scored.tokens[:, 0]).mean()),
                                     items=len(raw)))
                print(f"{objective} {name} {condition}: {time.time() - start:.0f} s", flush=True)
    return {"runs": runs, "seed": seed, "num_samples": num_samples, "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| model | scorer | suite | images | acc. | acc. per token | true / negative nats per token | extra tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['scorer']} | {r['suite'].split('/')[1]} | {r['images']} | "
                     f"{r['accuracy']:.1f} | {r['accuracy_per_token']:.1f} | "
                     f"{r['true_per_token']:.2f} / {r['negative_per_token']:.2f} | {r['extra_tokens']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="reproduce/runs/mini", help="a profile's run folder (data/, pretrain/)")
    p.add_argument("--out", default="reproduce/studies/sugarcrepe_add", help="folder for results.json")
    p.add_argument("--num-samples", type=int, default=32, help="ELBO samples per caption (paired)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    result = study(args.runs, args.num_samples, args.seed)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown(result) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
