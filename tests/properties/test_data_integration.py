"""The synthetic world's files are read by the same loaders as the real benchmarks."""
import os

import pytest
import torch

import mdc
from mdc.data import aro_sugarcrepe as comp
from mdc.data.formats import load_image, load_karpathy, load_wds_classification
from mdc.data.pipeline import SkipStats, iterate_batches, make_loader
from mdc.world.evalsets import write_evalsets
from mdc.world.scenes import write_shards


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("world"))
    summary = write_evalsets(out, seed=1, n_probe_train=16, n_probe_test=8, n_items=6, n_caption_train=4)
    return out, summary


def test_compositionality_suites_load(world):
    out, summary = world
    sugar = comp.load_sugarcrepe(os.path.join(out, "sugarcrepe"), os.path.join(out, "sugarcrepe", "images"))
    assert {k: len(v) for k, v in sugar.items()} == {k: 6 for k in comp.SUGARCREPE_SUBSETS}
    aro = os.path.join(out, "aro")
    rel = comp.load_vg_relation(os.path.join(aro, "visual_genome_relation.json"), aro)
    att = comp.load_vg_attribution(os.path.join(aro, "visual_genome_attribution.json"), aro)
    order = comp.load_order_suite(os.path.join(aro, "coco_order_test.json"), aro, seed=0)
    assert len(rel) == len(att) == 6 and len(order) == 6 * 5
    assert load_image(rel[0]).size == (64, 64)
    # every caption of every suite stays inside the tiny model's compact vocabulary
    tok = mdc.create_model("tiny").tokenizer
    texts = [x for items in sugar.values() for i in items for x in (i["caption"], i["negative_caption"])]
    texts += [x for i in rel + att for x in (i["true_caption"], i["false_caption"])]
    tok(texts)
    assert tok.unknown_count == 0


def test_probe_and_caption_sets_load(world):
    out, summary = world
    for task, info in summary["probe"].items():
        ds = load_wds_classification(os.path.join(out, "probe", task), "test")
        labels = [label for _, label in ds]
        assert len(labels) == 8 and max(labels) < info["classes"] == len(ds.classnames)
    caps = load_karpathy(os.path.join(out, "captions", "dataset_scenes.json"), os.path.join(out, "captions"))
    assert len(caps) == summary["captions"]["test"] and all(len(c["references"]) == 5 for c in caps)


def test_shards_feed_the_tiny_model(tmp_path):
    write_shards(str(tmp_path), 24, "descriptive", seed=0, shard_size=12)
    model = mdc.create_model("tiny")
    loader = make_loader(str(tmp_path / "{000000..000001}.tar"), model.tokenizer, 64, batch_size=8,
                         num_workers=0, crop_scale=None)
    stats = SkipStats()
    batches = list(iterate_batches(loader, stats))
    assert sum(len(images) for images, _ in batches) == 24 and stats.total == 0
    images, tokens = batches[0]
    assert images.shape == (8, 3, 64, 64) and tokens.shape == (8, 64)
    assert model.tokenizer.unknown_count == 0
    assert torch.isfinite(model.loss(images, tokens))
