"""reproduce.probe_records: the test items a claim row needs, from the item variance and seed spread of its records."""
import math

import numpy as np

from reproduce.claims import TASKS
from reproduce.probe_records import claim_test_items


def _runs(tile: int = 1) -> list[dict]:
    """MDC and CLIP on descriptive captions, three seeds, 400 items per task (each repeated ``tile`` times)."""
    rng = np.random.default_rng(0)
    known = {t: rng.random(400) < 0.5 for t in TASKS}  # items both models know, shared by every seed
    runs = []
    for seed, shift in enumerate((0.02, 0.03, 0.025)):
        for method, rate in (("MDC", 0.5 + shift), ("CLIP", 0.5)):
            datasets = {}
            for t in TASKS:
                right = np.where(known[t], rng.random(400) < 0.9, rng.random(400) < rate - 0.4)
                datasets[f"wds/{t}"] = {"correct": "".join("1" if x else "0" for x in np.repeat(right, tile))}
            labels = dict(method=method, style="descriptive", fraction=1.0, seed=seed)
            runs.append({"name": f"probe/{method}-s{seed}", "notebook": "linear_probe", "labels": labels,
                         "artifacts": ["claims"], "record": {"results": {"datasets": datasets}}})
    return runs


def test_the_items_a_row_needs_do_not_depend_on_how_many_it_had():
    """Four copies of every item: the same item variance at four times the items, so the items' half-width
    halves, the seeds' stays, and the items needed stay where they were."""
    one, four = (claim_test_items(_runs(tile))["MDC - CLIP, descriptive"] for tile in (1, 4))
    assert (one["n"], four["n"], one["seeds"]) == (400, 1600, 3)
    assert math.isclose(four["seeds_half"], one["seeds_half"])
    assert math.isclose(four["items_half"], one["items_half"] / 2, rel_tol=0.01)
    assert abs(four["needed"] - one["needed"]) <= 0.01 * one["needed"]
    assert one["needed"] == math.ceil(400 * (one["items_half"] / one["seeds_half"]) ** 2)
    assert set(claim_test_items(_runs())) == {"MDC - CLIP, descriptive"}  # rows without records are left out
