"""Standard errors of ``smooth_synthetic`` answers: are they the noise, and how much of the
error is the noise?

Run from the repository root:

    python -m bench.answer_stderr [--rounds 20] [--queries 300] [--datasets WDBC,CTG,PKS,CRM]

The ``marginals`` and ``tree`` methods of ``smooth_synthetic`` answer a query with the
exact expectation under their fitted law and give it a standard error by the parametric
bootstrap of :mod:`app.mechanisms.bootstrap` (``stderrs``: the law refitted from
``REPLICATES`` measurements simulated under the released law); ``moments`` answers on its
weighted support and bootstraps it likewise (:func:`app.mechanisms.smooth_synthetic.
noise_replicates`: moments simulated from the support, refitted on fresh candidates). This
benchmark checks that figure against what it estimates and against what an analyst wants
to know.

Protocol: the query families of ``bench/smooth_marginals.py`` (paper 000 §4 uniform
centres at sigma in {2, 4, 6, 8, 10}; centres at real rows plus N(0, 0.1^2) jitter at
sigma in {1, 2}; per-column min/max normalisation, benchmark only). Each round makes one
release of each method on the same data: the default ``tree`` at ``epsilon = 1, delta =
1e-9`` (the default of ``smooth_synthetic`` when ``delta > 0``), ``marginals`` at pure
``epsilon = 1`` (the default when ``delta = 0``) and ``moments`` at ``epsilon = 1, delta =
1e-9`` (paper 000 with the library defaults: Gaussian moments, ``R = max(d, R_paper)``,
``C = 10^4`` hypercube candidates, the vertex LP). ``--methods`` picks some of them and
``--name`` the results' file stem. Columns, per family:

* ``se / sd``: the bootstrap standard error against the standard deviation of the
  answers across the rounds (independent releases of the same data: the noise's actual
  effect), pooled over the queries in relative terms, ``sqrt(sum_q mean_r se_rq^2 / t_q^2
  / sum_q var_q / t_q^2)`` (``var_q`` the unbiased variance over the rounds, ``t_q`` the
  true answer; a ratio of two unbiased sums, where a per-query ratio of standard deviations
  from a few rounds would be biased upwards). 1 is a calibrated standard error. The
  queries of a family share the noise's few directions, so the pooled figure moves between
  runs more than ``1 / sqrt(2 (rounds - 1))``: two runs of 10 rounds read 0.93-0.96 and
  1.28-1.41 for the tree on CTG's uniform-centre families, one of 20 rounds 0.86.
* ``noise share``: the median over the queries of that standard deviation divided by the
  root-mean-square error against the truth: 1 where the error is all noise, near 0 where
  it is the model's (the dependence the law does not hold).
* ``covers truth``: the fraction of (query, round) pairs with the truth inside ``value +-
  1.96 se``, the interval an analyst would form from the answer.
* ``covers mean``: the same around the mean answer over the rounds (what the noise-only
  interval is for: near 0.95 when the standard error is right, whatever the model's bias).
* ``s``: seconds to build one release's bootstrap (what the synthesis stage adds, or the
  first answer of a version synthesised before it stored them) and to answer one family
  with standard errors.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np

from app.mechanisms import bootstrap, marginal_tree, marginals
from app.mechanisms import smooth_synthetic as ss
from app.mechanisms.chebyshev import gaussian_expansion
from bench._common import Run
from bench.smooth_marginals import DELTA, _families
from bench.smooth_synthetic import DATA_DIR, load_datasets

Z_95 = 1.959963984540054
BLOCK = 100
METHODS = ("tree (eps, delta)", "marginals (eps)", "moments (eps, delta)")
#: ``--methods`` names.
SHORT = {"tree": METHODS[0], "marginals": METHODS[1], "moments": METHODS[2]}


def _measure(method: str, X: np.ndarray) -> Any:
    if method == METHODS[0]:
        return marginal_tree.measure(X, 1.0, DELTA)
    if method == METHODS[2]:
        return ss.synthesize(X, 1.0, DELTA, rng=np.random.default_rng(), sample_size=1)
    return marginals.measure(X, 1.0, 0.0)


def _bootstrap(release: Any) -> None:
    """Fit the released law (not timed), then build the bootstrap (timed by the caller)."""
    if isinstance(release, ss.SyntheticRelease):
        return
    release.expectations(gaussian_expansion(np.zeros((1, 1, release.d)), np.ones((1, 1)), 1.0))


def _answers(release: Any, batch: Any, replicates: Any) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(release, ss.SyntheticRelease):
        offsets = replicates.offsets_of(replicates.sizes)
        supports = [
            batch.answers(replicates.points[o : o + k], replicates.weights[o : o + k])
            for o, k in zip(offsets, replicates.sizes, strict=True)
        ]
        return (
            batch.answers(release.points, release.weights),
            bootstrap.standard_errors(np.stack(supports)),
        )
    values, errors = [], []
    for start in range(0, len(batch), BLOCK):
        expansion = gaussian_expansion(
            batch.centers[start : start + BLOCK],
            batch.weights[start : start + BLOCK],
            batch.sigma,
        )
        values.append(release.expectations(expansion))
        errors.append(release.stderrs(expansion))
    return np.concatenate(values), np.concatenate(errors)


def run_dataset(
    X: np.ndarray, rounds: int, queries: int, methods: tuple[str, ...] = METHODS
) -> dict[str, Any]:
    families = _families(X, queries)
    truth = {k: b.answers(X) for k, b in families.items()}
    out: dict[str, Any] = {}
    for method in methods:
        values: dict[str, list[np.ndarray]] = {k: [] for k in families}
        errors: dict[str, list[np.ndarray]] = {k: [] for k in families}
        boot_s, answer_s = [], []
        for r in range(rounds):
            release = _measure(method, X)
            _bootstrap(release)
            t = time.perf_counter()
            replicates = (
                ss.noise_replicates(release)
                if isinstance(release, ss.SyntheticRelease)
                else release.noise_replicates
            )
            boot_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            for k, batch in families.items():
                v, e = _answers(release, batch, replicates)
                values[k].append(v)
                errors[k].append(e)
            answer_s.append((time.perf_counter() - t) / len(families))
            print(f"  {method} round {r + 1}/{rounds}: bootstrap {boot_s[-1]:.2f} s", flush=True)
        cells = {}
        for k in families:
            V, S, T = np.stack(values[k]), np.stack(errors[k]), truth[k]
            spread = V.std(axis=0, ddof=1)
            rmse = np.sqrt(((V - T) ** 2).mean(axis=0))
            pooled = np.sum((S**2).mean(axis=0) / T**2) / np.sum(spread**2 / T**2)
            cells[k] = {
                "se_over_sd": float(np.sqrt(pooled)),
                "noise_share": float(np.median(spread / rmse)),
                "covers_truth": float(np.mean(np.abs(V - T) <= Z_95 * S)),
                "covers_mean": float(np.mean(np.abs(V - V.mean(axis=0)) <= Z_95 * S)),
            }
        out[method] = {
            "families": cells,
            "bootstrap_seconds": float(np.mean(boot_s)),
            "answer_seconds_per_family": float(np.mean(answer_s)),
        }
    return out


def _span(values: list[float], percent: bool = False) -> str:
    if percent:
        return f"{100 * min(values):.0f}-{100 * max(values):.0f} %"
    return f"{min(values):.2f}-{max(values):.2f}"


def _summary(result: dict[str, Any]) -> list[str]:
    """Ranges over the datasets, per method: ``se / sd`` and ``covers truth`` on the
    uniform-centre families and on the row-centred ones."""
    lines = ["Ranges over the datasets:", ""]
    for method in next(iter(result["datasets"].values()))["methods"]:
        cells: dict[str, dict[str, list[float]]] = {"uniform": {}, "rows": {}}
        for per_method in result["datasets"].values():
            for family, c in per_method["methods"][method]["families"].items():
                kind = "rows" if family.startswith("rows") else "uniform"
                broad = kind == "uniform" and float(family.split("=")[1]) >= 4
                for key, value in c.items():
                    cells[kind].setdefault(key, []).append(value)
                if broad:
                    cells["uniform"].setdefault("broad", []).append(c["covers_truth"])
        u, r = cells["uniform"], cells["rows"]
        lines.append(
            f"* {method}: `se / sd` {_span(u['se_over_sd'])} on the uniform-centre queries, "
            f"{_span(r['se_over_sd'])} on the row-centred ones; `value +- 1.96 se` held the "
            f"truth for {_span(u['broad'], True)} of the uniform-centre queries at sigma >= 4 "
            f"({_span(u['covers_truth'], True)} with sigma = 2) and "
            f"{_span(r['covers_truth'], True)} of the row-centred ones; around the mean "
            f"release (the noise alone) {_span(u['covers_mean'] + r['covers_mean'], True)}."
        )
    return lines


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Standard errors of smooth_synthetic answers (parametric bootstrap of the noise)",
        "",
        "Produced by `python -m bench.answer_stderr` (protocol and columns in its docstring). "
        f"{s['rounds']} releases of each method per dataset, {s['queries']} queries per family, "
        f"{s['replicates']} bootstrap replicates per release. `tree`: the default "
        "`smooth_synthetic` at epsilon = 1, delta = 1e-9; `marginals`: the default at pure "
        "epsilon = 1; `moments`: paper 000's method with the library defaults at epsilon = "
        "1, delta = 1e-9. A cell reads `se / sd` | `noise share` | `covers truth` | "
        "`covers mean`.",
    ]
    lines += ["", *_summary(result)]
    for name, per_method in result["datasets"].items():
        lines += ["", f"## {name} (n = {per_method['n']}, d = {per_method['d']})", ""]
        families = list(next(iter(per_method["methods"].values()))["families"])
        lines.append("| release | " + " | ".join(families) + " | s (bootstrap, per family) |")
        lines.append("| --- " * (len(families) + 2) + "|")
        for method, row in per_method["methods"].items():
            cells = [
                f"{c['se_over_sd']:.2f} \\| {c['noise_share']:.2f} \\| {c['covers_truth']:.2f} "
                f"\\| {c['covers_mean']:.2f}"
                for c in row["families"].values()
            ]
            seconds = f"{row['bootstrap_seconds']:.2f}, {row['answer_seconds_per_family']:.2f}"
            lines.append(f"| {method} | " + " | ".join(cells) + f" | {seconds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="WDBC,CTG,PKS,CRM")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--methods", default=",".join(SHORT), help="of " + ", ".join(SHORT))
    parser.add_argument("--name", default="answer_stderr", help="results file stem")
    args = parser.parse_args(argv)
    methods = tuple(SHORT[m] for m in args.methods.split(","))
    command = "python -m bench.answer_stderr " + " ".join(sys.argv[1:] if argv is None else argv)
    run = Run(args.name, command.strip())
    data = load_datasets(args.datasets.split(","), DATA_DIR)
    result: dict[str, Any] = {
        "settings": {
            "rounds": args.rounds,
            "queries": args.queries,
            "replicates": bootstrap.REPLICATES,
        },
        "datasets": {},
    }
    for name, X in data.items():
        print(f"{name}: n = {X.shape[0]}, d = {X.shape[1]}", flush=True)
        result["datasets"][name] = {
            "n": int(X.shape[0]),
            "d": int(X.shape[1]),
            "methods": run_dataset(X, args.rounds, args.queries, methods),
        }
    run.write(render(result), result)


if __name__ == "__main__":
    main()
