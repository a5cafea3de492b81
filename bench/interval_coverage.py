"""Calibration of the error bars every release type reports: coverage and width.

Run from the repository root:

    python -m bench.interval_coverage            # the committed run (9-14 minutes here, by load)
    python -m bench.interval_coverage --quick    # smoke run (a few releases per cell)

What each release type claims (``app/releases/adapters``, README "Answers"), and what is
measured here against that claim, at epsilon 0.1, 1 and 10:

* ``randomized_response`` (paper 004, mechanism E): ``interval = value +- 1.96 stderr``
  with ``stderr`` the exact standard deviation of the unbiased estimator (17) maximised
  over databases of this size (never below the truth); a normal approximation. It is
  read as a 95 % interval for the query's exact answer on the (discretised) raw data,
  ``(1/n) sum_i phi(x_i)``. Measured: conjunctions of one to three attributes from
  common (50 %) to rare (< 0.5 %) and a table query with values in [0, 1], unbiased (17)
  and proper (21) estimators, on Adult (32,561 rows, five categorical columns, 10,080
  cells) and WDBC (569 rows: diagnosis and two continuous columns cut into the §V-A
  default cells, normalised with the columns' range as declared bounds).
* ``graph_cuts`` (paper 004 §VI-B): a 95 % interval for the true cut ``q_{S,T}(x)``,
  exact (Clopper-Pearson inversion of ``Bin(e, 1-p) + Bin(k-e, p)``, coverage at least
  0.95 for every graph) when ``k p (1 - p) < 400``, else normal, clipped to ``[0, k]``.
  Measured on the subgraph of the Facebook ego network induced by its first 300
  vertices, cuts of 6 to 7,200 pairs, each holding edges.
* ``smooth_synopsis`` (paper 001): ``interval``, nominal 95 %, for ``q_f(D)``, the exact
  query on the raw (normalised) rows: the DP noise by its saddlepoint (Laplace) or
  normal (Gaussian) quantile plus an estimate of the truncation error (not a bound);
  ``worst_case_interval``: noise quantile plus the truncation bound ``tau``, "valid for
  every dataset". Measured: the default synopsis (co-spread on) of WDBC, Laplace
  (delta = 0) and Gaussian (delta = 1e-6), answering 300 paper-000 Gaussian mixtures
  (10 centres, widths sigma = 2, 4, 8, smoothness sigma^2) by the code of
  ``answer_many`` (:func:`bench.smooth_synopsis.answer_rounds`).

Not measured here: ``smooth_synthetic`` reports no interval, only the noise's standard
error (a parametric bootstrap) that leaves out the model's error, which
``bench/results/answer_stderr.md`` and ``answer_stderr_moments.md`` audit; ``compressed``
reports neither a standard error nor an interval (its ``error_bound`` is Proposition 3.4's
bound on the PCA projector error).

Repetitions: every release is a fresh draw of OpenDP's CSPRNG (which cannot be seeded), so
the releases are independent. For one query, coverage over ``R`` releases is binomial:
its standard error is ``sqrt(c (1 - c) / R)``. Queries answered from one release share
its noise, so a pooled coverage's standard error is taken from the spread of the
per-release coverage across releases (``sd / sqrt(R)``). Width: ``half / q95`` is the
interval's median half-width over the 95th percentile of the absolute error actually
seen for that query over the releases (1 = as narrow as a 95 % interval of that query
could be if it were symmetric; above 1 conservative); reported as the median over the
queries of a cell.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import graph_cuts as gc
from app.mechanisms import randomized_response as rr
from app.mechanisms import smooth_synopsis
from app.mechanisms.basis import moments
from app.mechanisms.queries import GaussianMixtureBatch
from bench._common import DATASETS, Run
from bench.smooth_synopsis import answer_rounds
from bench.smooth_synthetic import QUERY_SEED, load_datasets

LEVEL = 0.95
Z_95 = 1.959963984540054
EPSILONS = (0.1, 1.0, 10.0)

ADULT_COLUMNS = ("workclass", "education", "marital-status", "race", "sex")


# --------------------------------------------------------------------------- summaries


def summarise(inside: np.ndarray, half: np.ndarray, error: np.ndarray) -> dict[str, Any]:
    """``inside``, ``half`` and ``error`` are ``(queries, releases)``: whether the interval
    held the truth, its half-width and the distance from its midpoint to the truth (the
    value's error where the interval is symmetric about the value)."""
    per_query = inside.mean(axis=1)
    per_release = inside.mean(axis=0)
    releases = inside.shape[1]
    q95 = np.quantile(error, LEVEL, axis=1)
    ratio = np.median(half, axis=1) / np.where(q95 > 0, q95, np.nan)
    return {
        "coverage": float(inside.mean()),
        "se": float(per_release.std(ddof=1) / math.sqrt(releases)) if releases > 1 else math.nan,
        "min_query_coverage": float(per_query.min()),
        "min_query_se": float(math.sqrt(per_query.min() * (1 - per_query.min()) / releases)),
        "half_over_q95": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else math.nan,
        "per_query": per_query.round(4).tolist(),
        "releases": int(releases),
        "queries": int(inside.shape[0]),
    }


def _interval_summary(ends: np.ndarray, truth: np.ndarray) -> dict[str, Any]:
    """``ends`` is ``(queries, releases, 2)``, the intervals' low and high ends."""
    low, high = ends[..., 0], ends[..., 1]
    t = truth[:, None]
    return summarise((low <= t) & (t <= high), (high - low) / 2, np.abs((low + high) / 2 - t))


# --------------------------------------------------------------------------- randomized response


def _adult(data_dir: Path) -> tuple[np.ndarray, rr.Domain, list[list[str]]]:
    with open(data_dir / "adult.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    levels = [sorted({row[c].strip() for row in rows}) for c in ADULT_COLUMNS]
    values = np.array(
        [[levels[j].index(row[c].strip()) for j, c in enumerate(ADULT_COLUMNS)] for row in rows]
    )
    domain = rr.Domain(tuple(len(v) for v in levels))
    return domain.encode(values), domain, levels


def _wdbc() -> tuple[np.ndarray, rr.Domain]:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X = data.data[:, :2]  # mean radius, mean texture
    low, high = X.min(axis=0), X.max(axis=0)
    normalised = np.clip(2 * (X - low) / (high - low) - 1, -1, 1)
    bits = rr.default_bits(X.shape[0])
    cells = [rr.discretize(normalised[:, j], bits) for j in range(2)]
    values = np.column_stack([data.target, *cells])
    domain = rr.Domain((2, 1 << bits, 1 << bits))
    return domain.encode(values), domain


def rr_queries(name: str, domain: rr.Domain, levels: list[list[str]] | None) -> list[tuple]:
    """``(label, row function, proper allowed)`` for one dataset."""
    out: list[tuple[str, Any, bool]] = []
    if name == "Adult":
        assert levels is not None

        def at(column: str, value: str) -> tuple[int, int]:
            j = ADULT_COLUMNS.index(column)
            return j, levels[j].index(value)

        specs = {
            "sex=Female": [at("sex", "Female")],
            "marital=Married-civ-spouse & workclass=Private": [
                at("marital-status", "Married-civ-spouse"),
                at("workclass", "Private"),
            ],
            "race=Black & sex=Female": [at("race", "Black"), at("sex", "Female")],
            "education=Doctorate": [at("education", "Doctorate")],
            "education=Doctorate & sex=Female & race=White": [
                at("education", "Doctorate"),
                at("sex", "Female"),
                at("race", "White"),
            ],
            "race=Other & education=Masters": [at("race", "Other"), at("education", "Masters")],
        }
    else:
        cells = domain.cardinalities[1]
        specs = {
            "diagnosis=benign": [(0, 1)],
            "malignant & radius in top half": [(0, 0), (1, list(range(cells // 2, cells)))],
            "benign & radius cell 0": [(0, 1), (1, [0])],
            "radius top cell & texture top cell": [(1, [cells - 1]), (2, [cells - 1])],
        }
    for label, terms in specs.items():
        out.append((label, rr.Conjunction(domain, dict(terms)), True))
    if domain.size <= 4096:
        table = np.random.default_rng(QUERY_SEED).random(domain.size)
        out.append(("table, values uniform in [0, 1]", rr.Table(table), False))
    return out


def rr_cell(
    codes: np.ndarray, domain: rr.Domain, queries: list[tuple], epsilon: float, releases: int
) -> dict[str, Any]:
    truth = np.array([float(np.mean(q.evaluate(codes))) for _, q, _ in queries])
    proper_rows = [i for i, (_, _, ok) in enumerate(queries) if ok]
    shape = (len(queries), releases)
    value, se = np.empty(shape), np.empty(shape)
    ends = np.empty((*shape, 2))
    pends = np.empty((len(proper_rows), releases, 2))
    for r in range(releases):
        release = rr.release(codes, domain, epsilon)
        for i, (_, q, _) in enumerate(queries):
            value[i, r], se[i, r], _, ends[i, r] = release.answer(q, proper=False)
        for k, i in enumerate(proper_rows):
            pends[k, r] = release.answer(queries[i][1], proper=True)[3]
    raw_half = Z_95 * se
    return {
        "truth": truth.tolist(),
        "unbiased": _interval_summary(ends, truth),
        "proper": _interval_summary(pends, truth[proper_rows]),
        "unclipped_half_median": [float(np.median(h)) for h in raw_half],
        "unclipped_coverage": float((np.abs(value - truth[:, None]) <= raw_half).mean()),
        "se_over_sd": [
            float(np.median(se[i]) / value[i].std(ddof=1)) if value[i].std() > 0 else math.nan
            for i in range(len(queries))
        ],
    }


def run_rr(releases: int, data_dir: Path) -> dict[str, Any]:
    adult_codes, adult_domain, levels = _adult(data_dir)
    wdbc_codes, wdbc_domain = _wdbc()
    out: dict[str, Any] = {}
    for name, codes, domain, lv in (
        ("Adult", adult_codes, adult_domain, levels),
        ("WDBC", wdbc_codes, wdbc_domain, None),
    ):
        queries = rr_queries(name, domain, lv)
        entry: dict[str, Any] = {
            "n": int(codes.shape[0]),
            "domain": domain.size,
            "queries": [label for label, _, _ in queries],
            "epsilons": {},
        }
        for epsilon in EPSILONS:
            started = time.time()
            cell = rr_cell(codes, domain, queries, epsilon, releases)
            entry["epsilons"][str(epsilon)] = cell
            print(
                f"RR {name} eps={epsilon}: unbiased {cell['unbiased']['coverage']:.4f}, "
                f"proper {cell['proper']['coverage']:.4f}; {time.time() - started:.0f} s",
                flush=True,
            )
        out[name] = entry
    return out


# --------------------------------------------------------------------------- graph cuts

GRAPH_VERTICES = 300
#: (|S|, |T|): S the first |S| vertices (vertex 0 is the ego of the first circle), T the
#: next |T|; each cut holds edges.
CUTS = ((2, 3), (5, 10), (20, 40), (60, 120))


def _graph(data_dir: Path) -> np.ndarray:
    edges = np.loadtxt(data_dir / "facebook_combined.txt", dtype=np.int64)
    keep = (edges < GRAPH_VERTICES).all(axis=1)
    edges = np.sort(edges[keep], axis=1)
    return np.unique(edges[edges[:, 0] != edges[:, 1]], axis=0)


def run_graph(releases: int, data_dir: Path) -> dict[str, Any]:
    edges = _graph(data_dir)
    adjacency = np.zeros((GRAPH_VERTICES, GRAPH_VERTICES), dtype=bool)
    adjacency[edges[:, 0], edges[:, 1]] = adjacency[edges[:, 1], edges[:, 0]] = True
    sets = [(np.arange(s), np.arange(s, s + t)) for s, t in CUTS]
    truth = np.array([float(adjacency[np.ix_(S, T)].sum()) for S, T in sets])
    out: dict[str, Any] = {
        "vertices": GRAPH_VERTICES,
        "edges": int(edges.shape[0]),
        "cuts": [
            {"S": s, "T": t, "pairs": s * t, "edges": int(e)}
            for (s, t), e in zip(CUTS, truth, strict=True)
        ],
        "epsilons": {},
    }
    for epsilon in EPSILONS:
        started = time.time()
        shape = (len(sets), releases)
        value, low, high, se = (np.empty(shape) for _ in range(4))
        for r in range(releases):
            noisy = gc.release_pair_bits([edges], GRAPH_VERTICES, epsilon)
            release = gc.PackedGraphRelease.from_pair_bits(
                noisy.bits, noisy.n_vertices, noisy.epsilon, noisy.flip_threshold
            )
            for i, (S, T) in enumerate(sets):
                value[i, r] = release.cut(S, T)
                low[i, r], high[i, r] = release.interval(S, T)
                se[i, r] = release.stderr(S, T)
        cell = _interval_summary(np.stack([low, high], axis=2), truth)
        cell["estimator_error_q95"] = np.quantile(
            np.abs(value - truth[:, None]), LEVEL, axis=1
        ).tolist()
        p = 1.0 / (1.0 + math.exp(epsilon))
        cell["exact_interval"] = [s * t * p * (1 - p) < gc.EXACT_INTERVAL_VARIANCE for s, t in CUTS]
        cell["se_over_sd"] = [
            float(se[i, 0] / sd) if (sd := value[i].std(ddof=1)) > 0 else math.nan
            for i in range(len(sets))
        ]
        out["epsilons"][str(epsilon)] = cell
        print(
            f"graph eps={epsilon}: coverage {cell['coverage']:.4f} "
            f"{cell['per_query']}; {time.time() - started:.0f} s",
            flush=True,
        )
    return out


# --------------------------------------------------------------------------- synopsis

SYNOPSIS_SIGMAS = (2, 4, 8)
SYNOPSIS_DELTAS = (0.0, 1e-6)


def run_synopsis(releases: int, n_queries: int, data_dir: Path) -> dict[str, Any]:
    X = load_datasets(["WDBC"], data_dir)["WDBC"]
    out: dict[str, Any] = {"n": int(X.shape[0]), "d": int(X.shape[1]), "cells": {}}
    for delta in SYNOPSIS_DELTAS:
        for epsilon in EPSILONS:
            for sigma in SYNOPSIS_SIGMAS:
                started = time.time()
                batch = GaussianMixtureBatch.random(
                    n_queries, 10, X.shape[1], float(sigma), np.random.default_rng(QUERY_SEED)
                )
                truth = batch.answers(X)
                synopses = [
                    smooth_synopsis.measure(X, epsilon, delta, smoothness=sigma * sigma)
                    for _ in range(releases)
                ]
                got = answer_rounds(synopses, batch, moments(X, synopses[0].index_set))
                error = np.abs(got["values"] - truth[:, None])
                cell = summarise(error <= got["halfwidth"], got["halfwidth"], error)
                plain_error = np.abs(got["plain"] - truth[:, None])
                worst = np.broadcast_to(got["worst_half"][:, None], plain_error.shape)
                cell["worst_case"] = summarise(plain_error <= worst, worst, plain_error)
                noise = error <= got["noise_halfwidth"]
                cell["noise_only"] = float(noise.mean())
                cell["R"] = synopses[0].size
                cell["co_spread"] = synopses[0].co_spread is not None
                for key in ("per_query",):
                    cell.pop(key)
                    cell["worst_case"].pop(key)
                out["cells"][f"{delta}/{epsilon}/{sigma}"] = cell
                print(
                    f"synopsis delta={delta} eps={epsilon} sigma={sigma}: "
                    f"{cell['coverage']:.3f} +- {cell['se']:.3f} (noise-only "
                    f"{cell['noise_only']:.3f}, worst {cell['worst_case']['coverage']:.3f}, "
                    f"R={cell['R']}); {time.time() - started:.0f} s",
                    flush=True,
                )
    return out


#: (delta, epsilon, sigma) of the cells whose errors are taken apart (WDBC).
DIAGNOSED = ((1e-6, 0.1, 2), (0.0, 10.0, 2), (0.0, 1.0, 4))


def diagnose_synopsis(releases: int, n_queries: int, data_dir: Path) -> dict[str, Any]:
    """For a few cells: ``answer_many``'s values, stderrs and half-widths over
    ``releases`` default synopses (co-spread on), and per query (then the median over
    queries) the ratio of the mean reported stderr to the spread of the values across
    releases, the bias of their mean in units of that spread, their skewness and excess
    kurtosis; the coverage of the reported interval, of ``value +- 1.96 stderr`` around
    the mean of the values (the noise part alone) and of ``value +- 1.96 sd`` around the
    truth (what a correct stderr would give)."""
    from scipy import stats

    X = load_datasets(["WDBC"], data_dir)["WDBC"]
    out: dict[str, Any] = {}
    for delta, epsilon, sigma in DIAGNOSED:
        batch = GaussianMixtureBatch.random(
            n_queries, 10, X.shape[1], float(sigma), np.random.default_rng(QUERY_SEED)
        )
        truth = batch.answers(X)[:, None]
        columns: dict[str, list[list[float]]] = {"value": [], "stderr": [], "halfwidth": []}
        for _ in range(releases):
            synopsis = smooth_synopsis.measure(X, epsilon, delta, smoothness=sigma * sigma)
            got = synopsis.answer_many(batch)
            for key, rows in columns.items():
                rows.append([float(getattr(a, key)) for a in got])
        V, S, H = (np.array(columns[k]).T for k in ("value", "stderr", "halfwidth"))
        sd = V.std(axis=1, ddof=1)
        out[f"{delta}/{epsilon}/{sigma}"] = {
            "coverage": float((np.abs(V - truth) <= H).mean()),
            "se_over_sd": float(np.median(S.mean(axis=1) / sd)),
            "bias_over_sd": float(np.median(np.abs(V.mean(axis=1) - truth[:, 0]) / sd)),
            "skewness": float(np.median(stats.skew(V, axis=1))),
            "excess_kurtosis": float(np.median(stats.kurtosis(V, axis=1))),
            "noise_coverage_about_mean": float(
                (np.abs(V - V.mean(axis=1, keepdims=True)) <= Z_95 * S).mean()
            ),
            "coverage_with_true_sd": float((np.abs(V - truth) <= Z_95 * sd[:, None]).mean()),
        }
        print(f"diagnosis {delta}/{epsilon}/{sigma}: {out[f'{delta}/{epsilon}/{sigma}']}")
    return out


# --------------------------------------------------------------------------- report


def _cov(c: dict[str, Any]) -> str:
    return f"{c['coverage']:.3f} +- {c['se']:.3f}"


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Interval coverage of every release type's error bars",
        "",
        "Produced by `python -m bench.interval_coverage` (claims, protocol and columns in "
        "its docstring). Nominal level 0.95 everywhere. `coverage +- se`: the share of "
        "(query, release) pairs whose interval held the exact answer on the raw data, and "
        "its standard error from the spread across independent releases; `worst query`: "
        "the lowest per-query coverage, with its binomial standard error; `half / q95`: "
        "median over queries of (median half-width) / (95th percentile of the distance "
        "from the interval's midpoint to the truth; the value's error where the interval "
        "is symmetric about it).",
        "",
        f"## randomized_response ({s['rr_releases']} releases per epsilon)",
        "",
        "| data | epsilon | unbiased (17) | worst query | proper (21) | worst query "
        "| half / q95 | stderr / sd |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in result["randomized_response"].items():
        for eps, cell in entry["epsilons"].items():
            u, p = cell["unbiased"], cell["proper"]
            ratios = [r for r in cell["se_over_sd"] if math.isfinite(r)]
            lines.append(
                f"| {name} (n = {entry['n']}, |D| = {entry['domain']}) | {eps} | {_cov(u)} | "
                f"{u['min_query_coverage']:.3f} +- {u['min_query_se']:.3f} | {_cov(p)} | "
                f"{p['min_query_coverage']:.3f} +- {p['min_query_se']:.3f} | "
                f"{u['half_over_q95']:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |"
            )
    lines += ["", "Queries (truth on the raw data at the first epsilon):", ""]
    for name, entry in result["randomized_response"].items():
        first = next(iter(entry["epsilons"].values()))
        for label, truth in zip(entry["queries"], first["truth"], strict=True):
            lines.append(f"- {name}: {label} = {truth:.4f}")
    g = result["graph_cuts"]
    lines += [
        "",
        f"## graph_cuts ({s['graph_releases']} releases per epsilon; {g['vertices']} "
        f"vertices, {g['edges']} edges)",
        "",
        "| epsilon | pooled | "
        + " | ".join(f"{c['S']}x{c['T']} ({c['edges']} edges)" for c in g["cuts"])
        + " | half / q95 |",
        "| --- | --- | " + " | ".join("---" for _ in g["cuts"]) + " | --- |",
    ]
    for eps, cell in g["epsilons"].items():
        per = [
            f"{c:.3f}{' (exact)' if ex else ''}"
            for c, ex in zip(cell["per_query"], cell["exact_interval"], strict=True)
        ]
        lines.append(
            f"| {eps} | {_cov(cell)} | " + " | ".join(per) + f" | {cell['half_over_q95']:.2f} |"
        )
    syn = result["smooth_synopsis"]
    lines += [
        "",
        f"Per-cut binomial standard error at 0.95: "
        f"{math.sqrt(0.95 * 0.05 / s['graph_releases']):.3f}.",
        "",
        f"## smooth_synopsis (WDBC {syn['n']} x {syn['d']}; {s['synopsis_releases']} releases "
        f"x {s['synopsis_queries']} queries per cell)",
        "",
        "| noise | epsilon | sigma | R | interval | worst query | half / q95 | noise-only "
        "| worst_case_interval | its half / q95 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, cell in syn["cells"].items():
        delta, eps, sigma = key.split("/")
        noise = "Laplace" if float(delta) == 0 else f"Gaussian, delta {delta}"
        w = cell["worst_case"]
        lines.append(
            f"| {noise} | {eps} | {sigma} | {cell['R']} | {_cov(cell)} | "
            f"{cell['min_query_coverage']:.3f} +- {cell['min_query_se']:.3f} | "
            f"{cell['half_over_q95']:.2f} | {cell['noise_only']:.3f} | "
            f"{w['coverage']:.3f} | {w['half_over_q95']:.1f} |"
        )
    lines += [
        "",
        f"Taken apart ({s['diagnosis_releases']} releases x {s['diagnosis_queries']} queries "
        "each; medians over queries; `bias / sd`: |mean of the values - truth| over their "
        "spread across releases; `noise part`: coverage of `value +- 1.96 stderr` about the "
        "mean of the values; `with true sd`: of `value +- 1.96 sd` about the truth):",
        "",
        "| noise | epsilon | sigma | interval | stderr / sd | bias / sd | skewness "
        "| excess kurtosis | noise part | with true sd |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in result["synopsis_diagnosis"].items():
        delta, eps, sigma = key.split("/")
        noise = "Laplace" if float(delta) == 0 else f"Gaussian, delta {delta}"
        lines.append(
            f"| {noise} | {eps} | {sigma} | {c['coverage']:.3f} | {c['se_over_sd']:.2f} | "
            f"{c['bias_over_sd']:.2f} | {c['skewness']:.2f} | {c['excess_kurtosis']:.2f} | "
            f"{c['noise_coverage_about_mean']:.3f} | {c['coverage_with_true_sd']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "settings": {
            "level": LEVEL,
            "epsilons": list(EPSILONS),
            "rr_releases": args.rr_releases,
            "graph_releases": args.graph_releases,
            "synopsis_releases": args.synopsis_releases,
            "synopsis_queries": args.synopsis_queries,
            "diagnosis_releases": args.diagnosis_releases,
            "diagnosis_queries": args.diagnosis_queries,
            "query_seed": QUERY_SEED,
        }
    }
    result["randomized_response"] = run_rr(args.rr_releases, args.data_dir)
    result["graph_cuts"] = run_graph(args.graph_releases, args.data_dir)
    result["smooth_synopsis"] = run_synopsis(
        args.synopsis_releases, args.synopsis_queries, args.data_dir
    )
    result["synopsis_diagnosis"] = diagnose_synopsis(
        args.diagnosis_releases, args.diagnosis_queries, args.data_dir
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few releases per cell")
    parser.add_argument("--rr-releases", type=int, default=1500)
    parser.add_argument("--graph-releases", type=int, default=2000)
    parser.add_argument("--synopsis-releases", type=int, default=80)
    parser.add_argument("--synopsis-queries", type=int, default=300)
    parser.add_argument("--diagnosis-releases", type=int, default=100)
    parser.add_argument("--diagnosis-queries", type=int, default=100)
    parser.add_argument("--data-dir", type=Path, default=DATASETS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rr_releases = args.graph_releases = 20
        args.synopsis_releases, args.synopsis_queries = 3, 30
        args.diagnosis_releases, args.diagnosis_queries = 4, 10
    command = "python -m bench.interval_coverage" + (" " + " ".join(argv) if argv else "")
    stem = "interval_coverage" + ("_quick" if args.quick else "")
    recorder = Run(stem, command)
    result = run(args)
    recorder.finish(render_markdown(result), result, quick=args.quick)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
