"""Paper 000 §4 protocol benchmark of ``smooth_synopsis`` (issue 4, paper 001).

Run from the repository root:

    python -m bench.smooth_synopsis                # full run, writes bench/results/
    python -m bench.smooth_synopsis --quick        # smoke run (WDBC, 1 round, 1000 queries,
                                                   # sigma in {4, 10}, 10 coverage draws)

Protocol (the one of ``bench.smooth_synthetic``, paper 000 §4, whose helpers it reuses):

* Data: WDBC (scikit-learn ``load_breast_cancer``), CTG, PKS, CRM (``/work/shared/datasets``
  or ``--data-dir``), each column min/max-normalised to ``[-1, 1]`` -- in the benchmark only;
  the service normalises with declared bounds.
* Queries: for each ``sigma`` in {2, 4, 6, 8, 10}, 10,000 Gaussian mixtures
  ``GaussianMixtureBatch.random(10_000, 10, d, sigma, default_rng(QUERY_SEED))``
  (``a_j ~ U[0, 1]``, ``c_j ~ U[-1, 1]^d``, the same fixed seed as ``smooth_synthetic``).
  The true answers are computed from the data.
* Privacy: ``epsilon = 1``; pure (``delta = 0``, Laplace noise) and, as a side line,
  ``delta = 1e-9`` (Gaussian noise). Each ``sigma`` is its own release with
  ``smoothness = sigma^2``.
* Releases, each round a fresh measurement:
  - ``synopsis``: ``smooth_synopsis.measure(X, 1.0, delta, smoothness=sigma^2, rng=...)``
    with the library defaults (``basis="auto"``, the service default); answers by
    ``Synopsis.answer_many(batch)`` (the vectorised Gaussian-mixture path, level 0.95);
  - ``synopsis nominal``: the same with ``basis="nominal"`` (a larger basis whose
    truncation bound is small against the noise, for near-nominal coverage);
  - ``smooth_synthetic``: ``smooth_synthetic.synthesize(X, 1.0, delta,
    smoothness=sigma^2, rng=...)`` with its library defaults, answered as the expectation
    of the weighted support, ``batch.answers(release.points, release.weights)``;
  - diagnostic, not private: the synopsis with its *exact* moments (same index set, no
    noise), which isolates the actual truncation error from the noise.
* Metrics, averaged over rounds: worst-case relative error ``max_q |a_q - t_q| / t_q``
  and mean relative error, each also as a multiple of the 0-DP baseline's (the exact
  expectation under the uniform distribution on ``[-1, 1]^d``,
  ``batch.uniform_expectations()``: a release that ignores the data); for the synopsis
  the share of the queries whose 95 % interval contains the truth, for the full interval
  (``value -+ (noise_halfwidth + truncation_bound)``, what the service returns) and for the
  noise-only part (``value -+ noise_halfwidth``), and the share whose noise-only interval
  contains the noise-free answer (a check of the noise calibration alone); the time to
  measure and the time of ``answer_many`` for the 10^4 queries.
* Coverage across the queries of one release is not the nominal per-query coverage: all
  answers of a release share one noise vector. So the per-query coverage is also measured
  over repeated measurements (``--draws``, default 2000, for the default synopsis;
  ``--draws-side``, default 1000, for the others, whose large bases make OpenDP's noise
  sampling slow) for 5 fixed queries (the first 5 of the batch) on WDBC at ``sigma = 4``.
* The answers of the rounds of one configuration share the Chebyshev coefficients (the
  index set depends on public parameters only): ``answer_many`` runs once per
  configuration (timed), and the answers of every round (and of the exact moments) come
  from one pass of the same code (:func:`answer_rounds`), checked equal to
  ``answer_many`` to 1e-9 for the first round. The answers include the independence
  extrapolation (``smooth_synopsis`` docstring), so the value, the stderr and the
  interval depend on the round's moments and are computed per round; the worst-case
  interval is centred on the plain Algorithm-2 answer. The truncation estimate uses the
  first round's ``centred_mu``.

The privacy noise of ``smooth_synopsis`` comes from OpenDP and cannot be seeded (its
``rng`` is accepted for the common signature), so synopsis rounds are not reproducible
bit for bit; ``smooth_synthetic`` rounds use the seeds ``1000 r + sigma``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import smooth_synopsis, smooth_synthetic
from app.mechanisms.basis import moments
from app.mechanisms.chebyshev import (
    gaussian_expansion,
    independence_extrapolation,
    restrict,
    truncation_estimate,
)
from app.mechanisms.queries import GaussianMixtureBatch
from bench._common import Run
from bench.smooth_synthetic import DATA_DIR, QUERY_SEED, SIGMAS, load_datasets

RESULTS = Path(__file__).resolve().parent / "results"
EPSILON = 1.0
DELTA_GAUSS = 1e-9
LEVEL = 0.95
COVERAGE_DATASET = "WDBC"
COVERAGE_SIGMA = 4
COVERAGE_QUERIES = 5

#: (label, delta, measure keyword arguments) of the synopsis releases.
SYNOPSES: tuple[tuple[str, float, dict[str, Any]], ...] = (
    ("synopsis (eps)", 0.0, {}),
    ("synopsis (eps), no co-spread", 0.0, {"co_spread": False}),
    ("synopsis nominal (eps)", 0.0, {"basis": "nominal"}),
    ("synopsis (eps,delta)", DELTA_GAUSS, {}),
)
#: (label, delta) of the smooth_synthetic releases (library defaults).
SYNTHETICS: tuple[tuple[str, float], ...] = (
    ("smooth_synthetic (eps)", 0.0),
    ("smooth_synthetic (eps,delta)", DELTA_GAUSS),
)
DEFAULT = SYNOPSES[0][0]


def _errors(answers: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    err = np.abs(answers - truth)
    rel = err / truth
    return {
        "abs": float(err.max()),
        "rel": float(rel.max()),
        "rel_mean": float(rel.mean()),
        "finite": float(np.all(np.isfinite(answers))),
    }


def answer_rounds(
    releases: list[smooth_synopsis.Synopsis],
    batch: GaussianMixtureBatch,
    exact: np.ndarray,
    second_order: bool = True,
) -> dict[str, np.ndarray]:
    """What :meth:`Synopsis.answer_many` returns, for every release of one configuration.

    The releases share the index set and the noise law (checked by the caller), so the
    Chebyshev coefficients (``gaussian_expansion`` then ``restrict``, in blocks of
    ``ANSWER_BLOCK`` queries) and the truncation estimate are computed once per block;
    the independence extrapolation, its delta-method stderr and the interval depend on
    the release's moments and are computed per release, by the same code as
    ``answer_many``, the co-spread correction included. The truncation estimate uses the
    first release's ``centred_mu`` (a clipped function of its noisy one-column moments;
    the other releases' differ by the noise only).
    ``exact`` are the noise-free moments (diagnostic): ``exact`` answers with and without
    the extrapolation. Arrays are ``(Q, rounds)``; ``worst_half`` is ``(Q,)``.
    """
    first = releases[0]
    index_set = first.index_set
    sigma = np.full(first.d, batch.sigma)
    min_length = index_set.max_degree + 1
    Q, k = len(batch), len(releases)
    out = {
        key: np.empty((Q, k))
        for key in ("values", "plain", "halfwidth", "noise_halfwidth", "dependence")
    }
    out |= {key: np.empty(Q) for key in ("worst_half", "exact", "exact_plain")}
    block = smooth_synopsis.ANSWER_BLOCK
    for start in range(0, Q, block):
        stop = min(start + block, Q)
        expansion = gaussian_expansion(
            batch.centers[start:stop], batch.weights[start:stop], sigma, min_length=min_length
        )
        coef = restrict(expansion, index_set)
        estimate = truncation_estimate(expansion, index_set, coef.coefficients, first.centred_mu)
        plain_half = first._noise_halfwidth(coef.coefficients, LEVEL)  # same in every round
        for r, syn in enumerate(releases):
            extrapolation = independence_extrapolation(
                expansion,
                index_set,
                syn.moments,
                syn.calibration.stddev**2 if second_order else 0.0,
            )
            answers = syn._answers(
                coef, LEVEL, estimate, extrapolation, plain_half, expansion=expansion
            )
            out["values"][start:stop, r] = answers.values
            out["plain"][start:stop, r] = answers.values - answers.extrapolation
            out["halfwidth"][start:stop, r] = answers.halfwidth
            out["noise_halfwidth"][start:stop, r] = answers.noise_halfwidth
            out["dependence"][start:stop, r] = answers.dependence
            if r == 0:
                out["worst_half"][start:stop] = answers.worst_case_halfwidth
        plain = coef.constant + coef.coefficients @ exact
        extrapolation = independence_extrapolation(expansion, index_set, exact)
        extra = 0.0 if extrapolation is None else extrapolation.value
        out["exact_plain"][start:stop] = plain
        out["exact"][start:stop] = plain + extra
    return out


@dataclass
class SynopsisRuns:
    """``rounds`` fresh measurements of one configuration and their answers to a batch.

    ``answers`` is ``answer_many`` of the first release (timed); ``rounds`` holds every
    release's answers from :func:`answer_rounds` (its first column checked against
    ``answers``).
    """

    synopsis: smooth_synopsis.Synopsis
    releases: list[smooth_synopsis.Synopsis]
    measure_s: list[float]
    answers: smooth_synopsis.Answers
    answer_s: float
    rounds: dict[str, np.ndarray]

    @property
    def values(self) -> np.ndarray:
        return self.rounds["values"]

    @property
    def exact(self) -> np.ndarray:
        return self.rounds["exact"]


def measure_rounds(
    X: np.ndarray,
    sigma: int,
    delta: float,
    kwargs: dict[str, Any],
    batch: GaussianMixtureBatch,
    rounds: int,
) -> SynopsisRuns:
    releases, measure_s = [], []
    for r in range(rounds):
        t0 = time.perf_counter()
        releases.append(
            smooth_synopsis.measure(
                X,
                EPSILON,
                delta,
                smoothness=sigma * sigma,
                rng=np.random.default_rng(1000 * r + sigma),  # unused: OpenDP draws the noise
                **kwargs,
            )
        )
        measure_s.append(time.perf_counter() - t0)
    first = releases[0]
    for syn in releases[1:]:
        same_set = np.array_equal(syn.index_set.degrees, first.index_set.degrees)
        if not same_set or syn.calibration != first.calibration:
            raise RuntimeError("rounds of one configuration must share index set and noise law")
    t0 = time.perf_counter()
    answers = first.answer_many(batch, level=LEVEL)
    answer_s = time.perf_counter() - t0
    per_round = answer_rounds(releases, batch, moments(X, first.index_set))
    for key, got in (("values", answers.values), ("halfwidth", answers.halfwidth)):
        if not np.allclose(per_round[key][:, 0], got, rtol=1e-9, atol=1e-12):
            raise RuntimeError(f"per-round {key} differ from Synopsis.answer_many")
    return SynopsisRuns(first, releases, measure_s, answers, answer_s, per_round)


def synopsis_stats(
    runs: SynopsisRuns, truth: np.ndarray
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per-round statistics and the noise-free (truncation only) diagnostic."""
    ans = runs.answers
    rounds = runs.rounds
    per_round = []
    for r in range(runs.values.shape[1]):
        v = runs.values[:, r]
        err = np.abs(v - truth)
        half, noise_half = rounds["halfwidth"][:, r], rounds["noise_halfwidth"][:, r]
        per_round.append(
            _errors(v, truth)
            | {
                "coverage": float(np.mean(err <= half)),
                "coverage_worst_case": float(
                    np.mean(np.abs(rounds["plain"][:, r] - truth) <= rounds["worst_half"])
                ),
                "coverage_noise_only": float(np.mean(err <= noise_half)),
                "coverage_noise_calibration": float(np.mean(np.abs(v - runs.exact) <= noise_half)),
                "halfwidth_mean": float(half.mean()),
                "measure_s": runs.measure_s[r],
                "corrected_share": float(np.mean(rounds["dependence"][:, r] != 0.0)),
            }
        )
    syn = runs.synopsis
    for stats, release in zip(per_round, runs.releases, strict=True):
        spread = release.co_spread
        stats["co_spread"] = float("nan") if spread is None else spread.value
        stats["co_spread_stddev"] = float("nan") if spread is None else spread.stddev
    common = {
        "answer_s": runs.answer_s,
        "R": float(syn.size),
        "noise_scale": syn.noise_scale,
        "stderr_mean": float(ans.stderr.mean()),
        "noise_halfwidth_mean": float(ans.noise_halfwidth.mean()),
        "truncation_bound_mean": float(ans.truncation_bound.mean()),
        "epsilon": syn.privacy_cost.epsilon,
        "delta": syn.privacy_cost.delta,
    }
    for stats in per_round:
        stats |= common
    actual = np.abs(runs.exact - truth)
    plain_actual = np.abs(rounds["exact_plain"] - truth)
    noise_free = _errors(runs.exact, truth) | {
        "plain_rel": _errors(rounds["exact_plain"], truth)["rel"],
        "plain_actual_truncation_error_mean": float(plain_actual.mean()),
        "R": float(syn.size),
        "truncation_bound_mean": float(ans.truncation_bound.mean()),
        "actual_truncation_error_mean": float(actual.mean()),
        "bound_over_actual_median": float(
            np.median(ans.truncation_bound / np.maximum(plain_actual, 1e-300))
        ),
        "estimate_over_actual_median": float(
            np.median((ans.halfwidth - ans.noise_halfwidth) / np.maximum(actual, 1e-300))
        ),
        "bound_holds": float(np.mean(plain_actual <= ans.truncation_bound * (1 + 1e-9) + 1e-15)),
    }
    return per_round, noise_free


def run_synthetic(
    X: np.ndarray,
    sigma: int,
    delta: float,
    batch: GaussianMixtureBatch,
    truth: np.ndarray,
    seed: int,
) -> dict[str, float]:
    t0 = time.perf_counter()
    release = smooth_synthetic.synthesize(
        X, EPSILON, delta, smoothness=sigma * sigma, rng=np.random.default_rng(seed)
    )
    t1 = time.perf_counter()
    answers = batch.answers(release.points, release.weights)
    t2 = time.perf_counter()
    return _errors(answers, truth) | {
        "synth_s": t1 - t0,
        "answer_s": t2 - t1,
        "support": float(release.points.shape[0]),
        "R": float(release.parameters["R"]),
    }


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    summary = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
    summary["rel_std"] = float(np.std([r["rel"] for r in runs]))
    summary["rounds"] = len(runs)
    return summary


def per_query_coverage(
    X: np.ndarray,
    sigma: int,
    n_queries: int,
    draws: int,
    draws_side: int,
    log: Callable[..., None],
) -> dict[str, Any]:
    """Coverage of fixed queries over repeated measurements (independent noise draws):
    ``draws`` for the default synopsis, ``draws_side`` for the others (their large bases
    make OpenDP's noise sampling the cost)."""
    d = X.shape[1]
    full = GaussianMixtureBatch.random(
        max(n_queries, COVERAGE_QUERIES), 10, d, float(sigma), np.random.default_rng(QUERY_SEED)
    )
    batch = GaussianMixtureBatch(
        full.centers[:COVERAGE_QUERIES], full.weights[:COVERAGE_QUERIES], full.sigma
    )
    truth = batch.answers(X)
    out: dict[str, Any] = {"sigma": sigma, "queries": COVERAGE_QUERIES, "draws": draws}
    for label, delta, kwargs in SYNOPSES:
        t0 = time.perf_counter()
        n_draws = draws if label == DEFAULT else draws_side
        runs = measure_rounds(X, sigma, delta, kwargs, batch, n_draws)
        ans = runs.answers
        rounds = runs.rounds
        v = runs.values.T  # (draws, queries)
        err = np.abs(v - truth)
        half, noise_half = rounds["halfwidth"].T, rounds["noise_halfwidth"].T
        plain_err = np.abs(rounds["plain"].T - truth)
        entry = {
            "R": runs.synopsis.size,
            "noise": runs.synopsis.noise_distribution,
            "draws": n_draws,
            "truth": truth.tolist(),
            "noise_free_answer": runs.exact.tolist(),
            "truncation_bound": ans.truncation_bound.tolist(),
            "actual_truncation_error": np.abs(rounds["exact_plain"] - truth).tolist(),
            "actual_error_extrapolated": np.abs(runs.exact - truth).tolist(),
            "stderr": ans.stderr.tolist(),
            "empirical_sd": v.std(axis=0, ddof=1).tolist(),
            "noise_halfwidth": noise_half.mean(axis=0).tolist(),
            "halfwidth": half.mean(axis=0).tolist(),
            "coverage": np.mean(err <= half, axis=0).tolist(),
            "coverage_worst_case": np.mean(
                plain_err <= rounds["worst_half"][None, :], axis=0
            ).tolist(),
            "coverage_noise_only": np.mean(err <= noise_half, axis=0).tolist(),
            "coverage_noise_calibration": np.mean(
                np.abs(v - runs.exact) <= noise_half, axis=0
            ).tolist(),
            "seconds": time.perf_counter() - t0,
        }
        out[label] = entry
        log(
            f"  per-query coverage {label}: R={entry['R']} full "
            f"{np.round(entry['coverage'], 3)} noise-only "
            f"{np.round(entry['coverage_noise_only'], 3)}"
            f" calibration {np.round(entry['coverage_noise_calibration'], 3)} "
            f"({entry['seconds']:.0f} s)"
        )
    return out


def run(
    *,
    datasets: list[str],
    rounds: int,
    n_queries: int,
    draws: int,
    draws_side: int,
    data_dir: Path,
    log: Callable[..., None] = print,
    data: dict[str, np.ndarray] | None = None,
    sigmas: tuple[int, ...] = SIGMAS,
) -> dict[str, Any]:
    """Run the protocol; ``data`` replaces the named datasets (used by the smoke test)."""
    started = time.time()
    result: dict[str, Any] = {
        "settings": {
            "sigmas": list(sigmas),
            "queries": n_queries,
            "centres_per_query": 10,
            "query_seed": QUERY_SEED,
            "epsilon": EPSILON,
            "deltas": [0.0, DELTA_GAUSS],
            "level": LEVEL,
            "rounds": rounds,
            "draws": draws,
            "draws_side": draws_side,
            "normalisation": "per-column min/max to [-1, 1] (benchmark only)",
        },
        "datasets": {},
    }
    if data is None:
        data = load_datasets(datasets, data_dir)
    for name, X in data.items():
        n, d = X.shape
        log(f"{name}: n={n} d={d} load={os.getloadavg()[0]:.2f}")
        entry: dict[str, Any] = {"n": n, "d": d, "baseline": {}, "noise_free": {}, "releases": {}}
        for sigma in sigmas:
            key = str(sigma)
            batch = GaussianMixtureBatch.random(
                n_queries, 10, d, float(sigma), np.random.default_rng(QUERY_SEED)
            )
            truth = batch.answers(X)
            base = _errors(batch.uniform_expectations(), truth)
            entry["baseline"][key] = base
            for label, delta, kwargs in SYNOPSES:
                per_round, noise_free = synopsis_stats(
                    measure_rounds(X, sigma, delta, kwargs, batch, rounds), truth
                )
                entry["noise_free"].setdefault(label, {})[key] = noise_free
                summary = _mean(per_round)
                summary["ratio"] = summary["rel"] / base["rel"]
                summary["ratio_mean"] = summary["rel_mean"] / base["rel_mean"]
                entry["releases"].setdefault(label, {})[key] = summary
            for label, delta in SYNTHETICS:
                runs = [
                    run_synthetic(X, sigma, delta, batch, truth, 1000 * r + sigma)
                    for r in range(rounds)
                ]
                summary = _mean(runs)
                summary["ratio"] = summary["rel"] / base["rel"]
                summary["ratio_mean"] = summary["rel_mean"] / base["rel_mean"]
                entry["releases"].setdefault(label, {})[key] = summary
            syn_s = entry["releases"][DEFAULT][key]
            syn_t = entry["releases"]["smooth_synthetic (eps)"][key]
            log(
                f"  sigma={sigma}: baseline rel {base['rel']:.3f}; synopsis x{syn_s['ratio']:.2f} "
                f"(R={syn_s['R']:.0f}, coverage {syn_s['coverage']:.3f} / noise-only "
                f"{syn_s['coverage_noise_only']:.3f}, answer {syn_s['answer_s']:.2f} s); "
                f"smooth_synthetic x{syn_t['ratio']:.2f}; {time.time() - started:.0f} s"
            )
        result["datasets"][name] = entry
    if COVERAGE_DATASET in data and COVERAGE_SIGMA in sigmas and draws > 0:
        log(
            f"per-query coverage on {COVERAGE_DATASET}, sigma={COVERAGE_SIGMA}, "
            f"{draws} / {draws_side} draws"
        )
        result["per_query_coverage"] = {
            COVERAGE_DATASET: per_query_coverage(
                data[COVERAGE_DATASET], COVERAGE_SIGMA, n_queries, draws, draws_side, log
            )
        }
    result["wall_seconds"] = time.time() - started
    return result


# --- report --------------------------------------------------------------------------------


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _error_table(entry: dict[str, Any], sigmas: list[int], metric: str) -> list[str]:
    ratio = "ratio" if metric == "rel" else "ratio_mean"
    head = ["release", *[f"sigma={s}" for s in sigmas]]
    lines = [_row(head), _row(["---"] * len(head))]
    base = entry["baseline"]
    lines.append(_row(["0-DP uniform baseline", *[f"{base[str(s)][metric]:.3f}" for s in sigmas]]))
    for label, per_sigma in entry["releases"].items():
        cells = [
            f"{per_sigma[str(s)][metric]:.3f} (x{per_sigma[str(s)][ratio]:.2f})" for s in sigmas
        ]
        lines.append(_row([label, *cells]))
    for label, per_sigma in entry["noise_free"].items():
        values = [per_sigma[str(s)][metric] for s in sigmas]
        cells = [
            f"{v:.3f} (x{v / base[str(s)][metric]:.2f})"
            for v, s in zip(values, sigmas, strict=True)
        ]
        lines.append(_row([f"{label}, exact moments (not private)", *cells]))
    return lines


NOTES = [
    "Errors: `0.123 (x0.41)` is the error averaged over rounds and, in brackets, as a multiple "
    "of the 0-DP baseline's same error. Worst case: max over the queries of |a_q - t_q| / t_q; "
    "mean: the mean over the queries of the same ratio. 0-DP baseline: the exact expectation "
    "under the uniform distribution on [-1, 1]^d (`uniform_expectations()`), a release that "
    "ignores the data.",
    "`synopsis (eps)`: `smooth_synopsis.measure` with the library (and service) defaults, "
    "basis `auto`, Laplace noise, 5 % of epsilon on the co-spread (`smooth_synopsis` "
    "docstring, Dependence correction); `synopsis (eps), no co-spread`: the same with "
    "`co_spread=False` (all of epsilon on the moments, no correction); "
    "`synopsis nominal (eps)`: basis `nominal`; "
    "`synopsis (eps,delta)`: delta = 1e-9, Gaussian noise, basis `auto`. `smooth_synthetic`: "
    "`synthesize` with its library defaults (hypercube grid, vertex LP), answered as the "
    "expectation of the weighted support. `exact moments (not private)`: the same index set "
    "with the noise-free moments, i.e. the actual truncation error alone (a diagnostic). Every "
    "synopsis answer (noisy and exact) includes the independence extrapolation "
    "(`smooth_synopsis` docstring; the answers' default): the out-of-set interaction terms "
    "predicted by the product of the released one-column moments, with a delta-method stderr. "
    "The worst-case interval and the truncation-bound columns refer to the plain Algorithm-2 "
    "answer (without it), around which the bound holds.",
    "Coverage: 95 % intervals. `full` = `value -+ halfwidth`, the interval the service "
    "returns (`Answer.as_dict()['interval']`: noise quantile and estimated truncation, "
    "`smooth_synopsis` docstring, Intervals); `worst case` = `value -+ (noise_halfwidth + "
    "truncation_bound)` around the plain answer (`worst_case_interval`, valid for every "
    "dataset); `noise-only` = "
    "`value -+ noise_halfwidth` against the truth; `calibration` = `noise-only` against the "
    "noise-free answer (checks the noise quantile alone). Across the queries of one release "
    "the shares are not independent (one noise vector per release); the per-query table over "
    "repeated measurements is the nominal-coverage check (Monte Carlo standard error "
    "sqrt(0.95 * 0.05 / draws): 0.5 % for 2000 draws, 0.7 % for 1000).",
    "Data: per-column min/max normalisation to [-1, 1] in the benchmark only (the service "
    "uses declared bounds). WDBC 569 x 30, CTG 2126 x 21 (CLASS, NSP dropped), PKS 5875 x 21 "
    "(subject# dropped), CRM 1994 x 100. Queries: 10 centres, a_j ~ U[0, 1], c_j ~ U[-1, 1]^d, "
    f"seed {QUERY_SEED}, smoothness = sigma^2, one release per sigma.",
    "The synopsis noise is drawn by OpenDP and cannot be seeded: synopsis rounds are not "
    "reproducible bit for bit (smooth_synthetic uses seeds 1000 r + sigma).",
    "Times: `measure s` is `smooth_synopsis.measure` (moments + noise); `answer s` is "
    "`answer_many` on the whole query batch (Chebyshev coefficients, stderr, saddlepoint "
    "quantiles and truncation bounds included); smooth_synthetic `synth s` is the whole "
    "`synthesize` and its `answer s` is `batch.answers(points, weights)`. Means over rounds, "
    "on a shared, loaded 2-core machine.",
]


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    sigmas = s["sigmas"]
    lines = [
        "# smooth_synopsis benchmark (paper 000 §4 protocol, issue 4)",
        "",
        "Produced by `python -m bench.smooth_synopsis` (protocol in its docstring).",
        "",
        f"- {s['queries']} queries, epsilon = {s['epsilon']}, delta in {{0, {DELTA_GAUSS}}}, "
        f"rounds per dataset and sigma: {s['rounds']} (each a fresh measurement); "
        f"{s['draws']} draws ({s['draws_side']} for the other synopses) for the per-query "
        "coverage. Whole run "
        f"{result['wall_seconds'] / 60:.1f} min.",
        *[f"- {note}" for note in NOTES],
        "",
        "## Worst-case relative error as a multiple of the 0-DP baseline",
        "",
    ]
    head = ["dataset", "release", *[f"sigma={sg}" for sg in sigmas]]
    lines += [_row(head), _row(["---"] * len(head))]
    for name, entry in result["datasets"].items():
        for label in (DEFAULT, "smooth_synthetic (eps)"):
            per_sigma = entry["releases"][label]
            lines.append(
                _row([name, label, *[f"x{per_sigma[str(sg)]['ratio']:.2f}" for sg in sigmas]])
            )
    lines.append("")
    for name, entry in result["datasets"].items():
        lines += [f"## {name} (n = {entry['n']}, d = {entry['d']})", ""]
        lines += ["Worst-case relative error:", "", *_error_table(entry, sigmas, "rel"), ""]
        lines += ["Mean relative error:", "", *_error_table(entry, sigmas, "rel_mean"), ""]
        lines += ["Synopsis basis size R:", ""]
        head = ["release", *[f"sigma={sg}" for sg in sigmas]]
        lines += [_row(head), _row(["---"] * len(head))]
        for label, _, _ in SYNOPSES:
            per_sigma = entry["releases"][label]
            lines.append(_row([label, *[f"{per_sigma[str(sg)]['R']:.0f}" for sg in sigmas]]))
        lines.append("")
    lines += _coverage_tables(result)
    lines += _co_spread_table(result)
    lines += _timing_table(result)
    return "\n".join(lines) + "\n"


def _coverage_tables(result: dict[str, Any]) -> list[str]:
    sigmas = result["settings"]["sigmas"]
    lines = [
        "## Interval coverage across the queries of a release (95 % intervals)",
        "",
        "Cells: `full / worst case / noise-only / calibration` (definitions in the notes), "
        "mean over rounds. Last column: `full` pooled over every sigma, round and query of the "
        "row.",
        "",
    ]
    head = ["dataset", "release", *[f"sigma={sg}" for sg in sigmas]]
    lines += [_row([*head, "pooled"]), _row(["---"] * (len(head) + 1))]
    for name, entry in result["datasets"].items():
        for label, _, _ in SYNOPSES:
            per_sigma = entry["releases"][label]
            stats = [per_sigma[str(sg)] for sg in sigmas]
            cells = [
                f"{st['coverage']:.3f} / {st.get('coverage_worst_case', float('nan')):.3f} / "
                f"{st['coverage_noise_only']:.3f} / {st['coverage_noise_calibration']:.3f}"
                for st in stats
            ]
            pooled = float(np.mean([st["coverage"] for st in stats]))
            lines.append(_row([name, label, *cells, f"{pooled:.3f}"]))
    lines += [
        "",
        "Mean half-widths behind these intervals: `halfwidth` of the full interval; then "
        "`noise_halfwidth + truncation_bound` of the worst case (in brackets the medians over "
        "queries of the estimated truncation width and of the bound over the actual truncation "
        "error):",
        "",
        _row(head),
        _row(["---"] * len(head)),
    ]
    for name, entry in result["datasets"].items():
        for label, _, _ in SYNOPSES:
            per_sigma = entry["releases"][label]
            nf = entry["noise_free"][label]
            cells = [
                f"{per_sigma[str(sg)].get('halfwidth_mean', float('nan')):.3g}; "
                f"{per_sigma[str(sg)]['noise_halfwidth_mean']:.3g} + "
                f"{per_sigma[str(sg)]['truncation_bound_mean']:.3g} "
                f"(est x{nf[str(sg)].get('estimate_over_actual_median', float('nan')):.2g}, "
                f"bound x{nf[str(sg)]['bound_over_actual_median']:.0f})"
                for sg in sigmas
            ]
            lines.append(_row([name, label, *cells]))
    lines.append("")
    for name, pq in result.get("per_query_coverage", {}).items():
        lines += [
            "## Per-query coverage over independent measurements "
            f"({name}, sigma = {pq['sigma']}, the first {pq['queries']} queries)",
            "",
            "Cells: `full / worst case / noise-only / calibration`; then the reported stderr "
            "against the "
            "empirical standard deviation of the answer over the draws, and the truncation "
            "bound against the actual truncation error |noise-free answer - truth|.",
            "",
        ]
        head = ["release", "R", "draws", *[f"query {i}" for i in range(pq["queries"])]]
        lines += [_row(head), _row(["---"] * len(head))]
        for label, _, _ in SYNOPSES:
            e = pq[label]
            cells = [
                f"{c:.3f} / {c1:.3f} / {c2:.3f} / {c3:.3f}"
                for c, c1, c2, c3 in zip(
                    e["coverage"],
                    e.get("coverage_worst_case", [float("nan")] * len(e["coverage"])),
                    e["coverage_noise_only"],
                    e["coverage_noise_calibration"],
                    strict=True,
                )
            ]
            lines.append(_row([label, str(e["R"]), str(e["draws"]), *cells]))
        for label, _, _ in SYNOPSES:
            e = pq[label]
            cells = [
                f"se {se:.3g} vs sd {sd:.3g}; tau {tau:.3g} vs {act:.3g}"
                for se, sd, tau, act in zip(
                    e["stderr"],
                    e["empirical_sd"],
                    e["truncation_bound"],
                    e["actual_truncation_error"],
                    strict=True,
                )
            ]
            lines.append(_row([label, str(e["R"]), str(e["draws"]), *cells]))
        lines.append("")
    return lines


def _co_spread_table(result: dict[str, Any]) -> list[str]:
    sigmas = result["settings"]["sigmas"]
    head = ["dataset", "release", *[f"sigma={sg}" for sg in sigmas]]
    lines = [
        "## Co-spread",
        "",
        "Cells: the released co-spread `A_hat` (mean over rounds) -+ its stated standard "
        "deviation; then the share of the answers that took the correction "
        "(`dependence_log_factor != 0`).",
        "",
        _row(head),
        _row(["---"] * len(head)),
    ]
    for name, entry in result["datasets"].items():
        for label, _, kwargs in SYNOPSES:
            if kwargs:
                continue
            per_sigma = entry["releases"][label]
            cells = [
                f"{per_sigma[str(sg)].get('co_spread', float('nan')):.3g} -+ "
                f"{per_sigma[str(sg)].get('co_spread_stddev', float('nan')):.2g}; "
                f"{per_sigma[str(sg)].get('corrected_share', float('nan')):.2f}"
                for sg in sigmas
            ]
            lines.append(_row([name, label, *cells]))
    lines.append("")
    return lines


def _timing_table(result: dict[str, Any]) -> list[str]:
    sigmas = result["settings"]["sigmas"]
    q = result["settings"]["queries"]
    lines = [
        f"## Times (seconds, mean over rounds; answers for {q} queries)",
        "",
        "Synopsis cells: `measure s / answer s`; smooth_synthetic cells: `synth s / answer s`.",
        "",
    ]
    head = ["dataset", "release", *[f"sigma={sg}" for sg in sigmas]]
    lines += [_row(head), _row(["---"] * len(head))]
    for name, entry in result["datasets"].items():
        for label, per_sigma in entry["releases"].items():
            first = "synth_s" if "synth_s" in per_sigma[str(sigmas[0])] else "measure_s"
            cells = [
                f"{per_sigma[str(sg)][first]:.2f} / {per_sigma[str(sg)]['answer_s']:.2f}"
                for sg in sigmas
            ]
            lines.append(_row([name, label, *cells]))
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: WDBC, 1 round, 1000 queries, sigma in {4, 10}, 10 draws",
    )
    parser.add_argument("--rounds", type=int, default=10, help="rounds per dataset and sigma")
    parser.add_argument(
        "--draws",
        type=int,
        default=2000,
        help="measurements for the per-query coverage of the default synopsis",
    )
    parser.add_argument(
        "--draws-side",
        type=int,
        default=1000,
        help="measurements for the per-query coverage of the other synopses",
    )
    parser.add_argument("--datasets", default="WDBC,CTG,PKS,CRM")
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--sigmas", default=",".join(str(sg) for sg in SIGMAS))
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.rounds, args.queries, args.draws, args.draws_side = (
            "WDBC",
            1,
            1000,
            10,
            10,
        )
        args.sigmas = "4,10"
    command = "python -m bench.smooth_synopsis" + (" " + " ".join(argv) if argv else "")
    stem = "smooth_synopsis_quick" if args.quick else "smooth_synopsis"
    recorder = Run(stem, command)
    result = run(
        datasets=args.datasets.split(","),
        rounds=args.rounds,
        n_queries=args.queries,
        draws=args.draws,
        draws_side=args.draws_side,
        data_dir=args.data_dir,
        sigmas=tuple(int(sg) for sg in args.sigmas.split(",")),
        log=lambda *a: print(*a, flush=True),
    )
    machine = recorder.machine()
    payload = {"benchmark": stem, "command": command, "machine": machine} | result
    markdown = render_markdown(result).rstrip() + "\n\n" + recorder.machine_md(machine) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown)
    print(f"wrote {args.out / stem}.json and .md")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
