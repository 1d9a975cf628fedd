"""CLIPScore and RefCLIPScore (Hessel et al. 2021, MC-Diffusion's reference-free metric) with any CLIP,
and CLIP reranking of sampled captions.

For a caption c of image v with references R, E the CLIP embeddings:

    CLIPScore(c, v)       = w * max(cos(E_c, E_v), 0),  w = 2.5
    RefCLIPScore(c, R, v) = H-mean(CLIPScore(c, v), max(max_{r in R} cos(E_c, E_r), 0))

H-mean is the harmonic mean 2ab / (a + b), 0 when a term is 0 (the reference term is not
scaled by w, as in the paper). A corpus score is the mean over images, as the reference code
reports. Hessel et al. prepend "A photo depicts" to every caption and reference for OpenAI's
CLIP; ``prefix=None`` keeps that for open_clip models and uses none for a CLIP trained by this
package (its captions never carried one, and a compact vocabulary has no such words).

CLIPs (:func:`load_clip`): a checkpoint folder of this package's ``objective="clip"`` model
(``mdc.load``), or ``"open_clip:<arch>:<weights file>"``, open_clip's architecture with
weights a user has locally; nothing is ever downloaded (a missing file is an error).
"""
from __future__ import annotations

import os
from typing import Sequence

import torch
import torch.nn.functional as F

from mdc.base.torchvision_shim import patch_torchvision
from mdc.api import generate
from mdc.factory import image_transform, load

W = 2.5  # CLIPScore's rescaling weight
OPENAI_PREFIX = "A photo depicts "


def clip_score(image_emb: torch.Tensor, text_emb: torch.Tensor, w: float = W) -> torch.Tensor:
    """CLIPScore [N] of captions ``text_emb`` [N, E] for images ``image_emb`` [N, E] (any norm)."""
    return w * F.cosine_similarity(image_emb, text_emb, dim=-1).clamp(min=0)


def ref_clip_score(image_emb: torch.Tensor, text_emb: torch.Tensor, ref_embs: Sequence[torch.Tensor],
                   w: float = W) -> torch.Tensor:
    """RefCLIPScore [N]; ``ref_embs[i]`` [R_i, E] are the references of caption i."""
    a = clip_score(image_emb, text_emb, w)  # [N]
    b = torch.stack([F.cosine_similarity(t[None], r, dim=-1).max().clamp(min=0) for t, r in zip(text_emb, ref_embs)])
    return torch.where((a > 0) & (b > 0), 2 * a * b / (a + b).clamp(min=1e-12), torch.zeros_like(a))


class Clip:
    """A CLIP behind one interface: unit embeddings of PIL images and of texts, [N, E]."""

    def __init__(self, model, encode_image, encode_text, preprocess, tokenize, kind: str, source: str, prefix: str):
        self.model, self._image, self._text = model.eval(), encode_image, encode_text
        self.preprocess, self.tokenize = preprocess, tokenize
        self.kind, self.source, self.prefix, self.device = kind, source, prefix, "cpu"

    def to(self, device: str) -> "Clip":
        self.device = device
        self.model.to(device)
        return self

    @torch.no_grad()
    def images(self, images: Sequence, batch_size: int = 64) -> torch.Tensor:
        out = [self._image(torch.stack([self.preprocess(im) for im in images[i:i + batch_size]]).to(self.device))
               for i in range(0, len(images), batch_size)]
        return F.normalize(torch.cat(out).float().cpu(), dim=-1)

    @torch.no_grad()
    def texts(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        texts = [self.prefix + t for t in texts]
        out = [self._text(self.tokenize(texts[i:i + batch_size]).to(self.device)) for i in range(0, len(texts), batch_size)]
        return F.normalize(torch.cat(out).float().cpu(), dim=-1)


def load_clip(spec: str, prefix: str | None = None, device: str = "cpu") -> Clip:
    """A CLIP from a checkpoint folder (objective "clip") or ``"open_clip:<arch>:<weights file>"``."""
    if spec.startswith("open_clip:"):
        arch, weights = (spec.split(":", 2) + ["", ""])[1:3]
        if not arch or not weights or not os.path.isfile(weights):
            raise ValueError(f"clip = {spec!r}: give 'open_clip:<arch>:<local weights file>' with an existing file "
                             f"(weights are never downloaded)")
        import open_clip

        patch_torchvision()
        model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=weights, pretrained_text=False)
        clip = Clip(model, model.encode_image, model.encode_text, preprocess, open_clip.get_tokenizer(arch), "open_clip",
                    spec, OPENAI_PREFIX if prefix is None else prefix)
    else:
        try:
            model = load(spec)  # a checkpoint folder or a pretraining run folder
        except FileNotFoundError as exn:
            raise ValueError(f"clip = {spec!r}: not a checkpoint folder ({exn})") from exn
        if model.config.objective != "clip":
            raise ValueError(f"clip = {spec!r} holds an {model.config.objective!r} model; CLIPScore needs "
                             f"objective 'clip' (train one with --objective clip)")
        clip = Clip(model, model.image_embedding, model.text_embedding, image_transform(model),
                    model.tokenizer, "mdc", spec, "" if prefix is None else prefix)
    return clip.to(device)


def clip_scores(clip: Clip, images: Sequence, captions: Sequence[str],
                references: Sequence[Sequence[str]] | None = None) -> dict:
    """Per image: ``{"clipscore": [N], "refclipscore": [N] | None}`` (tensors) for PIL ``images``."""
    if len(images) != len(captions):
        raise ValueError(f"got {len(images)} images but {len(captions)} captions")
    img, txt = clip.images(images), clip.texts(captions)
    out = {"clipscore": clip_score(img, txt), "refclipscore": None}
    if references is not None:
        flat = clip.texts([r for refs in references for r in refs])
        sizes = [len(refs) for refs in references]
        if min(sizes, default=1) == 0:
            raise ValueError(f"image {sizes.index(0)} has no references (RefCLIPScore needs at least one)")
        out["refclipscore"] = ref_clip_score(img, txt, list(flat.split(sizes)))
    return out


@torch.no_grad()
def clip_rerank(model, clip: Clip, images: Sequence, *, k: int = 8, length: int = 15, temperature: float = 1.0,
                seed: int = 0, device: str = "cpu", **guidance) -> tuple[list[str], list[list[str]], torch.Tensor]:
    """Sample ``k`` captions per PIL image with ``model`` (MDC temperature sampling, seeded; the
    D3PM sampler for ``noise="mask_replace"``; ``guidance``: guidance with guidance_strength or
    guidance_scale, as in ``mdc.generate``) and keep the one with the best CLIPScore. Returns
    (best [B], candidates [B][k], CLIPScores [B, k]).

    API for users (docs/guidance.md); no experiment of the paper calls it. Reranking samples by
    CLIPScore is the usual decoding-time alternative to guidance for captions closer to the image,
    so a user comparing guidance with it needs it built from the same sampler and the same CLIP."""
    if model.config.objective != "mdc":
        raise ValueError(f"CLIP reranking samples MDC captions; got objective {model.config.objective!r}")
    if k < 1 or temperature <= 0:
        raise ValueError(f"need k >= 1 and temperature > 0; got k={k}, temperature={temperature}")
    transform = image_transform(model)
    x = torch.stack([transform(im) for im in images]).to(device).repeat_interleave(k, 0)  # [B*k, 3, S, S]
    flat = generate(model, x, length, temperature=temperature, generator=torch.Generator(device).manual_seed(seed),
                    **guidance)
    scores = clip_score(clip.images(images).repeat_interleave(k, 0), clip.texts(flat)).view(len(images), k)  # [B, k]
    candidates = [flat[i * k:(i + 1) * k] for i in range(len(images))]
    return [c[int(j)] for c, j in zip(candidates, scores.argmax(1))], candidates, scores
