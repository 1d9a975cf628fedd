"""Keyed randomness: noise that names what it is for, so a result never depends on its batch.

Wherever a number must not depend on what else is in a call (the ELBO's masked copies, MCS's
partial-condition masks), its noise is drawn from a generator seeded by (seed, key) with
:func:`key_seed`, not from a stream shared by the batch. :func:`uniform` draws U[0, 1) from a
generator or from the global stream.
"""
from __future__ import annotations

import hashlib
from typing import Hashable

import torch


def uniform(*size: int, generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """U[0, 1) draws of shape ``size`` from ``generator`` (the global stream when None). The generator is
    passed on only when given: under torch.compile with a dynamic batch size, ``torch.rand(B, generator=None)``
    fails to trace (its generator overload wants concrete sizes), while ``torch.rand(B)`` draws the same."""
    if generator is None:
        return torch.rand(*size, device=device)
    return torch.rand(*size, generator=generator, device=device)


def plain_key(key: Hashable) -> Hashable:
    """``key`` in plain Python values: numpy scalars and 0-dim arrays / tensors as their ``.item()``
    (np.int64(5) -> 5, np.str_("a") -> "a", torch.tensor(5) -> 5), recursively inside tuples."""
    if type(key) is tuple:
        return tuple(plain_key(k) for k in key)
    if getattr(key, "shape", None) == () and hasattr(key, "item"):
        return key.item()
    return key


def key_seed(seed: int, key: Hashable) -> int:
    """A 63-bit generator seed from (seed, key), stable across processes and platforms. The key is
    hashed as :func:`plain_key`, so 5, np.int64(5) and torch.tensor(5) give the same noise (the seeds
    of plain int / str / tuple keys are those of the repr they always had)."""
    digest = hashlib.blake2b(repr((int(seed), plain_key(key))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
