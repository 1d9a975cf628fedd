"""Byte-reproducible webdataset shards: the tar writer and the image member encodings.

:func:`write_tar` writes ``(name, bytes)`` members with fixed metadata, so the same members give
the same file byte for byte; :func:`png_bytes` and :func:`npy_bytes` encode an image
deterministically. The synthetic world (:mod:`mdc.world`) and :mod:`mdc.data.convert` write
their shards through these.
"""
from __future__ import annotations

import io
import os
import tarfile
from functools import lru_cache
from typing import Iterable

import numpy as np

__all__ = ["write_tar", "png_bytes", "npy_bytes"]


def png_bytes(image) -> bytes:
    """PNG encoding of a PIL image (deterministic; zlib level 3 is both faster and smaller here than 6)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=3)
    return buf.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    """A uint8 [H, W, 3] image in NumPy's ``.npy`` format (the same bytes as ``np.save``)."""
    return _npy_header(array.shape, array.dtype.str) + np.ascontiguousarray(array).tobytes()


@lru_cache(maxsize=8)
def _npy_header(shape: tuple, dtype: str) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(shape, dtype), allow_pickle=False)
    return buf.getvalue()[: -int(np.prod(shape)) * np.dtype(dtype).itemsize or None]


def _ustar_header(name: str, size: int) -> bytes:
    """The 512-byte USTAR header that ``tarfile`` writes for a regular file with write_tar's fixed
    metadata (mode 0644, uid/gid 0, no user names, mtime 0); tarfile builds the rare long names."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > 100 or size >= 8**11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    head = encoded.ljust(100, b"\0") + b"0000644\0" + b"0000000\0" * 2 + b"%011o\0" % size + b"0" * 11 + b"\0"
    tail = b"0" + bytes(100) + tarfile.POSIX_MAGIC + bytes(32 + 32 + 8 + 8 + 155 + 12)
    checksum = sum(head) + sum(tail) + 8 * ord(" ")  # the checksum field counts as eight spaces
    return head + b"%06o\0 " % checksum + tail


def write_tar(path: str, members: Iterable[tuple[str, bytes]]) -> str:
    """Write ``(name, bytes)`` members to a tar with fixed metadata (byte-reproducible); atomic.

    The bytes are those of ``tarfile`` in USTAR format (headers built directly: faster)."""
    tmp = path + ".tmp"
    written = 0
    with open(tmp, "wb") as f:
        for name, data in members:
            pad = -len(data) % tarfile.BLOCKSIZE
            f.write(_ustar_header(name, len(data)) + data + bytes(pad))
            written += tarfile.BLOCKSIZE + len(data) + pad
        end = written + 2 * tarfile.BLOCKSIZE  # two zero blocks, then zeros up to a whole record, as tarfile
        f.write(bytes(2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
    os.replace(tmp, path)
    return path
