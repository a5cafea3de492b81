"""Paper 002: PCA projector error of the compressed release against m.

Run: ``python -m bench.compressed_pca`` (about six minutes on 2 cores; most of it is
drawing ``m x n`` secure normals).

Data: the six numeric columns of UCI Adult (``adult.csv``, n = 32561, p = 6), normalised
to [-1, 1] with bounds taken from the public file. ``A = X^T X / n`` after the column
normalisation of eq. (4) (uncentred, as in the paper). For each m, five releases with
``Delta_max = sqrt(ln p / n)`` (the rate of Theorem 3.5) and the data as reference;
the error is ``||P^k(A) - P^k(A + B)||_F`` for the top-k projectors. Beside it: the
oracle right-hand side of Proposition 3.4, ``||B||_F / delta_k(A)`` (computed with the
true A, shown where its condition ``||B||_F <= delta_k / 2`` holds), the public bound
that :meth:`CompressedRelease.pca` can state from the release alone, and the alpha of
Theorem 4.6.
"""

from __future__ import annotations

import csv
import math
from typing import Any

import numpy as np

from app.mechanisms import compressed as cp
from bench._common import DATASETS, Run, loglog_slope

COLUMNS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
M_VALUES = [None, 500, 1000, 2000, 4000, 8000, 16000]  # None: the Lemma 4.4 minimum
RUNS = 5
KS = [1, 2]


def load() -> np.ndarray:
    with open(DATASETS / "adult.csv", newline="") as handle:
        X = np.array([[float(r[c]) for c in COLUMNS] for r in csv.DictReader(handle)])
    lo, hi = X.min(axis=0), X.max(axis=0)
    return 2.0 * (X - lo) / (hi - lo) - 1.0


def top_projector(matrix: np.ndarray, k: int) -> np.ndarray:
    values, vectors = np.linalg.eigh(matrix)
    top = vectors[:, np.argsort(values)[::-1][:k]]
    return top @ top.T


def largest_finite_delta(n: int, p: int, m: int, lmin: float, lmax: float) -> float:
    """Largest Delta_max for which Theorem 4.6's bound is finite (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.isfinite(cp.alpha_bound(n, p, m, mid, lmin, lmax)):
            lo = mid
        else:
            hi = mid
    return lo


def main() -> None:
    run = Run("compressed_pca", "python -m bench.compressed_pca")
    X = load()
    n, p = X.shape
    scaled = X * np.sqrt(n / np.sum(X**2, axis=0))
    A = scaled.T @ scaled / n
    eigenvalues = np.sort(np.linalg.eigvalsh(A))[::-1]
    delta_max = math.sqrt(math.log(p) / n)
    rows: list[dict[str, Any]] = []
    for m_value in M_VALUES:
        m = cp.min_rows(n, p) if m_value is None else m_value
        errors = {k: [] for k in KS}  # type: dict[int, list[float]]
        oracle = {k: [] for k in KS}  # type: dict[int, list[float]]
        public = {k: [] for k in KS}  # type: dict[int, list[float | None]]
        b_norms = []
        violations = 0
        for _ in range(RUNS):
            released = cp.release(X, m=m, delta_max=delta_max)
            B = released.covariance - A
            b_norms.append(float(np.linalg.norm(B)))
            for k in KS:
                result = released.pca(k)
                errors[k].append(float(np.linalg.norm(top_projector(A, k) - result.projector)))
                gap = (eigenvalues[k - 1] - eigenvalues[k]) / 2
                oracle[k].append(b_norms[-1] / gap if b_norms[-1] <= gap / 2 else math.nan)
                violations += bool(errors[k][-1] > oracle[k][-1])  # False when n/a (nan)
                public[k].append(result.projector_error_bound)
        rows.append(
            {
                "m": m,
                # Theorem 4.6 with the data as reference, from the data's own eigenvalues: the
                # release no longer computes it (f6cff34: there it would be a statistic of
                # the data), so released.alpha is None and this bench crashed on it.
                "alpha": cp.alpha_bound(
                    n, p, m, delta_max, float(eigenvalues[-1]), float(eigenvalues[0])
                ),
                "b_frobenius": float(np.mean(b_norms)),
                "prop_3_4_violations": violations,
                **{f"error_k{k}": float(np.mean(errors[k])) for k in KS},
                **{f"oracle_bound_k{k}": float(np.mean(oracle[k])) for k in KS},
                **{
                    f"public_bound_k{k}": (
                        None if any(b is None for b in public[k]) else max(public[k])
                    )
                    for k in KS
                },
            }
        )
    m_min = cp.min_rows(n, p)
    finite = largest_finite_delta(n, p, m_min, float(eigenvalues[-1]), float(eigenvalues[0]))
    alpha_small = cp.alpha_bound(
        n, p, m_min, finite / 2, float(eigenvalues[-1]), float(eigenvalues[0])
    )
    slopes = {k: loglog_slope([r["m"] for r in rows], [r[f"error_k{k}"] for r in rows]) for k in KS}
    slope_b = loglog_slope([r["m"] for r in rows], [r["b_frobenius"] for r in rows])

    total_violations = sum(r["prop_3_4_violations"] for r in rows)
    applicable = sum(
        math.isfinite(r[f"oracle_bound_k{k}"]) for r in rows for k in KS
    )  # (m, k) cells where the oracle condition held on average

    applies_at = [r["m"] for r in rows if any(r[f"public_bound_k{k}"] is not None for k in KS)]
    public_note = (
        f"it applies from m = {min(applies_at)} on."
        if applies_at
        else "it needs m of the order of n or more on this data, so it is n/a at every m."
    )
    finite_alpha = [r["alpha"] for r in rows if math.isfinite(r["alpha"])]
    alpha_note = (
        f"finite at {len(finite_alpha)} of {len(rows)} values of m"
        if finite_alpha
        else "infinite at every m (no guarantee on this data at this Delta_max)"
    )

    def fmt(value: float | None) -> str:
        if value is not None and math.isinf(value):
            return "inf"
        return "n/a" if value is None or not math.isfinite(value) else f"{value:.3g}"

    lines = [
        "# Paper 002: PCA from the compressed release, projector error against m",
        "",
        f"UCI Adult, numeric columns ({', '.join(COLUMNS)}), n = {n}, p = {p}, normalised to "
        f"[-1, 1] and then by eq. (4). Eigenvalues of A = X^T X / n: "
        f"{', '.join(f'{v:.3g}' for v in eigenvalues)}. Delta_max = sqrt(ln p / n) = "
        f"{delta_max:.3g}; data as reference; {RUNS} releases per m (means shown).",
        "",
        "Paper 002 has no experiments; Theorem 5.1 predicts ||B||_F = O(p sqrt(ln(2np)/m)), "
        "so the projector error should fall like m^(-1/2) once Proposition 3.4 applies.",
        "",
        "| m | ||B||_F | error k=1 | error k=2 | Prop. 3.4 oracle k=1 | Prop. 3.4 oracle k=2 "
        "| public bound k=1 | public bound k=2 | alpha (Thm 4.6) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['m']} | {r['b_frobenius']:.3g} | {r['error_k1']:.3g} | {r['error_k2']:.3g} | "
            f"{fmt(r['oracle_bound_k1'])} | {fmt(r['oracle_bound_k2'])} | "
            f"{fmt(r['public_bound_k1'])} | {fmt(r['public_bound_k2'])} | {fmt(r['alpha'])} |"
        )
    lines += [
        "",
        f"Log-log slope of the projector error against m: k=1 **{slopes[1]:.2f}**, "
        f"k=2 **{slopes[2]:.2f}**; of ||B||_F: **{slope_b:.2f}** (theory: -0.5).",
        "",
        "The oracle column checks Proposition 3.4 with the true A (n/a where ||B||_F > "
        f"delta_k/2 in some run); over all runs where it applied, the error exceeded it "
        f"{total_violations} times ({applicable} (m, k) cells with the condition in every run). "
        "The public bound is what the release can state about itself (Weyl on the released "
        "eigengap, ||B||_F <= p tau from eq. 12): " + public_note,
        "",
        f"alpha is {alpha_note}: Theorem 4.6's bound needs lambda_min(Sigma) > "
        f"p Delta_max and ||Sigma||_2 ||Gamma||_F <= 1/2; with lambda_min = "
        f"{eigenvalues[-1]:.3g} it is finite only for Delta_max <= {finite:.3g} "
        f"(= {finite * n:.3g} / n), and at half that, alpha(m = {m_min}) = "
        f"{alpha_small:.3g}.",
    ]
    run.write(
        "\n".join(lines),
        {
            "n": n,
            "p": p,
            "delta_max": delta_max,
            "eigenvalues": eigenvalues.tolist(),
            "rows": rows,
            "slopes": slopes,
            "slope_b_frobenius": slope_b,
            "largest_finite_delta_max": finite,
            "alpha_at_half_that": alpha_small,
        },
    )


if __name__ == "__main__":
    main()
