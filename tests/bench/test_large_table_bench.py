"""Smoke test of bench.large_table at a tiny n (the real run is not a test): the real
server in its own process, every step, the results and their comparison with a run."""

import json
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from bench import large_table as bench


@pytest.mark.slow  # a server started for each of the 6 steps: about 15 s
def test_tiny_run_measures_every_step_and_writes_the_results(tmp_path: Path) -> None:
    n = 1500
    out = tmp_path / "results"
    bench.main(["--sizes", str(n), "--out", str(out), "--name", "tiny", "--tmp", str(tmp_path)])
    payload = json.loads((out / "tiny.json").read_text())
    text = (out / "tiny.md").read_text()

    machine = payload["machine"]
    assert machine["cpus"] >= 1
    assert "load average" in machine["uptime_start"]
    assert payload["command"].startswith("python -m bench.large_table --sizes 1500")
    (result,) = payload["results"]
    assert result["n"] == n
    assert result["peak_reset_per_step"] is True
    assert set(result["uploads"]) == {"csv", "parquet"}
    for upload in result["uploads"].values():
        assert upload["seconds"] > 0
        assert upload["file_mib"] > 0
        assert upload["peak_rss_mib"] > 0
    assert list(result["releases"]) == list(bench.RELEASES)
    for label, release in result["releases"].items():
        assert release["seconds"] >= release["measure_s"] >= 0, label
        assert release["synthesize_s"] >= 0, label
        assert release["answers"]["seconds"] > 0, label
        assert release["answers"]["requests"] == 1, label
        assert release["download"]["mib"] >= 0, label
    methods = [r["resolved"].get("method") for r in result["releases"].values()]
    assert methods[:2] == ["marginals", "tree"]  # the defaults at delta 0 and delta > 0
    assert "basis_size" in result["releases"]["smooth_synopsis"]["resolved"]
    assert "| 1500 | csv |" in text
    assert "| 1500 | smooth_synthetic, delta 1e-9 (tree) | bins" in text
    assert "Machine: " in text

    # a run compared with itself: every step, the same numbers on both sides
    compared = bench.markdown(payload["results"], payload)
    assert "## Against `tiny`" in compared
    assert "| 1500 | upload parquet |" in compared
    assert "| 1500 | randomized_response: download |" in compared


def test_the_tables_are_the_declared_ones_and_seeded(tmp_path: Path) -> None:
    first = bench.write_files(3000, _dir(tmp_path / "a"))
    second = bench.write_files(3000, _dir(tmp_path / "b"))
    assert first["csv"].read_bytes() == second["csv"].read_bytes()
    table = pq.read_table(first["parquet"])
    assert table.equals(pacsv.read_csv(first["csv"]).cast(table.schema))
    assert table.num_rows == 3000
    declared = {c["name"]: c for c in bench.schema()["columns"]}
    assert table.column_names == list(declared)
    for name, (lower, upper) in bench.BOUNDS.items():
        column = table.column(name).to_numpy()
        assert lower <= column.min() < column.max() <= upper, name
    assert set(table.column(bench.CATEGORICAL).to_pylist()) <= set(bench.CATEGORIES)
    assert set(table.column(bench.BINARY).to_pylist()) == {0, 1}


def _dir(path: Path) -> Path:
    path.mkdir()
    return path
