"""What a smooth_synopsis answers request costs, against what its work check charges
(``app.releases.adapters.smooth_synopsis.answer_work``): per shape of query, the time an
answer takes in a batch, its charged work, and the time of the largest batch of it the
check lets through (:data:`MAX_ANSWER_WORK`). A fuzz audit found batches charged ``R`` a
query (100,000 one-factor queries at R = 60, 15-50 s; products of ten narrow Gaussian
factors, 67 ms each, about 5000 a request). The check should keep the largest batch of
every shape near 12 s or under.

    python -m bench.synopsis_answer_work [--quick]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from sklearn.datasets import load_breast_cancer

from app.mechanisms import smooth_synopsis as sy
from app.releases.adapters import smooth_queries
from app.releases.adapters import smooth_synopsis as adapter
from app.releases.registry import ColumnInfo, DatasetInfo
from bench._common import Run

#: (label, epsilon, delta, smoothness, basis_size) of the synopses measured on WDBC.
SYNOPSES = [
    ("gaussian, R from smoothness 16", 0.5, 1e-6, 16, None),
    ("laplace, R from smoothness 16", 0.5, 0.0, 16, None),
    ("gaussian, R = 5000", 0.5, 1e-6, 4, 5000),
]
#: (factors, width as a share of the column's range) of the product queries.
SHAPES = [(1, 1.0), (1, 0.01), (10, 1.0), (10, 0.01), (30, 0.01), (10, 0.0002)]


def wdbc() -> tuple[np.ndarray, DatasetInfo]:
    X = load_breast_cancer().data
    lo, hi = X.min(0), X.max(0)
    columns = tuple(
        ColumnInfo(f"c{j}", "continuous", float(lo[j]), float(hi[j])) for j in range(X.shape[1])
    )
    return np.clip(2 * (X - lo) / (hi - lo) - 1, -1, 1), DatasetInfo(len(X), columns)


def query(info: DatasetInfo, factors: int, width: float) -> dict[str, Any]:
    return {
        "type": "product",
        "space": "original",
        "factors": {
            c.name: {
                "type": "gaussian",
                "center": (c.lower + c.upper) / 2,  # type: ignore[operator]
                "sigma": (c.upper - c.lower) * width,  # type: ignore[operator]
            }
            for c in info.columns[:factors]
        },
    }


def measure(
    synopsis: sy.Synopsis, info: DatasetInfo, factors: int, width: float, seconds: float
) -> dict[str, Any]:
    """Time a batch of about ``seconds`` of the shape; the charged work of one query."""
    one = query(info, factors, width)
    work = adapter.answer_work(synopsis, smooth_queries.parse([one], info))
    answer = adapter.SmoothSynopsis().answer
    allowed = adapter.MAX_ANSWER_WORK // work
    n = 4
    while True:
        n = min(n, allowed)
        started = time.perf_counter()
        answer(synopsis, info, [one] * n)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds or n >= min(20000, allowed):
            break
        n *= 4
    per_query = elapsed / n
    return {
        "factors": factors,
        "width": width,
        "work": work,
        "microseconds_per_query": round(per_query * 1e6, 1),
        "batch_timed": n,
        "largest_batch": int(min(allowed, 100_000)),
        "largest_batch_seconds": round(min(allowed, 100_000) * per_query, 1),
        # charged R a query, before answer_work
        "before_largest_batch_seconds": round(
            min(adapter.MAX_ANSWER_WORK // synopsis.size, 100_000) * per_query, 1
        ),
        "microseconds_per_unit": round(per_query * 1e6 / work, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timed batches")
    args = parser.parse_args()
    run = Run("synopsis_answer_work", "python -m bench.synopsis_answer_work")
    X, info = wdbc()
    seconds = 0.3 if args.quick else 1.5
    results = []
    for label, epsilon, delta, smoothness, basis in SYNOPSES:
        synopsis = sy.measure(X, epsilon, delta, smoothness=smoothness, basis_size=basis)
        rows = [measure(synopsis, info, f, w, seconds) for f, w in SHAPES]
        results.append({"synopsis": label, "R": synopsis.size, "rows": rows})
    lines = [
        "# smooth_synopsis answers: time against the work check",
        "",
        f"WDBC (569 x 30); MAX_ANSWER_WORK = {adapter.MAX_ANSWER_WORK:.3g}; product queries "
        "of Gaussian factors centred mid-range, width a share of each column's range. "
        "`largest batch`: the most queries of the shape one request may hold (the check, "
        "or the 100,000 of the schema); its time is the batch's per-query time times that.",
        "",
        "| synopsis | R | factors | width | work a query | us a query | us a unit | "
        "largest batch | its time (s) | charged R alone: its time (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        for row in result["rows"]:
            lines.append(
                f"| {result['synopsis']} | {result['R']} | {row['factors']} | {row['width']} | "
                f"{row['work']} | {row['microseconds_per_query']} | "
                f"{row['microseconds_per_unit']} | {row['largest_batch']} | "
                f"{row['largest_batch_seconds']} | {row['before_largest_batch_seconds']} |"
            )
    run.write("\n".join(lines), {"results": results})


if __name__ == "__main__":
    main()
