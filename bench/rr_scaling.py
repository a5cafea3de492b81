"""Paper 004, Fig. 4: squared error of linear queries against n, next to bound (20).

Run: ``python -m bench.rr_scaling`` (about a minute on 2 cores).

Setup, following §VI-A.3 with UCI Adult instead of Netflix: the databases are nested
random subsets of ``adult.csv`` (n = 1000 ... 32561) restricted to a set of categorical
columns; the domain is the product of their declared categories (the categories seen
in the public file, ``?`` included). One set of 200 linear queries is drawn once and
used for every n: a row function takes iid U[0, 1] values on the domain cells, divided
by (max - min) so its range is 1 (the paper's normalisation, so ``c = b - a = 1``).
For each n and each of 20 runs: one release at epsilon = 1, the unbiased estimate
(17) of every query, the worst squared error among the 200 queries; the table gives
its mean over the runs (the paper's "worst-case distortion ... averaged over 20 runs"),
bound (20) ``g^2 / ((1 - e^-eps)^2 n)``, and the exact worst-case variance of the
estimator (max over the 200 queries of ``stderr(kind="worst_case")^2``).
"""

from __future__ import annotations

import csv
import math
from typing import Any

import numpy as np

from app.mechanisms import randomized_response as rr
from bench._common import DATASETS, Run, loglog_slope

EPSILON = 1.0
SIZES = [1000, 2000, 4000, 8000, 16000, 32561]
RUNS = 20
QUERIES = 200
DOMAINS = {
    "race": ["race"],
    "sex x race x salary": ["sex", "race", "Salary"],
    "workclass x education": ["workclass", "education"],
}


def load_columns(columns: list[str]) -> tuple[np.ndarray, rr.Domain]:
    with open(DATASETS / "adult.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    categories = [sorted({row[c] for row in rows}) for c in columns]
    index = [{value: i for i, value in enumerate(cats)} for cats in categories]
    values = np.array([[index[j][row[c]] for j, c in enumerate(columns)] for row in rows])
    domain = rr.Domain(tuple(len(c) for c in categories))
    return domain.encode(values), domain


def one_domain(name: str, columns: list[str], seed: int) -> dict[str, Any]:
    codes, domain = load_columns(columns)
    rng = np.random.default_rng(seed)
    order = rng.permutation(codes.size)
    raw = rng.uniform(0, 1, size=(QUERIES, domain.size))
    tables = raw / (raw.max(axis=1) - raw.min(axis=1))[:, None]
    rows = []
    for n in SIZES:
        x = codes[order[:n]]
        truth = tables[:, x].mean(axis=1)
        worst, mean_sq = [], []
        for _ in range(RUNS):
            released = rr.release(x, domain, EPSILON)
            estimates = np.array([released.estimate(t) for t in tables])
            errors = (estimates - truth) ** 2
            worst.append(float(errors.max()))
            mean_sq.append(float(errors.mean()))
        worst_variance = max(released.stderr(t) ** 2 for t in tables)
        bound = released.stderr(tables[0], "bound") ** 2
        rows.append(
            {
                "n": n,
                "worst_sq_error": float(np.mean(worst)),
                "mean_sq_error": float(np.mean(mean_sq)),
                "worst_case_variance": worst_variance,
                "bound_20": bound,
            }
        )
    preview = rr.preview(SIZES[-1], domain.size, EPSILON)
    return {
        "domain": name,
        "columns": columns,
        "domain_size": domain.size,
        "rows": rows,
        "slope_worst_sq_error": loglog_slope(
            [r["n"] for r in rows], [r["worst_sq_error"] for r in rows]
        ),
        "slope_bound_20": loglog_slope([r["n"] for r in rows], [r["bound_20"] for r in rows]),
        "preview_warning_at_full_n": preview.warning,
    }


def main() -> None:
    run = Run("rr_scaling", "python -m bench.rr_scaling")
    results = [one_domain(name, cols, seed=i) for i, (name, cols) in enumerate(DOMAINS.items())]
    lines = [
        "# Paper 004, Fig. 4: squared error of linear queries against n (randomized response)",
        "",
        f"UCI Adult (`adult.csv`), nested random subsets, epsilon = {EPSILON}, {QUERIES} random "
        f"linear queries with range 1 (fixed across n), {RUNS} runs per n. Columns: mean over "
        "runs of the worst squared error among the queries, mean over runs and queries of the "
        "squared error, exact worst-case variance of the estimator (max over the queries), "
        "bound (20).",
        "",
        "Paper (Fig. 4, Netflix ratings, |D| = 5, n = 14,559 ... 232,944): a plot only, no "
        "numbers in the text; the worst-case squared error lies below bound (20) and falls as "
        "O(1/n) (log-log slope -1).",
        "",
    ]
    for result in results:
        lines += [
            f"## {result['domain']} (|D| = {result['domain_size']})",
            "",
            "| n | worst sq. error | mean sq. error | worst-case variance | bound (20) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in result["rows"]:
            lines.append(
                f"| {r['n']} | {r['worst_sq_error']:.3g} | {r['mean_sq_error']:.3g} | "
                f"{r['worst_case_variance']:.3g} | {r['bound_20']:.3g} |"
            )
        lines += [
            "",
            f"Log-log slope of the worst squared error: **{result['slope_worst_sq_error']:.2f}** "
            f"(bound (20): {result['slope_bound_20']:.2f}; paper: about -1).",
        ]
        if result["preview_warning_at_full_n"]:
            lines.append(f"Preview at n = {SIZES[-1]}: {result['preview_warning_at_full_n']}")
        lines.append("")
    run.write("\n".join(lines), {"epsilon": EPSILON, "results": results})
    assert all(math.isfinite(r["slope_worst_sq_error"]) for r in results)


if __name__ == "__main__":
    main()
