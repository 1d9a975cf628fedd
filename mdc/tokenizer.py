"""CLIP BPE tokenizer with an appended [MASK] id, and an optional compact vocabulary.

Token layout of one caption (length ``context_length``)::

    [SOT] c_0 c_1 ... c_{N-1} [EOT] [PAD] ... [PAD]

Over-long captions are truncated the CLIP way: keep the first ``context_length`` ids and
overwrite the last one with [EOT], so every row holds exactly one [EOT]. Padding is the
region after [EOT]; the model finds it by position (``valid_mask``), never by the pad id,
so a pad id that doubles as a real BPE id (CLIP's id 0 is "!") is harmless.

Full vocabulary: the 49,408 CLIP BPE ids, then [MASK] = 49408 (vocab_size 49,409).
Compact vocabulary (for tiny CPU models): ``vocab`` lists the BPE ids to keep. Compact ids
are 0 = [PAD], 1 = [UNK], then the kept ids in sorted order, then [MASK]. A BPE id outside
the compact vocabulary maps to [UNK].

Text is always text: the literal strings ``<start_of_text>`` / ``<end_of_text>`` in a caption are
encoded as ordinary characters, never as the control ids (which would put an [EOT] mid-row).
:meth:`Tokenizer.tokenize` returns, with the tokens, a :class:`TextStats` of that call: how
many caption tokens became [UNK] and how many captions were truncated. Counts travel with
the data (e.g. out of DataLoader workers) instead of living on a tokenizer copy.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import regex

import torch


@lru_cache(maxsize=1)
def _bpe():
    """open_clip's SimpleTokenizer (its BPE file ships in the wheel, so it works offline).

    Its module needs nothing else from open_clip, so it is loaded on its own: importing the
    open_clip package (models, timm, torchvision) would add seconds to every process start.
    """
    module = sys.modules.get("open_clip.tokenizer")
    if module is None:
        package = importlib.util.find_spec("open_clip")
        path = os.path.join(package.submodule_search_locations[0], "tokenizer.py")
        spec = importlib.util.spec_from_file_location("mdc._open_clip_tokenizer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.SimpleTokenizer()


# CLIP's pre-tokenisation pattern without its special-token alternatives, so that a caption's
# "<end_of_text>" is split into ordinary pieces rather than matched as the control token.
_TEXT_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""", regex.IGNORECASE)


@dataclass
class TextStats:
    """Counts of a batch of captions: captions, caption tokens, of which [UNK], captions truncated."""

    captions: int = 0
    tokens: int = 0  # caption tokens before truncation (SOT/EOT excluded)
    unknown: int = 0  # caption tokens outside a compact vocabulary, mapped to [UNK]
    truncated: int = 0  # captions longer than the context, cut the CLIP way

    @property
    def unknown_rate(self) -> float:
        return self.unknown / self.tokens if self.tokens else 0.0

    def merge(self, other: "TextStats | Mapping[str, int]") -> "TextStats":
        """Add ``other``'s counts in place and return self."""
        for key, value in (asdict(other) if isinstance(other, TextStats) else other).items():
            setattr(self, key, getattr(self, key) + int(value))
        return self

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Tokenizer:
    """Callable: ``tok(list_of_str) -> LongTensor [B, context_length]``."""

    def __init__(self, context_length: int = 77, vocab: Sequence[int] | None = None):
        if context_length < 3:
            raise ValueError(f"context_length must be >= 3 (SOT, a token, EOT); got {context_length}")
        self.bpe = _bpe()
        self.context_length = context_length
        self.stats = TextStats()  # running totals of __call__ in this process
        sot, eot = self.bpe.sot_token_id, self.bpe.eot_token_id
        if vocab is None:
            self.vocab = None
            self.pad_id, self.unk_id = 0, None
            self.sot_id, self.eot_id = sot, eot
            self.mask_id = len(self.bpe.encoder)  # 49408
        else:
            kept = sorted(set(int(i) for i in vocab) | {sot, eot})
            bad = [i for i in kept if not 0 <= i < len(self.bpe.encoder)]
            if bad:
                raise ValueError(f"compact vocabulary holds ids outside CLIP BPE: {bad[:5]}")
            self.vocab = tuple(kept)
            self.pad_id, self.unk_id = 0, 1
            self._to_compact = {b: i + 2 for i, b in enumerate(kept)}
            self._to_bpe = dict(zip(self._to_compact.values(), self._to_compact.keys()))
            self.sot_id, self.eot_id = self._to_compact[sot], self._to_compact[eot]
            self.mask_id = len(kept) + 2
        self.vocab_size = self.mask_id + 1

    # ---------------------------------------------------------------- encode
    def encode(self, text: str) -> list[int]:
        """Caption body ids (no SOT/EOT), in this tokenizer's id space; special-token strings are text."""
        bpe = self.bpe
        ids = []
        for piece in _TEXT_PATTERN.findall(bpe.clean_fn(text)):
            piece = "".join(bpe.byte_encoder[b] for b in piece.encode("utf-8"))
            ids.extend(bpe.encoder[t] for t in bpe.bpe(piece).split(" "))
        if self.vocab is None:
            return ids
        return [self._to_compact.get(i, self.unk_id) for i in ids]

    def tokenize(self, texts: str | Iterable[str], context_length: int | None = None) -> tuple[torch.Tensor, TextStats]:
        """(tokens [B, context_length], the :class:`TextStats` of these captions)."""
        if isinstance(texts, str):
            texts = [texts]
        L = context_length or self.context_length
        rows = [self.encode(t) for t in texts]
        out = torch.full((len(rows), L), self.pad_id, dtype=torch.long)
        stats = TextStats(captions=len(rows))
        for b, body in enumerate(rows):
            ids = [self.sot_id, *body, self.eot_id][:L]
            ids[-1] = self.eot_id
            out[b, : len(ids)] = torch.tensor(ids)
            stats.tokens += len(body)
            stats.truncated += len(body) + 2 > L
            if self.vocab is not None:
                stats.unknown += sum(i == self.unk_id for i in body)
        return out, stats

    def __call__(self, texts: str | Iterable[str], context_length: int | None = None) -> torch.Tensor:
        """Tokens [B, context_length]; the counts are added to ``self.stats``."""
        tokens, stats = self.tokenize(texts, context_length)
        self.stats.merge(stats)
        return tokens

    @property
    def unknown_count(self) -> int:
        """Caption tokens mapped to [UNK] by ``__call__`` so far (this object, this process)."""
        return self.stats.unknown

    # ---------------------------------------------------------------- decode
    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """Text of a body or a full row: stops at EOT, skips SOT/PAD/MASK, shows UNK."""
        words: list[int] = []
        unk = 0
        for i in (ids.tolist() if torch.is_tensor(ids) else ids):
            if i == self.eot_id:
                break
            if i in (self.sot_id, self.mask_id) or (self.vocab is not None and i == self.pad_id):
                continue
            if self.vocab is not None:
                if i == self.unk_id or i not in self._to_bpe:
                    unk += 1
                    words.append(-1)
                    continue
                i = self._to_bpe[i]
            words.append(i)
        text, chunk = [], []
        for i in words + [-2]:
            if i >= 0:
                chunk.append(i)
                continue
            if chunk:
                text.append(self.bpe.decode(chunk).strip())
                chunk = []
            if i == -1:
                text.append("<unk>")
        return " ".join(t for t in text if t)

    def batch_decode(self, rows: torch.Tensor) -> list[str]:
        return [self.decode(r) for r in rows]


def valid_mask(tokens: torch.Tensor, eot_id: int) -> torch.Tensor:
    """[B, L] bool: True for SOT, the caption and EOT; False for padding after EOT."""
    is_eot = tokens == eot_id
    after_eot = (is_eot.cumsum(-1) - is_eot.long()) > 0
    return ~after_eot


def caption_mask(tokens: torch.Tensor, sot_id: int, eot_id: int) -> torch.Tensor:
    """[B, L] bool: True exactly on the caption tokens c_0..c_{N-1} (not SOT, EOT or PAD)."""
    return valid_mask(tokens, eot_id) & (tokens != sot_id) & (tokens != eot_id)


def trim_padding(tokens: torch.Tensor, eot_id: int, multiple: int = 1) -> torch.Tensor:
    """Drop trailing columns that are padding in every row ([B, L] -> [B, L']); L' is rounded up
    to ``multiple`` (within L) so that a compiled model sees few distinct lengths."""
    n = int(valid_mask(tokens, eot_id).sum(1).max())
    return tokens[:, : min(tokens.shape[1], -(-n // multiple) * multiple)]


def compact_vocab(texts: Iterable[str]) -> tuple[int, ...]:
    """The sorted BPE ids occurring in ``texts`` (plus SOT/EOT): a compact vocabulary."""
    bpe = _bpe()
    ids = {bpe.sot_token_id, bpe.eot_token_id}
    for t in texts:
        ids.update(bpe.encode(t))
    return tuple(sorted(ids))


