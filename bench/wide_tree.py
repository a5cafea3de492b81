"""Wide tables and the ``tree`` method: the pair counts, the measure stage and the answers.

What the scale audit of 2026-11-28 found slow at ``d`` in the hundreds, measured before
and after its fixes, in one process (the library, no server):

- *pair counts*: :func:`app.mechanisms.marginal_tree.all_pair_counts`, every pair's
  coarse table, as one-hot Gram products of row chunks (since 15b84f8) against the
  per-pair :func:`~app.mechanisms.marginal_tree.pair_counts` loop it replaced
  (:func:`per_pair_counts`, kept here as the reference); the two must agree integer for
  integer (checked on every run).
- *measure*: :func:`app.mechanisms.marginal_tree.measure` at ``epsilon = 1``, ``delta =
  1e-9`` (the three steps; the pair counts are most of it at large ``d``).
- *answers*: ``10^4`` one-centre Gaussian kernels (``sigma = 4`` in ``[-1, 1]`` units) on
  the measured tree (:meth:`TreeMeasurements.answers`, the 21 laws: the release and its
  bootstrap replicates), in blocks of 500 queries as the service sends them, with
  OpenBLAS's default thread count (one per core) and with one thread
  (``CURATOR_BLAS_THREADS = 1``, the service's default since 6e058d4), alone and as two
  requests at once (two threads, as the API's threadpool serves two analysts).

Data: ``n`` rows of ``d`` columns, a Gaussian AR(1) chain (correlation 0.6 between
neighbours, fixed seed :data:`SEED`) clipped to ``[-1, 1]``.

    python -m bench.wide_tree [--shapes 100000x50,100000x100,100000x191] [--queries 10000]
"""

from __future__ import annotations

import argparse
import shlex
import threading
import time
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import ThreadpoolController

from app.mechanisms import marginal_tree
from app.mechanisms.chebyshev import gaussian_expansion
from app.mechanisms.data import RowSource, as_source, iter_checked
from bench._common import Run

SEED = 20261128
EPSILON, DELTA = 1.0, 1e-9
SIGMA = 4.0
BLOCK = 500


def table(n: int, d: int, seed: int = SEED) -> NDArray[np.float64]:
    """An AR(1) Gaussian chain, correlation 0.6 between neighbours, scale 0.4, clipped."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, d))
    X[:, 0] = rng.standard_normal(n)
    for j in range(1, d):
        X[:, j] = 0.6 * X[:, j - 1] + 0.8 * rng.standard_normal(n)
    return np.clip(0.4 * X, -1.0, 1.0)


def per_pair_counts(
    source: RowSource, bins: int, atoms: bool, group: NDArray[np.int64], pair_bins: int
) -> tuple[int, NDArray[np.int64]]:
    """The pair counts as before 15b84f8: one ``bincount`` per pair per batch."""
    pairs = marginal_tree.all_pairs(source.n_cols)
    counts = np.zeros((len(pairs), pair_bins, pair_bins), dtype=np.int64)
    n = 0
    for batch in iter_checked(source):
        codes = marginal_tree._batch_coarse_codes(batch, bins, atoms, group)
        n += codes.shape[0]
        for k, (i, j) in enumerate(pairs):
            counts[k] += marginal_tree.pair_counts(codes, i, j, pair_bins)
    return n, counts


def _timed(function: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = function(*args)
    return time.perf_counter() - started, out


def _answers_seconds(tree: marginal_tree.TreeMeasurements, centers: NDArray[np.float64]) -> float:
    weights = np.ones((centers.shape[0], 1))
    started = time.perf_counter()
    for start in range(0, centers.shape[0], BLOCK):
        expansion = gaussian_expansion(
            centers[start : start + BLOCK], weights[start : start + BLOCK], SIGMA
        )
        tree.answers(expansion)
    return time.perf_counter() - started


def _concurrent_answers_seconds(
    tree: marginal_tree.TreeMeasurements, centers: NDArray[np.float64]
) -> float:
    """Wall time of two requests of ``centers`` answered at once, each in its own thread
    (the API's threadpool serving two analysts)."""
    threads = [threading.Thread(target=_answers_seconds, args=(tree, centers)) for _ in range(2)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def measure_shape(n: int, d: int, queries: int) -> dict[str, Any]:
    X = table(n, d)
    fixed = marginal_tree.plan(n, d, EPSILON, DELTA)
    # equal groups (the column_groups of "equal": public, from the shape alone)
    group = marginal_tree.column_groups(np.zeros((d, fixed.cells)), fixed.pair_bins, "equal")
    source = as_source(X)
    args = (source, fixed.bins, fixed.atoms, group, fixed.pair_bins)
    gram_s, (_, gram) = _timed(marginal_tree.all_pair_counts, *args)
    loop_s, (_, loop) = _timed(per_pair_counts, *args)
    if not np.array_equal(gram, loop):
        raise AssertionError(f"the pair counts differ at n = {n}, d = {d}")
    measure_s, tree = _timed(marginal_tree.measure, X, EPSILON, DELTA)
    tree.answers(gaussian_expansion(np.zeros((1, 1, d)), np.ones((1, 1)), SIGMA))  # laws fitted
    centers = np.random.default_rng(SEED + 1).uniform(-1, 1, (queries, 1, d))
    controller = ThreadpoolController()
    default_threads = [i["num_threads"] for i in controller.select(user_api="blas").info()]
    answers_default = _answers_seconds(tree, centers)
    concurrent_default = _concurrent_answers_seconds(tree, centers)
    with controller.limit(limits=1, user_api="blas"):
        answers_one = _answers_seconds(tree, centers)
        concurrent_one = _concurrent_answers_seconds(tree, centers)
    return {
        "n": n,
        "d": d,
        "pairs": d * (d - 1) // 2,
        "pair_bins": fixed.pair_bins,
        "pair_counts_per_pair_s": round(loop_s, 2),
        "pair_counts_gram_s": round(gram_s, 2),
        "measure_s": round(measure_s, 2),
        "queries": queries,
        "blas_default_threads": default_threads,
        "answers_blas_default_s": round(answers_default, 2),
        "answers_blas_one_s": round(answers_one, 2),
        "two_requests_blas_default_s": round(concurrent_default, 2),
        "two_requests_blas_one_s": round(concurrent_one, 2),
    }


def markdown(results: list[dict[str, Any]], note: str = "") -> str:
    lines = [
        "# Wide tables and the tree: pair counts, measure, answers",
        "",
        *([note, ""] if note else []),
        "The library in one process (protocol in `bench/wide_tree.py`). *per pair*: one "
        "`bincount` per pair per batch (before 15b84f8); *Gram*: one-hot products of row "
        "chunks (the same integers, checked). *measure*: `marginal_tree.measure` at "
        f"epsilon {EPSILON}, delta {DELTA:g}. *answers*: one-centre Gaussian kernels (sigma "
        f"{SIGMA:g}) in blocks of {BLOCK}, OpenBLAS at its default thread count and at one "
        "(the service's `CURATOR_BLAS_THREADS` default); *two requests*: the same batch "
        "answered twice at once, in two threads (two analysts), wall time for both.",
        "",
        "| n | d | pairs | pair counts, per pair s | pair counts, Gram s | speed-up | measure s "
        "| queries | answers, BLAS default s (threads) | answers, 1 BLAS thread s "
        "| two requests, BLAS default s | two requests, 1 BLAS thread s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        speedup = r["pair_counts_per_pair_s"] / max(r["pair_counts_gram_s"], 1e-9)
        lines.append(
            f"| {r['n']:,} | {r['d']} | {r['pairs']:,} | {r['pair_counts_per_pair_s']} | "
            f"{r['pair_counts_gram_s']} | {speedup:.1f}x | {r['measure_s']} | {r['queries']:,} | "
            f"{r['answers_blas_default_s']} ({r['blas_default_threads']}) | "
            f"{r['answers_blas_one_s']} | {r['two_requests_blas_default_s']} | "
            f"{r['two_requests_blas_one_s']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--shapes",
        default="100000x50,100000x100,100000x191",
        help="comma-separated n x d (default 10^5 rows of 50, 100 and 191 columns)",
    )
    parser.add_argument("--queries", type=int, default=10_000, help="kernels answered")
    parser.add_argument("--name", default="wide_tree", help="stem of the result files")
    parser.add_argument("--note", default="", help="a line under the title (what was run)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    run = Run(args.name, shlex.join(["python", "-m", "bench.wide_tree", *(argv or [])]))
    results = [measure_shape(n, d, args.queries) for n, d in shapes]
    payload = {
        "settings": {"seed": SEED, "epsilon": EPSILON, "delta": DELTA, "sigma": SIGMA},
        "note": args.note,
        "results": results,
    }
    run.write(markdown(results, args.note), payload)
    return payload


if __name__ == "__main__":
    main()
