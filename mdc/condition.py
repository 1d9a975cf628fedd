"""The image condition y as the decoder sees it, and its two variants (inputs of the network).

y is the projected image tokens [B, T, W] (:meth:`mdc.model.Captioner.condition`). Every
decoder block cross-attends to it; :class:`ImageContext` holds those keys/values, computed
once per batch of images and shared by any number of token rows.

Variants, learned only by models trained with the option on (so older checkpoints load
unchanged); MC-Diffusion's guidance (:mod:`mdc.mc_diffusion.guidance`) combines them with y:

- null condition (``cond_drop_prob`` = P_cond): every token of y replaced by ``cond_null`` [W]
  (a whole-condition replacement, :func:`vary_condition`);
- partial condition (``cond_mask_prob`` = P_mask): each image token masked with probability
  P_mask, y_i = [MASK] at position i (MC-Diffusion, Eq. 11). The token's *content* is masked and
  its position kept, so the decoder knows which regions are missing: the ViT replaces the patch
  embedding of a masked patch by the learned ``cond_mask_token`` [vision_width], then adds timm's
  position embedding and runs the encoder (:func:`masked_vit_features`); VQ codes become the
  [MASK] code K, embedded like any code before the position embedding is added
  (:meth:`mdc.mc_diffusion.vqvae.VQImageTokens.masked_features`). A tower that masks its own tokens has a
  ``masked_features(images, token_mask)`` method; :func:`masked_features` dispatches.

Training draws them in MC-Diffusion's extension (:class:`mdc.mc_diffusion.guidance.ConditionVariants`, attached by
the factory as ``model.condition_variants``); this module only applies a variant it is given.
"""
from __future__ import annotations

import torch


class ImageContext:
    """Encoded images as the decoder sees them: every block's cross-attention (keys, values),
    each [B, heads, T, width/heads]. Encode once (:meth:`mdc.model.Captioner.context`), then decode
    any number of token rows against it: ``select`` picks image rows, ``repeat`` repeats each k times.

    Repeats are not copied: a context with ``fold`` f stands for f consecutive rows per stored
    image, and cross-attention folds those f token rows into one longer query sequence against
    the image's keys/values (exact: cross-attention has no mask, so each query attends alone).
    Beam search (K beams per image) and the ELBO (S masked copies per caption) rely on it.
    """

    def __init__(self, kv: list[tuple[torch.Tensor, torch.Tensor]], fold: int = 1):
        self.kv, self.fold = kv, fold

    def __len__(self) -> int:  # rows it stands for
        return len(self.kv[0][0]) * self.fold

    def __getitem__(self, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[block]

    def select(self, rows: torch.Tensor) -> "ImageContext":
        """The context of rows ``rows`` [R] (indices, repeats allowed); runs of one image that all
        have the same length f are kept as a fold of f instead of being copied."""
        images = rows // self.fold  # [R] stored image of each row
        values, counts = torch.unique_consecutive(images, return_counts=True)
        if len(counts) and bool((counts == counts[0]).all()):
            return ImageContext([(k[values], v[values]) for k, v in self.kv], int(counts[0]))
        return ImageContext([(k[images], v[images]) for k, v in self.kv])

    def repeat(self, k: int) -> "ImageContext":
        """Each row k times in a row: [R] -> [R * k] (beam search, several captions per image)."""
        return ImageContext(self.kv, self.fold * k) if self.fold == 1 else \
            self.select(torch.arange(len(self), device=self.kv[0][0].device).repeat_interleave(k))


def num_image_tokens(model) -> int:
    """T, the number of condition tokens per image."""
    return getattr(model.visual, "num_tokens", None) or model.visual.patch_embed.num_patches


def has_token_mask(model) -> bool:
    """Whether ``model`` learnt MCS's mask (``cond_mask_prob`` > 0): the ViT's ``cond_mask_token``
    or a visual tower that masks its own tokens (the VQ codes' [MASK] code)."""
    return getattr(model, "cond_mask_token", None) is not None or \
        getattr(model.visual, "mask_id", None) is not None


def vary_condition(model, v: torch.Tensor, null=None) -> torch.Tensor:
    """y [B, T, W] with the rows ``null`` [B] replaced by the null condition. ``torch.where`` keeps
    the vector in the graph (zero gradient where unused), so DDP sees every parameter used. (The
    partial condition is masked inside the visual tower: :func:`masked_features`.)"""
    if null is not None:
        v = torch.where(null[:, None, None], model.cond_null.to(v.dtype), v)
    return v


def masked_vit_features(vit, images: torch.Tensor, token_mask: torch.Tensor, mask_token: torch.Tensor) -> torch.Tensor:
    """A timm ViT's ``forward_features`` with the patches ``token_mask`` [B, N] masked: their patch
    embeddings replaced by ``mask_token`` [D] before the position embedding is added, so a masked
    patch keeps its position. The same steps as timm's ``forward_features`` (patch_embed, _pos_embed,
    patch_drop, norm_pre, blocks, norm); an all-False mask gives exactly its output. [B, T, D]."""
    x = vit.patch_embed(images)  # [B, N, D]
    if tuple(token_mask.shape) != tuple(x.shape[:2]):
        raise ValueError(f"token_mask must have shape [B, N] = {list(x.shape[:2])} (one per patch); "
                         f"got {list(token_mask.shape)}")
    x = torch.where(token_mask.to(x.device)[..., None], mask_token.to(x.dtype), x)
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(x)))
    if vit.grad_checkpointing and not torch.jit.is_scripting():
        from timm.models import checkpoint_seq  # timm loads lazily (mdc.model.vision_tower)

        x = checkpoint_seq(vit.blocks, x)
    else:
        x = vit.blocks(x)
    return vit.norm(x)


def masked_features(model, images: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """The visual tokens [B, T, Dv] of ``images`` with the tokens ``token_mask`` [B, T] masked
    (module docstring); ValueError for a model that never learnt the mask."""
    if not has_token_mask(model):
        raise ValueError("the partial condition needs a model trained with cond_mask_prob > 0; this model has "
                         "no learned mask token")
    if hasattr(model.visual, "masked_features"):
        return model.visual.masked_features(images, token_mask)
    return masked_vit_features(model.visual, images, token_mask, model.cond_mask_token)
