"""bench.compressed_pca: one small run end to end."""

import json
from pathlib import Path

import numpy as np
import pytest

from bench import compressed_pca as bench


def test_a_small_run_writes_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Since f6cff34 a release with the data as reference carries no alpha (None); the
    bench computes Theorem 4.6's bound itself and writes its table (it raised TypeError
    on ``math.isfinite(None)`` before)."""
    monkeypatch.setattr("bench._common.RESULTS", tmp_path)
    monkeypatch.setattr(bench, "M_VALUES", [None, 400])
    monkeypatch.setattr(bench, "RUNS", 1)
    rng = np.random.default_rng(3)
    X = np.clip(rng.normal(0.0, 0.4, size=(1500, 3)) @ np.diag([1.0, 0.6, 0.3]), -1.0, 1.0)
    monkeypatch.setattr(bench, "load", lambda: X)
    bench.main()
    result = json.loads((tmp_path / "compressed_pca.json").read_text())
    assert [row["m"] for row in result["rows"]][1] == 400
    assert all(row["alpha"] is not None and row["alpha"] >= 0 for row in result["rows"])
    assert "alpha (Thm 4.6)" in (tmp_path / "compressed_pca.md").read_text()
