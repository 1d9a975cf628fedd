"""Scoring a compositionality suite: every candidate caption of every item under each scorer's variants,
with the image, without it (``<variant>_blind``) and debiased (``<variant>_debiased``), as
:mod:`mdc.eval.compositionality` describes; the settings travel as one :class:`SuiteOptions`.

The ELBO's noise is keyed by the item's image (a hash of its pixels, :func:`image_keys`) and the seed, not
by the item: a pair (image, caption) scores the same in every suite that holds it, and an image's candidates
share their masked copies (common random numbers). A scoring run reads each image file once, for the keys and
the pixels it scores together (:class:`_ImageCache`). :func:`score_suites` scores several suites in one pass
that scores each distinct pair once (the in-distribution suites, built from the same scenes, repeat about
40% of their pairs) and hands every suite its scores, the ones it gets alone.
"""
from __future__ import annotations

import copy
import hashlib
import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from mdc.absorbing import ElboOptions
from mdc.api import score_candidates
from mdc.data.formats import crop_box, load_image
from mdc.data.transforms import ImageTransform, normalize
from mdc.distribution import encode_null
from mdc.eval.suites import Suite, reference_images, shuffled_images
from mdc.base.options import with_options
from mdc.scoring import METHODS
from mdc.tokenizer import caption_mask

DEBIASED = ("exact", "elbo")  # scorers whose blind score is the same estimator without the image


def resolve_methods(objective: str, methods="auto") -> list[str]:
    """"auto": every scorer of the objective (ARC: exact; MDC: elbo, heuristic; CLIP: cosine);
    else the given method(s), each of which must fit the objective."""
    if methods == "auto":
        return list(METHODS[objective])
    methods = [methods] if isinstance(methods, str) else list(methods)
    known = sorted({m for ms in METHODS.values() for m in ms})
    for m in methods:
        if m not in known:
            raise ValueError(f"unknown method {m!r}; choose from {known} or 'auto'")
        if m not in METHODS[objective]:
            raise ValueError(f"method {m!r} does not fit a {objective!r} checkpoint; "
                             f"{objective!r} models are scored with {list(METHODS[objective])}")
    return methods


def variants(methods: Sequence[str], elbo_trained_t: bool = True) -> list[str]:
    """Score variants reported: each method, plus ``elbo_trained_t`` after ``elbo`` if asked."""
    return [v for m in methods for v in ([m, "elbo_trained_t"] if m == "elbo" and elbo_trained_t else [m])]


@dataclass
class SuiteScores:
    """Per-item scores of one suite: ``scores[variant]`` [N, K] and caption token counts ``tokens`` [N, K];
    ``methods[variant]`` the scorer behind each variant ("exact", "elbo", "heuristic", "cosine")."""
    suite: Suite
    scores: dict = field(default_factory=dict)
    tokens: np.ndarray | None = None
    seconds: float = 0.0
    methods: dict = field(default_factory=dict)

    def normalised(self, variant: str) -> np.ndarray:
        """Length-normalised scores [N, K]: divided by the tokens scored (+1 for exact's [EOT]); cosine as is."""
        method = self.methods.get(variant, variant)
        if method == "cosine":
            return self.scores[variant]
        return self.scores[variant] / (self.tokens + (method == "exact"))


@dataclass(frozen=True)
class SuiteOptions:
    """How a suite is scored (:func:`score_suite`, :func:`score_variants`): one default each."""
    num_samples: int = ElboOptions.num_samples  # ELBO copies per caption
    max_samples: int | None = None  # sequential ELBO: copies doubled up to this where an item is unsure
    stratified: bool = True  # the ELBO's mask counts spread by one offset
    seed: int = 0  # the ELBO's keyed noise and the reference images of the image-free scores
    paired: bool = True  # an image's candidates share their noise (common random numbers)
    elbo_trained_t: bool = True  # also the ELBO over the mask ratios the model was trained on
    blind: bool = True  # image-free and debiased scores beside each likelihood
    shuffled: bool = False  # the shuffled-image control beside each variant: another item's image (Table 2 runs: on)
    blind_images: int = 8  # reference images of a "marginal" image-free score
    debias_alpha: float = 1.0  # v_debiased = v - alpha v_blind
    batch_size: int = 32  # rows per scoring call: an image's captions, at most K (an item's) a row
    max_rows: int = 256  # masked copies in one forward pass
    device: str = "cpu"
    workers: int = 0  # image-loading workers


def suite_options(options: SuiteOptions | None = None, **kw) -> SuiteOptions:
    """``options`` (default: :class:`SuiteOptions`'s defaults) with the fields ``kw`` replaced; a ValueError
    names an unknown option."""
    return with_options(SuiteOptions, options, kw, "suite scoring")


def method_variants(model, methods, options: SuiteOptions | None = None, **kw) -> dict[str, dict]:
    """The score variants of ``methods`` (:func:`variants`) as :func:`mdc.score_candidates` keywords:
    ``{variant: {"method": ..., ...}}``; an ELBO variant's ``elbo`` (:class:`mdc.absorbing.ElboOptions`) holds
    its keyed noise and its one window: all mask ratios, or the trained ones (``config.masking.trained_window``).
    ``blind``: each likelihood variant's image-free baseline too (:func:`with_blind`)."""
    o = suite_options(options, **kw)
    elbo = ElboOptions(num_samples=o.num_samples, seed=o.seed, stratified=o.stratified, max_samples=o.max_samples)
    windows = {"elbo": (0.0, 1.0), "elbo_trained_t": model.config.masking.trained_window}
    scoring = {v: dict(method="elbo", elbo=replace(elbo, windows=windows[v]), max_rows=o.max_rows)
               if v in windows else dict(method=v)
               for v in variants(resolve_methods(model.config.objective, methods), o.elbo_trained_t)}
    scoring = with_blind(model, scoring) if o.blind else scoring
    return with_shuffled(scoring) if o.shuffled else scoring


def with_shuffled(scoring: dict[str, dict]) -> dict[str, dict]:
    """``scoring`` with ``<variant>_shuffled`` after each variant scored with an image: the same scorer and
    noise keys with another item's image (keyword ``image`` = "shuffled", the fixed derangement of
    :func:`mdc.eval.suites.shuffled_images`), the positive control of "the image decides"."""
    out = {}
    for v, kw in scoring.items():
        out[v] = kw
        if kw.get("image") is None:
            out[f"{v}_shuffled"] = dict(kw, image="shuffled")
    return out


def with_blind(model, scoring: dict[str, dict]) -> dict[str, dict]:
    """``scoring`` with ``<variant>_blind`` after each likelihood variant, the same scorer without the
    image, with the raw score's noise keys: keyword ``image`` = "null" (the learned null condition: plain
    MDC scorers of a model trained with one) or "marginal" (the log-mean-exp over reference images of
    the suite, :func:`mdc.eval.suites.reference_images`: every other scorer). Cosine has none. The ELBO's
    sequential copies (``max_samples``) are for the decisions with the image only: an image-free score
    over K images is limited by K, not by the copies, and keeps ``num_samples`` per image."""
    null = getattr(model, "cond_null", None) is not None
    out = {}
    for v, kw in scoring.items():
        out[v] = kw
        if kw["method"] != "cosine":
            plain_mdc = kw["method"] in ("elbo", "heuristic") and kw.get("guidance") is None
            blind = {k: x for k, x in kw.items() if k != "max_samples"}
            if "elbo" in blind:
                blind["elbo"] = replace(blind["elbo"], max_samples=None)
            out[f"{v}_blind"] = dict(blind, image="null" if null and plain_mdc else "marginal")
    return out


def score_suite(model, transform, suite: Suite, methods: Sequence[str], options: SuiteOptions | None = None,
                **kw) -> SuiteScores:
    """Score every candidate of every item with each method's variants (:func:`method_variants`),
    with their image-free and debiased scores unless ``blind=False``: :func:`score_suites` of one suite.
    ``options`` (or its fields as keywords, :class:`SuiteOptions`): ELBO noise is keyed by the item's image
    (:func:`image_keys`) and shared by its candidates when ``paired`` (common random numbers); ``max_rows``
    bounds the masked copies in one forward pass. ``max_samples``: ELBO copies are added, doubling, up to
    it where an item's decision with the image is within 3 standard errors
    (:func:`mdc.scoring.elbo_sequential`; image-free scores keep ``num_samples``); None: ``num_samples``."""
    options = suite_options(options, **kw)
    return score_variants(model, transform, suite, method_variants(model, methods, options), options)


def score_suites(model, transform, suites: dict[str, Suite], methods: Sequence[str],
                 options: SuiteOptions | None = None, **kw) -> dict[str, SuiteScores]:
    """:func:`score_suite` of every suite of ``suites`` ``{name: Suite}`` in one pass that scores each
    distinct (image, caption) pair once (:func:`score_suites_variants`); a suite's scores are those it
    gets alone."""
    options = suite_options(options, **kw)
    return score_suites_variants(model, transform, suites, method_variants(model, methods, options), options)


def _calls(scoring: dict[str, dict]) -> list[tuple[dict, list[tuple[str, int]]]]:
    """One scoring call per distinct set of keywords, ELBO windows aside: ``[(keywords, [(variant, column)])]``.
    ELBO variants that differ only in their window share one set of masked copies (column j of the call's
    [B, K, J] scores, J > 1; one window scores [B, K]); variants with equal keywords share their scores."""
    groups: dict[str, tuple[dict, list]] = {}
    for v, kw in scoring.items():
        elbo = kw.get("elbo")
        if elbo is not None and elbo.several:
            raise ValueError(f"variant {v!r} scores {len(elbo.windows)} ELBO windows; a variant scores one")
        rest = dict(kw, elbo=replace(elbo, windows=(0.0, 1.0))) if elbo is not None else kw
        groups.setdefault(repr(sorted(rest.items())), (rest, []))[1].append((v, elbo and elbo.windows[0]))
    calls = []
    for rest, named in groups.values():
        windows = list(dict.fromkeys(w for _, w in named if w is not None))  # in the order of first use
        kw = dict(rest, elbo=replace(rest["elbo"], windows=tuple(windows))) if windows else rest
        calls.append((kw, [(v, windows.index(w) if w is not None else -1) for v, w in named]))
    return calls


def image_keys(items, workers: int = 0) -> list[str]:
    """Per item [N], its image's noise key: a hash of the pixels it is scored on (after its crop), so items
    that show one picture share it, whatever suite they are in and wherever the file lies."""
    return _ImageCache(items, None, workers).keys


def _content_key(image) -> str:
    return "image/" + hashlib.blake2b(repr((image.mode, image.size)).encode() + image.tobytes(),
                                      digest_size=12).hexdigest()


class _Files(torch.utils.data.Dataset):
    """Distinct image files ``[(path, [bbox or None])]``, each read once: per crop of the file its noise key
    (:func:`_content_key` of the crop) and ``transform`` of it (None when there is no transform)."""

    def __init__(self, files: list[tuple[str, list]], transform=None):
        self.files, self.transform = files, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i) -> list[tuple]:
        path, boxes = self.files[i]
        image = load_image({"image_path": path})
        crops = [crop_box(image, box) for box in boxes]  # VG items: their bbox; None: the whole image
        return [(_content_key(c), None if self.transform is None else self.transform(c)) for c in crops]


def _held(transform):
    """(what the cache applies to an image, what makes a stack of its results [B, ...] the transform's
    batch): an evaluation :class:`ImageTransform`'s floats are held as its uint8 pixels, normalised per
    batch (4x less memory, the same floats bit for bit, :func:`mdc.data.transforms.normalize`); any other
    transform's output as it is."""
    if isinstance(transform, ImageTransform) and not transform.train and not transform.uint8:
        pixels = copy.copy(transform)
        pixels.uint8 = True
        return pixels, normalize
    return transform, lambda x: x


class _ImageCache:
    """One scoring run's images, each distinct file read once (its crops cut from the one read; ``workers``
    loading processes): ``keys``, per item [N] its image's noise key, and per key the image as ``transform``
    gives it (:meth:`batch`); ``transform`` None: the keys alone. Items that show one picture share its key
    and its pixels. The run holds every distinct image: 3 S^2 bytes each from an evaluation ImageTransform."""

    def __init__(self, items, transform=None, workers: int = 0):
        where = [(it["image_path"], None if it.get("bbox") is None else tuple(it["bbox"])) for it in items]
        files: dict[str, dict] = {}
        for path, box in where:
            files.setdefault(path, {})[box] = None  # a file's distinct crops, in the order of first use
        held, self._restore = _held(transform)
        loader = torch.utils.data.DataLoader(_Files([(p, list(b)) for p, b in files.items()], held),
                                             batch_size=None, num_workers=workers)
        found, self._pixels = {}, {}
        for (path, boxes), crops in zip(files.items(), loader):
            for box, (key, x) in zip(boxes, crops):
                found[path, box] = key
                if x is not None:  # a copy: a worker's tensor would hold a shared-memory file open
                    self._pixels.setdefault(key, x.clone())  # [3, S, S]
        self.keys = [found[w] for w in where]

    def batch(self, keys: Sequence[str]) -> torch.Tensor:
        """The images of ``keys`` [B] as the transform gives them, [B, 3, S, S]."""
        return self._restore(torch.stack([self._pixels[k] for k in keys]))


def _terms(suite: Suite, keys: list[str], image, paired: bool, o: SuiteOptions) -> list:
    """What each score of ``suite`` reads under a call's ``image`` keyword: per item [N] per candidate [K]
    its terms [T], each (shown image's key, noise key, caption); the noise key is the item's image's
    (with the caption when not ``paired``). T = 1; "marginal": the K' reference images (:func:`reference_images`);
    none where the suite has no other image to show."""
    if image == "marginal":
        pool, chosen = reference_images(suite, o.blind_images, o.seed)
        shown = [[keys[pool[j]] for j in row] for row in chosen.tolist()]  # [N][K']
    elif image == "shuffled":
        shown = [[keys[j]] if j >= 0 else [] for j in shuffled_images(suite, o.seed).tolist()]
    else:  # the item's own image ("null": the image is not read)
        shown = [[k] for k in keys]
    return [[[(s, keys[i] if paired else (keys[i], c), c) for s in shown[i]] for c in cands]
            for i, cands in enumerate(suite.candidates)]


def _rows(terms: list, sequential: bool, width: int) -> list[tuple]:
    """The distinct rows to score, ``(group, captions)``: a group is (shown image, noise key), the captions
    its distinct ones in runs of at most ``width``; sequential ELBO: a group is an item, (shown image, noise
    key, its candidates), scored whole (its copies depend on its decision)."""
    groups: dict[tuple, dict] = {}
    for item in terms:
        cands = tuple(t[2] for cell in item for t in cell[:1])
        for cell in item:
            for shown, key, caption in cell:
                groups.setdefault((shown, key, cands) if sequential else (shown, key), {})[caption] = None
    if sequential:
        return [(g, g[2]) for g in groups]
    return [(g, tuple(list(cs)[a:a + width])) for g, cs in groups.items() for a in range(0, len(cs), width)]


def _score_rows(model, images: _ImageCache, rows: list[tuple], kw: dict, o: SuiteOptions, paired: bool):
    """``{(group, caption): scores [J]}`` of ``rows``: rows of one length in calls of ``batch_size``, each
    row's image (the run's ``images``) encoded once, its captions keyed by the group's noise key. Rows are
    called in the order of their longest caption (less padding); keyed noise makes the order change no score."""
    by_length: dict[int, list[int]] = {}
    for r in sorted(range(len(rows)), key=lambda r: max(map(len, rows[r][1]))):
        by_length.setdefault(len(rows[r][1]), []).append(r)
    batches = [rs[a:a + o.batch_size] for rs in by_length.values() for a in range(0, len(rs), o.batch_size)]
    out = {}
    for batch in batches:
        chunk = [rows[r] for r in batch]
        x = images.batch([g[0] for g, _ in chunk])  # [B, 3, S, S]: each row's shown image
        s = score_candidates(model, x.to(o.device), [list(c) for _, c in chunk], paired=paired,
                             item_keys=[g[1] for g, _ in chunk], **kw)
        s = s.double().cpu().numpy().reshape(len(chunk), len(chunk[0][1]), -1)  # [B, K, J]
        for (g, captions), row in zip(chunk, s):
            out.update({(g, c): v for c, v in zip(captions, row)})
    return out


def _gather(terms: list, values: dict, sequential: bool, K: int, J: int) -> np.ndarray:
    """Scores [N, K, J] from the terms' values: one term its value, several their log-mean-exp (log (1/K')
    sum_k p(t | i_k)), none NaN."""
    N, T = len(terms), len(terms[0][0]) if terms and K else 0
    if T == 0:
        return np.full((N, K, J), math.nan)
    cands = [tuple(cell[0][2] for cell in item) for item in terms]
    a = np.array([[[values[((s, key, cands[i]) if sequential else (s, key), c)] for s, key, c in cell]
                   for cell in item] for i, item in enumerate(terms)]).reshape(N, K, T, J)
    return a[:, :, 0] if T == 1 else torch.from_numpy(a).logsumexp(2).numpy() - math.log(T)


def _score_call(model, images: _ImageCache, kw: dict, suites: dict[str, Suite], keys: dict,
                o: SuiteOptions) -> dict:
    """One scoring call's scores per suite, ``{name: [N, K, J]}``: the terms of every suite (:func:`_terms`),
    each distinct row scored once (:func:`_rows`, :func:`_score_rows`), handed back to every suite; ``keys``
    per suite its items' image keys, ``images`` the run's images."""
    kw = dict(kw)
    image = kw.pop("image", None)
    if image == "null":
        kw["encode"] = encode_null
    elbo = kw.get("elbo")
    sequential = elbo is not None and elbo.max_samples not in (None, elbo.num_samples)
    J = len(elbo.windows) if elbo is not None else 1
    terms = {n: _terms(s, keys[n], image, o.paired or sequential, o) for n, s in suites.items()}
    width = max((len(s.candidates[0]) for s in suites.values() if s.candidates), default=1)
    rows = _rows([item for t in terms.values() for item in t], sequential, width)  # over every suite
    values = _score_rows(model, images, rows, kw, o, o.paired or not sequential)
    return {n: _gather(t, values, sequential, len(suites[n].candidates[0]) if suites[n].candidates else 0, J)
            for n, t in terms.items()}


@torch.no_grad()
def score_variants(model, transform, suite: Suite, scoring: dict[str, dict], options: SuiteOptions | None = None,
                   **kw) -> SuiteScores:
    """Score every candidate of every item under each variant of ``scoring``, ``{name: keywords of
    mdc.score_candidates}``: :func:`score_suites_variants` of one suite."""
    return score_suites_variants(model, transform, {suite.name: suite}, scoring, options, **kw)[suite.name]


@torch.no_grad()
def score_suites_variants(model, transform, suites: dict[str, Suite], scoring: dict[str, dict],
                          options: SuiteOptions | None = None, **kw) -> dict[str, SuiteScores]:
    """Score every candidate of every item of ``suites`` under each variant of ``scoring``, ``{name: keywords
    of mdc.score_candidates}`` (``method`` and its options, e.g. ``guidance``, and ``image``: "null" or
    "marginal" for an image-free score, :func:`with_blind`; "shuffled"): one pass per distinct scorer
    (:func:`_calls`) that scores each distinct (image, caption) pair once over all the suites and hands every
    suite its scores. A pair's noise is keyed by its image (:func:`image_keys`) and ``seed``, so it scores
    the same in every suite, alone or with others, in calls of any size (up to float rounding), and an
    image's candidates share their copies when ``paired``; a sequential ELBO scores whole items. "marginal"
    is logmeanexp_k score(t | i_k) over ``blind_images`` reference images of the suite
    (:func:`reference_images`, ``seed``), keyed by the item's image as its raw score is. Every exact or ELBO
    ``v`` scored with its ``v_blind`` also gets ``v_debiased`` = v - ``debias_alpha`` v_blind. ``options``:
    :class:`SuiteOptions` (``paired``, ``batch_size``: rows of at most K captions per call, ``device``,
    ``workers``, ``blind_images``, ``seed``, ``debias_alpha`` apply here). ``seconds``: the pass's time,
    shared out by the suites' candidates."""
    o = suite_options(options, **kw)
    start, model, tok = time.time(), model.to(o.device), model.tokenizer
    images = _ImageCache([it for s in suites.values() for it in s.items], transform, o.workers)  # a file read once
    flat = iter(images.keys)
    keys = {n: [next(flat) for _ in s.items] for n, s in suites.items()}
    out = {n: SuiteScores(s, {v: None for v in scoring}, methods={v: kw["method"] for v, kw in scoring.items()})
           for n, s in suites.items()}
    for call, names in _calls(scoring):
        for n, s in _score_call(model, images, call, suites, keys, o).items():  # [N, K, J]
            out[n].scores |= {v: s[..., max(j, 0)] for v, j in names}
    counts = {n: sum(map(len, s.candidates)) for n, s in suites.items()}
    for n, s in suites.items():
        K = len(s.candidates[0]) if s.candidates else 0
        ids = tok.tokenize([c for cs in s.candidates for c in cs])[0] if K else torch.zeros(0, 2, dtype=torch.long)
        out[n].tokens = caption_mask(ids, tok.sot_id, tok.eot_id).sum(1).view(len(s.candidates), K).numpy()
        for v in scoring:
            if f"{v}_blind" in scoring and out[n].methods[v] in DEBIASED:  # log p(t | i) - alpha log p(t)
                out[n].scores[f"{v}_debiased"] = out[n].scores[v] - o.debias_alpha * out[n].scores[f"{v}_blind"]
                out[n].methods[f"{v}_debiased"] = out[n].methods[v]
        out[n].seconds = (time.time() - start) * counts[n] / max(sum(counts.values()), 1)
    return out


def save_item_scores(path: str, scored: dict[str, SuiteScores]) -> str:
    """Per-item scores as ``.npz``: ``<suite>/ids`` [N], ``<suite>/tokens`` [N, K] and
    ``<suite>/<variant>`` [N, K] (column 0 = the true caption)."""
    arrays = {}
    for name, s in scored.items():
        arrays[f"{name}/ids"] = np.array([str(it["id"]) for it in s.suite.items])
        arrays[f"{name}/tokens"] = s.tokens
        arrays |= {f"{name}/{v}": a for v, a in s.scores.items()}
    np.savez_compressed(path, **arrays)
    return path
