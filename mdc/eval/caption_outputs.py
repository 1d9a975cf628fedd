"""Captioning outputs: Table 3's rows, the results of a captioning run, the files beside them and
Fig. 6's examples (redrawn from the results alone)."""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import re
from dataclasses import asdict
from typing import Mapping, Sequence

import numpy as np
from PIL import Image

from mdc.data.formats import Items, load_image
from mdc.eval.metrics import mean_words

#: Table 3: our metric keys -> the paper's column suffixes (rows: :func:`row_label`).
TABLE3_COLUMNS = {"bleu4": "bleu4", "meteor": "meteor", "cider": "cider", "spice": "spice", "rouge_l": "rougeL"}
TABLE3_PREFIX = {"coco": "coco", "flickr30k": "flickr"}


#: The matched lengths' tags (mdc.eval.caption_generation) as the rows name them.
MATCHED = {"ref": "ref. length", "arc": "ARC's length"}


def row_label(name: str) -> str:
    """The row label of a caption set: ``arc-beam6`` -> "ARC (beam 6)", ``mdc-10`` -> "MDC-10" (the paper's),
    ``arc-greedy`` -> "ARC (greedy)", ``arc-beam6-ref`` -> "ARC (beam 6, ref. length)", ``mdc-arc`` ->
    "MDC (ARC's length)", ``mdc-ref`` -> "MDC (ref. length)"."""
    method, _, rest = name.partition("-")
    decoding, _, tag = rest.partition("-")
    if method == "arc":
        decoding = "greedy" if decoding == "greedy" else f"beam {decoding.removeprefix('beam')}"
        return f"ARC ({decoding}{', ' + MATCHED[tag] if tag else ''})"
    return f"MDC-{decoding}" if decoding.isdigit() else f"MDC ({MATCHED.get(decoding, decoding)})"


def paper_sets(names) -> list[str]:
    """The caption sets the paper reports (MDC at fixed lengths, ARC's beam search), in ``names``' order: the
    ones its LLM judge compares and Fig. 6 shows."""
    return [n for n in names if re.fullmatch(r"mdc-\d+|arc-beam\d+", n)]


def _row_order(name: str) -> tuple:
    """ARC greedy, beam, beam at a matched length; then MDC by length, at ARC's length, at the references'."""
    method, _, rest = name.partition("-")
    if method == "arc":
        return (0, rest != "greedy", rest.count("-"), rest)
    return (1, not rest.isdigit(), int(rest) if rest.isdigit() else 0, rest)


def table3_rows(results: Mapping, dataset: str | None = None) -> list[dict]:
    """Table 3 rows (ARC, then MDC by length; values in percent, as the paper prints them) from
    a captioning ``results`` dict: ``method``, ``length_<dataset>`` (MDC's fixed length), ``words`` (mean
    words per caption), ``bp`` (BLEU's brevity penalty, %), ``<prefix>_bleu4, _meteor, _cider, _spice, _rougeL,
    _llm_judge`` (prefix coco | flickr) and, beside the paper's columns, :func:`descriptiveness`'
    ``grounded_words`` and ``repeated`` (%) and the wrong-image control ``<prefix>_cider_another_image`` (the set's
    CIDEr-D against another image's references, :func:`mdc.eval.metrics.another_image_cider`); None where not
    computed."""
    dataset = dataset or results["dataset"]["name"]
    prefix = TABLE3_PREFIX[dataset]
    judge = (results.get("judge") or {}).get("selection_rate") or {}
    percent = lambda v: None if v is None else 100 * v  # noqa: E731
    rows = []
    for name in sorted(results["metrics"], key=_row_order):
        m = results["metrics"][name]
        fixed = name[4:] if name.startswith("mdc-") and name[4:].isdigit() else None
        row = {"method": row_label(name), f"length_{dataset}": int(fixed) if fixed else None,
               "words": m.get("words"), "bp": percent(m.get("bp"))}
        row |= {f"{prefix}_{col}": percent(m.get(k)) for k, col in TABLE3_COLUMNS.items()}
        row[f"{prefix}_llm_judge"] = 100 * judge[name] if name in judge else None
        row |= {"grounded_words": m.get("grounded_words"), "repeated": percent(m.get("repeated")),
                f"{prefix}_cider_another_image": percent(m.get("cider_another_image"))}
        rows.append(row)
    return rows


def pick_examples(items: Sequence[Mapping], captions_by_model: Mapping[str, Mapping], k: int = 3,
                  seed: int = 0) -> dict:
    """``k`` seeded random images with every model's caption: the arguments of :func:`mdc.plots.plot_captions`,
    plus ``items``: the picked items (image_id, image_path, references), each with its captions and a
    thumbnail, so that the figure can be redrawn from the results alone (:func:`example_images`)."""
    chosen = sorted(np.random.default_rng(seed).choice(len(items), min(k, len(items)), replace=False).tolist())
    picked = [items[i] for i in chosen]
    images = [load_image(it) for it in picked]
    by_model = {n: [c[it["image_id"]] for it in picked] for n, c in captions_by_model.items()}
    return {"images": images, "references": [it["references"] for it in picked], "captions_by_model": by_model,
            "items": [{**{k: it[k] for k in ("image_id", "image_path", "references")},
                       "captions": {n: caps[i] for n, caps in by_model.items()}, "thumbnail": _thumbnail(image)}
                      for i, (it, image) in enumerate(zip(picked, images))]}


def _thumbnail(image, size: int = 128) -> str:
    """A PIL image as a base64 PNG whose longer side is at most ``size`` pixels."""
    image = image.copy()
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def example_images(examples: Sequence[Mapping]) -> list:
    """The PIL images of :func:`pick_examples`' ``items`` (from their thumbnails)."""
    return [Image.open(io.BytesIO(base64.b64decode(e["thumbnail"]))).convert("RGB") for e in examples]


def captioning_results(*, dataset: str, items: Items, metrics: Mapping[str, dict], judge: Mapping | None,
                       checkpoints: Mapping[str, dict], captions_json: str, captions_format: str, split) -> dict:
    """The ``results`` of a captioning results file (schema in the module docstring).

    ``metrics``: :func:`evaluate_captions`' output; ``judge``: :func:`mdc.eval.judge.llm_judge`'s
    (its per-image answers are left out; a judge that did not run is null); ``checkpoints``:
    the ``info`` of :func:`caption_checkpoint` per objective.
    """
    if dataset not in TABLE3_PREFIX:
        raise ValueError(f"dataset must be one of {list(TABLE3_PREFIX)} (the Table 3 block); got {dataset!r}")
    unavailable = {obj: f"no {obj}_checkpoint given" for obj in ("mdc", "arc") if obj not in checkpoints}
    for name, m in metrics.items():
        for key, reason in m.get("unavailable", {}).items():
            unavailable.setdefault(key, reason)
    ran = judge is not None and judge["images"] > 0
    if judge is not None and judge.get("reason"):
        unavailable["judge"] = judge["reason"]
    return {
        "dataset": {"name": dataset, "captions_json": captions_json, "format": captions_format, "split": split,
                    "images_evaluated": len(items), "images_total": getattr(items, "total", len(items)),
                    "images_missing": len(getattr(items, "missing", ())),
                    "reference_words": mean_words([r for it in items for r in it["references"]]),
                    "image_ids": sorted((it["image_id"] for it in items), key=str)},
        "metrics": dict(metrics),
        "judge": {k: v for k, v in judge.items() if k not in ("answers", "reason")} if ran else None,
        "unavailable": unavailable,
        "checkpoints": {obj: {k: info[k] for k in ("path", "checkpoint_id", "finetuned")} | {"model": asdict(info["config"])}
                        for obj, info in checkpoints.items()},
        "finetune": {obj: info["finetune"] for obj, info in checkpoints.items() if info["finetune"]},
    }


def write_outputs(output_dir: str, captions: Mapping[str, Mapping], results: Mapping,
                  judge: Mapping | None = None) -> dict:
    """Write ``predictions.json`` ({name: {image_id: caption}}), ``table3.csv`` / ``table3.md``
    (:func:`table3_rows`) and, if the judge ran, ``judge_answers.json``; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    files = {"predictions": os.path.join(output_dir, "predictions.json"), "table": os.path.join(output_dir, "table3.csv")}
    with open(files["predictions"], "w") as f:
        json.dump({name: {str(i): c for i, c in caps.items()} for name, caps in captions.items()}, f, indent=1)
    rows = table3_rows(results)
    columns = list(rows[0]) if rows else ["method"]
    with open(files["table"], "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.splitext(files["table"])[0] + ".md", "w") as f:
        f.write(markdown_table(rows))
    if judge and judge.get("answers"):
        files["judge_answers"] = os.path.join(output_dir, "judge_answers.json")
        with open(files["judge_answers"], "w") as f:
            json.dump(judge["answers"], f, indent=1)
    return files


def markdown_table(rows: Sequence[Mapping]) -> str:
    """Rows of :func:`table3_rows` as a Markdown table (numbers to one decimal, "-" where missing)."""
    if not rows:
        return "(no captioner evaluated)\n"
    columns = list(rows[0])
    cell = lambda v: "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"
