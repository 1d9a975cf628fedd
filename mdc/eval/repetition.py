"""Repetition in descriptive captions: does a captioner name one shape twice in the object list?

Scenes come fresh from the synthetic world (:func:`mdc.world.graphs.sample_scene`), each with its true caption
in the descriptive style (:func:`mdc.world.text.descriptive_plan`), rendered at the model's image size. Scene i's
*true length* L_i is its caption's token count under the model's tokenizer (SOT and EOT not counted); a scene
whose caption does not fit the context (L_i + 2 > ``context_length``) is dropped and counted. The model writes
each caption at its scene's L_i (:func:`mdc.api.generate`, a batch holds one length): MDC exactly L_i tokens by
greedy confidence unmasking; ARC beam search (``beam_size``) with ``min_length = length = L_i``, so [EOT] is
held back until L_i tokens and forced after them: every hypothesis, the best included, has exactly L_i tokens.

Views: ``own`` (scene i's image), ``other_image`` (scene i shown the image of scene i + 1, cyclically, at its
own L_i) and ``references`` (the true captions, no model: the world's ceiling). A caption's *object list* is its
text after the first ':' up to the next '.' (the end where none); later sentences re-mention objects by
relation, so only the list is read. A list that names no shape word counts as none.

Measures per view, shares over captions in [0, 1] (a caption without a list counts as naming nothing):

- ``shape_twice``: some shape word occurs at least twice in the list (no scene holds a shape twice);
  ``shape_twice_many``: the same over the scenes of two objects or more, the lists with room for a repeat;
- ``pairs_exist``: of the list's colour-shape pairs (a colour word followed by a shape word, only size and
  texture words between them), the share whose (colour, shape) an object of scene i has, pooled over pairs
  (``n_pairs`` of them); ``pairs_exist_caption``: the mean of each caption's share, over captions with a pair.
  Every view is judged against scene i, the scene whose length the caption takes, so ``other_image`` is what
  a caption of an unrelated image matches by chance;
- ``no_list``: no parsable list; ``objects_named``: mean shape words in the list; ``objects_true``: mean
  objects per scene; ``exact_length``: captions of exactly L_i tokens.

``differences``: own minus other_image per scene for ``pairs_exist_caption`` (scenes with a pair in both) and
``shape_twice``, with a 95% percentile bootstrap interval over scenes. Randomness: scene i from stream
``STREAM_REPETITION``, its caption ``+ 1`` (:mod:`mdc.world.streams`). Nothing depends on ``batch_size``.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from mdc.api import generate
from mdc.base.seeding import key_seed
from mdc.data.transforms import image_transform
from mdc.eval.neighbours import paired_interval
from mdc.tokenizer import valid_mask
from mdc.unmasking import Unmasking, decoder_options
from mdc.world.graphs import sample_scene
from mdc.world.render import COLOURS, SHAPES, render
from mdc.world.streams import STREAM_REPETITION, stream_rng
from mdc.world.text import SIZE_WORDS, TEXTURE_ADJ, descriptive_plan, render_descriptive, word_tokens

__all__ = ["VIEWS", "descriptive_repetition", "format_repetition", "object_list", "make_scenes", "scene_captions",
           "view_measures"]

VIEWS = ("own", "other_image", "references")
BETWEEN = frozenset(w for table in (SIZE_WORDS, TEXTURE_ADJ) for words in table.values() for w in words)
N_EXAMPLES = 4


# ------------------------------------------------------------------------------------------------ parsing
def object_list(caption: str) -> dict | None:
    """The object list of ``caption`` (module docstring): ``shapes``, its shape words in order, and ``pairs``,
    its (colour, shape) pairs; None where there is no ':' or the text after it names no shape before a '.'."""
    _, colon, rest = caption.partition(":")
    words = word_tokens(rest.split(".")[0])
    shapes = [w for w in words if w in SHAPES]
    if not colon or not shapes:
        return None
    pairs = []
    for k, word in enumerate(words):
        if word in COLOURS:
            j = k + 1
            while j < len(words) and words[j] in BETWEEN:
                j += 1
            if j < len(words) and words[j] in SHAPES:
                pairs.append((word, words[j]))
    return {"shapes": shapes, "pairs": pairs}


def _caption_row(caption: str, scene: dict) -> dict:
    """One caption's parts of the measures, judged against ``scene``."""
    parsed = object_list(caption)
    shapes, pairs = (parsed["shapes"], parsed["pairs"]) if parsed else ([], [])
    truth = {(o["colour"], o["shape"]) for o in scene["objects"]}
    hits = [p in truth for p in pairs]
    return {"no_list": parsed is None, "twice": bool(shapes) and max(Counter(shapes).values()) >= 2,
            "named": len(shapes), "hits": sum(hits), "pairs": len(hits),
            "share": sum(hits) / len(hits) if hits else None}


def view_measures(captions: list[str], scenes: list[dict], lengths=None, target=None) -> tuple[dict, list[dict]]:
    """The measures (module docstring) of ``captions`` [S] against ``scenes`` [S], with the rows per caption;
    ``lengths`` [S] the captions' token counts and ``target`` [S] the true lengths (None: exact by definition)."""
    rows = [_caption_row(c, s) for c, s in zip(captions, scenes)]
    shares = [r["share"] for r in rows if r["share"] is not None]
    n_pairs = sum(r["pairs"] for r in rows)
    exact = 1.0 if lengths is None else float(np.mean([a == b for a, b in zip(lengths, target)]))
    many = [r["twice"] for r, s in zip(rows, scenes) if len(s["objects"]) > 1]
    out = {"shape_twice": float(np.mean([r["twice"] for r in rows])),
           "shape_twice_many": float(np.mean(many)) if many else None,
           "pairs_exist": sum(r["hits"] for r in rows) / n_pairs if n_pairs else None,
           "pairs_exist_caption": float(np.mean(shares)) if shares else None, "n_pairs": n_pairs,
           "no_list": float(np.mean([r["no_list"] for r in rows])),
           "objects_named": float(np.mean([r["named"] for r in rows])),
           "objects_true": float(np.mean([len(s["objects"]) for s in scenes])), "exact_length": exact}
    return out, rows


# ------------------------------------------------------------------------------------------------- scenes
def make_scenes(tok, n_scenes: int, seed: int, image_size: int, context_length: int) -> dict:
    """Scenes 0..n_scenes-1 of ``seed`` that fit the context: ``scenes`` [S], ``texts`` [S] (true captions),
    ``lengths`` [S] (their token counts, SOT/EOT not counted), ``images`` [S, 3, s, s] (CLIP-normalised) and
    ``dropped``, the scenes whose caption exceeds ``context_length``."""
    transform = image_transform(image_size, train=False)
    scenes, texts, lengths, images, dropped = [], [], [], [], 0
    for i in range(n_scenes):
        scene = sample_scene(stream_rng(seed, STREAM_REPETITION, i))
        text = render_descriptive(descriptive_plan(scene, stream_rng(seed, STREAM_REPETITION + 1, i)))
        n = len(tok.encode(text))
        if n + 2 > context_length:
            dropped += 1
            continue
        scenes.append(scene)
        texts.append(text)
        lengths.append(n)
        images.append(transform(render(scene, image_size)))
    if not scenes:
        raise ValueError(f"no descriptive caption of {n_scenes} scenes fits a context of {context_length} tokens")
    return {"scenes": scenes, "texts": texts, "lengths": lengths, "images": torch.stack(images), "dropped": dropped}


# ------------------------------------------------------------------------------------------------ decoding
def _draws(decoding: dict) -> bool:
    """Whether MDC's ``decoding`` (a named ``decoder`` and :class:`mdc.unmasking.Unmasking` fields) draws."""
    o = Unmasking(**decoder_options(decoding.get("decoder"), {k: v for k, v in decoding.items() if k != "decoder"}))
    return o.temperature > 0 or o.order == "random"


def scene_captions(model, images, lengths: list[int], *, shift: int = 0, batch_size: int = 64, beam_size: int = 6,
                   seed: int = 0, **decoding):
    """Scene i's caption at length ``lengths[i]`` from the image of scene i + ``shift`` (cyclically), scenes
    grouped by length: (captions [S], their token counts [S]). A length None is the model's own: ARC's beam ends
    at its [EOT] (at most the context), a hidden-length MDC at its first [EOT]. ``decoding``: MDC's decoder
    (``mdc.generate``'s ``decoder`` and its options); one that draws decodes each scene alone with a generator
    of (``seed``, scene), so no caption depends on ``batch_size``."""
    if model.causal and decoding:
        raise ValueError(f"{sorted(decoding)} are options of MDC's decoders; ARC decodes by beam search")
    tok, device = model.tokenizer, next(model.parameters()).device
    S, alone = len(lengths), bool(decoding) and _draws(decoding)
    captions, counts = [""] * S, [0] * S
    for L in sorted(set(lengths), key=lambda v: (v is not None, v or 0)):
        group = [i for i in range(S) if lengths[i] == L]
        length = model.config.context_length - 2 if L is None and model.causal else L
        exact = {"min_length": L} if model.causal and L is not None else {}
        for b in range(0, len(group), 1 if alone else batch_size):
            rows = group[b:b + (1 if alone else batch_size)]
            shown = images[[(i + shift) % S for i in rows]].to(device)  # [R, 3, s, s]
            drawn = {"generator": torch.Generator(device).manual_seed(key_seed(seed, rows[0]))} if alone else {}
            tokens = generate(model, shown, length, beam_size=beam_size, return_tokens=True, **exact, **drawn,
                              **decoding).cpu()  # [R, L']
            n = valid_mask(tokens, tok.eot_id).sum(1) - 2  # [R] tokens between SOT and the first EOT
            for i, row, k in zip(rows, tokens, n.tolist()):
                captions[i], counts[i] = tok.decode(row), k
    return captions, counts


def _difference(own: list[dict], other: list[dict], key: str, seed: int) -> dict:
    """Own minus other_image per scene of a per-caption value, over scenes where both have one (one scene, one
    value: the bootstrap resamples scenes)."""
    both = [(a[key], b[key]) for a, b in zip(own, other) if a[key] is not None and b[key] is not None]
    diff = np.array([float(a) - float(b) for a, b in both])  # [n]
    if not len(diff):
        return {"difference": None, "n": 0, "interval": [None, None]}
    interval = paired_interval(diff, np.arange(len(diff)), seed)
    return {"difference": float(diff.mean()), "n": len(diff), "interval": interval}


@torch.no_grad()
def descriptive_repetition(model, n_scenes: int = 300, seed: int = 0, batch_size: int = 64,
                           beam_size: int = 6) -> dict:
    """The repetition measures (module docstring) of a captioner (MDC or ARC) on ``n_scenes`` fresh scenes of
    ``seed``, as plain JSON-able numbers: ``views[view]`` the measures of ``own``, ``other_image`` and
    ``references``; ``differences`` own - other_image; ``n_scenes`` (measured), ``dropped``, ``lengths``
    (mean, max of L_i) and ``examples`` (true, own caption) of the first scenes."""
    if n_scenes < 1 or batch_size < 1 or beam_size < 1:
        raise ValueError(f"n_scenes, batch_size and beam_size must be >= 1; got {n_scenes}, {batch_size}, "
                         f"{beam_size}")
    data = make_scenes(model.tokenizer, n_scenes, seed, model.config.image_size, model.config.context_length)
    scenes, lengths = data["scenes"], data["lengths"]
    views, rows, captions = {}, {}, {}
    for view, shift in (("own", 0), ("other_image", 1)):
        captions[view], counts = scene_captions(model, data["images"], lengths, shift=shift, batch_size=batch_size,
                                                beam_size=beam_size)
        views[view], rows[view] = view_measures(captions[view], scenes, counts, lengths)
    views["references"], _ = view_measures(data["texts"], scenes)
    examples = [{"true": t, "own": c} for t, c in zip(data["texts"][:N_EXAMPLES], captions["own"])]
    differences = {"pairs_exist_caption": _difference(rows["own"], rows["other_image"], "share", seed),
                   "shape_twice": _difference(rows["own"], rows["other_image"], "twice", seed)}
    return {"objective": "arc" if model.causal else "mdc", "seed": seed, "beam_size": beam_size, "views": views,
            "differences": differences, "n_scenes": len(scenes), "dropped": data["dropped"],
            "lengths": {"mean": float(np.mean(lengths)), "max": int(max(lengths))}, "examples": examples}


def _pct(x) -> str:
    return "    -" if x is None else f"{100 * x:5.1f}"


def format_repetition(result: dict) -> str:
    """A table of :func:`descriptive_repetition`'s result: per view the shares (%) and counts, then the own -
    other_image differences with their 95% intervals."""
    lines = [f"descriptive repetition: {result['objective']}, {result['n_scenes']} scenes (dropped "
             f"{result['dropped']}), length mean {result['lengths']['mean']:.1f} max {result['lengths']['max']}",
             f"  {'view':<12} {'twice':>6} {'many':>6} {'pairs':>6} {'p/capt':>6} {'n_pairs':>7} {'nolist':>6} "
             f"{'named':>5} {'true':>5} {'exact':>6}"]
    for view, m in result["views"].items():
        lines.append(f"  {view:<12} {_pct(m['shape_twice']):>6} {_pct(m['shape_twice_many']):>6} "
                     f"{_pct(m['pairs_exist']):>6} "
                     f"{_pct(m['pairs_exist_caption']):>6} {m['n_pairs']:>7} {_pct(m['no_list']):>6} "
                     f"{m['objects_named']:5.2f} {m['objects_true']:5.2f} {_pct(m['exact_length']):>6}")
    for key, d in result["differences"].items():
        lo, hi = d["interval"]
        diff = "  -" if d["difference"] is None else \
            f"{100 * d['difference']:+5.1f} [{100 * lo:+5.1f}, {100 * hi:+5.1f}]"
        lines.append(f"  own - other_image, {key}: {diff} (n {d['n']})")
    return "\n".join(lines)
