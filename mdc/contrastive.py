"""CLIP's objective: the symmetric InfoNCE loss over the global batch (the contrastive baseline)."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["clip_loss", "gather_features"]


def gather_features(x: torch.Tensor) -> torch.Tensor:
    """Concatenate [B, E] features from every DDP rank, keeping the gradient of every slice."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather  # only where torch has a process group

    return torch.cat(all_gather(x), dim=0)


def clip_loss(image_emb, text_emb, scale):
    """Symmetric InfoNCE over the global batch (features gathered across ranks with gradient).

    Every rank computes the same global loss; all_gather's backward sums the gradient
    contributions of all ranks, and DDP's averaging then yields the global-batch gradient.
    """
    img, txt = gather_features(image_emb), gather_features(text_emb)  # [G, E]
    logits = scale * img @ txt.t()  # [G, G]
    labels = torch.arange(len(logits), device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
