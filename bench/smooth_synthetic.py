"""Paper 000 §4 benchmark of ``smooth_synthetic`` (issue 3).

Run from the repository root:

    python -m bench.smooth_synthetic            # full run, writes bench/results/
    python -m bench.smooth_synthetic --quick    # smoke run (WDBC, 1 round, 1000 queries)

Protocol (paper 000 §4): datasets WDBC (scikit-learn), CTG, PKS, CRM (``/work/shared/
datasets``, or ``--data-dir``), each column min/max-normalised to ``[-1, 1]`` (benchmark
only: the service normalises with declared bounds). 10,000 queries ``f(x) = sum_{j=1}^{10}
a_j exp(-||x - c_j||^2 / (2 sigma^2))``, ``a_j ~ U[0, 1]``, ``c_j ~ U[-1, 1]^d``, a fixed
query seed, ``sigma`` in {2, 4, 6, 8, 10}; worst-case absolute and relative error over the
queries, averaged over rounds; ``epsilon = 1`` and ``(epsilon = 1, delta = 1e-10)``; grids
hypercube and pca_ellipsoid; ``C = 10^4`` and ``5 10^4``. Each ``sigma`` is a separate
experiment (its own measurement, as in the paper, where ``R`` depends on ``K = sigma^2``).

Configurations:
* ``paper``: the paper as written, practical variant -- ``R`` by appendix A.5 with
  ``K = sigma^2`` (``basis_rule="paper"``), vertex LP, pure Laplace for eps-DP and the
  §3.2 Laplace (correctly calibrated, ``noise_mechanism="laplace_approx"``) for
  ``(eps, delta)``.
* ``default``: the library defaults -- ``R = max(d, R_paper)``, Laplace (eps-DP) or
  Gaussian (``(eps, delta)``), vertex LP, ``smoothness = sigma^2``.
* ``default+ipm`` (side table): the default with the interior-point LP solution.

The 0-DP baseline is the exact expectation under the uniform distribution on
``[-1, 1]^d`` (erf factorisation): a release that ignores the data.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.mechanisms import smooth_synthetic
from app.mechanisms.errors import SolverError
from app.mechanisms.queries import GaussianMixtureBatch

SIGMAS = (2, 4, 6, 8, 10)
QUERY_SEED = 20180918
DATA_DIR = Path("/work/shared/datasets")
RESULTS = Path(__file__).resolve().parent / "results"

#: Paper 000 worst-case relative errors (sigma = 2..10) and times (s), C = 10^4.
PAPER: dict[str, dict[str, dict[str, Any]]] = {
    "table3_eps_ellipsoid": {
        "CRM": {
            "rel": [1.084, 0.256, 0.083, 0.037, 0.027],
            "abs": [0.001, 0.035, 0.033, 0.022, 0.020],
            "seconds": 1.1,
        },
        "CTG": {
            "rel": [0.209, 0.063, 0.033, 0.015, 0.006],
            "abs": [0.046, 0.041, 0.027, 0.014, 0.005],
            "seconds": 1.1,
        },
        "PKS": {
            "rel": [0.059, 0.013, 0.002, 0.008, 0.004],
            "abs": [0.006, 0.007, 0.001, 0.007, 0.004],
            "seconds": 0.9,
        },
        "WDBC": {
            "rel": [0.329, 0.110, 0.053, 0.013, 0.014],
            "abs": [0.037, 0.059, 0.039, 0.011, 0.012],
            "seconds": 1.0,
        },
    },
    "table4_epsdelta_ellipsoid": {
        "CRM": {"rel": [0.631, 0.126, 0.083, 0.034, 0.028], "seconds": 7.5},
        "CTG": {"rel": [0.192, 0.045, 0.028, 0.016, 0.008], "seconds": 1.1},
        "PKS": {"rel": [0.109, 0.003, 0.003, 0.001, 0.007], "seconds": 1.4},
        "WDBC": {"rel": [0.388, 0.061, 0.026, 0.021, 0.013], "seconds": 1.2},
    },
    "table5_eps_hypercube": {
        "CRM": {"rel": [1.721, 0.226, 0.101, 0.051, 0.046], "seconds": 7.2},
        "CTG": {"rel": [0.796, 0.139, 0.066, 0.033, 0.019], "seconds": 1.8},
        "PKS": {"rel": [0.655, 0.154, 0.068, 0.032, 0.019], "seconds": 3.4},
        "WDBC": {
            "rel": [0.309, 0.137, 0.037, 0.022, 0.017],
            "abs": [0.040, 0.062, 0.029, 0.019, 0.015],
            "seconds": 2.7,
        },
    },
    "table6_epsdelta_hypercube": {
        "CRM": {"rel": [1.773, 0.258, 0.093, 0.054, 0.039], "seconds": 14.5},
        "CTG": {"rel": [0.884, 0.140, 0.055, 0.028, 0.021], "seconds": 2.6},
        "PKS": {"rel": [0.924, 0.165, 0.065, 0.032, 0.025], "seconds": 3.2},
        "WDBC": {"rel": [0.340, 0.099, 0.057, 0.026, 0.021], "seconds": 3.3},
    },
}


def paper_table(delta: float, grid: str) -> str:
    eps_only = delta == 0.0
    if grid == "pca_ellipsoid":
        return "table3_eps_ellipsoid" if eps_only else "table4_epsdelta_ellipsoid"
    return "table5_eps_hypercube" if eps_only else "table6_epsdelta_hypercube"


# --- data ----------------------------------------------------------------------------------


def _read_csv(path: Path, drop: set[str]) -> np.ndarray:
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        keep = [i for i, name in enumerate(header) if name not in drop]
        rows = [[float(row[i]) for i in keep] for row in reader]
    return np.asarray(rows, dtype=np.float64)


def normalise(X: np.ndarray) -> np.ndarray:
    """Per-column min/max to [-1, 1] (benchmark only; constant columns -> 0)."""
    lo, hi = X.min(axis=0), X.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    out = np.where(hi > lo, 2.0 * (X - lo) / span - 1.0, 0.0)
    return np.clip(out, -1.0, 1.0)


def load_datasets(names: list[str], data_dir: Path) -> dict[str, np.ndarray]:
    out = {}
    for name in names:
        if name == "WDBC":
            from sklearn.datasets import load_breast_cancer

            raw = load_breast_cancer().data
        elif name == "CTG":
            raw = _read_csv(data_dir / "ctg.csv", {"CLASS", "NSP"})
        elif name == "PKS":
            raw = _read_csv(data_dir / "pks.csv", {"subject#"})
        elif name == "CRM":
            raw = _read_csv(data_dir / "crm.csv", set())
        else:
            raise SystemExit(f"unknown dataset {name!r}")
        out[name] = normalise(raw)
    return out


# --- configurations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    variant: str  # "paper" | "default" | "default+ipm"
    delta: float
    grid: str
    C: int

    @property
    def key(self) -> str:
        privacy = "eps" if self.delta == 0.0 else "eps,delta"
        return f"{self.variant}|{privacy}|{self.grid}|C={self.C}"

    def measure_kwargs(self, sigma: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"smoothness": sigma * sigma, "grid": self.grid}
        if self.variant == "paper":
            kwargs["basis_rule"] = "paper"
            if self.delta > 0:
                kwargs["noise_mechanism"] = "laplace_approx"
        return kwargs

    @property
    def solver(self) -> str:
        return "ipm" if self.variant.endswith("+ipm") else "simplex"


def configs(sizes: tuple[int, ...], with_ipm: bool) -> list[Config]:
    out = [
        Config(variant, delta, grid, C)
        for variant in ("paper", "default")
        for delta in (0.0, 1e-10)
        for grid in ("hypercube", "pca_ellipsoid")
        for C in sizes
    ]
    if with_ipm:
        out += [
            Config("default+ipm", delta, grid, sizes[0])
            for delta in (0.0, 1e-10)
            for grid in ("hypercube", "pca_ellipsoid")
        ]
    return out


# --- running -------------------------------------------------------------------------------


def run_one(
    X: np.ndarray,
    config: Config,
    sigma: int,
    queries: GaussianMixtureBatch,
    truth: np.ndarray,
    seed: int,
) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    measurements = smooth_synthetic.measure(
        X, 1.0, config.delta, rng=rng, **config.measure_kwargs(sigma)
    )
    t1 = time.perf_counter()
    release = smooth_synthetic.synthesize_from(
        measurements, rng, grid_size=config.C, solver=config.solver
    )
    t2 = time.perf_counter()
    answers = queries.answers(release.points, release.weights)
    err = np.abs(answers - truth)
    return {
        "abs": float(err.max()),
        "rel": float(np.max(err / truth)),
        "measure_s": t1 - t0,
        "synth_s": t2 - t1,
        "lp_s": float(release.solver["seconds"]),
        "R": float(release.parameters["R"]),
        "support": float(release.points.shape[0]),
        "objective": float(release.solver["objective"]),
        "crossover_fallback": float(release.solver["fallback"] == "crossover"),
        "epsilon": measurements.privacy_cost.epsilon,
        "delta": measurements.privacy_cost.delta,
        "pca_above_noise": float(release.parameters.get("pca_eigenvalues_above_noise") or 0),
    }


def machine() -> dict[str, Any]:
    def sh(cmd: str) -> str:
        try:
            return subprocess.run(
                cmd, shell=True, capture_output=True, text=True, check=False
            ).stdout.strip()
        except OSError:
            return ""

    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": sh("nproc"),
        "memory": sh("free -g | awk '/Mem:/ {print $2 \" GiB\"}'"),
        "cpu": model,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: WDBC, 1 round, 1000 queries"
    )
    parser.add_argument("--rounds", type=int, default=20, help="rounds for C = 10^4 (default 20)")
    parser.add_argument(
        "--rounds-large", type=int, default=5, help="rounds for C = 5*10^4 (default 5)"
    )
    parser.add_argument("--rounds-ipm", type=int, default=3, help="rounds of the IPM side table")
    parser.add_argument(
        "--ipm-datasets",
        default="WDBC,CTG,PKS",
        help="datasets with the IPM side table (its 10^4-point supports are slow to evaluate)",
    )
    parser.add_argument("--datasets", default="WDBC,CTG,PKS,CRM")
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="save each finished dataset under OUT/partial/ and reuse those already there",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.datasets, args.rounds, args.rounds_large, args.rounds_ipm, args.queries = (
            "WDBC",
            1,
            1,
            1,
            1000,
        )
    result = run(
        datasets=args.datasets.split(","),
        rounds=args.rounds,
        rounds_large=args.rounds_large,
        rounds_ipm=args.rounds_ipm,
        n_queries=args.queries,
        data_dir=args.data_dir,
        sizes=(10_000,) if args.quick else (10_000, 50_000),
        ipm=args.ipm_datasets.split(","),
        log=print,
        partial_dir=args.out / "partial" if args.resume else None,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "smooth_synthetic_quick" if args.quick else "smooth_synthetic"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(render_markdown(result))
    print(f"wrote {args.out / stem}.json and .md")


def run(
    *,
    datasets: list[str],
    rounds: int,
    rounds_large: int,
    rounds_ipm: int,
    n_queries: int,
    data_dir: Path,
    sizes: tuple[int, ...],
    ipm: list[str],
    log: Any = print,
    data: dict[str, np.ndarray] | None = None,
    partial_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the protocol; ``data`` replaces the named datasets (used by the smoke test)."""
    started = time.time()
    result: dict[str, Any] = {
        "machine": machine(),
        "load_before": os.getloadavg(),
        "settings": {
            "sigmas": list(SIGMAS),
            "queries": n_queries,
            "centres_per_query": 10,
            "query_seed": QUERY_SEED,
            "epsilon": 1.0,
            "deltas": [0.0, 1e-10],
            "rounds": {"C=10000": rounds, "C=50000": rounds_large, "ipm": rounds_ipm},
            "ipm_datasets": ipm,
            "normalisation": "per-column min/max to [-1, 1] (benchmark only)",
        },
        "paper": PAPER,
        "datasets": {},
    }
    if data is None:
        data = load_datasets(datasets, data_dir)
    for name, X in data.items():
        n, d = X.shape
        partial = None if partial_dir is None else partial_dir / f"{name}.json"
        if partial is not None and partial.exists():
            log(f"{name}: loaded from {partial}")
            result["datasets"][name] = json.loads(partial.read_text())
            continue
        log(f"{name}: n={n} d={d} load={os.getloadavg()[0]:.2f}")
        entry: dict[str, Any] = {"n": n, "d": d, "baseline": {}, "configs": {}}
        batches = {}
        truth = {}
        for sigma in SIGMAS:
            queries = GaussianMixtureBatch.random(
                n_queries, 10, d, float(sigma), np.random.default_rng(QUERY_SEED)
            )
            batches[sigma] = queries
            truth[sigma] = queries.answers(X)
            base = np.abs(queries.uniform_expectations() - truth[sigma])
            entry["baseline"][str(sigma)] = {
                "abs": float(base.max()),
                "rel": float(np.max(base / truth[sigma])),
            }
        for config in configs(sizes, name in ipm):
            n_rounds = (
                rounds_ipm
                if config.solver == "ipm"
                else (rounds if config.C == 10_000 else rounds_large)
            )
            per_sigma = {}
            for sigma in SIGMAS:
                runs, failures = [], []
                for r in range(n_rounds):
                    try:
                        runs.append(
                            run_one(
                                X, config, sigma, batches[sigma], truth[sigma], 1000 * r + sigma
                            )
                        )
                    except SolverError as error:  # recorded, never hidden
                        failures.append(str(error))
                if not runs:
                    raise SolverError(f"{name} {config.key} sigma={sigma}: every round failed")
                summary = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}
                summary["rel_std"] = float(np.std([r["rel"] for r in runs]))
                summary["ratio"] = summary["rel"] / entry["baseline"][str(sigma)]["rel"]
                summary["rounds"] = len(runs)
                summary["failures"] = failures  # type: ignore[assignment]
                per_sigma[str(sigma)] = summary
            entry["configs"][config.key] = per_sigma
            ratios = " ".join(f"{per_sigma[str(s)]['ratio']:.2f}" for s in SIGMAS)
            synth = max(per_sigma[str(s)]["synth_s"] for s in SIGMAS)
            log(f"  {config.key:42s} x baseline {ratios}  synth {synth:.2f}s")
        result["datasets"][name] = entry
        if partial is not None:
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(entry))
    result["load_after"] = os.getloadavg()
    result["wall_seconds"] = time.time() - started
    return result


# --- report --------------------------------------------------------------------------------

NOTES = [
    "Errors: worst case over the queries of |q(D) - q(S)| (Abs) and |q(D) - q(S)| / q(D) "
    "(Rel), averaged over rounds; `(x0.41)` is Rel as a multiple of the 0-DP baseline's Rel. "
    "q(S) is the answer of the weighted support (the expectation of the sampled database).",
    "0-DP baseline: the exact expectation under the uniform distribution on [-1, 1]^d, a "
    "release that ignores the data.",
    "`paper`: R by appendix A.5 with K = sigma^2, vertex LP; pure Laplace (eps) or the §3.2 "
    "Laplace, calibrated correctly through zCDP (eps, delta). `default`: the library "
    "defaults, R = max(d, R_paper), pure Laplace (eps) or Gaussian (eps, delta), vertex LP. "
    "`default+ipm`: the same with the interior-point LP solution.",
    "Ellipsoid grid: Algorithm 2 with k = d, L = 1 on 20% of the budget (Gaussian noise when "
    "delta > 0, Laplace otherwise); centre = the noisy first-degree moments, or a charged 5% "
    "step when R < d. `PCA>noise`: how many private eigenvalues exceed the noise level "
    "(mean over sigma and rounds).",
    "`synth s`: synthesis after measurement (candidates, W, LP, sampling m rows), the largest "
    "mean over sigma; `LP s`: the LP alone; `measure s`: the measure step.",
    "Data: per-column min/max normalisation to [-1, 1] in the benchmark only (the service "
    "uses declared bounds). CTG: 21 columns (CLASS and NSP dropped; the paper says 20); PKS: "
    "21 (subject# dropped; paper 20); CRM: 1994 x 100 (paper 1993); WDBC: 569 x 30.",
    "Paper rows: Tables 3-6 of paper 000 (C = 10^4, 20 rounds, CPLEX on 2 Xeon X5650); the "
    "paper does not report R, k, L or its budget split. Its Abs errors are about 5x below "
    "ours and below the baseline's at equal Rel, which fits queries with sum_j a_j = 1 (the "
    "condition of its Proposition 2.1) rather than the a_j ~ U[0, 1] of §4 that we use; Rel "
    "does not depend on that scale, so compare Rel.",
]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    s = result["settings"]
    sigmas = s["sigmas"]
    rounds = s["rounds"]
    load_before = ", ".join(f"{v:.2f}" for v in result["load_before"])
    load_after = ", ".join(f"{v:.2f}" for v in result["load_after"])
    lines = [
        "# smooth_synthetic benchmark (paper 000 §4 protocol)",
        "",
        "Produced by `python -m bench.smooth_synthetic` (protocol in its docstring).",
        "",
        f"- Machine: {m['cpu']}, {m['nproc']} cores, {m['memory']} RAM; "
        f"Python {m['python']}, numpy {m['numpy']}.",
        f"- Load average (1/5/15 min) before the run: {load_before}; after: {load_after}. The "
        "machine is shared with other engineers' jobs; times are those of a loaded machine.",
        f"- Whole run: {result['wall_seconds'] / 60:.1f} min. {s['queries']} queries x "
        f"{s['centres_per_query']} centres, query seed {s['query_seed']}, epsilon = 1, delta in "
        f"{{0, 1e-10}}. Rounds: {rounds['C=10000']} for C = 10^4, {rounds['C=50000']} for "
        f"C = 5*10^4, {rounds['ipm']} for the IPM rows (on {', '.join(s['ipm_datasets'])} only); "
        "fewer for the slow configurations, to fit the shared 2-core machine.",
        *[f"- {note}" for note in NOTES],
        "",
    ]
    lines += _summary(result)
    for name, entry in result["datasets"].items():
        base = entry["baseline"]
        lines += [f"## {name} (n = {entry['n']}, d = {entry['d']})", ""]
        head = ["configuration", *[f"sigma={sg}" for sg in sigmas]]
        head += ["R", "support", "PCA>noise", "synth s", "LP s", "measure s"]
        lines += [_row(head), _row(["---"] * len(head))]
        lines.append(
            _row(
                ["0-DP uniform baseline", *[f"{base[str(sg)]['rel']:.3f}" for sg in sigmas]]
                + ["-"] * 6
            )
        )
        abs_lines = [
            _row(["configuration", *[f"sigma={sg}" for sg in sigmas]]),
            _row(["---"] * (len(sigmas) + 1)),
            _row(["0-DP uniform baseline", *[f"{base[str(sg)]['abs']:.3f}" for sg in sigmas]]),
        ]
        for key, per_sigma in entry["configs"].items():
            variant, privacy, grid, size = key.split("|")
            delta = 0.0 if privacy == "eps" else 1e-10
            table_name = paper_table(delta, grid)
            table = result["paper"][table_name].get(name)
            if variant == "paper" and size == "C=10000" and table is not None:
                ratios = [table["rel"][i] / base[str(sg)]["rel"] for i, sg in enumerate(sigmas)]
                label = f"**paper 000 {table_name.split('_')[0]}** ({privacy}, {grid})"
                cells = [f"{v:.3f} (x{r:.2f})" for v, r in zip(table["rel"], ratios, strict=True)]
                lines.append(_row([label, *cells, "?", "?", "?", f"{table['seconds']}", "?", "?"]))
                if "abs" in table:
                    abs_lines.append(_row([label, *[f"{v:.3f}" for v in table["abs"]]]))
            stats = [per_sigma[str(sg)] for sg in sigmas]
            Rs = "/".join(str(v) for v in sorted({int(st["R"]) for st in stats}))
            support = f"{np.mean([st['support'] for st in stats]):.0f}"
            pca = (
                "-"
                if grid != "pca_ellipsoid"
                else f"{np.mean([st['pca_above_noise'] for st in stats]):.1f}"
            )
            n_rounds = max(st["rounds"] for st in stats)
            label = f"{variant} ({privacy}, {grid}, {size.replace('C=', 'C = ')}; {n_rounds} rounds"
            failed = sum(len(st.get("failures", [])) for st in stats)
            crossed = sum(st.get("crossover_fallback", 0.0) * st["rounds"] for st in stats)
            if failed:
                label += f"; {failed} runs failed in the LP"
            if crossed:
                label += f"; {crossed:.0f} IPM runs fell back to crossover"
            label += ")"
            cells = [f"{st['rel']:.3f} (x{st['ratio']:.2f})" for st in stats]
            timing = [
                f"{max(st['synth_s'] for st in stats):.2f}",
                f"{max(st['lp_s'] for st in stats):.2f}",
                f"{max(st['measure_s'] for st in stats):.2f}",
            ]
            lines.append(_row([label, *cells, Rs, support, pca, *timing]))
            abs_lines.append(_row([label, *[f"{st['abs']:.3f}" for st in stats]]))
        lines += ["", f"Worst-case absolute error ({name}):", "", *abs_lines, ""]
    return "\n".join(lines) + "\n"


def _summary(result: dict[str, Any]) -> list[str]:
    """Default configuration vs the 0-DP baseline on every dataset and sigma."""
    sigmas = result["settings"]["sigmas"]
    lines = [
        "## Library defaults vs the 0-DP baseline (Rel as a multiple of the baseline's Rel)",
        "",
        _row(
            ["dataset", "privacy", *[f"sigma={sg}" for sg in sigmas], "worst", "synth s (C = 10^4)"]
        ),
        _row(["---"] * (len(sigmas) + 4)),
    ]
    for name, entry in result["datasets"].items():
        for privacy in ("eps", "eps,delta"):
            key = f"default|{privacy}|hypercube|C=10000"
            if key not in entry["configs"]:
                continue
            stats = [entry["configs"][key][str(sg)] for sg in sigmas]
            worst = max(st["ratio"] for st in stats)
            synth = max(st["synth_s"] for st in stats)
            cells = [f"x{st['ratio']:.2f}" for st in stats]
            lines.append(_row([name, privacy, *cells, f"x{worst:.2f}", f"{synth:.2f}"]))
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
