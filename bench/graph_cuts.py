"""Paper 004, Table I: worst-case relative error of cut queries on Facebook subgraphs.

Run: ``python -m bench.graph_cuts`` (about two minutes on 2 cores).

Setup, following §VI-B.1: the subgraph of ``facebook_combined.txt`` on the first |V|
vertex ids; per run one release at epsilon = 1 (the paper's "differential privacy
level is fixed to epsilon = 1") and 100 cut queries (S a uniformly random half of V,
T = V \\ S); the worst relative error ``max_q |q_hat - q| / q`` among them; the table
gives its mean over 10 runs. Beside it: the exact standard error of estimator (34)
relative to the mean true cut, bound (35) relative to it, and the same experiment at
epsilon = 2 (a diagnostic: see the note under the table).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from app.mechanisms import graph_cuts as gc
from bench._common import DATASETS, Run

SIZES = [577, 1154, 1731, 2308, 2885, 3462, 4039]
PAPER = [10.4, 11.7, 8.7, 5.3, 4.7, 5.3, 5.4]  # Table I, per cent
RUNS = 10
QUERIES = 100
EPSILONS = [1.0, 2.0]


def cut_sizes(edges: np.ndarray, s_masks: np.ndarray) -> np.ndarray:
    """True cuts between S and V \\ S for every mask row (edges crossing the partition)."""
    return (s_masks[:, edges[:, 0]] != s_masks[:, edges[:, 1]]).sum(axis=1)


def one_size(all_edges: np.ndarray, n_vertices: int, epsilon: float, seed: int) -> dict[str, Any]:
    edges = all_edges[(all_edges < n_vertices).all(axis=1)]
    rng = np.random.default_rng(seed)
    worst, mean_abs, stderr_rel, bound_rel, seconds = [], [], [], [], []
    for _ in range(RUNS):
        start = time.perf_counter()
        released = gc.release(edges, n_vertices, epsilon)
        seconds.append(time.perf_counter() - start)
        s_masks = np.zeros((QUERIES, n_vertices), dtype=bool)
        for q in range(QUERIES):
            s_masks[q, rng.permutation(n_vertices)[: n_vertices // 2]] = True
        truth = cut_sizes(edges, s_masks)
        estimates = released.cuts(list(s_masks), list(~s_masks))
        worst.append(float(np.max(np.abs(estimates - truth) / truth)))
        mean_abs.append(float(np.mean(np.abs(estimates - truth)) / truth.mean()))
        stderr_rel.append(released.stderr(s_masks[0], ~s_masks[0]) / float(truth.mean()))
        bound_rel.append(released.bound(s_masks[0], ~s_masks[0]) / float(truth.mean()))
    return {
        "n_vertices": n_vertices,
        "n_edges": int(edges.shape[0]),
        "epsilon": epsilon,
        "worst_relative_error": float(np.mean(worst)),
        "worst_relative_error_runs": worst,
        "mean_abs_error_relative": float(np.mean(mean_abs)),
        "stderr_relative": float(np.mean(stderr_rel)),
        "bound_35_relative": float(np.mean(bound_rel)),
        "release_seconds": float(np.mean(seconds)),
    }


def main() -> None:
    run = Run("graph_cuts", "python -m bench.graph_cuts")
    edges = np.loadtxt(DATASETS / "facebook_combined.txt", dtype=np.int64)
    results = {
        eps: [one_size(edges, v, eps, seed=i) for i, v in enumerate(SIZES)] for eps in EPSILONS
    }
    first, second = results[EPSILONS[0]], results[EPSILONS[1]]
    held = sum(r["mean_abs_error_relative"] <= r["bound_35_relative"] for r in first)
    ratio = float(
        np.mean([100 * r["worst_relative_error"] / p for r, p in zip(first, PAPER, strict=True)])
    )
    lines = [
        "# Paper 004, Table I: relative error of cut queries (graph_cuts)",
        "",
        f"Subgraphs of `facebook_combined.txt` on the first |V| vertex ids; {QUERIES} cut "
        f"queries per run (S a random half of V, T = V \\ S), mean over {RUNS} runs of the "
        "worst relative error max_q |q_hat - q| / q. mean/q: mean absolute error over the "
        "queries and runs; sigma/q: exact standard error of (34); (35)/q: bound (35) on the "
        "expected absolute error of one query; all three over the mean true cut. ",
        "",
        "| abs(V) | edges | paper (eps = 1) | ours, eps = 1 | mean/q | sigma/q | (35)/q | "
        "ours, eps = 2 | release time (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for paper, a, b in zip(PAPER, first, second, strict=True):
        lines.append(
            f"| {a['n_vertices']} | {a['n_edges']} | {paper:.1f}% | "
            f"{100 * a['worst_relative_error']:.1f}% | {100 * a['mean_abs_error_relative']:.1f}% | "
            f"{100 * a['stderr_relative']:.1f}% | "
            f"{100 * a['bound_35_relative']:.1f}% | {100 * b['worst_relative_error']:.1f}% | "
            f"{a['release_seconds']:.2f} |"
        )
    lines += [
        "",
        f"Bound (35): the mean absolute error (mean/q) is below (35)/q for {held} of "
        f"{len(first)} sizes; the worst of 100 queries may exceed it, since (35) bounds one "
        "query's expected error.",
        "",
        f"At the stated epsilon = 1 our worst-case errors are {ratio:.1f} times the paper's "
        "on average. They "
        "are what the exact standard error predicts (the worst of 100 roughly normal "
        "errors is 2-2.5 sigma; mean/q is near sqrt(2/pi) sigma/q = 0.8 sigma/q, the mean of "
        "|N(0, sigma^2)|, up to the few independent errors per run: the 100 queries of a run "
        "share one release). "
        "The paper's numbers are close to our epsilon = 2 column. We do not know what the "
        "paper did differently: its text says epsilon = 1 and gives estimator (34) with flip "
        "probability 1/(1 + e^eps).",
    ]
    payload = {"paper_table_i_percent": dict(zip(SIZES, PAPER, strict=True))} | {
        f"epsilon_{eps:g}": rows for eps, rows in results.items()
    }
    run.write("\n".join(lines), payload)


if __name__ == "__main__":
    main()
