"""The grid probe: tokens pooled to cells in place, a task of position alone that the mean cannot read, one
extraction for both probes (the pooled numbers unchanged), caching."""
import pytest
import torch

from conftest import small_model
from mdc.eval import probe
from mdc.eval.grid_probe import probe_with_grid, probe_with_grid_random_init, token_grid
from mdc.eval.probe import ProbeConfig, dataset_fns, linear_probe, probe_datasets, probe_random_init, synthetic_roots


def test_token_grid_averages_cells_in_place_and_drops_the_cls_token():
    side, d = 4, 3
    values = torch.arange(side * side, dtype=torch.float32).reshape(side, side)  # token (r, c) holds 4r + c
    patches = values.reshape(1, side * side, 1).expand(2, -1, d)  # [2, 16, 3], row-major like a ViT's
    with_cls = torch.cat([torch.full((2, 1, d), 99.0), patches], 1)  # [2, 17, 3]
    cells = token_grid(with_cls, 2).reshape(2, 4, d)  # [2, cells, D]
    expect = torch.tensor([[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]], dtype=torch.float32).mean(1)
    assert torch.equal(cells[0, :, 0], expect) and torch.equal(cells, token_grid(patches, 2).reshape(2, 4, d))
    with pytest.raises(ValueError, match="cannot be pooled"):
        token_grid(patches, 3)


def _where(n, seed):
    """Tokens [n, 16, 8] holding one marker token, in the left or the right half of a 4 x 4 grid (label 0 / 1):
    every token's features are the same set whatever the label, so their mean carries no label."""
    g = torch.Generator().manual_seed(seed)
    marker = torch.randn(8, generator=torch.Generator().manual_seed(7))
    tokens = torch.zeros(n, 16, 8) + 0.05 * torch.randn(n, 16, 8, generator=g)
    y = torch.arange(n) % 2
    col = torch.randint(0, 2, (n,), generator=g) + 2 * y
    row = torch.randint(0, 4, (n,), generator=g)
    tokens[torch.arange(n), 4 * row + col] += marker
    return tokens, y


def test_the_grid_reads_a_task_of_position_alone_that_the_mean_cannot():
    (train, y), (test, yt) = _where(400, 0), _where(200, 1)
    pooled = linear_probe((train.mean(1), y), (test.mean(1), yt))["top1"]
    grid = linear_probe((token_grid(train, 2), y), (token_grid(test, 2), yt))["top1"]
    assert grid > 0.95 and pooled < 0.65


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    from mdc.world.evalsets import write_evalsets

    out = str(tmp_path_factory.mktemp("evalsets"))
    write_evalsets(out, seed=1, image_size=32, n_probe_train=16, n_probe_test=8, n_items=2, n_caption_train=0)
    return synthetic_roots(out, ("relation", "count"))


def test_one_extraction_serves_both_probes_the_pooled_numbers_unchanged_and_the_floor_shared(tmp_path, monkeypatch,
                                                                                               roots):
    from mdc import image_transform

    model, cfg = small_model("clip"), ProbeConfig(epochs=2)  # CLIP: a [CLS] token before the 4 x 4 patches
    transform = image_transform(model)
    pooled = probe_datasets(model, dataset_fns(roots, transform), cfg)  # the pooled probe alone
    calls, real = [], probe.extract_features
    monkeypatch.setattr(probe, "extract_features", lambda *a, **k: (calls.append(a[0]), real(*a, **k))[1])
    both = probe_with_grid(model, dataset_fns(roots, transform), cfg, grid=2, cache_dir=str(tmp_path / "f"),
                           transform_key="eval32")
    assert len(calls) == 4  # 2 tasks x (train, test), once for both probes
    assert both["pooled"] == pooled  # every number and per-item outcome
    assert both["grid"]["grid"] == 2 and set(both["grid"]["datasets"]) == set(roots)
    assert all(r["n_test"] == 8 and len(r["correct"]) == 8 for r in both["grid"]["datasets"].values())
    assert probe_with_grid(model, dataset_fns(roots, transform), cfg, grid=2, cache_dir=str(tmp_path / "f"),
                           transform_key="eval32") == both and len(calls) == 4  # read back, not extracted
    x = probe.cached_features(model, None, "wds-count__pooled+grid2__train__eval32", str(tmp_path / "f"))[0]
    assert x.shape == (16, 5 * model.config.vision_width)  # [N, D + 2 x 2 x D]
    kw = dict(seed=3, grid=2, transform_key="eval32")
    floor = probe_with_grid_random_init(model, roots, transform, cfg, shared_cache=str(tmp_path / "shared"), **kw)
    again = probe_with_grid_random_init(small_model("clip"), roots, transform, cfg, shared_cache=str(tmp_path / "shared"),
                                        **kw)
    assert floor == again and len(calls) == 8  # the second run's floor read from the shared folder
    assert floor["pooled"] == probe_random_init(model, roots, transform, cfg, seed=3)
