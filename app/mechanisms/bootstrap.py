"""Parametric bootstrap of the DP noise: standard errors for answers of a fitted law.

A release of :mod:`~app.mechanisms.marginals` or :mod:`~app.mechanisms.marginal_tree`
answers a query with the exact expectation under a law fitted to noisy measurements by
a chain of nonlinear steps (thresholds, simplex projections, rakes, a copula fit), so the
noise's effect on an answer has no closed form. The noise *law* is public, though (each
measurement's distribution and scale are in the record), so the parametric bootstrap
(Efron and Tibshirani 1993, ch. 6; for DP releases Ferrando, Wang and Sheldon 2022,
"Parametric Bootstrap for Differentially Private Confidence Intervals") estimates it:

1. take the released law ``M`` as the truth;
2. for ``b = 1..B``, simulate the measurements ``M`` would have given, ``y*_b = E_M[y] +
   z_b`` with ``z_b`` drawn from the measurement's own noise law, and refit the law
   ``M*_b`` from ``y*_b`` by the release's own post-processing;
3. the standard error of the answer ``q(M)`` is the sample standard deviation of
   ``q(M*_1), ..., q(M*_B)``.

This reads nothing but the release and public scales, so it is post-processing and spends
no budget. The draws ``z_b`` are a simulation of a public law, never released as privacy
noise (that comes from OpenDP only: :mod:`~app.mechanisms.noise`), so they come from a
numpy ``Generator``, seeded by :func:`seed_of` from the released values themselves: the
same release gives the same standard errors in every process.

What the standard error is *not*: the error of the model. A law that keeps one-column
marginals (and a tree of pairs) misses dependence the data has, and that bias is not
noise: ``bench/results/answer_stderr.md`` measures both.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.typing import NDArray

from app.mechanisms.errors import MechanismError

#: Replicates per release: the standard error's own relative error is about
#: ``1 / sqrt(2 (B - 1))``, 16 % at ``B = 20``; each replicate refits the law (0.01-0.3 s
#: for a tree on the benchmark datasets, ``bench/results/answer_stderr.md``).
REPLICATES = 20


def seed_of(*arrays: NDArray[np.float64]) -> int:
    """A 64-bit seed from released values (SHA-256 of their bytes): the bootstrap of a
    release is the same wherever it runs, and depends on nothing else."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array, dtype=np.float64).tobytes())
    return int.from_bytes(digest.digest()[:8], "little")


def simulated_noise(
    distribution: str, scale: float, shape: tuple[int, ...], rng: np.random.Generator
) -> NDArray[np.float64]:
    """Draws of a measurement's public noise law (``"laplace"`` with scale ``b`` or
    ``"gaussian"`` with standard deviation ``scale``) for the bootstrap's simulated
    measurements; never released."""
    if distribution == "laplace":
        return rng.laplace(0.0, scale, shape)
    if distribution == "gaussian":
        return rng.normal(0.0, scale, shape)
    raise MechanismError(f"no simulation of a {distribution!r} noise law")


def standard_errors(replicate_answers: NDArray[np.float64]) -> NDArray[np.float64]:
    """``(Q,)`` sample standard deviations (``ddof = 1``) of ``(B, Q)`` replicate answers.

    Computed on the answers divided by their largest magnitude per query: the squared
    deviations of answers past ~1e154 (a query of weight 1e300) overflowed to an infinite
    standard error, and the answer was refused, though its spread is a finite number."""
    answers = np.asarray(replicate_answers, dtype=np.float64)
    if answers.ndim != 2 or answers.shape[0] < 2:
        raise MechanismError("a bootstrap standard error needs at least two replicates")
    scale = np.max(np.abs(answers), axis=0)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    out: NDArray[np.float64] = (answers / scale).std(axis=0, ddof=1) * scale
    return out
