"""Neighbour use: does a captioner's decoder read the word beside the one it predicts?

Items come from fresh scenes of the synthetic world (:func:`mdc.world.graphs.sample_scene`) captioned in the
descriptive style (:func:`mdc.world.text.descriptive_plan`), rendered at the model's image size. Each object
of a caption is one item: its attribute word of a kind (``colour``; ``size``, ``texture`` on request) and
its partner, the shape word the attribute modifies, both in the object list ("a small striped red circle").
Their token positions come from the plan (which words belong to which object, :func:`caption_spans`), never
from a search of the text; words that are not one token of the model's vocabulary are dropped and counted.

Measures (the target's *partner* is the other word of its pair, shown or masked at its list mention; the
target's other mentions, e.g. the colour in a long-form relation sentence, are always masked, so nothing is
copied; every other caption token is masked where ``u < r``, u one seeded draw per item that all conditions
and ratios share):

- ``<kind>_given_shape`` (MDC): the attribute masked; argmax accuracy at its position with the shape word
  visible and with it masked, and the difference (visible - hidden);
- ``shape_given_<kind>`` (MDC): the converse, the shape word masked, the attribute visible vs masked;
- ``shape_after_<kind>`` (both objectives): the shape word's accuracy after the true attribute and after
  another value substituted (every mention; a value absent from the scene where there is one). ARC is
  teacher-forced (key ``teacher_forced``); MDC has the shape word masked and the rest per r. A decoder that
  follows the attribute loses accuracy when it is wrong; the shipped ARC does (78% against 21%);
- attention (MDC, the ``*_given_*`` measures): the self-attention probability from the target's position to
  the partner's, per layer, the mean over heads and the largest head's mean, beside ``uniform``, what an
  even spread over the attended positions (SOT to EOT) would give.

Every figure comes twice: with the item's own image and with another's (``other_image``: scene s shown the
image of scene s + 1, cyclically), where a decoder that reads the image falls towards its no-image rate.
Differences carry a 95% percentile bootstrap interval over scenes (a scene's items resampled together).
Randomness: scene i from stream ``STREAM_NEIGHBOURS``, its caption ``+ 1``, the substituted values ``+ 2``,
kind k's masking draws ``+ 3 + k`` (:mod:`mdc.world.streams`). Nothing depends on ``batch_size``.
"""
from __future__ import annotations

import numpy as np
import torch

from mdc.data.transforms import image_transform
from mdc.distribution import caption_log_probs
from mdc.model import evaluating
from mdc.tokenizer import caption_mask, valid_mask
from mdc.transformer import recording_attention
from mdc.world.graphs import sample_scene
from mdc.world.render import COLOURS, render
from mdc.world.streams import STREAM_NEIGHBOURS, stream_rng
from mdc.world.text import (DESCRIPTIVE_RELATION, JOINERS, SIZE_WORDS, TEXTURE_ADJ, descriptive_plan, join_list,
                            pick, render_descriptive, with_article)

__all__ = ["KINDS", "RATIOS", "caption_spans", "format_neighbour_use", "make_items", "neighbour_use"]

RATIOS = (0.25, 0.75, 0.95)
KINDS = ("colour", "size", "texture")  # attributes with a word in the object list
FIELDS = ("size", "texture", "colour", "shape")  # an object's words in the list, in order
WORDS = {"colour": {c: (c,) for c in COLOURS}, "size": SIZE_WORDS, "texture": TEXTURE_ADJ}  # value -> words
VIEWS = ("own", "other_image")


# ------------------------------------------------------------------------------------------------ items
def caption_spans(plan: dict) -> tuple[str, list[tuple[int, str, int, int, bool]]]:
    """The descriptive caption of ``plan`` and where its object words are: ``(object, field, start, end, listed)``
    character spans of every mention, ``listed`` for the object list's (the others in relation sentences)."""
    w, spans = plan["words"], []
    fields = {k: plan[k] for k in ("bg", "count", "region") if k in plan}
    phrases = [with_article(" ".join(w[i][f] for f in FIELDS)) for i in plan["order"]]
    at = len(plan["template"].split("{objs}")[0].format(**fields))
    for k, (i, phrase) in enumerate(zip(plan["order"], phrases)):
        start = at + len(phrase) - len(" ".join(w[i][f] for f in FIELDS))  # past the article
        for f in FIELDS:
            spans.append((i, f, start, start + len(w[i][f]), True))
            start += len(w[i][f]) + 1
        at += len(phrase) + len(JOINERS[1] if k == len(phrases) - 2 else JOINERS[0])
    text = plan["template"].format(objs=join_list(phrases), **fields)
    named = ("shape",) if plan["short"] else ("colour", "shape")
    for a, rel, b in plan["relations"]:
        names = {x: " ".join(w[x][f] for f in named) for x in (a, b)}
        sentence = DESCRIPTIVE_RELATION.format(a=names[a], rel=rel, b=names[b])
        for obj, slot in ((a, "{a}"), (b, "{b}")):
            start = len(text) + 1 + len(DESCRIPTIVE_RELATION.split(slot)[0].format(a=names[a], rel=rel))
            for f in named:
                spans.append((obj, f, start, start + len(w[obj][f]), False))
                start += len(w[obj][f]) + 1
        text += " " + sentence
    if text != render_descriptive(plan) or any(text[s:e] != w[i][f] for i, f, s, e, _ in spans):
        raise RuntimeError("caption_spans is out of step with mdc.world.text.render_descriptive")
    return text, spans


def _positions(tok, text: str, spans: list, tokens: torch.Tensor) -> list:
    """Each span's token position in ``tokens`` [L] (SOT at 0), or None where the word is not one in-context
    vocabulary token. BPE splits words apart, so the tokens before a word are those of the text before it."""
    out = []
    for *_, start, end, _listed in spans:
        ids, pos = tok.encode(text[start:end]), 1 + len(tok.encode(text[:start]))
        usable = len(ids) == 1 and ids[0] != tok.unk_id and pos < len(tokens) - 1
        if usable and int(tokens[pos]) != ids[0]:
            raise RuntimeError(f"token {pos} of {text!r} is not {text[start:end]!r}")
        out.append(pos if usable else None)
    return out


def _substitutes(scene: dict, rng) -> list[dict]:
    """Per object, per kind (all of KINDS, in order, so the draws do not depend on the kinds asked for): the word
    of another value, one absent from the scene where there is one."""
    out = []
    for obj in scene["objects"]:
        subs = {}
        for kind in KINDS:
            others = [v for v in WORDS[kind] if v != obj[kind]]
            absent = [v for v in others if all(o[kind] != v for o in scene["objects"])]
            subs[kind] = pick(rng, WORDS[kind][pick(rng, absent or others)])
        out.append(subs)
    return out


def make_items(tok, n_items: int, seed: int, kinds=("colour",), image_size: int = 64) -> dict:
    """``n_items`` objects of fresh descriptive scenes as items, per kind: ``tokens`` / ``swapped`` [N, L] (the
    caption; with the object's attribute substituted, every mention), ``attr`` / ``shape`` [N] (their list
    positions), ``attr_more`` / ``shape_more`` [N, L] bool (their other mentions), ``scene`` [N]; with
    ``images`` [S, 3, s, s] (CLIP-normalised), ``texts`` [S] and ``dropped`` per kind: objects whose attribute,
    shape or substitute is not one token of ``tok``'s vocabulary, or lies past its context."""
    L, transform = tok.context_length, image_transform(image_size, train=False)
    rows = {k: [] for k in kinds}
    dropped, images, texts, objects, s = dict.fromkeys(kinds, 0), [], [], 0, 0
    while objects < n_items:
        scene = sample_scene(stream_rng(seed, STREAM_NEIGHBOURS, s))
        text, spans = caption_spans(descriptive_plan(scene, stream_rng(seed, STREAM_NEIGHBOURS + 1, s)))
        subs = _substitutes(scene, stream_rng(seed, STREAM_NEIGHBOURS + 2, s))
        tokens = tok.tokenize([text], L)[0][0]  # [L]
        where = _positions(tok, text, spans, tokens)
        for obj in range(min(len(scene["objects"]), n_items - objects)):
            for kind in kinds:
                item = _item(tok, tokens, spans, where, obj, kind, subs[obj][kind])
                if item is None:
                    dropped[kind] += 1
                else:
                    rows[kind].append(item | {"scene": s})
        objects += len(scene["objects"])
        images.append(transform(render(scene, image_size)))
        texts.append(text)
        s += 1
    if not all(rows.values()):
        raise ValueError(f"no usable item of kinds {[k for k in kinds if not rows[k]]}: their words are not single "
                         "tokens of this tokenizer's vocabulary")
    out = {k: {key: torch.stack([torch.as_tensor(r[key]) for r in rows[k]]) for key in rows[k][0]} for k in kinds}
    return out | {"images": torch.stack(images), "dropped": dropped, "texts": texts}


def _item(tok, tokens, spans, where, obj, kind, substitute) -> dict | None:
    """One item's positions and rows (:func:`make_items`), or None when the attribute or shape is unusable."""
    mine = [(f, listed, p) for (o, f, *_, listed), p in zip(spans, where) if o == obj]
    attr = next(p for f, listed, p in mine if f == kind and listed)
    shape = next(p for f, listed, p in mine if f == "shape" and listed)
    new = tok.encode(substitute)
    if attr is None or shape is None or len(new) != 1 or new[0] == tok.unk_id:
        return None
    more = {f: torch.zeros(len(tokens), dtype=torch.bool) for f in (kind, "shape")}
    swapped = tokens.clone()
    for f, listed, p in mine:
        if f in more and p is not None:
            more[f][p] = not listed
            if f == kind:
                swapped[p] = new[0]
    return {"tokens": tokens, "swapped": swapped, "attr": attr, "shape": shape,
            "attr_more": more[kind], "shape_more": more["shape"]}


# --------------------------------------------------------------------------------------------- measures
def _specs(kind: str, causal: bool) -> dict:
    """measure -> (target, partner, the target's other mentions, {condition: (token rows, partner masked)});
    the difference is the first condition's accuracy minus the second's."""
    after = {f"shape_after_{kind}": ("shape", "attr", "shape_more",
                                     {"true": ("tokens", False), "substituted": ("swapped", False)})}
    if causal:
        return after
    hide = {"visible": ("tokens", False), "hidden": ("tokens", True)}
    return {f"{kind}_given_shape": ("attr", "shape", "attr_more", hide),
            f"shape_given_{kind}": ("shape", "attr", "shape_more", hide)} | after


def _masked(tok, x, target, partner, more, hide: bool, drawn) -> torch.Tensor:
    """``x`` [R, L] with the target [R] and its other mentions ``more`` [R, L] masked, the partner [R] masked iff
    ``hide``, and every other caption token where ``drawn`` [R, L] (bool) holds."""
    m = (caption_mask(x, tok.sot_id, tok.eot_id) & drawn) | more  # [R, L]
    rows = torch.arange(len(x))
    m[rows, partner] = hide
    m[rows, target] = True
    return x.masked_fill(m, tok.mask_id)


def _predict(model, x, context, target, partner=None):
    """The argmax [R] at the positions ``target`` [R] (ARC: the next token, from the position before) and, given
    ``partner`` [R], each block's self-attention probability from target to partner [R, layers, heads]."""
    rows, maps = torch.arange(len(x)), None
    at = target - 1 if model.causal else target
    if partner is None:
        h = model.hidden(x, context)[rows, at]  # [R, W]
    else:
        with recording_attention(model.decoder) as probs:  # one [R, h, L, L] per block
            h = model.hidden(x, context)[rows, at]
        maps = torch.stack([p[rows, :, target, partner] for p in probs], 1).cpu()  # [R, layers, h]
    logp = caption_log_probs(model.head(h), model.tokenizer, allow_eot=model.causal)  # [R, V]
    return logp.argmax(-1).cpu(), maps


def _batch(model, items: dict, rows, images, drawn: dict, specs: dict, raw: dict) -> None:
    """Every measure, view, ratio and condition on the items ``rows``; appends (hits [R], attention) to ``raw``.
    Rows are cut after their longest caption (the padding after [EOT] changes no output), and a pass two
    measures share (``shape_given_*`` visible, ``shape_after_*`` true) runs once."""
    device, tok = next(model.parameters()).device, model.tokenizer
    attend = not model.causal and hasattr(model, "decoder")
    n = int(valid_mask(items["tokens"][rows], tok.eot_id).sum(1).max())  # positions in use
    cut = {k: v[rows][:, :n] if v.dim() == 2 else v[rows] for k, v in items.items()}
    for view in VIEWS:
        scenes = cut["scene"] if view == "own" else (cut["scene"] + 1) % len(images)
        context, memo = model.context(images[scenes].to(device)), {}
        for name, (target, partner, more, conditions) in specs.items():
            t, p = cut[target], cut[partner]  # [R]
            look = p.to(device) if attend and "given" in name else None
            for key, draw in drawn.items():
                for condition, (source, hide) in conditions.items():
                    x = cut[source] if draw is None else _masked(tok, cut[source], t, p, cut[more], hide,
                                                                draw[rows][:, :n])
                    shared = (key, target, more, source, hide)
                    if shared not in memo or (look is not None and memo[shared][1] is None):
                        memo[shared] = _predict(model, x.to(device), context, t.to(device), look)
                    pred, maps = memo[shared]
                    raw.setdefault((name, key, view, condition), []).append(
                        (pred == cut["tokens"][torch.arange(len(t)), t], maps if look is not None else None))


def paired_interval(diff: np.ndarray, cluster: np.ndarray, seed: int = 0, n_boot: int = 2000) -> list[float]:
    """95% percentile bootstrap interval of the mean of ``diff`` [N], resampling the clusters [N] (scenes)."""
    if len(diff) == 0:
        return [float("nan"), float("nan")]
    _, inverse = np.unique(cluster, return_inverse=True)
    sums, counts = np.bincount(inverse, weights=diff), np.bincount(inverse)
    draw = np.random.default_rng(seed).integers(len(sums), size=(n_boot, len(sums)))
    means = sums[draw].sum(1) / counts[draw].sum(1)  # [n_boot]
    return [float(v) for v in np.quantile(means, [0.025, 0.975])]


def _summarise(raw: dict, items: dict, specs: dict, seed: int, uniform: float) -> dict:
    """{measure: {ratio: {view: {condition accuracies, n, difference, interval[, attention]}}}}."""
    out: dict = {}
    for (name, key, view, condition), parts in raw.items():
        entry = out.setdefault(name, {}).setdefault(key, {}).setdefault(view, {})
        hits = torch.cat([h for h, _ in parts]).double().numpy()  # [N]
        entry[condition] = float(hits.mean()) if len(hits) else None
        entry.setdefault("_hits", []).append(hits)
        if parts and parts[0][1] is not None:
            maps = torch.cat([m for _, m in parts]).double()  # [N, layers, h]
            attention = entry.setdefault("attention", {"uniform": uniform})
            attention[condition] = {"mean": maps.mean((0, 2)).tolist(), "max_head": maps.mean(0).amax(-1).tolist()}
    scenes = items["scene"].numpy()
    for name, by_ratio in out.items():
        for entry in (e for ratio in by_ratio.values() for e in ratio.values()):
            first, second = entry.pop("_hits")
            entry["n"] = len(first)
            entry["difference"] = float((first - second).mean()) if len(first) else None
            entry["interval"] = paired_interval(first - second, scenes, seed)
            entry["conditions"] = list(specs[name][3])
    return out


@torch.no_grad()
def neighbour_use(model, n_items: int = 1000, seed: int = 0, ratios=RATIOS, batch_size: int = 64,
                  kinds=("colour",), precision: str = "fp32") -> dict:
    """The neighbour-use measures (module docstring) of a captioner on ``n_items`` objects of fresh scenes of
    ``seed``, as plain JSON-able numbers: ``measures[name][ratio][view]`` holds each condition's accuracy,
    ``n``, ``difference`` (first condition - second), its 95% ``interval`` and, for MDC's ``*_given_*``
    measures, ``attention``. ARC's only ratio key is ``teacher_forced``."""
    if n_items < 1 or batch_size < 1:
        raise ValueError(f"n_items and batch_size must be >= 1; got {n_items}, {batch_size}")
    if not all(0 < r < 1 for r in ratios) or not set(kinds) <= set(KINDS):
        raise ValueError(f"ratios must lie in (0, 1) and kinds in {KINDS}; got {list(ratios)}, {list(kinds)}")
    tok, causal = model.tokenizer, bool(model.causal)
    data = make_items(tok, n_items, seed, kinds, model.config.image_size)
    result = {"objective": "arc" if causal else "mdc", "n_items": n_items, "scenes": len(data["texts"]),
              "seed": seed, "ratios": [float(r) for r in ratios], "kinds": list(kinds), "dropped": data["dropped"],
              "measures": {}}
    with evaluating(model, precision):
        for kind in kinds:
            items, specs = data[kind], _specs(kind, causal)
            u = torch.from_numpy(stream_rng(seed, STREAM_NEIGHBOURS + 3 + KINDS.index(kind), 0)
                                 .random(tuple(items["tokens"].shape)))  # [N, L] one draw per item
            drawn = {"teacher_forced": None} if causal else {f"{r:g}": u < r for r in ratios}
            raw: dict = {}
            for b in range(0, len(u), batch_size):
                _batch(model, items, torch.arange(b, min(b + batch_size, len(u))), data["images"], drawn, specs, raw)
            valid = valid_mask(items["tokens"], tok.eot_id).sum(1).double()  # [N] positions SOT..EOT
            uniform = float((1 / valid).mean())
            result["measures"] |= _summarise(raw, items, specs, seed, uniform)
    return result


def _pct(x) -> str:
    return "  -  " if x is None else f"{100 * x:5.1f}"


def format_neighbour_use(result: dict) -> str:
    """A table of :func:`neighbour_use`'s result: per measure, ratio and image the two conditions' accuracies
    (%), their difference with its 95% interval, n and, where recorded, the attention to the partner per layer
    (mean over heads / the largest head, first condition) beside the uniform share."""
    lines = [f"neighbour use: {result['objective']}, {result['n_items']} objects of {result['scenes']} scenes, "
             f"seed {result['seed']}, dropped {result['dropped']}"]
    for name, by_ratio in result["measures"].items():
        first, second = next(iter(next(iter(by_ratio.values())).values()))["conditions"]
        lines.append(f"\n{name}: {first} - {second}")
        lines.append(f"  {'r':>14}  {'image':<11} {first[:11]:>11} {second[:11]:>11}  {'diff [95%]':<22} {'n':>5}  "
                     "attention to the partner by layer (mean/max head; uniform)")
        for ratio, views in by_ratio.items():
            for view, e in views.items():
                lo, hi = e["interval"]
                diff = "  -" if e["difference"] is None else \
                    f"{100 * e['difference']:+5.1f} [{100 * lo:+5.1f}, {100 * hi:+5.1f}]"
                att = e.get("attention")
                heads = "" if att is None else " ".join(f"{m:.3f}/{x:.3f}" for m, x in zip(
                    att[first]["mean"], att[first]["max_head"])) + f"; {att['uniform']:.3f}"
                lines.append(f"  {ratio:>14}  {view:<11} {_pct(e[first]):>11} {_pct(e[second]):>11}  {diff:<22} "
                             f"{e['n']:>5}  {heads}")
    return "\n".join(lines)
