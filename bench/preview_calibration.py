"""Are the preview's predictions true? Each release type's predicted accuracy against what
its releases deliver, at epsilon 0.1, 1 and 10.

Run from the repository root:

    python -m bench.preview_calibration            # the committed run (~10 minutes here)
    python -m bench.preview_calibration --quick    # smoke run (a few releases per cell)

``POST /v1/datasets/{id}/preview`` returns an ``accuracy`` object computed from public
values only (``app/releases/adapters/*.py``); a release keeps it as "the accuracy
predicted at the request". What each one predicts, and what is measured here against the
true data (computed in the bench, never exposed by the service), at the mechanism level
(the adapters call the same functions with the same public parameters):

* ``smooth_synopsis`` (``_preview`` of the adapter, :class:`BasisCandidate` of
  :func:`app.mechanisms.smooth_synopsis.plan`, the plan its ``measure`` uses), for "a
  representative query of the declared smoothness: one Gaussian kernel of width
  ``sqrt(K)`` with a uniform random centre (normalised scale)":

  - ``moment_stddev``: the noise standard deviation of each released moment. Measured:
    the standard deviation of ``noisy - exact`` moments over every coordinate and release.
  - ``predicted_stderr``: ``moment_stddev sqrt(E_c ||c_S||^2)``, the root mean square over
    centres of the noise standard error of the *plain* Algorithm-2 answer
    ``c_0 + <c_S, b_hat>``. Measured: the RMS of ``plain - exact plain`` (the plain answer's
    noise error, exactly), the RMS spread across releases of the answers the service gives
    (``answer_many``'s default: with the independence extrapolation and the co-spread
    correction), and the RMS of the ``stderr`` those answers report.
  - ``predicted_halfwidth_95``: ``1.96 sqrt(stderr^2 + cross^2) + axis_tail``, the
    half-width of the 95 % interval predicted for that query. Measured: the share of
    (query, release) whose answer lies within ``predicted_halfwidth_95`` of the truth
    (nominal 0.95), the 95th percentile of ``|answer - truth|`` over it, and the median
    reported ``halfwidth`` over it.
  - ``predicted_truncation``: the mean over centres of the worst-case truncation bound
    ``tau`` (over every dataset in the cube). Measured: the mean realised truncation error
    ``|exact plain - truth|`` over it (and the extrapolated answer's at exact moments).

* ``smooth_synthetic`` ``marginals`` (``frequency_stddev``) and ``tree``
  (``frequency_stddev``, ``pair_frequency_stddev``): the noise standard deviation of each
  cell frequency of a one-way histogram and of a two-way table, before the projection.
  Measured: the standard deviation of ``noisy - exact`` one-way frequencies, of a pair
  table's noise (``(sum of its b^2 noisy cells - 1) / b``: the exact cells sum to 1), and
  the RMS error left after the projection onto the simplex (``marginals()``).
  ``moments``: ``moment_stddev`` is the calibration :func:`~app.mechanisms.smooth_synthetic.
  noise_plan` fixes for ``measure`` (the same object; not re-measured here).
* ``randomized_response`` (``rmse_bound``): bound (20) of paper 004, ``1 / ((1 - rho)
  sqrt(n))``, on the RMS error of the unbiased estimate (17) of a statistical query whose
  row function has range 1, for every database. Measured: each query's RMS error over the
  releases (Adult and WDBC, the queries of ``bench.interval_coverage``), unbiased and
  proper (21) (the preview's note does not say which; bound (22) for the proper one is
  twice (20)).
* ``graph_cuts`` (``stderr_half_split``): the exact standard deviation of estimator (34)
  for a cut between two halves of the vertices, whatever the graph;
  ``expected_noisy_edges_from_flips``: ``p |V| (|V| - 1) / 2``, the expected number of
  flipped pairs. Measured on the first 300 vertices of the Facebook ego network: the
  spread of the half-split cut over releases, and the number of flipped pairs.
* ``compressed``: predicts nothing (a note: alpha and the PCA bound are computed at
  release time); nothing to measure.

Repetitions: every release is a fresh draw of OpenDP's CSPRNG (which cannot be seeded), so
releases are independent; the queries are fixed by ``QUERY_SEED``. A ratio is reported
with its relative standard error where it is a standard deviation over ``k`` draws
(``1 / sqrt(2 (k - 1))``); a coverage with the standard error of the per-release shares.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import graph_cuts as gc
from app.mechanisms import marginal_tree, marginals
from app.mechanisms import randomized_response as rr
from app.mechanisms import smooth_synopsis as sy
from app.mechanisms.basis import moments
from app.mechanisms.chebyshev import query_coefficients
from app.mechanisms.data import as_source
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import GaussianMixtureBatch
from bench._common import DATASETS, Run
from bench.interval_coverage import GRAPH_VERTICES, _adult, _graph, _wdbc, rr_queries
from bench.smooth_synthetic import QUERY_SEED, load_datasets

EPSILONS = (0.1, 1.0, 10.0)
LEVEL = 0.95
SYNOPSIS_DATASETS = ("WDBC", "CTG")
SYNOPSIS_DELTAS = (0.0, 1e-6)
SMOOTHNESS = 4  # the service's default K
TREE_DELTA = 1e-6


def _rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


def _spread(values: np.ndarray) -> float:
    """RMS over queries of the standard deviation across releases (axis 1)."""
    return float(np.sqrt(np.mean(values.var(axis=1, ddof=1))))


# --------------------------------------------------------------------------- synopsis


def representative_queries(d: int, smoothness: int, count: int) -> GaussianMixtureBatch:
    """The preview's representative query: one kernel of width ``sqrt(K)``, weight 1,
    centre uniform in ``[-1, 1]^d``."""
    rng = np.random.default_rng(QUERY_SEED)
    centers = rng.uniform(-1.0, 1.0, size=(count, 1, d))
    return GaussianMixtureBatch(centers, np.ones((count, 1)), math.sqrt(smoothness))


def synopsis_cell(
    X: np.ndarray, epsilon: float, delta: float, releases: int, batch: GaussianMixtureBatch
) -> dict[str, Any]:
    n, d = X.shape
    index_set, choice, share = sy.plan(n, d, epsilon=epsilon, delta=delta, smoothness=SMOOTHNESS)
    predicted = choice.chosen
    truth = batch.answers(X)
    exact = moments(X, index_set)
    coef = query_coefficients(batch, index_set)
    exact_plain = coef.constant + coef.coefficients @ exact
    shape = (len(batch), releases)
    values, plain, stderr, halfwidth = (np.empty(shape) for _ in range(4))
    moment_noise = np.empty((releases, index_set.size))
    for r in range(releases):
        synopsis = sy.measure(X, epsilon, delta, smoothness=SMOOTHNESS)
        assert synopsis.size == index_set.size  # the preview's plan is the measure's
        moment_noise[r] = synopsis.moments - exact
        got = synopsis.answer_many(batch)
        values[:, r] = got.values
        plain[:, r] = got.values - got.extrapolation
        stderr[:, r] = got.stderr
        halfwidth[:, r] = got.halfwidth
    error = np.abs(values - truth[:, None])
    inside = error <= predicted.predicted_halfwidth
    shares = inside.mean(axis=0)
    at_exact = sy.Synopsis(
        index_set=index_set,
        moments=exact,
        calibration=synopsis.calibration,
        n=n,
        smoothness=SMOOTHNESS,
        basis=choice,
    ).answer_many(batch)
    return {
        "R": int(index_set.size),
        "co_spread_share": share,
        "releases": releases,
        "queries": len(batch),
        "truth_mean": float(truth.mean()),
        "predicted": {
            "moment_stddev": predicted.coordinate_stddev,
            "predicted_stderr": predicted.predicted_stderr,
            "predicted_halfwidth_95": predicted.predicted_halfwidth,
            "predicted_truncation": predicted.predicted_truncation,
            "predicted_axis_tail": predicted.predicted_axis_tail,
            "predicted_cross_scale": predicted.predicted_cross_scale,
        },
        "moment_noise_sd": float(moment_noise.std()),
        "plain_noise_rms": _rms(plain - exact_plain[:, None]),
        "answer_spread_rms": _spread(values),
        "reported_stderr_rms": _rms(stderr),
        "error_rms": _rms(error),
        "error_q95": float(np.quantile(error, LEVEL)),
        "reported_halfwidth_median": float(np.median(halfwidth)),
        "coverage_of_predicted_halfwidth": float(inside.mean()),
        "coverage_se": float(shares.std(ddof=1) / math.sqrt(releases)),
        "coverage_of_reported_interval": float((error <= halfwidth).mean()),
        "truncation_plain_mean": float(np.abs(exact_plain - truth).mean()),
        "truncation_extrapolated_mean": float(np.abs(at_exact.values - truth).mean()),
    }


def run_synopsis(releases: int, n_queries: int, data_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SYNOPSIS_DATASETS:
        X = load_datasets([name], data_dir)[name]
        batch = representative_queries(X.shape[1], SMOOTHNESS, n_queries)
        entry: dict[str, Any] = {"n": int(X.shape[0]), "d": int(X.shape[1]), "cells": {}}
        for delta in SYNOPSIS_DELTAS:
            for epsilon in EPSILONS:
                started = time.time()
                cell = synopsis_cell(X, epsilon, delta, releases, batch)
                entry["cells"][f"{delta}/{epsilon}"] = cell
                p = cell["predicted"]
                print(
                    f"synopsis {name} delta={delta} eps={epsilon} R={cell['R']}: "
                    f"plain/pred {cell['plain_noise_rms'] / p['predicted_stderr']:.2f}, "
                    f"answers/pred {cell['answer_spread_rms'] / p['predicted_stderr']:.2f}, "
                    f"coverage {cell['coverage_of_predicted_halfwidth']:.3f}; "
                    f"{time.time() - started:.0f} s",
                    flush=True,
                )
        out[name] = entry
    return out


# --------------------------------------------------------------------------- smooth_synthetic


def run_marginals(releases: int, X: np.ndarray) -> dict[str, Any]:
    n, d = X.shape
    out: dict[str, Any] = {}
    for epsilon in EPSILONS:
        bins, atoms = marginals.resolve(n, d, epsilon, 0.0)
        predicted = marginals.noise_calibration(n, d, epsilon, 0.0, bins + 2 * atoms).stddev
        exact = marginals.exact_histograms(as_source(X), bins, atoms)
        noise_sd, projected = [], []
        for _ in range(releases):
            m = marginals.measure(X, epsilon, 0.0)
            noise_sd.append(m.frequencies - exact)
            projected.append(m.marginals() - exact)
        out[str(epsilon)] = {
            "bins": bins,
            "atoms": atoms,
            "frequency_stddev": predicted,
            "noise_sd": float(np.std(noise_sd)),
            "projected_rms": _rms(np.array(projected)),
            "draws": releases * d * (bins + 2 * atoms),
        }
        print(f"marginals eps={epsilon}: {out[str(epsilon)]}", flush=True)
    return out


def run_tree(releases: int, X: np.ndarray) -> dict[str, Any]:
    n, d = X.shape
    out: dict[str, Any] = {}
    for epsilon in EPSILONS:
        try:
            fixed = marginal_tree.plan(n, d, epsilon, TREE_DELTA)
        except MechanismError as exc:  # the service's default is then "marginals"
            out[str(epsilon)] = {"refused": str(exc)}
            print(f"tree eps={epsilon}: {exc}", flush=True)
            continue
        exact = marginals.exact_histograms(as_source(X), fixed.bins, fixed.atoms)
        one_way, pair, projected = [], [], []
        for _ in range(releases):
            tree = marginal_tree.measure(X, epsilon, TREE_DELTA)
            one_way.append(tree.one_way.frequencies - exact)
            projected.append(tree.one_way.marginals() - exact)
            b = tree.pair_bins
            pair.append((tree.tables.sum(axis=(1, 2)) - 1.0) / b)
        out[str(epsilon)] = {
            "bins": fixed.bins,
            "atoms": fixed.atoms,
            "pair_bins": fixed.pair_bins,
            "frequency_stddev": fixed.one_way_scale,
            "pair_frequency_stddev": fixed.pair_scale,
            "one_way_noise_sd": float(np.std(one_way)),
            "pair_noise_sd": float(np.sqrt(np.mean(np.square(pair)))),
            "projected_rms": _rms(np.array(projected)),
            "one_way_draws": releases * d * (fixed.bins + 2 * fixed.atoms),
            "pair_draws": releases * (d - 1),
        }
        print(f"tree eps={epsilon}: {out[str(epsilon)]}", flush=True)
    return out


# --------------------------------------------------------------------------- randomized response


def run_rr(releases: int, data_dir: Path) -> dict[str, Any]:
    adult_codes, adult_domain, levels = _adult(data_dir)
    wdbc_codes, wdbc_domain = _wdbc()
    out: dict[str, Any] = {}
    for name, codes, domain, lv in (
        ("Adult", adult_codes, adult_domain, levels),
        ("WDBC", wdbc_codes, wdbc_domain, None),
    ):
        queries = rr_queries(name, domain, lv)
        truth = np.array([float(np.mean(q.evaluate(codes))) for _, q, _ in queries])
        proper_rows = [i for i, (_, _, ok) in enumerate(queries) if ok]
        entry: dict[str, Any] = {
            "n": int(codes.shape[0]),
            "domain": domain.size,
            "queries": [label for label, _, _ in queries],
            "epsilons": {},
        }
        for epsilon in EPSILONS:
            preview = rr.preview(codes.shape[0], domain.size, epsilon)
            value = np.empty((len(queries), releases))
            proper = np.empty((len(proper_rows), releases))
            worst = np.empty(len(queries))
            for r in range(releases):
                release = rr.release(codes, domain, epsilon)
                for i, (_, q, _) in enumerate(queries):
                    value[i, r] = release.estimate(q)
                    if r == 0:
                        worst[i] = release.stderr(q)
                for k, i in enumerate(proper_rows):
                    proper[k, r] = release.estimate_proper(queries[i][1])
            rmse = np.sqrt(np.mean((value - truth[:, None]) ** 2, axis=1))
            rmse_proper = np.sqrt(np.mean((proper - truth[proper_rows, None]) ** 2, axis=1))
            entry["epsilons"][str(epsilon)] = {
                "rmse_bound": preview.rmse_bound,
                "useful": preview.useful,
                "rmse": rmse.tolist(),
                "rmse_proper": rmse_proper.tolist(),
                "worst_case_stderr": worst.tolist(),
            }
            print(
                f"RR {name} eps={epsilon}: bound {preview.rmse_bound:.4g}, max rmse "
                f"{rmse.max():.4g}, max proper {rmse_proper.max():.4g}",
                flush=True,
            )
        out[name] = entry
    return out


# --------------------------------------------------------------------------- graph cuts


def run_graph(releases: int, data_dir: Path) -> dict[str, Any]:
    edges = _graph(data_dir)
    n = GRAPH_VERTICES
    true_bits = gc.pair_bits_of([edges], n)
    half = n // 2
    S, T = np.arange(half), np.arange(half, n)
    adjacency = np.zeros((n, n), dtype=bool)
    adjacency[edges[:, 0], edges[:, 1]] = adjacency[edges[:, 1], edges[:, 0]] = True
    truth = float(adjacency[np.ix_(S, T)].sum())
    pairs = n * (n - 1) // 2
    out: dict[str, Any] = {"vertices": n, "edges": int(edges.shape[0]), "epsilons": {}}
    for epsilon in EPSILONS:
        p = 1.0 / (1.0 + math.exp(epsilon))
        predicted_sd = math.sqrt(half * (n - half) * p * (1 - p)) / (1 - 2 * p)
        cuts, flips, false = np.empty(releases), np.empty(releases), np.empty(releases)
        for r in range(releases):
            noisy = gc.release_pair_bits([edges], n, epsilon)
            release = gc.PackedGraphRelease.from_pair_bits(
                noisy.bits, noisy.n_vertices, noisy.epsilon, noisy.flip_threshold
            )
            cuts[r] = release.cut(S, T)
            flips[r] = gc.pair_count(np.bitwise_xor(noisy.bits, true_bits))
            false[r] = gc.pair_count(noisy.bits & ~true_bits)
        out["epsilons"][str(epsilon)] = {
            "stderr_half_split": predicted_sd,
            "cut_sd": float(cuts.std(ddof=1)),
            "cut_bias": float(cuts.mean() - truth),
            "expected_noisy_edges_from_flips": p * pairs,
            "flips_mean": float(flips.mean()),
            "false_edges_mean": float(false.mean()),
            "false_edges_expected": p * (pairs - edges.shape[0]),
        }
        print(f"graph eps={epsilon}: {out['epsilons'][str(epsilon)]}", flush=True)
    return out


# --------------------------------------------------------------------------- report


def _ratio_se(k: int) -> float:
    """Relative standard error of a standard deviation estimated from ``k`` draws."""
    return 1.0 / math.sqrt(2.0 * max(k - 1, 1))


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Calibration of the preview's predicted accuracy",
        "",
        "Produced by `python -m bench.preview_calibration` (what each prediction means and "
        "how it is measured: its docstring). Truth computed in the bench from the raw "
        "rows; the service never exposes it. Ratios are realised / predicted: 1 is exact, "
        "above 1 the preview was optimistic.",
        "",
        f"## smooth_synopsis ({s['synopsis_releases']} releases x {s['synopsis_queries']} "
        f"representative queries per cell: one Gaussian kernel of width sqrt(K) = "
        f"{math.sqrt(SMOOTHNESS):g}, centre uniform in the cube; K = {SMOOTHNESS}, the default)",
        "",
        "`plain / pred`: RMS noise error of the plain Algorithm-2 answer over "
        "`predicted_stderr`; `answers / pred`: RMS spread across releases of the answers the "
        "service returns (extrapolated, co-spread) over `predicted_stderr`; `reported / "
        "pred`: RMS of the `stderr` those answers report over `predicted_stderr`; "
        "`coverage`: share of answers within `predicted_halfwidth_95` of the truth (nominal "
        "0.95), +- the standard error across releases; `q95 / pred hw`: 95th percentile of "
        "|answer - truth| over `predicted_halfwidth_95`; `reported hw / pred hw`: median "
        "reported half-width over it; `trunc`: mean realised truncation error of the plain "
        "answer (exact moments) over `predicted_truncation` (a worst-case bound).",
        "",
        "| data | noise | epsilon | R | moment sd / pred | plain / pred | answers / pred "
        "| reported / pred | coverage | q95 / pred hw | reported hw / pred hw | trunc |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in result["smooth_synopsis"].items():
        for key, c in entry["cells"].items():
            delta, eps = key.split("/")
            p = c["predicted"]
            noise = "Laplace" if float(delta) == 0 else f"Gaussian {delta}"
            se = p["predicted_stderr"]
            hw = p["predicted_halfwidth_95"]
            lines.append(
                f"| {name} ({entry['n']} x {entry['d']}) | {noise} | {eps} | {c['R']} | "
                f"{c['moment_noise_sd'] / p['moment_stddev']:.3f} | "
                f"{c['plain_noise_rms'] / se:.2f} | {c['answer_spread_rms'] / se:.2f} | "
                f"{c['reported_stderr_rms'] / se:.2f} | "
                f"{c['coverage_of_predicted_halfwidth']:.3f} +- {c['coverage_se']:.3f} | "
                f"{c['error_q95'] / hw:.2f} | {c['reported_halfwidth_median'] / hw:.2f} | "
                f"{c['truncation_plain_mean'] / p['predicted_truncation']:.1e} |"
            )
    lines += [
        "",
        f"Standard error of a ratio of standard deviations: about "
        f"{_ratio_se(s['synopsis_releases']):.2f} relative per query, less pooled over "
        f"{s['synopsis_queries']} queries (they share a release's noise).",
        "",
        f"## smooth_synthetic, marginals (WDBC, delta 0, {s['synthetic_releases']} releases)",
        "",
        "| epsilon | bins (+ atoms) | frequency_stddev | realised noise sd / pred "
        "| RMS error after projection / pred |",
        "| --- | --- | --- | --- | --- |",
    ]
    for eps, c in result["marginals"].items():
        lines.append(
            f"| {eps} | {c['bins']}{' + 2' if c['atoms'] else ''} | {c['frequency_stddev']:.4g} | "
            f"{c['noise_sd'] / c['frequency_stddev']:.3f} | "
            f"{c['projected_rms'] / c['frequency_stddev']:.3f} |"
        )
    lines += [
        "",
        f"## smooth_synthetic, tree (WDBC, delta {TREE_DELTA:g}, {s['tree_releases']} releases)",
        "",
        "| epsilon | bins (+ atoms) | pair_bins | frequency_stddev | one-way sd / pred "
        "| pair_frequency_stddev | pair sd / pred | RMS after projection / pred |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for eps, c in result["tree"].items():
        if "refused" in c:
            lines.append(f"| {eps} | refused by the plan: {c['refused']} | | | | | | |")
            continue
        lines.append(
            f"| {eps} | {c['bins']}{' + 2' if c['atoms'] else ''} | {c['pair_bins']} | "
            f"{c['frequency_stddev']:.4g} | "
            f"{c['one_way_noise_sd'] / c['frequency_stddev']:.3f} | "
            f"{c['pair_frequency_stddev']:.4g} | "
            f"{c['pair_noise_sd'] / c['pair_frequency_stddev']:.3f} "
            f"(+- {_ratio_se(c['pair_draws']):.3f}) | "
            f"{c['projected_rms'] / c['frequency_stddev']:.3f} |"
        )
    lines += [
        "",
        f"## randomized_response ({s['rr_releases']} releases per epsilon; queries of "
        "`bench.interval_coverage`)",
        "",
        "`rmse / bound`: the largest over the queries of the realised RMS error over "
        "`rmse_bound` (<= 1: the bound held); `worst-case stderr / bound`: the service's "
        "exact worst-case standard error of each query over the bound (at most 0.5 for a "
        "0/1 query).",
        "",
        "| data | epsilon | rmse_bound | useful | rmse / bound (unbiased) | rmse / bound "
        "(proper) | worst-case stderr / bound |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, entry in result["randomized_response"].items():
        for eps, c in entry["epsilons"].items():
            b = c["rmse_bound"]
            lines.append(
                f"| {name} (n = {entry['n']}, |D| = {entry['domain']}) | {eps} | {b:.4g} | "
                f"{c['useful']} | {max(c['rmse']) / b:.3f} | {max(c['rmse_proper']) / b:.3f} | "
                f"{min(c['worst_case_stderr']) / b:.3f}-{max(c['worst_case_stderr']) / b:.3f} |"
            )
    g = result["graph_cuts"]
    lines += [
        "",
        f"## graph_cuts ({s['graph_releases']} releases per epsilon; first {g['vertices']} "
        f"vertices of the Facebook ego network, {g['edges']} edges; the cut between the "
        "first and second halves)",
        "",
        "| epsilon | stderr_half_split | realised sd / pred | bias / pred "
        "| expected_noisy_edges_from_flips | flipped pairs / pred | false edges / pred |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for eps, c in g["epsilons"].items():
        lines.append(
            f"| {eps} | {c['stderr_half_split']:.4g} | "
            f"{c['cut_sd'] / c['stderr_half_split']:.3f} (+- "
            f"{_ratio_se(s['graph_releases']):.3f}) | "
            f"{c['cut_bias'] / c['stderr_half_split']:+.3f} | "
            f"{c['expected_noisy_edges_from_flips']:.4g} | "
            f"{c['flips_mean'] / c['expected_noisy_edges_from_flips']:.4f} | "
            f"{c['false_edges_mean'] / c['expected_noisy_edges_from_flips']:.4f} |"
        )
    lines += [
        "",
        "`compressed` predicts nothing (its preview's note says alpha and the PCA bound are "
        "computed at release time); `smooth_synthetic` `moments` predicts the calibration "
        "its measure draws (`noise_plan`, one object), not re-measured here.",
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "settings": {
            "epsilons": list(EPSILONS),
            "smoothness": SMOOTHNESS,
            "synopsis_releases": args.synopsis_releases,
            "synopsis_queries": args.synopsis_queries,
            "synthetic_releases": args.synthetic_releases,
            "tree_releases": args.tree_releases,
            "rr_releases": args.rr_releases,
            "graph_releases": args.graph_releases,
            "query_seed": QUERY_SEED,
        }
    }
    X = load_datasets(["WDBC"], args.data_dir)["WDBC"]
    result["smooth_synopsis"] = run_synopsis(
        args.synopsis_releases, args.synopsis_queries, args.data_dir
    )
    result["marginals"] = run_marginals(args.synthetic_releases, X)
    result["tree"] = run_tree(args.tree_releases, X)
    result["randomized_response"] = run_rr(args.rr_releases, args.data_dir)
    result["graph_cuts"] = run_graph(args.graph_releases, args.data_dir)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few releases per cell")
    parser.add_argument("--synopsis-releases", type=int, default=40)
    parser.add_argument("--synopsis-queries", type=int, default=200)
    parser.add_argument("--synthetic-releases", type=int, default=200)
    parser.add_argument("--tree-releases", type=int, default=30)
    parser.add_argument("--rr-releases", type=int, default=400)
    parser.add_argument("--graph-releases", type=int, default=1000)
    parser.add_argument("--data-dir", type=Path, default=DATASETS)
    args = parser.parse_args(argv)
    if args.quick:
        args.synopsis_releases, args.synopsis_queries = 3, 20
        args.synthetic_releases = args.tree_releases = 3
        args.rr_releases = args.graph_releases = 10
    command = "python -m bench.preview_calibration" + (" " + " ".join(argv) if argv else "")
    stem = "preview_calibration" + ("_quick" if args.quick else "")
    recorder = Run(stem, command)
    result = run(args)
    recorder.finish(render_markdown(result), result, quick=args.quick)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
