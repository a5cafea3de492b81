"""bench.wide_tree: the reference pair counts, and one small run end to end."""

from pathlib import Path

import numpy as np
import pytest

from app.mechanisms import marginal_tree
from app.mechanisms.data import as_source
from bench import wide_tree as bench


def test_the_reference_counts_every_row_of_every_pair() -> None:
    """The per-pair loop (the code before 15b84f8) against a direct count."""
    X = bench.table(300, 4, seed=1)
    assert X.min() >= -1.0
    assert X.max() <= 1.0
    group = marginal_tree.column_groups(np.zeros((4, 10)), 4, "equal")
    n, counts = bench.per_pair_counts(as_source(X), 8, True, group, 4)
    assert n == 300
    assert counts.shape == (6, 4, 4)
    assert (counts.sum(axis=(1, 2)) == 300).all()
    codes = marginal_tree._batch_coarse_codes(X, 8, True, group)
    direct = np.zeros((4, 4), dtype=np.int64)
    np.add.at(direct, (codes[:, 0], codes[:, 3]), 1)
    assert np.array_equal(counts[2], direct)  # pairs (0,1), (0,2), (0,3), ...


def test_a_small_run_writes_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench._common.RESULTS", tmp_path)
    payload = bench.main(["--shapes", "2000x6", "--queries", "40", "--name", "wide_tree_test"])
    (row,) = payload["results"]
    assert (row["n"], row["d"], row["pairs"]) == (2000, 6, 15)
    assert row["answers_blas_one_s"] >= 0
    text = (tmp_path / "wide_tree_test.md").read_text()
    assert "| 2,000 | 6 | 15 |" in text
    assert "Machine:" in text
