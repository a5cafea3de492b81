"""Interval coverage of ``smooth_synopsis`` over many releases, with its standard error.

Run from the repository root:

    python -m bench.synopsis_coverage                  # 40 releases per sigma, 1000 queries
    python -m bench.synopsis_coverage --quick          # smoke run (WDBC, sigma 4, 3 releases)

Why a separate run: the answers of one release share one noise vector, so the share of a
release's queries that its 95 % intervals cover swings from release to release (often
all or nothing when the queries are alike); ``bench.smooth_synopsis`` measures 6-10
releases per sigma, which leaves the pooled coverage uncertain by a few percent. Here
each (dataset, sigma) gets ``--releases`` fresh measurements of the default synopsis
(``smooth_synopsis.measure(X, 1.0, smoothness=sigma^2)``, the library and service
defaults, co-spread included; ``--delta`` for the Gaussian variant) answering the same
``--queries`` paper-000 queries (``GaussianMixtureBatch.random(Q, 10, d, sigma,
default_rng(QUERY_SEED))``) by the code of ``answer_many`` (:func:`bench.smooth_synopsis.
answer_rounds`). Reported: the per-release coverage averaged over releases, and its
standard error ``sd / sqrt(releases)`` (releases are independent), per sigma and pooled
over all sigmas of a dataset (the pooled standard error from the per-sigma ones).
Data: the paper-000 protocol's (``bench.smooth_synthetic.load_datasets``).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import smooth_synopsis
from app.mechanisms.basis import moments
from app.mechanisms.queries import GaussianMixtureBatch
from bench._common import Run
from bench.smooth_synopsis import answer_rounds
from bench.smooth_synthetic import DATA_DIR, QUERY_SEED, SIGMAS, load_datasets

LEVEL = 0.95


def coverage(
    X: np.ndarray,
    sigma: int,
    releases: int,
    n_queries: int,
    delta: float,
    epsilon: float = 1.0,
    before: bool = False,
) -> dict[str, Any]:
    """Per-release coverage of ``releases`` fresh default synopses at one sigma.

    ``before``: the same releases are answered a second time as the code before c118fd3 /
    8dee82a did (no second-order variance of the product, ``CO_SPREAD_MODEL_ERROR = 0``),
    a paired comparison, reported under ``"before"``."""
    d = X.shape[1]
    batch = GaussianMixtureBatch.random(
        n_queries, 10, d, float(sigma), np.random.default_rng(QUERY_SEED)
    )
    truth = batch.answers(X)
    synopses = [
        smooth_synopsis.measure(X, epsilon, delta, smoothness=sigma * sigma)
        for _ in range(releases)
    ]
    exact = moments(X, synopses[0].index_set)
    cell = _summary(answer_rounds(synopses, batch, exact), truth, releases)
    cell["R"] = synopses[0].size
    cell["co_spread"] = synopses[0].co_spread is not None
    if before:
        saved = smooth_synopsis.CO_SPREAD_MODEL_ERROR
        smooth_synopsis.CO_SPREAD_MODEL_ERROR = 0.0
        try:
            old = answer_rounds(synopses, batch, exact, second_order=False)
        finally:
            smooth_synopsis.CO_SPREAD_MODEL_ERROR = saved
        cell["before"] = _summary(old, truth, releases)
    return cell


def _summary(out: dict[str, np.ndarray], truth: np.ndarray, releases: int) -> dict[str, Any]:
    error = np.abs(out["values"] - truth[:, None])
    inside = error <= out["halfwidth"]
    per_release = inside.mean(axis=0)
    per_query = inside.mean(axis=1)
    noise_only = (error <= out["noise_halfwidth"]).mean(axis=0)
    q95 = np.quantile(error, LEVEL, axis=1)
    ratio = np.median(out["halfwidth"], axis=1) / np.where(q95 > 0, q95, np.nan)
    return {
        "per_release": per_release.tolist(),
        "mean": float(per_release.mean()),
        "se": float(per_release.std(ddof=1) / math.sqrt(releases)) if releases > 1 else math.nan,
        "noise_only": float(noise_only.mean()),
        "min_query": float(per_query.min()),
        "half_over_q95": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else math.nan,
        "applied": float(np.mean(out["dependence"] != 0)),
    }


def run(
    datasets: list[str],
    sigmas: tuple[int, ...],
    releases: int,
    n_queries: int,
    delta: float,
    data_dir: Path,
    epsilon: float = 1.0,
    before: bool = False,
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "settings": {
            "sigmas": list(sigmas),
            "releases": releases,
            "queries": n_queries,
            "epsilon": epsilon,
            "delta": delta,
            "level": LEVEL,
            "query_seed": QUERY_SEED,
        },
        "datasets": {},
    }
    for name, X in load_datasets(datasets, data_dir).items():
        entry: dict[str, Any] = {"n": X.shape[0], "d": X.shape[1], "sigmas": {}}
        for sigma in sigmas:
            started = time.time()
            entry["sigmas"][str(sigma)] = cell = coverage(
                X, sigma, releases, n_queries, delta, epsilon, before
            )
            was = cell.get("before")
            print(
                f"{name} sigma={sigma}: coverage {cell['mean']:.3f} +- {cell['se']:.3f} "
                f"(noise-only {cell['noise_only']:.3f}, worst query {cell['min_query']:.3f}, "
                f"half/q95 {cell['half_over_q95']:.2f}, R={cell['R']})"
                + (
                    f"; before {was['mean']:.3f} (worst query {was['min_query']:.3f}, "
                    f"half/q95 {was['half_over_q95']:.2f})"
                    if was
                    else ""
                )
                + f"; {time.time() - started:.0f} s",
                flush=True,
            )
        cells = list(entry["sigmas"].values())
        entry["pooled"] = float(np.mean([c["mean"] for c in cells]))
        entry["pooled_se"] = float(math.sqrt(sum(c["se"] ** 2 for c in cells)) / len(cells))
        result["datasets"][name] = entry
    return result


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    sigmas = s["sigmas"]
    head = ["dataset", *[f"sigma={sg}" for sg in sigmas], "pooled"]
    lines = [
        "# smooth_synopsis interval coverage over many releases (issue 4)",
        "",
        "Produced by `python -m bench.synopsis_coverage` (protocol in its docstring).",
        "",
        f"- {s['releases']} fresh releases per dataset and sigma, {s['queries']} queries each, "
        f"epsilon = {s['epsilon']}, delta = {s['delta']}, nominal level {s['level']}; the "
        "default synopsis (basis `auto`, co-spread on).",
        "- Cells: `coverage +- standard error (noise-only)`. Coverage: the share of a "
        "release's queries whose interval (`Answer.as_dict()['interval']`) holds the true "
        "answer, averaged over releases; standard error: the spread of that share across "
        "the (independent) releases over sqrt(releases). Noise-only: the same with "
        "`noise_halfwidth` alone. Pooled: the mean over sigma, its standard error from the "
        "per-sigma ones.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] * len(head)) + " |",
    ]
    for name, entry in result["datasets"].items():
        cells = [
            f"{c['mean']:.3f} +- {c['se']:.3f} ({c['noise_only']:.3f})"
            for c in (entry["sigmas"][str(sg)] for sg in sigmas)
        ]
        pooled = f"**{entry['pooled']:.3f} +- {entry['pooled_se']:.3f}**"
        lines.append(
            "| " + " | ".join([f"{name} ({entry['n']} x {entry['d']})", *cells, pooled]) + " |"
        )
    lines += [
        "",
        "Per cell: the lowest per-query coverage (over releases), `half / q95` (the median "
        "over queries of the median half-width over the 95th percentile of the absolute "
        "error seen), the share of answers with the dependence correction applied and, "
        "with `--before`, the same releases answered as before c118fd3 / 8dee82a (no "
        "second-order variance of the product, `CO_SPREAD_MODEL_ERROR = 0`).",
        "",
        "| dataset | sigma | R | coverage | worst query | half / q95 | applied "
        "| before: coverage | worst query | half / q95 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in result["datasets"].items():
        for sg in sigmas:
            c = entry["sigmas"][str(sg)]
            if "min_query" not in c:
                continue
            b = c.get("before")
            was = (
                f"{b['mean']:.3f} +- {b['se']:.3f} | {b['min_query']:.3f} | "
                f"{b['half_over_q95']:.2f}"
                if b
                else "- | - | -"
            )
            lines.append(
                f"| {name} | {sg} | {c['R']} | {c['mean']:.3f} +- {c['se']:.3f} | "
                f"{c['min_query']:.3f} | {c['half_over_q95']:.2f} | {c['applied']:.2f} | {was} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="WDBC, sigma 4, 3 releases")
    parser.add_argument("--releases", type=int, default=40)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--delta", type=float, default=0.0)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument(
        "--before", action="store_true", help="also answer as before c118fd3/8dee82a (paired)"
    )
    parser.add_argument("--datasets", default="WDBC,CTG,PKS,CRM")
    parser.add_argument("--sigmas", default=",".join(str(sg) for sg in SIGMAS))
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.sigmas, args.releases, args.queries = "WDBC", "4", 3, 200
    command = "python -m bench.synopsis_coverage" + (" " + " ".join(argv) if argv else "")
    stem = "smooth_synopsis_coverage" + ("_quick" if args.quick else "")
    if args.delta > 0:
        stem += "_gauss"
    if args.epsilon != 1.0:
        stem += f"_eps{args.epsilon:g}"
    recorder = Run(stem, command)
    result = run(
        args.datasets.split(","),
        tuple(int(sg) for sg in args.sigmas.split(",")),
        args.releases,
        args.queries,
        args.delta,
        args.data_dir,
        args.epsilon,
        args.before,
    )
    recorder.finish(render_markdown(result), result, quick=args.quick)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
