"""reproduce.artifacts.paper_tables and reproduce.artifacts.compositionality_table: the paper's tables rebuilt from a small synthetic
run index, byte for byte.

The index mimics the registry's wiring (two seeds of the probe runs, Table 2's three scorers, two
captioning runs); the expected digests are those of the tables the builders wrote before they
moved out of ``mdc`` (mdc/report.py), Table 1's since it gained the pretraining-loss column and its records the
grid probe, Table 3's since it gained the length columns (words, BP), Tables 6-8's since their caption names
mdc.base.optim, so a change to any table's bytes shows up here.
"""
import hashlib
import json
import os

import numpy as np
import pytest

from conftest import write_records
from mdc.eval.results import write_results
from reproduce import registry

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAPER_DIR = os.path.join(ROOT, "reproduce", "paper")
TABLES = ["table1", "table2", "table3", "table4", "table5", "tables6-8"]
TASKS = ("object", "shape", "texture", "count", "relation", "shape_texture", "colour", "background")
# sha256 (16 hex digits) of every table file written from synthetic_index() by mdc/report.py
EXPECTED = {
    "table1_linear_probe.csv": "a9bc88051bbd24f3",
    "table1_linear_probe.md": "369666f86f86041a",
    "table1_linear_probe.tex": "b756141052c13481",
    "table2_compositionality.csv": "f1591da84e06d5d0",
    "table2_compositionality.md": "332641e1e328f26f",
    "table2_compositionality.tex": "847f483f07b9abdb",
    "table3_captioning.csv": "b8eef031fcf45c9c",
    "table3_captioning.md": "297a26ea0e4c78ea",
    "table3_captioning.tex": "39274be1beb7c080",
    "table4_time_weighting.csv": "bba00b6b94c15522",
    "table4_time_weighting.md": "abce4687daa01e40",
    "table4_time_weighting.tex": "0cce0a77195d1fc2",
    "table5_noise_schedule.csv": "2876b3656ffdf2fd",
    "table5_noise_schedule.md": "7972f3ba0b0d94b4",
    "table5_noise_schedule.tex": "d38bf50c3bac0a59",
    "tables6-8_hyperparameters.csv": "4446ff45b1b43f9d",
    "tables6-8_hyperparameters.md": "3ce1ba1336dac997",
    "tables6-8_hyperparameters.tex": "0c9e8524c3bd793f",
}


def _probe(rng, grid: float = 0.5, grid_floor: float = 0.3) -> dict:
    """A probe's results: the pooled probe and its floor drawn from ``rng``, the grid probe's every task at
    ``grid`` (its floor at ``grid_floor``), drawing nothing."""
    top1 = lambda lo, hi: {f"wds/{t}": {"top1": float(rng.uniform(lo, hi))} for t in TASKS}  # noqa: E731
    fixed = lambda v: {f"wds/{t}": {"top1": v} for t in TASKS}  # noqa: E731
    return {"datasets": top1(0.2, 0.9), "random_init": {"datasets": top1(0.05, 0.3)},
            "grid": {"datasets": fixed(grid), "random_init": {"datasets": fixed(grid_floor)}}}


def synthetic_index(folder) -> tuple[str, list[str]]:
    """Run records in ``folder``/records, shaped as a reproduction writes them; returns that folder and
    the runs in the registry's order."""
    rng, lengths = np.random.default_rng(0), np.random.default_rng(1)
    index = {}

    def add(name, notebook, results, artifacts, labels):
        path = os.path.join(folder, name, "results.json")
        write_results(path, notebook, results)
        index[name] = {"notebook": notebook, "params": {}, "labels": labels, "artifacts": artifacts,
                       "results": path}

    for seed in (0, 1):
        probes = [(f"{m.lower()}-{s}", ["table1"] + (["table4"] if m == "MDC" else [])
                   + (["table5", "fig4"] if (m, s) == ("MDC", "alt") else [])
                   + (["fig5"] if (m, s) == ("MDC", "descriptive") else []), dict(method=m, style=s))
                  for s in ("alt", "descriptive") for m in ("CLIP", "ARC", "MDC")]
        probes += [("cliplb-descriptive", ["table1"], dict(method="CLIP-LB", style="descriptive"))]
        probes += [(f"mdc-wot-{s}", ["table4"], dict(method="MDC (w/o t)", style=s)) for s in ("alt", "descriptive")]
        probes += [(f"mdc-t{lo}-{hi}-alt", ["table5"], dict(method="MDC", style="alt", t_interval=[lo, hi]))
                   for lo, hi in ((0.0, 1.0), (0.3, 0.8), (0.4, 0.9))]
        for tag, artifacts, labels in probes:
            add(f"probe/{tag}-s{seed}", "linear_probe", _probe(rng), artifacts, {**labels, "seed": seed})
        for method, variants in (("CLIP", ["cosine"]), ("ARC", ["exact"]),
                                 ("MDC", ["elbo", "elbo_trained_t", "heuristic"])):
            columns = ("aro_relation", "aro_attribute", "aro_coco_order", "sugarcrepe_add", "sugarcrepe_replace",
                       "sugarcrepe_swap")
            table2 = {v + suffix: {c: float(rng.uniform(0.1, 1.0)) for c in columns}
                      for v in variants for suffix in ("", "_lengthnorm")}
            add(f"compositionality/{method.lower()}-descriptive-s{seed}", "compositionality", {"table2": table2},
                ["table2"], dict(method=method, style="descriptive", seed=seed))
        metrics = {name: {"bleu4": float(rng.uniform(0, 0.4)), "meteor": float(rng.uniform(0, 0.3)),
                          "cider": float(rng.uniform(0, 1.5)), "spice": None, "rouge_l": float(rng.uniform(0, 0.6)),
                          "grounded_words": float(rng.uniform(0, 4)), "repeated": float(rng.uniform(0, 0.6))}
                   for name in ("arc-beam6", "mdc-10", "mdc-15", "mdc-20")}
        for name, m in metrics.items():  # the length columns, from their own draws (the others' values stay)
            m |= {"words": float(lengths.uniform(5, 20)), "bp": float(lengths.uniform(0.3, 1.0))}
        judge = {"selection_rate": {n: 0.25 for n in metrics}} if seed == 0 else None
        add(f"captioning/alt-s{seed}", "captioning",
            {"dataset": {"name": "coco", "reference_words": 14.0 + seed}, "metrics": metrics, "judge": judge,
             "examples": []},
            ["table3"], dict(style="alt", seed=seed))
    return write_records(os.path.join(folder, "records"), index), list(index)


def digests(folder) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()[:16]
            for name in sorted(os.listdir(folder))}


def test_tables_from_a_synthetic_index_are_byte_identical(tmp_path):
    records, runs = synthetic_index(tmp_path / "runs")
    files = registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, TABLES, runs)
    assert list(files) == TABLES and all(len(fs) == 3 for fs in files.values())
    assert digests(tmp_path / "figures") == EXPECTED
    table1 = (tmp_path / "figures" / "table1_linear_probe.md").read_text()
    assert "| descriptive | CLIP-LB | 2 |" in table1 and " ± " in table1  # two seeds: mean ± std


def test_unknown_artifacts_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown artifact"):
        registry.build_artifacts(str(tmp_path / "records"), str(tmp_path), PAPER_DIR, ["table9"])


def test_table2_shows_blind_and_debiased_rows_and_flags_a_text_decided_column(tmp_path):
    columns = ("aro_relation", "aro_coco_order", "sugarcrepe_add")
    table2 = {f"heuristic{k}{s}": {c: 0.6 for c in columns} for k in ("", "_blind", "_debiased")
              for s in ("", "_lengthnorm")}
    table2["heuristic_blind"]["sugarcrepe_add"] = 0.97  # the longer caption always loses: text decides
    entries = {c: {"chance": 0.5, "items": 100, "scores": {"heuristic_blind": {"far_from_chance": c == "sugarcrepe_add"}}}
               for c in columns}
    path = tmp_path / "run" / "results.json"
    write_results(str(path), "compositionality", {"table2": table2, "columns": entries})
    records = write_records(tmp_path / "records", {"c": {"notebook": "compositionality", "labels": {"seed": 0},
                                                         "artifacts": ["table2"], "results": str(path)}})
    registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, ["table2"])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in
            (tmp_path / "figures" / "table2_compositionality.md").read_text().splitlines() if line.startswith("| MDC")}
    assert list(rows) == ["MDC (Heuristic)", "MDC (Heuristic) per token", "MDC (Heuristic), no image",
                          "MDC (Heuristic), the image adds (points)",
                          "MDC (Heuristic), image-debiased"]  # per token only for the raw score
    assert "| 97.0* |" in rows["MDC (Heuristic), no image"] and rows["MDC (Heuristic)"].count("*") == 0
    notes = (tmp_path / "figures" / "table2_compositionality.md").read_text().split("\n\n")[-2]  # then provenance
    assert notes.startswith("- ties: each benchmark's own rule") and "\n- *: a no-image accuracy" in notes


def test_table2_cells_carry_cluster_bootstrap_intervals_and_what_the_image_adds(tmp_path):
    """From per-item records: each cell the accuracy [95% interval], ↑ above chance; 'the image adds' the
    paired difference with its interval; two seeds: the mean over seeds, the interval of the pooled items."""
    import mdc.eval.compositionality as C

    def run(seed):
        n, rng = 40, np.random.default_rng(seed)
        suites = {f"sugarcrepe/{f}": C.Suite(f"sugarcrepe/{f}", "synthetic", [{"id": i} for i in range(n)],
                                             [["a", "b"]] * n, [""] * n, [f], n, clusters=[f"{i // 2}.jpg" for i in range(n)])
                  for f in ("add_att", "add_obj")}
        wins = {v: rng.random((2, n)) < p for v, p in (("exact", 0.9), ("exact_blind", 0.5), ("exact_shuffled", 0.5))}
        scored = {name: C.SuiteScores(s, {v: np.where(w[k][:, None], [[0.0, -1.0]], [[-1.0, 0.0]])
                                          for v, w in wins.items()}, np.full((n, 2), 3),
                                      methods={v: "exact" for v in wins})
                  for k, (name, s) in enumerate(suites.items())}
        path = tmp_path / f"run{seed}" / "results.json"
        write_results(str(path), "compositionality", C.summarise(scored, resamples=50))
        return f"c{seed}", {"notebook": "compositionality", "labels": {"seed": seed}, "artifacts": ["table2"],
                            "results": str(path)}

    records = write_records(tmp_path / "records", dict(run(s) for s in (0, 1)))
    registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, ["table2"])
    lines = (tmp_path / "figures" / "table2_compositionality.md").read_text().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = {r[0]: dict(zip(header, r)) for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:8])}
    column = "sugarcrepe_add (unseen phrasing)"
    raw, adds = rows["ARC"][column], rows["ARC, the image adds (points)"][column]
    assert 0 <= float(raw.split(" / ")[1]) <= 100 and adds.startswith("+") and rows["ARC"]["seeds"] == "2"
    raw = raw.split(" / ")[0]  # the controls beside it: the shuffled-image accuracy, the blind accuracy
    acc, lo, hi = (float(x) for x in raw.rstrip("]↑").replace("[", "").replace(",", "").split())
    assert lo < acc < hi and lo > 50
    assert rows["ARC"]["sugarcrepe_add (sub-file mean)"].count("[") == 1


def test_table1_shows_each_seeds_pretraining_loss_so_a_run_that_did_not_train_is_seen(tmp_path):
    """The issue's rule 'every objective trains': a probe row carries its pretraining runs' loss, first -> last."""
    index = {}
    for seed, (first, last) in enumerate(((4.3, 3.0), (4.2, 3.9))):  # seed 1 barely moves
        run = tmp_path / f"pretrain-s{seed}"
        run.mkdir()
        losses = np.linspace(first, last, 40)
        write_results(str(run / "results.json"), "pretrain", {"losses": losses.tolist()})
        probe = tmp_path / f"probe-s{seed}" / "results.json"
        write_results(str(probe), "linear_probe", _probe(np.random.default_rng(seed)))
        for path in (run / "results.json", probe):  # both name the same weights, as the notebooks record them
            record = json.loads(path.read_text())
            path.write_text(json.dumps({**record, "checkpoint_id": f"weights-{seed}"}))
        index[f"pretrain/clip-alt-s{seed}"] = {"notebook": "pretrain", "params": {}, "labels": {"seed": seed},
                                               "artifacts": ["table1"], "results": str(run / "results.json")}
        index[f"probe/clip-alt-s{seed}"] = {"notebook": "linear_probe", "params": {}, "artifacts": ["table1"],
                                            "labels": {"method": "CLIP", "style": "alt", "seed": seed},
                                            "results": str(probe)}
    registry.build_artifacts(write_records(tmp_path / "records", index), str(tmp_path / "figures"), PAPER_DIR,
                             ["table1"])
    lines = (tmp_path / "figures" / "table1_linear_probe.md").read_text().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    rows = {r[1]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:] if line.startswith("|"))}
    column = header.index("pretraining loss, first → last 10 steps (per seed)")
    ends = [np.linspace(first, last, 40) for first, last in ((4.3, 3.0), (4.2, 3.9))]
    assert rows["CLIP"][column] == ", ".join(f"{v[:10].mean():.2f} → {v[-10:].mean():.2f}" for v in ends)
    assert rows["CLIP random init"][column] == "-"


def test_table2_joins_a_model_s_parts_into_the_table_of_one_run_over_all_suites(tmp_path):
    """mini scores Table 2 in parts (reproduce.registry.TABLE2_PARTS: the order task apart from the pair tasks);
    the report joins the parts of one model into the same table as one run over every suite."""
    import mdc.eval.compositionality as C

    n, rng = 30, np.random.default_rng(0)
    suites = {f"sugarcrepe/{f}": C.Suite(f"sugarcrepe/{f}", "synthetic", [{"id": i} for i in range(n)], [["a", "b"]] * n,
                                         [""] * n, [f], n, clusters=[f"{i // 2}.jpg" for i in range(n)])
              for f in ("add_att", "add_obj", "swap_att")}
    scored = {name: C.SuiteScores(s, {"exact": np.where(rng.random(n)[:, None] < 0.8, [[0.0, -1.0]], [[-1.0, 0.0]])},
                                  np.full((n, 2), 3), methods={"exact": "exact"}) for name, s in suites.items()}

    def build(parts, folder):
        index = {}
        for part, names in parts.items():
            path = tmp_path / folder / part / "results.json"
            write_results(str(path), "compositionality", C.summarise({k: scored[k] for k in names}, resamples=50))
            labels = {"method": "ARC", "seed": 0, **({"part": part} if len(parts) > 1 else {})}
            index[f"compositionality/arc-{part}-s0"] = {"notebook": "compositionality", "labels": labels,
                                                       "artifacts": ["table2"], "results": str(path)}
        records = write_records(tmp_path / folder / "records", index)
        registry.build_artifacts(records, str(tmp_path / folder / "figures"), PAPER_DIR, ["table2"])
        table = (tmp_path / folder / "figures" / "table2_compositionality.md").read_text()
        return table.rsplit("\n\nFrom ", 1)[0]  # the provenance line counts the records

    whole = build({"all": list(scored)}, "whole")
    assert build({"pairs": ["sugarcrepe/add_att", "sugarcrepe/add_obj"], "swap": ["sugarcrepe/swap_att"]}, "parts") == whole
    assert "| ARC | 1 |" in whole and whole.count("[") >= 2


def test_table2_puts_the_in_distribution_columns_first_with_their_controls_and_verdicts(tmp_path):
    """Runs with the controls: each scorer's cell own [interval] / shuffled / no image, the control row says
    "passed" where some scorer loses the margin with another item's image and "control failed" where none does;
    a column no run scored says "-"."""
    import mdc.eval.compositionality as C

    n = 100
    suites = {f"own_sugarcrepe/{f}": C.Suite(f"own_sugarcrepe/{f}", "synthetic", [{"id": i} for i in range(n)],
                                             [["a", "b"]] * n, [""] * n, [f], n) for f in ("replace_att", "swap_att")}
    p = {"own_sugarcrepe/replace_att": {"exact": 1.0, "exact_shuffled": 0.5, "exact_blind": 0.5},  # the image decides
         "own_sugarcrepe/swap_att": {"exact": 0.6, "exact_shuffled": 0.58, "exact_blind": 0.5}}  # it does not
    scored = {name: C.SuiteScores(s, {v: np.where((np.arange(n) < q * n)[:, None], [[0.0, -1.0]], [[-1.0, 0.0]])
                                      for v, q in p[name].items()}, np.full((n, 2), 3),
                                  methods={v: "exact" for v in p[name]}) for name, s in suites.items()}
    path = tmp_path / "run" / "results.json"
    write_results(str(path), "compositionality", C.summarise(scored, resamples=20))
    records = write_records(tmp_path / "records", {"c": {"notebook": "compositionality", "labels": {"seed": 0},
                                                         "artifacts": ["table2"], "results": str(path)}})
    registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, ["table2"])
    lines = (tmp_path / "figures" / "table2_compositionality.md").read_text().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[2:4] == ["own_replace (in-distribution)", "own_swap (in-distribution)"]  # before the templates
    rows = {r[0]: dict(zip(header, r)) for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:])
            if len(r) > 2}
    assert rows["ARC"]["own_replace (in-distribution)"].endswith("↑ / 50.0 / 50.0")
    assert rows["ARC"]["own_replace (in-distribution)"].startswith("100.0 [100.0, 100.0]")  # from the sub-files' records
    assert rows["ARC"]["own_swap (in-distribution)"].endswith(" / 58.0 / 50.0")
    control = rows["control (own - shuffled >= margin, some scorer)"]
    assert control["own_replace (in-distribution)"] == "passed (margin 15)"  # 2 sqrt(0.5 / 100) = 14.1 points
    assert control["own_swap (in-distribution)"] == "control failed (margin 15)"
    assert control["aro_relation (unseen phrasing)"] == "-"  # not scored at all


def test_table1_grid_columns_read_the_grid_probe_and_its_floor(tmp_path):
    """The grid cells over seeds come from the grid probe; the floor's grid cells from the floor's grid probe."""
    index = {}
    for seed in (0, 1):
        results = _probe(np.random.default_rng(seed), grid=0.5 + 0.2 * seed, grid_floor=0.3 - 0.1 * seed)
        probe = tmp_path / f"probe-s{seed}" / "results.json"
        write_results(str(probe), "linear_probe", results)
        index[f"probe/arc-alt-s{seed}"] = {"notebook": "linear_probe", "params": {}, "artifacts": ["table1"],
                                           "labels": {"method": "ARC", "style": "alt", "seed": seed},
                                           "results": str(probe)}
    records = write_records(tmp_path / "records", index)

    def rows(names):
        registry.build_artifacts(records, str(tmp_path / "figures"), PAPER_DIR, ["table1"], names)
        lines = (tmp_path / "figures" / "table1_linear_probe.md").read_text().splitlines()
        header = [c.strip() for c in lines[2].strip("|").split("|")]
        cells = {r[1]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:]
                                   if line.startswith("|"))}
        return {m: (cells[m][header.index("relation, grid")], cells[m][header.index("mean4, grid")]) for m in cells}

    assert rows(["probe/arc-alt-s0"]) == {"ARC": ("50.0", "50.0"), "ARC random init": ("30.0", "30.0")}
    assert rows(["probe/arc-alt-s0", "probe/arc-alt-s1"]) == {"ARC": ("60.0 ± 14.1", "60.0 ± 14.1"),
                                                             "ARC random init": ("25.0 ± 7.1",) * 2}
