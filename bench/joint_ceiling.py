"""Issue 7: how far joint models could go without noise (ceilings, not releases).

Run from the repository root:

    python -m bench.joint_ceiling [--datasets WDBC,CTG,PKS] [--points 100000]

Why: the default ``smooth_synthetic`` release is a tree of two-way tables
(:mod:`app.mechanisms.marginal_tree`); on CTG's row-centred ``sigma = 1`` queries the issue's
target (0.5x the better of MST and AIM) is 0.12x the 0-DP baseline, and even the tree built
from the *exact* tables reads 0.17-0.24x there. This benchmark asks which family of joint
models could reach the target at all if every parameter were known exactly. Nothing here
is private: each model is fitted to the exact data, and the table shows the error the
family cannot go below however the budget is spent.

Models, first the Gaussian copulas (each with the exact one-column laws, sampled): ``m`` points,
each column's value the empirical quantile ``x_(ceil(n u))`` of ``u = Phi(g_i)``, with
``g ~ N(0, R)``, ``R`` a correlation matrix of the normal scores
``z_ti = Phi^{-1}((rank_ti + 1/2) / n)`` (Sklar's theorem; DPCopula, Li, Xiong and Jiang
2014, is the private version of the full model):

* ``independent``: ``R = I`` (the exact marginals only);
* ``tree``: a Gaussian Markov tree, the maximum spanning tree of ``-log(1 - r_ij^2)``
  (Chow and Liu 1968: the tree of largest mutual information for Gaussians) with the
  exact correlation on each edge and ``R_ij = prod r_e`` along the path (what a tree of
  pairs can carry, read as Gaussian dependence);
* ``k factors``: the best rank-``k`` approximation of ``R`` (its top ``k`` eigenpairs)
  with the diagonal reset to 1 (``k = 1, 2, 3``), the dependence a few latent factors
  carry;
* ``full``: ``R`` itself, every pairwise correlation exact;

then latent classes, a dependence that is not pairwise:

* ``K clusters`` (``K = 4, 8, 16``): the mixture of products
  ``p(x) = sum_k pi_k prod_i p_ki(x_i)`` over the ``K`` clusters of k-means on the rows
  (:func:`cluster_sample`; ``pi_k`` a cluster's share of the rows, ``p_ki`` the exact law
  of column ``i`` inside it): columns are independent given the cluster, so what they
  share is carried by one discrete latent variable (a latent class model). Its
  parameters are ``K d`` one-column laws; a private version would measure them as ``d``
  tables of cluster by column, each row in one cell of each, so with the sensitivity of
  the one-way histograms (``sqrt(2 d) / n``) whatever ``K`` is, but ``K`` times less mass
  in a cell.

Protocol: the queries of ``bench/smooth_marginals.py`` (paper 000 §4 uniform centres at
sigma in {2, 4, 6, 8, 10}; centres at real rows plus N(0, 0.1^2) jitter at sigma in {1, 2}),
1000 per family; worst-case relative error as a multiple of the 0-DP uniform baseline.
One sample of ``m`` points per model (its sampling error is in the cells: the
``independent`` row beside ``bench/smooth_marginals.py``'s shuffled columns shows its size).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.cluster.vq import kmeans2
from scipy.special import ndtr, ndtri

from app.mechanisms import marginal_tree
from bench._common import Run
from bench.smooth_marginals import FAMILY_KEYS, _ratios, _scored_families
from bench.smooth_synthetic import DATA_DIR, load_datasets

FACTORS = (1, 2, 3)
CLUSTERS = (4, 8, 16)
#: Seed of k-means (:func:`cluster_sample`): the clusters are one fixed function of the data.
KMEANS_SEED = 5
#: A correlation matrix is made positive definite by this ridge before its Cholesky factor.
RIDGE = 1e-9


def normal_scores(X: NDArray[np.float64]) -> NDArray[np.float64]:
    """``z_ti = Phi^{-1}((rank_ti + 1/2) / n)``, ties broken by row order."""
    n = X.shape[0]
    ranks = np.argsort(np.argsort(X, axis=0, kind="stable"), axis=0)
    scores: NDArray[np.float64] = ndtri((ranks + 0.5) / n)
    return scores


def tree_correlation(R: NDArray[np.float64]) -> NDArray[np.float64]:
    """The Gaussian Markov tree of largest mutual information (Chow-Liu: the maximum
    spanning tree of ``-log(1 - r^2)``, :func:`marginal_tree.spanning_tree` with
    ``argmax``), as a correlation matrix: ``R_ij`` the product of the edge correlations
    along the path from ``i`` to ``j``."""
    d = R.shape[0]
    pairs = [(i, j) for i in range(d) for j in range(i + 1, d)]
    info = np.array([-np.log1p(-min(R[i, j] ** 2, 1.0 - 1e-12)) for i, j in pairs])
    edges = marginal_tree.spanning_tree(pairs, info, d, lambda v: int(np.argmax(v)))
    neighbours: list[list[int]] = [[] for _ in range(d)]
    for i, j in edges:
        neighbours[i].append(j)
        neighbours[j].append(i)
    out = np.eye(d)
    for root in range(d):  # walk the tree from each column, multiplying along the way
        stack, seen = [root], {root}
        while stack:
            k = stack.pop()
            for m in set(neighbours[k]) - seen:
                out[root, m] = out[root, k] * R[k, m]
                seen.add(m)
                stack.append(m)
    return out


def factor_correlation(R: NDArray[np.float64], k: int) -> NDArray[np.float64]:
    """The top-``k`` eigenpairs of ``R`` with the diagonal reset to 1 (positive
    semidefinite: a rank-``k`` PSD matrix plus a nonnegative diagonal)."""
    values, vectors = np.linalg.eigh(R)
    top = vectors[:, -k:] * np.sqrt(np.maximum(values[-k:], 0.0))
    out: NDArray[np.float64] = top @ top.T
    np.fill_diagonal(out, 1.0)
    return out


def copula_sample(
    X: NDArray[np.float64], R: NDArray[np.float64], m: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``m`` points of the Gaussian copula ``R`` with ``X``'s exact marginals."""
    n, d = X.shape
    chol = np.linalg.cholesky(R + RIDGE * np.eye(d))
    u = ndtr(rng.standard_normal((m, d)) @ chol.T)
    index = np.minimum((u * n).astype(np.int64), n - 1)
    sample: NDArray[np.float64] = np.take_along_axis(np.sort(X, axis=0), index, axis=0)
    return sample


def cluster_sample(
    X: NDArray[np.float64], clusters: int, m: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``m`` points of the mixture of products over ``X``'s k-means clusters (module doc):
    a point's cluster ``k`` drawn with probability ``n_k / n``, then each of its columns
    independently a value of that column among the cluster's rows, uniformly."""
    n, d = X.shape
    _, label = kmeans2(X, clusters, minit="++", rng=np.random.default_rng(KMEANS_SEED))
    sizes = np.bincount(label, minlength=clusters)
    cluster = rng.choice(clusters, size=m, p=sizes / n)
    sample = np.empty((m, d))
    for k in np.nonzero(sizes)[0]:
        members, chosen = X[label == k], cluster == k
        picks = rng.integers(0, len(members), size=(int(chosen.sum()), d))
        sample[chosen] = members[picks, np.arange(d)]
    return sample


def models(R: NDArray[np.float64]) -> dict[str, NDArray[np.float64]]:
    """The correlation matrices of the module doc, in table order."""
    out = {"independent": np.eye(R.shape[0]), "tree": tree_correlation(R)}
    out |= {f"{k} factor{'s' if k > 1 else ''}": factor_correlation(R, k) for k in FACTORS}
    out["full"] = R
    return out


def run(
    data: dict[str, np.ndarray], points: int, n_queries: int, log: Any = print
) -> dict[str, Any]:
    result: dict[str, Any] = {"datasets": {}}
    for name, X in data.items():
        batches, truth, base = _scored_families(X, n_queries)
        R = np.corrcoef(normal_scores(X), rowvar=False)
        eigenvalues = np.linalg.eigvalsh(R)[::-1]
        rows = {}
        samples = {label: partial(copula_sample, X, corr) for label, corr in models(R).items()}
        samples |= {f"{k} clusters": partial(cluster_sample, X, k) for k in CLUSTERS}
        for label, draw in samples.items():
            got = _ratios(batches, truth, base, draw(points, np.random.default_rng(11)), None)
            rows[label] = {k: got[k] for k in FAMILY_KEYS}
            log(f"{name} {label:12s} " + " ".join(f"{rows[label][k]:.3f}" for k in FAMILY_KEYS))
        result["datasets"][name] = {
            "n": X.shape[0],
            "d": X.shape[1],
            "baseline": {k: base[k] for k in FAMILY_KEYS},
            "top_eigenvalues": [float(v) for v in eigenvalues[:5]],
            "rows": rows,
        }
    return result


def render_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Issue 7: ceilings of joint models without noise (not private)",
        "",
        "Produced by `python -m bench.joint_ceiling` (models and protocol in its docstring). "
        "Each row is a Gaussian copula with the exact one-column laws and a correlation "
        "matrix of the exact normal scores, or a mixture of products over k-means clusters "
        "with the exact one-column laws inside each cluster, sampled at "
        f"{s['points']} points; cells: worst-case relative error over {s['queries']} queries "
        "per family as a multiple of the 0-DP uniform baseline. Nothing is private here: "
        "each row is the floor of its model family, whatever a mechanism spends.",
        "",
    ]
    for name, entry in result["datasets"].items():
        eig = ", ".join(f"{v:.1f}" for v in entry["top_eigenvalues"])
        lines += [
            f"## {name} (n = {entry['n']}, d = {entry['d']}; top eigenvalues of the "
            f"normal-score correlation: {eig})",
            "",
        ]
        head = ["joint model", *FAMILY_KEYS]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for label, row in entry["rows"].items():
            lines.append(f"| {label} | " + " | ".join(f"x{row[k]:.3f}" for k in FAMILY_KEYS) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="WDBC,CTG,PKS")
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    args = parser.parse_args(argv)
    command = "python -m bench.joint_ceiling " + " ".join(sys.argv[1:] if argv is None else argv)
    bench = Run("joint_ceiling", command)
    result = run(load_datasets(args.datasets.split(","), DATA_DIR), args.points, args.queries)
    result["settings"] = {"points": args.points, "queries": args.queries}
    bench.write(render_markdown(result), result)


if __name__ == "__main__":
    main()
