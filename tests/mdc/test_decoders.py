"""MDC's decoders (:data:`mdc.unmasking.DECODERS`, ``mdc.generate(..., decoder=)``), each against a case small enough
to work out by hand: a caption distribution whose every position has a fixed distribution of its own whatever the
others hold (a table), so that the order a decoder reveals in and the tokens it writes follow from the table."""
import pytest
import torch

import mdc
from conftest import small_model
from mdc.unmasking import DECODERS, mdc_sample

WORDS = (10, 11, 12)  # three ordinary token ids the tables put their mass on


class Table:
    """A caption distribution with position j's log p fixed at ``table[j]`` [V] (the rows of ``x`` alike)."""

    def __init__(self, table: torch.Tensor):
        self.table = table  # [L, V]

    def log_probs(self, x, where, temperature=None):
        logits = self.table.expand(x.shape[0], -1, -1)[where]  # [M, V]
        return (logits / (temperature or 1.0)).log_softmax(-1)


def table(model, probs: list[list[float]]) -> Table:
    """A table over [SOT] + len(probs) positions + [EOT]: position j + 1 draws WORDS with ``probs[j]``."""
    t = torch.full((len(probs) + 2, model.tokenizer.vocab_size), -torch.inf)
    for j, row in enumerate(probs):
        t[j + 1, list(WORDS)] = torch.tensor(row).log()
    return Table(t)


def reveals(model, dist: Table, length: int, batch: int = 1, **options) -> list[list[int]]:
    """Row 0's positions revealed at each step."""
    trace = []
    mdc_sample(model, torch.zeros(batch, 3, 32, 32), length, trace=trace, encode=lambda m, i: dist, **options)
    return [step["revealed"][0].nonzero().flatten().tolist() for step in trace]


# positions 1-4: most likely .50, .34, .60, .45; margins .01, .005, .40, 0: confidence-first reveals 3, 1, 4, 2,
# margin-first 3, 1, 2, 4
PROBS = [[0.50, 0.49, 0.01], [0.34, 0.335, 0.325], [0.60, 0.20, 0.20], [0.45, 0.45, 0.10]]


@pytest.fixture(scope="module")
def model():
    return small_model().eval()


def test_confidence_and_margin_first_reveal_in_the_tables_order(model):
    dist = table(model, PROBS)
    assert reveals(model, dist, 4) == [[3], [1], [4], [2]]
    assert reveals(model, dist, 4, order="margin") == [[3], [1], [2], [4]]
    assert reveals(model, dist, 4, order="margin", tokens_per_step=2) == [[1, 3], [2, 4]]


def test_a_random_order_takes_each_position_first_equally_often(model):
    rows, trace = 4000, []
    mdc_sample(model, torch.zeros(rows, 3, 32, 32), 4, order="random", trace=trace,
               encode=lambda m, i: table(model, PROBS), generator=torch.Generator().manual_seed(0))
    first = trace[0]["revealed"].float().argmax(1)  # [rows]
    counts = torch.bincount(first, minlength=6)[1:5].float()
    assert (counts - rows / 4).abs().max() < 5 * (rows * 0.25 * 0.75) ** 0.5, counts


def test_ancestral_sampling_draws_each_position_from_its_distribution(model):
    """Random order, temperature 1: with positions independent, each draws from its own row (float64 noise)."""
    rows = 20000
    out = mdc_sample(model, torch.zeros(rows, 3, 32, 32), 4, encode=lambda m, i: table(model, PROBS),
                     generator=torch.Generator().manual_seed(1), **DECODERS["ancestral"])
    for j, row in enumerate(PROBS):
        seen = torch.stack([(out[:, j + 1] == w).float().mean() for w in WORDS])
        expected = torch.tensor(row)
        assert ((seen - expected).abs() <= 5 * (expected * (1 - expected) / rows).sqrt() + 1e-9).all(), (j, seen)


def test_semi_autoregressive_blocks_reveal_left_to_right(model):
    probs = [[0.4, 0.3, 0.3], [0.9, 0.05, 0.05], [0.5, 0.3, 0.2], [0.99, 0.005, 0.005], [0.6, 0.2, 0.2],
             [0.8, 0.1, 0.1]]
    dist = table(model, probs)
    assert reveals(model, dist, 6) == [[4], [2], [6], [5], [3], [1]]
    assert reveals(model, dist, 6, blocks=3) == [[2], [1], [4], [3], [6], [5]]  # spans 1-2, 3-4, 5-6
    assert reveals(model, dist, 6, **DECODERS["semi-autoregressive"]) == [[2], [1], [3], [4], [5], [6]]  # 1-2, 3,
    # 4-5, 6


def test_remasking_rewrites_the_least_confident_token(model):
    """Each round masks the written token held with the least probability and writes it again; with positions
    independent it is written as before, so the caption is the plain decoder's."""
    dist, images = table(model, PROBS), torch.zeros(2, 3, 32, 32)
    assert reveals(model, dist, 4, refine=3) == [[3], [1], [4], [2], [2], [2], [2]]
    plain = mdc_sample(model, images, 4, encode=lambda m, i: dist)
    assert torch.equal(mdc_sample(model, images, 4, encode=lambda m, i: dist, refine=3), plain)


def test_every_named_decoder_captions_through_generate(model):
    images = torch.randn(3, 3, 32, 32)
    assert mdc.list_decoders() == sorted(DECODERS)
    default = mdc.generate(model, images, 6, return_tokens=True)
    assert torch.equal(mdc.generate(model, images, 6, decoder="confidence", return_tokens=True), default)
    for name in mdc.list_decoders():
        out = mdc.generate(model, images, 6, decoder=name, return_tokens=True, generator=torch.Generator())
        assert out.shape == default.shape and not (out == model.tokenizer.mask_id).any(), name
    wide = mdc.generate(model, images, 6, decoder="remask", tokens_per_step=2, return_tokens=True)  # a field beside
    assert not (wide == model.tokenizer.mask_id).any()
    with pytest.raises(ValueError, match="unknown decoder 'best'"):
        mdc.generate(model, images, 6, decoder="best")
    with pytest.raises(ValueError, match="order must be one of"):
        mdc.generate(model, images, 6, order="left")
    with pytest.raises(ValueError, match="options of MDC's unmasking sampler"):
        mdc.generate(small_model("arc").eval(), images, 6, decoder="margin")
