"""Guidance for MDC captioners (MC-Diffusion, Definitions 1 and 2, Algorithm 1).

Condition variants. The decoder's condition y is the projected image tokens [B, T, W]
(:meth:`mdc.model.Captioner.condition`). Two learned vectors of width W make its variants:

- null condition (CFG, ``cond_drop_prob`` = P_cond): every token of y replaced by ``cond_null``;
- partial condition (y_[M], y_o) (MCS, ``cond_mask_prob`` = P_mask): each token of y replaced
  by ``cond_mask`` with probability P_mask (the paper's Eq. for y_i).

They exist only in models trained with the option on, so older checkpoints load unchanged.
The ViT's tokens are contextualised, so a masked token's content still leaks through its
neighbours; with VQ-VAE codes (:mod:`mdc.vqvae`, MC-Diffusion's setup) tokens are local.

Training (:func:`training_condition`, called by the MDC and D3PM losses). Per caption one
uniform u: u < P_cond(CFG) -> null condition; P_cond(CFG) <= u < P_cond(CFG) + P_cond(MCS)
-> partial condition (Algorithm 1's branch "p < P_cond: mask some entries", P_cond(MCS) =
``cond_mask_select_prob``, 0.1 in the paper); otherwise the full condition. The two events
are disjoint, so one checkpoint serves both CFG and MCS. Both options off: no draw at all.

Sampling and scoring combine log-probabilities over caption tokens (as
:func:`mdc.diffusion.caption_log_probs`) and renormalise with a log-softmax:

- CFG (Definition 1):       (1 - g) log p(x | null) + g log p(x | y);   g = 1 is the plain model;
- MCS (Definition 2, as printed): g log p(x | y_[M], y_o) + (1 - g) log p(x | y);   g = 0 is the plain model.

(As printed, MCS with g > 1 extrapolates *towards* the partial condition; the form that
mirrors CFG would swap the two weights. We implement the paper's formula.) At the unguided
scale the extra pass is skipped, so the result is exactly the plain model's. Otherwise the
conditional and the variant rows go through the decoder together: one call on 2B rows.
The partial condition of guided sampling masks each image token with probability P_mask,
drawn from a CPU generator seeded by ``guidance_seed`` (the same images and seed give the
same masks on any device); the scorers key it by the item, like the ELBO noise.

Asking for guidance a model was not trained for (no ``cond_null`` / ``cond_mask``) is a
ValueError: the variant would be an embedding the model never learnt, so the "guided"
numbers would mean nothing. Unknown names and negative scales are ValueErrors too.

Results of ``notebooks/guidance.ipynb`` (``kind="guidance"``, :mod:`mdc.eval.results`)::

    {
      "dataset": {"captions_json", "format", "split", "images": int},
      "length": int,                       # MDC caption length (tokens)
      "runs": [{"label": "none" | "cfg@2" | "mcs@0.5" | ...,   # scale_label(guidance, scale)
                "guidance": "none" | "cfg" | "mcs", "scale": float | null,
                "bleu4", "meteor", "cider": float | null,      # pycocoevalcap fractions; null: not computed
                "clipscore", "refclipscore": float | null,     # mean over images; null: no CLIP
                "unavailable": {metric: why}}],                # the unguided run first
      "clip": {"checkpoint", "kind": "mdc" | "open_clip", "prefix"} | null,
      "unavailable": {metric: why},        # e.g. "clipscore": no clip_checkpoint given
      "compositionality": null | {"method": "heuristic" | "elbo",
                "table2": {label (+ "_lengthnorm"): {column: accuracy}},
                "columns": {column: {label: {"accuracy", "ci": [lo, hi]}}}},  # synthetic suites
      "files": {"predictions": path, "figure": path}   # {label: {image_id: caption}}; the trade-off figure
    }
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

from mdc.diffusion import caption_log_probs

GUIDANCE = ("cfg", "mcs")
UNGUIDED = {"cfg": 1.0, "mcs": 0.0}  # the scale at which each rule is the plain conditional model
_NEEDS = {"cfg": ("cond_drop_prob", "cond_null", "null condition"), "mcs": ("cond_mask_prob", "cond_mask", "mask embedding")}


def check_guidance(model, guidance: str | None, scale: float | None) -> None:
    """ValueError naming the value: unknown guidance, a missing or negative scale, a model not trained for it."""
    if guidance is None:
        if scale is not None:
            raise ValueError(f"guidance_scale = {scale} given without guidance; pass guidance='cfg' or 'mcs'")
        return
    if guidance not in GUIDANCE:
        raise ValueError(f"unknown guidance {guidance!r}; choose one of {GUIDANCE} or None")
    if scale is None:
        raise ValueError(f"guidance={guidance!r} needs a guidance_scale (unguided: {UNGUIDED[guidance]})")
    if not float(scale) >= 0.0:  # also NaN
        raise ValueError(f"guidance_scale must be >= 0; got {scale}")
    if model.config.objective != "mdc":
        raise ValueError(f"guidance applies to 'mdc' captioners; got objective {model.config.objective!r}")
    option, param, what = _NEEDS[guidance]
    if getattr(model, param, None) is None:
        raise ValueError(f"guidance={guidance!r} needs a model trained with {option} > 0 (its learned {what}); "
                         f"this model has {option} = {getattr(model.config, option)}. Train with e.g. "
                         f"{option}=0.1 (MC-Diffusion's value)")


def num_image_tokens(model) -> int:
    """T, the number of condition tokens per image."""
    return getattr(model.visual, "num_tokens", None) or model.visual.patch_embed.num_patches


def vary_condition(model, v: torch.Tensor, null=None, token_mask=None) -> torch.Tensor:
    """y [B, T, W] with the rows ``null`` [B] replaced by the null condition and the tokens
    ``token_mask`` [B, T] by the mask embedding. ``torch.where`` keeps both vectors in the graph
    (zero gradient where unused), so DDP sees every parameter used."""
    if null is not None:
        v = torch.where(null[:, None, None], model.cond_null.to(v.dtype), v)
    if token_mask is not None:
        v = torch.where(token_mask[..., None], model.cond_mask.to(v.dtype), v)
    return v


def training_condition(model, batch: int, generator=None, device=None) -> dict:
    """``model.context`` keywords for one training batch (module docstring): {} when both
    options are off, else ``null`` [B] and/or ``token_mask`` [B, T] (bool)."""
    cfg = model.config
    if cfg.cond_drop_prob == 0 and cfg.cond_mask_prob == 0:
        return {}
    u = torch.rand(batch, generator=generator, device=device)  # [B] one draw per caption
    out = {}
    if cfg.cond_drop_prob > 0:
        out["null"] = u < cfg.cond_drop_prob
    if cfg.cond_mask_prob > 0:
        selected = (u >= cfg.cond_drop_prob) & (u < cfg.cond_drop_prob + cfg.cond_mask_select_prob)  # [B]
        p = torch.rand(batch, num_image_tokens(model), generator=generator, device=device)  # [B, T]
        out["token_mask"] = selected[:, None] & (p < cfg.cond_mask_prob)
    return out


def mcs_token_mask(model, batch: int, seed: int = 0, keys: Sequence[Hashable] | None = None) -> torch.Tensor:
    """Partial-condition masks [B, T] (bool, CPU): each token with probability P_mask. From one
    generator seeded by ``seed``, or, given ``keys`` [B], one generator per (seed, key)."""
    T, p = num_image_tokens(model), model.config.cond_mask_prob
    if keys is None:
        return torch.rand(batch, T, generator=torch.Generator().manual_seed(seed)) < p
    from mdc.scoring import _key_seed

    return torch.stack([torch.rand(T, generator=torch.Generator().manual_seed(_key_seed(seed, ("mcs", k)))) < p
                        for k in keys])


def combine(lp_cond: torch.Tensor, lp_var: torch.Tensor, guidance: str, scale: float, tok,
            temperature: float | None = None) -> torch.Tensor:
    """Guided log p [..., V] from log p(x | y) and log p(x | variant) (module docstring), divided
    by ``temperature`` if given, renormalised over caption tokens."""
    w = scale if guidance == "cfg" else 1.0 - scale  # weight of log p(x | y)
    lp_cond, lp_var = torch.nan_to_num(lp_cond, neginf=0.0), torch.nan_to_num(lp_var, neginf=0.0)  # banned ids
    mixed = w * lp_cond + (1.0 - w) * lp_var
    return caption_log_probs(mixed if temperature is None else mixed / temperature, tok)


class Guide:
    """The caption distribution of a batch of encoded images, guided or not: what the sampler
    and the MDC scorers query. Guided, ``context`` holds 2B rows: the B full conditions, then
    their B variants; each query decodes the token rows against both in one decoder call."""

    def __init__(self, model, context, guidance: str | None = None, scale: float | None = None):
        self.model, self.context, self.guidance, self.scale = model, context, guidance, scale
        self.guided = not is_unguided(guidance, scale)

    @classmethod
    def of(cls, model, images, guidance=None, scale=None, *, seed: int = 0, keys=None) -> "Guide":
        """Encode ``images`` [B, 3, S, S] once; MCS masks from ``seed`` (and ``keys`` [B] if given)."""
        check_guidance(model, guidance, scale)
        if is_unguided(guidance, scale):  # exactly the plain model: no second pass
            return cls(model, model.context(images))
        v = model.condition(images)  # [B, T, W]
        if guidance == "cfg":
            variant = vary_condition(model, v, null=torch.ones(len(v), dtype=torch.bool, device=v.device))
        else:
            variant = vary_condition(model, v, token_mask=mcs_token_mask(model, len(v), seed, keys).to(v.device))
        return cls(model, model.kv_context(torch.cat([v, variant])), guidance, scale)  # [2B, T, W]

    def __len__(self) -> int:  # images
        return len(self.context) // (2 if self.guided else 1)

    def select(self, rows: torch.Tensor) -> "Guide":
        """The guide of images ``rows`` [R] (repeats allowed)."""
        rows = torch.cat([rows, rows + len(self)]) if self.guided else rows
        return Guide(self.model, self.context.select(rows), self.guidance, self.scale)

    def log_probs(self, tokens: torch.Tensor, where: torch.Tensor | None = None,
                  temperature: float | None = None) -> torch.Tensor:
        """log p over caption tokens: [R, L, V] for token rows [R, L] (row r against image r),
        or [M, V] at the positions ``where`` [R, L] only; divided by ``temperature`` if given."""
        model, tok = self.model, self.model.tokenizer
        rows = tokens.repeat(2, 1) if self.guided else tokens  # [kR, L], k = 2 guided, else 1
        if where is None:
            logits = model.logits(rows, self.context)  # [kR, L, V]
        else:
            where = where.repeat(2, 1) if self.guided else where
            logits = model.head(model.hidden(rows, self.context)[where])  # [kM, V]
        if not self.guided:
            return caption_log_probs(logits if temperature is None else logits / temperature, tok)
        cond, variant = (caption_log_probs(x, tok) for x in logits.chunk(2))
        return combine(cond, variant, self.guidance, self.scale, tok, temperature)


def as_guide(model, context) -> Guide:
    """A :class:`Guide` as is; an :class:`mdc.model.ImageContext` as the unguided guide."""
    return context if isinstance(context, Guide) else Guide(model, context)


def scale_label(guidance: str | None, scale: float | None) -> str:
    """"none", "cfg@2", "mcs@0.5": a run's name in results and figures."""
    return "none" if guidance is None else f"{guidance}@{scale:g}"


def is_unguided(guidance: str | None, scale: float | None) -> bool:
    """No guidance, or the scale at which the rule is the plain conditional model."""
    return guidance is None or float(scale) == UNGUIDED[guidance]


# ----------------------------------------------------------------------------- evaluation (notebooks/guidance.ipynb)
def sweep_settings(scales: Sequence[float], guidances: Sequence[str] = GUIDANCE) -> list[tuple]:
    """[(None, None), (guidance, scale) for each guidance and scale]: the unguided run first."""
    for g in guidances:
        if g not in GUIDANCE:
            raise ValueError(f"unknown guidance {g!r}; choose from {GUIDANCE}")
    for s in scales:
        if not float(s) >= 0:
            raise ValueError(f"guidance scales must be >= 0; got {s}")
    return [(None, None)] + [(g, float(s)) for g in guidances for s in scales]


@torch.no_grad()
def caption_sweep(model, items: Sequence[dict], settings: Sequence[tuple], *, length: int = 15, batch_size: int = 32,
                  device: str = "cpu", seed: int = 0) -> dict[str, dict]:
    """``{label: {image_id: caption}}`` (labels of :func:`scale_label`): MDC captions of every item
    under each (guidance, scale). MCS masks of the batch starting at item i use seed ``seed + i``."""
    from mdc.data.formats import load_image
    from mdc.factory import image_transform
    from mdc.sampler import generate

    for g, s in settings:
        check_guidance(model, g, s)
    model.to(device).eval()
    transform, out = image_transform(model), {scale_label(g, s): {} for g, s in settings}
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        images = torch.stack([transform(load_image(it)) for it in batch]).to(device)  # [B, 3, S, S]
        for g, s in settings:
            caps = generate(model, images, length, guidance=g, guidance_scale=s, guidance_seed=seed + start)
            out[scale_label(g, s)].update({it["image_id"]: c for it, c in zip(batch, caps)})
    return out


def clipscore_sweep(clip: str, items: Sequence[dict], captions: dict[str, dict], *, prefix: str | None = None,
                    device: str = "cpu") -> tuple[dict | None, dict | None, str | None]:
    """Mean CLIPScore and RefCLIPScore per label: ``({label: {clipscore, refclipscore}}, clip info, None)``,
    or ``(None, None, why)`` without a CLIP (``clip = ""``)."""
    if not clip:
        return None, None, ("no clip_checkpoint given: CLIPScore needs a CLIP (a checkpoint trained with "
                            "objective 'clip', or 'open_clip:<arch>:<local weights file>')")
    from mdc.data.formats import load_image
    from mdc.eval.clipscore import clip_scores, load_clip

    model = load_clip(clip, prefix, device)
    images, refs = [load_image(it) for it in items], [it["references"] for it in items]
    scores = {}
    for label, caps in captions.items():
        s = clip_scores(model, images, [caps[it["image_id"]] for it in items], refs)
        scores[label] = {k: float(v.mean()) for k, v in s.items()}
    return scores, {"checkpoint": clip, "kind": model.kind, "prefix": model.prefix}, None


def guidance_results(settings: Sequence[tuple], metrics: dict, clip: dict | None, clip_info: dict | None,
                     clip_reason: str | None, *, dataset: dict, length: int) -> dict:
    """The ``results`` of a guidance results file (module docstring) from :func:`caption_sweep`'s
    labels, ``mdc.eval.captioning.evaluate_captions``' ``metrics`` and :func:`clipscore_sweep`."""
    runs, unavailable, reported = [], {}, ("bleu4", "meteor", "cider")
    for g, s in settings:
        label, m = scale_label(g, s), metrics[scale_label(g, s)]
        c, missing = (clip or {}).get(label, {}), {k: v for k, v in m["unavailable"].items() if k in reported}
        runs.append({"label": label, "guidance": g or "none", "scale": s, **{k: m[k] for k in reported},
                     "clipscore": c.get("clipscore"), "refclipscore": c.get("refclipscore"), "unavailable": missing})
        for key, why in missing.items():
            unavailable.setdefault(key, why)
    if clip_reason:
        unavailable["clipscore"] = unavailable["refclipscore"] = clip_reason
    return {"dataset": dict(dataset), "length": length, "runs": runs, "clip": clip_info, "unavailable": unavailable}


@torch.no_grad()
def guided_compositionality(model, suites: dict, settings: Sequence[tuple], *, method: str = "heuristic",
                            num_samples: int = 256, seed: int = 0, batch_size: int = 32, device: str = "cpu",
                            resamples: int = 200) -> dict:
    """Does guided scoring change compositionality? Every suite (``mdc.eval.compositionality.load_suites``)
    scored by the MDC scorer ``method`` under each (guidance, scale), aggregated as Table 2
    (``summarise``). Returns ``{"method", "table2": {label: {column: accuracy}}`` (plus
    ``label_lengthnorm``), ``"columns": {column: {label: {"accuracy", "ci"}}}}``."""
    import numpy as np

    from mdc.data.formats import load_image
    from mdc.eval import compositionality as comp
    from mdc.factory import image_transform
    from mdc.scoring import score_candidates
    from mdc.tokenizer import caption_mask

    for g, s in settings:
        check_guidance(model, g, s)
    model.to(device).eval()
    transform, tok, kw = image_transform(model), model.tokenizer, dict(num_samples=num_samples, seed=seed)
    scored = {}
    for name, suite in suites.items():
        out, tokens, keys = comp.SuiteScores(suite, {scale_label(g, s): [] for g, s in settings}), [], suite.keys()
        for start in range(0, len(suite.items), batch_size):
            rows = slice(start, start + batch_size)
            images = torch.stack([transform(load_image(it)) for it in suite.items[rows]]).to(device)
            cands = suite.candidates[rows]
            ids = tok.tokenize([c for cs in cands for c in cs])[0]  # [B*K, L]
            tokens.append(caption_mask(ids, tok.sot_id, tok.eot_id).sum(1).view(len(cands), -1).numpy())
            for g, s in settings:
                got = score_candidates(model, images, cands, method, item_keys=keys[rows], guidance=g,
                                       guidance_scale=s, **(kw if method == "elbo" else {}))  # [B, K]
                out.scores[scale_label(g, s)].append(got.double().cpu().numpy())
        K = len(suite.candidates[0]) if suite.candidates else 0  # a suite may be left without items
        out.scores = {k: np.concatenate(v) if v else np.zeros((0, K)) for k, v in out.scores.items()}
        out.tokens = np.concatenate(tokens) if tokens else np.zeros((0, K), dtype=np.int64)
        scored[name] = out
    summary = comp.summarise(scored, resamples=resamples, seed=seed)
    columns = {c: {v: {"accuracy": e["scores"][v]["accuracy"], "ci": e["scores"][v]["ci"]} for v in e["scores"]}
               for c, e in summary["columns"].items()}
    return {"method": method, "table2": summary["table2"], "columns": columns}


def runs_markdown(results: dict) -> str:
    """The runs of a guidance ``results`` as a Markdown table (metrics in %, CLIPScores as is, "-" where missing)."""
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    num = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    lines = ["| run | BLEU-4 | METEOR | CIDEr | CLIPScore | RefCLIPScore |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {pct(r['bleu4'])} | {pct(r['meteor'])} | {pct(r['cider'])} | {num(r['clipscore'])} | "
              f"{num(r['refclipscore'])} |" for r in results["runs"]]
    return "\n".join(lines) + "\n"
