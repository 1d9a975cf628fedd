"""Scoring a compositionality suite: every candidate caption of every item under each scorer's variants,
with the image, without it (``<variant>_blind``) and debiased (``<variant>_debiased``), as
:mod:`mdc.eval.compositionality` describes; the settings travel as one :class:`SuiteOptions`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from mdc.absorbing import ElboOptions
from mdc.api import score_candidates
from mdc.data.formats import load_image
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


class _Images(torch.utils.data.Dataset):
    def __init__(self, items, transform):
        self.items, self.transform = items, transform

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.transform(load_image(self.items[i]))  # [3, S, S]; VG items cropped to their bbox


@dataclass(frozen=True)
class SuiteOptions:
    """How a suite is scored (:func:`score_suite`, :func:`score_variants`): one default each."""
    num_samples: int = ElboOptions.num_samples  # ELBO copies per caption
    max_samples: int | None = None  # sequential ELBO: copies doubled up to this where an item is unsure
    stratified: bool = True  # the ELBO's mask counts spread by one offset
    seed: int = 0  # the ELBO's keyed noise and the reference images of the image-free scores
    paired: bool = True  # an item's candidates share their noise (common random numbers)
    elbo_trained_t: bool = True  # also the ELBO over the mask ratios the model was trained on
    blind: bool = True  # image-free and debiased scores beside each likelihood
    shuffled: bool = False  # the shuffled-image control beside each variant: another item's image (Table 2 runs: on)
    blind_images: int = 8  # reference images of a "marginal" image-free score
    debias_alpha: float = 1.0  # v_debiased = v - alpha v_blind
    batch_size: int = 32  # items per scoring call
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
    with their image-free and debiased scores unless ``blind=False``. ``options`` (or its fields as
    keywords, :class:`SuiteOptions`): ELBO noise is keyed by the item's id (:meth:`Suite.keys`) and shared
    by its candidates when ``paired`` (common random numbers); ``max_rows`` bounds the masked copies in
    one forward pass. ``max_samples``: ELBO copies are added, doubling, up to it where an item's decision
    with the image is within 3 standard errors (:func:`mdc.scoring.elbo_sequential`; image-free scores
    keep ``num_samples``); None: ``num_samples``."""
    options = suite_options(options, **kw)
    return score_variants(model, transform, suite, method_variants(model, methods, options), options)


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


@torch.no_grad()
def score_variants(model, transform, suite: Suite, scoring: dict[str, dict], options: SuiteOptions | None = None,
                   **kw) -> SuiteScores:
    """Score every candidate of every item under each variant of ``scoring``, ``{name: keywords of
    mdc.score_candidates}`` (``method`` and its options, e.g. ``guidance``, and ``image``: "null" or
    "marginal" for an image-free score, :func:`with_blind`): the candidates of ``batch_size`` items in
    one call per distinct scorer (:func:`_calls`), each image encoded once per call. "marginal" is
    logmeanexp_k score(t | i_k) over ``blind_images`` reference images (:func:`reference_images`,
    ``seed``). Every exact or ELBO ``v`` scored with its ``v_blind`` also gets ``v_debiased`` =
    v - ``debias_alpha`` v_blind. ``options``: :class:`SuiteOptions` (``paired``, ``batch_size``, ``device``,
    ``workers``, ``blind_images``, ``seed``, ``debias_alpha`` apply here)."""
    o = suite_options(options, **kw)
    start, model = time.time(), model.to(o.device)
    keys, tok = suite.keys(), model.tokenizer
    out = SuiteScores(suite, {v: [] for v in scoring}, methods={v: kw["method"] for v, kw in scoring.items()})
    tokens = []
    dataset = _Images(suite.items, transform)
    pool, chosen = reference_images(suite, o.blind_images, o.seed)
    other = shuffled_images(suite, o.seed)  # [N] the shuffled-image control's pairing
    if any(kw.get("image") == "marginal" for kw in scoring.values()) and pool:
        pool_images = torch.stack([dataset[i] for i in pool]).to(o.device)  # [P, 3, S, S]
    calls = _calls(scoring)
    first = 0
    for images in torch.utils.data.DataLoader(dataset, batch_size=o.batch_size, num_workers=o.workers):
        images, rows = images.to(o.device), slice(first, first + len(images))  # [B, 3, S, S]
        cands, first = suite.candidates[rows], first + len(images)
        ids = tok.tokenize([c for cs in cands for c in cs])[0]  # [B*K, L]
        tokens.append(caption_mask(ids, tok.sot_id, tok.eot_id).sum(1).view(len(cands), -1).numpy())
        for kw, names in calls:
            kw = dict(kw)
            image = kw.pop("image", None)
            if image == "null":
                kw["encode"] = encode_null
            score = lambda x: score_candidates(model, x, cands, paired=o.paired, item_keys=keys[rows], **kw)  # noqa: E731
            if image == "shuffled" and (other[rows] < 0).any():  # a suite of one image has no other image
                s = torch.full((len(cands), len(cands[0])), math.nan, dtype=torch.float64)
            elif image == "shuffled":
                s = score(torch.stack([dataset[j] for j in other[rows].tolist()]).to(o.device)).double()
            elif image != "marginal":
                s = score(images).double()
            elif chosen.shape[1] == 0:  # a suite of one image has no other image
                s = torch.full((len(cands), len(cands[0])), math.nan, dtype=torch.float64)
            else:  # log (1/K) sum_k p(t | i_k)
                k = torch.as_tensor(chosen[rows], device=o.device)  # [B, K]
                s = torch.stack([score(pool_images[k[:, j]]).double() for j in range(k.shape[1])])
                s = s.logsumexp(0) - math.log(k.shape[1])
            s = s.cpu().numpy()  # [B, K] or [B, K, J]
            for v, j in names:
                out.scores[v].append(s[..., j] if s.ndim == 3 else s)
    K = len(suite.candidates[0]) if suite.candidates else 0
    out.scores = {v: np.concatenate(s) if s else np.zeros((0, K)) for v, s in out.scores.items()}
    for v in scoring:
        if f"{v}_blind" in scoring and out.methods[v] in DEBIASED:  # log p(t | i) - alpha log p(t)
            out.scores[f"{v}_debiased"] = out.scores[v] - o.debias_alpha * out.scores[f"{v}_blind"]
            out.methods[f"{v}_debiased"] = out.methods[v]
    out.tokens = np.concatenate(tokens) if tokens else np.zeros((0, K), dtype=np.int64)
    out.seconds = time.time() - start
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
