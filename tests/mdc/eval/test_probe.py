"""Linear probe: CLIP_benchmark's protocol on cached features; separable tasks, sklearn agreement, cache keys."""
import shutil

import numpy as np
import pytest
import torch

from conftest import small_model
from mdc.eval import probe
from mdc.eval.probe import ProbeConfig, cached_features, fingerprint, linear_probe


def _blobs(n, d=16, k=4, spread=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=torch.Generator().manual_seed(99)) * 2
    y = torch.arange(n) % k
    return centres[y] + spread * torch.randn(n, d, generator=g), y


def test_separable_task_is_solved():
    res = linear_probe(_blobs(400, spread=0.05), _blobs(200, spread=0.05, seed=1))
    assert res["top1"] == 1.0 and res["classes"] == 4 and res["chance"] == 0.25
    assert (res["n_train"], res["n_test"], res["weight_decay"]) == (400, 200, 0.0)


def test_the_probe_records_which_test_items_it_got_right():
    """Per-item outcomes (in test order) let an interval resample the test items (reproduce/claims/claim_rows.py)."""
    train, test = _blobs(400, spread=6.0), _blobs(200, spread=6.0, seed=1)
    res = linear_probe(train, test)
    assert len(res["correct"]) == res["n_test"] == 200 and set(res["correct"]) == {"0", "1"}
    assert res["correct"].count("1") / 200 == pytest.approx(res["top1"])


def test_probe_agrees_with_sklearn_logistic_regression():
    from sklearn.linear_model import LogisticRegression

    train, test = _blobs(800, spread=6.0), _blobs(400, spread=6.0, seed=1)
    ours = linear_probe(train, test)["top1"]
    x = torch.nn.functional.normalize(train[0], dim=-1).numpy()
    xt = torch.nn.functional.normalize(test[0], dim=-1).numpy()
    theirs = LogisticRegression(C=100.0, max_iter=5000).fit(x, train[1].numpy()).score(xt, test[1].numpy())
    assert 0.4 < theirs < 0.95  # a task neither trivial nor hopeless
    assert abs(ours - theirs) < 0.03, (ours, theirs)


def test_weight_decay_search_picks_a_grid_value():
    res = linear_probe(_blobs(300, spread=2.0), _blobs(200, spread=2.0, seed=1),
                       ProbeConfig(weight_decay="search", epochs=2))
    assert any(np.isclose(res["weight_decay"], w) for w in np.logspace(-6, 2, 97))


def test_features_are_cached_per_weights(tmp_path, monkeypatch, images):
    calls = []
    real = probe.extract_features
    monkeypatch.setattr(probe, "extract_features", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    data = [(img, i % 2) for i, img in enumerate(images)]
    a = small_model()
    f1 = cached_features(a, lambda: data, "toy__train__eval32", str(tmp_path))
    f2 = cached_features(a, lambda: data, "toy__train__eval32", str(tmp_path))
    assert len(calls) == 1 and torch.equal(f1[0], f2[0]) and f1[0].shape == (4, 64)
    torch.testing.assert_close(f1[0], a.encode_image(images).detach())
    b = small_model()  # other random weights: another cache entry
    assert fingerprint(a) != fingerprint(b)
    cached_features(b, lambda: data, "toy__train__eval32", str(tmp_path))
    assert len(calls) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CLIP_benchmark's linear probe asserts CUDA")
def test_agrees_with_clip_benchmark_on_cuda(tmp_path):
    """Top-1 of this module and of clip_benchmark.metrics.linear_probe.evaluate on the same data and
    protocol agree within the probe's run-to-run noise (their shuffling RNGs differ)."""
    from mdc.eval.probe import extract_features

    # a GPU machine's own PyTorch image may lack clip-benchmark: the comparison is then skipped, saying so
    evaluate = pytest.importorskip("clip_benchmark.metrics.linear_probe",
                                   reason="clip-benchmark is not installed: nothing to compare with").evaluate

    torch.manual_seed(0)
    images, labels = torch.randn(600, 3, 32, 32), torch.arange(600) % 3
    images[labels == 1] += 0.5
    data = list(zip(images, labels.tolist()))
    train, test, cfg = data[:400], data[400:], ProbeConfig()
    model = small_model().to("cuda").eval()
    loader = lambda ds: torch.utils.data.DataLoader(ds, batch_size=256)  # noqa: E731
    theirs = evaluate(model, loader(train), loader(test), fewshot_k=-1, batch_size=cfg.batch_size, num_workers=0,
                      lr=cfg.lr, epochs=cfg.epochs, model_id=fingerprint(model), seed=cfg.seed,
                      feature_root=str(tmp_path), device="cuda", normalize=cfg.normalize, amp=True)
    ours = linear_probe(extract_features(model, train, device="cuda"), extract_features(model, test, device="cuda"),
                        cfg, "cuda")
    assert abs(ours["top1"] - float(theirs["lp_acc1"])) < 0.05, (ours["top1"], theirs["lp_acc1"])


@pytest.fixture(scope="module")
def probe_roots(tmp_path_factory):
    """Two synthetic probe tasks, 16 training and 8 test images each at 32 px."""
    from mdc.eval.probe import synthetic_roots
    from mdc.world.evalsets import write_evalsets

    out = str(tmp_path_factory.mktemp("evalsets"))
    write_evalsets(out, seed=1, image_size=32, n_probe_train=16, n_probe_test=8, n_items=2, n_caption_train=0)
    return synthetic_roots(out, ("shape", "count"))


def _count_extractions(monkeypatch) -> list:
    calls, real = [], probe.extract_features
    monkeypatch.setattr(probe, "extract_features", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_random_init_features_are_shared_between_runs_and_change_nothing(tmp_path, monkeypatch, probe_roots):
    """The floor with a shared cache is bitwise the floor without one; a second run (another model of the
    same architecture) extracts nothing."""
    from mdc import image_transform
    from mdc.eval.probe import probe_random_init

    model, cfg = small_model("arc"), ProbeConfig(epochs=2)
    kw = dict(transform=image_transform(model), cfg=cfg, seed=3, transform_key="eval32")
    calls = _count_extractions(monkeypatch)
    alone = probe_random_init(model, probe_roots, cache_dir=str(tmp_path / "run0"), **kw)
    assert len(calls) == 4  # 2 tasks x (train, test)
    first = probe_random_init(model, probe_roots, shared_cache=str(tmp_path / "shared"), cache_dir=str(tmp_path / "run1"),
                              **kw)
    assert len(calls) == 8
    second = probe_random_init(small_model("arc"), probe_roots, shared_cache=str(tmp_path / "shared"),
                               cache_dir=str(tmp_path / "run2"), **kw)
    assert len(calls) == 8  # read from the shared folder
    assert alone == first == second  # every number and per-item outcome, exactly
    assert not (tmp_path / "run1").exists() and not (tmp_path / "run2").exists()
    other_seed = probe_random_init(model, probe_roots, shared_cache=str(tmp_path / "shared"), **{**kw, "seed": 4})
    assert len(calls) == 12 and other_seed != alone  # another initialisation: other features


def test_a_bad_shared_file_is_recomputed_not_trusted(tmp_path, monkeypatch, caplog, probe_roots):
    from safetensors.torch import load_file, save_file

    from mdc import image_transform
    from mdc.eval.probe import probe_random_init

    model, shared = small_model(), tmp_path / "shared"
    kw = dict(transform=image_transform(model), cfg=ProbeConfig(epochs=1), shared_cache=str(shared))
    good = probe_random_init(model, probe_roots, **kw)
    files = sorted(shared.rglob("*.safetensors"))
    assert len(files) == 4
    files[0].write_bytes(files[0].read_bytes()[:100])  # half written
    data = load_file(str(files[1]))
    save_file({"features": data["features"] + 1, "labels": data["labels"]}, str(files[1]),
              metadata={"key": files[1].stem, "sha256": "0" * 64})  # tampered
    calls = _count_extractions(monkeypatch)
    assert probe_random_init(model, probe_roots, **kw) == good
    assert len(calls) == 2
    warnings = [r.getMessage() for r in caplog.records if "recomputing" in r.getMessage()]
    assert len(warnings) == 2 and any("unreadable" in w for w in warnings) and any("digest" in w for w in warnings)
    assert probe_random_init(model, probe_roots, **kw) == good and len(calls) == 2  # rewritten intact


def test_feature_key_names_what_determines_the_features(tmp_path, probe_roots):
    from mdc import image_transform
    from mdc.eval.probe import content_id, feature_key, random_init_like

    model = small_model()
    root, t = probe_roots["wds/shape"], image_transform(model)
    where = dict(name="wds/shape", root=root, split="train", transform=t, batch_size=256, device="cpu")
    key = lambda m, **k: feature_key(m, **{**where, **k})  # noqa: E731
    base = key(random_init_like(model, 0))
    assert base == key(random_init_like(small_model(), 0))  # same config and seed: same weights
    assert base != key(random_init_like(model, 1))
    assert base != key(random_init_like(small_model(text_layers=1), 0))  # another architecture
    assert base != key(random_init_like(model, 0), split="test")
    assert base != key(random_init_like(model, 0), transform=image_transform(64))
    assert base != key(random_init_like(model, 0), batch_size=64)
    assert base != key(random_init_like(model, 0), root=probe_roots["wds/count"])
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert content_id(str(copy)) == content_id(root)  # content, not place
    (copy / "train" / "nshards.txt").write_text("2\n")
    assert content_id(str(copy)) != content_id(root)
