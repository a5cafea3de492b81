"""Private principal directions for the ellipsoid grid: paper 000, Algorithm 2 (PSI).

Private subspace iteration (after Hardt 2013), on ``A = (1/n) D^T D - mu mu^T`` (the
covariance of the rows, ``mu`` their mean)::

    X^(0) = GS(G^(0)),  G^(0) ~ N(0, 1)^{d x k}            (public randomness, rng)
    for l = 1..L:
        W^(l) = A X^(l-1) + G^(l)                          (G^(l): OpenDP noise, d x k)
        X^(l) = GS(W^(l))

``GS`` is Gram-Schmidt (a reduced QR with ``R_ii >= 0``). Corrections to the paper:

* Step 4 writes ``G^(l) ~ N(0, sigma^2)^{n x k}``; ``A X`` is ``d x k``, so is the noise
  (errata; Theorem 3.6 has ``d x k``).
* Corollary 3.5 estimates eigenvalues by ``sqrt(x_s^T A^2 x_s)``, which reads ``A`` again
  *without noise* and is not private. Here the eigenpairs are post-processing of the last
  noisy iterate only: a Rayleigh-Ritz step on ``M = X^(L-1)^T W^(L) = X^T A X + X^T G``
  (``k x k``): ``(M + M^T)/2 = V diag(lambda_hat) V^T``, axes ``X^(L-1) V``. Each
  ``lambda_hat`` is the noisy Rayleigh quotient of an orthonormal direction, clipped to
  ``[0, d]`` (no direction of data in ``[-1, 1]^d`` has variance above ``d``).
* The paper scales the noise by ``||X^(l-1)||_inf`` and takes its constants (``5d``,
  ``50 d^{3/2} k``) from a spectral-norm bound. Here the noise is calibrated to the
  sensitivity of the released matrix ``A X`` for any orthonormal ``X``, derived below,
  and the budget of the ``L`` adaptive releases is composed through OpenDP.

Sensitivity of ``A X`` under replace-one neighbours (rows in ``[-1, 1]^d``)
-------------------------------------------------------------------------
Let the other ``n - 1`` rows have mean ``m`` and let the changed row go ``z -> z'``.
Expanding ``A = (1/n) sum_i x_i x_i^T - mu mu^T`` with ``mu = ((n - 1) m + z) / n``
gives exactly

    A(D') - A(D) = ((n - 1) / n^2) (b b^T - a a^T),   a = z - m,  b = z' - m.

Per coordinate, ``(a_i, b_i)`` lies in the hexagon ``|a_i|, |b_i| <= 2, |a_i - b_i| <= 2``,
on which ``a_i b_i >= a_i^2 + b_i^2 - 4`` (the difference is concave, and is >= 0 at the
six vertices). Summing, ``a.b >= |a|^2 + |b|^2 - 4d``. With ``|a|^2, |b|^2 <= 4d``:

    ||b b^T - a a^T||_F^2 = |a|^4 + |b|^4 - 2 (a.b)^2 <= 16 d^2

(if ``|a|^2 + |b|^2 <= 4d`` the left side is at most ``(|a|^2 + |b|^2)^2``; otherwise use
the bound on ``a.b``). Hence ``||A(D) - A(D')||_F <= 4d (n - 1) / n^2``, attained when
``n - 1`` rows sit at one corner and ``z`` at the opposite one moves onto them. For
``X`` with orthonormal columns ``||Delta A X||_F <= ||Delta A||_F ||X||_2``, so

* L2 sensitivity of ``A X`` (``d k`` entries): ``4 d (n - 1) / n^2`` (Gaussian version);
* L1 sensitivity: ``<= sqrt(d k)`` times that, ``4 d^{3/2} sqrt(k) (n - 1) / n^2``
  (Laplace version).

:func:`covariance_sensitivity` declares these plus a bound on the floating-point rounding
of ``A`` and of ``A X`` (:func:`app.mechanisms.noise.float_sensitivity`; relative
``2e-10`` at ``n = 10^4``, ``d = k = 30``, formula there), and the ``X`` of each release is
made ``||X||_2 <= 1`` provably (:func:`within_unit_norm`). The tests brute-force both
bounds on random, corner and near-corner neighbour pairs.

Privacy: ``G^(0)`` is data-independent; each ``W^(l)`` is a Gaussian (zCDP) or Laplace
(pure) release of ``A X^(l-1)`` with ``X^(l-1)`` a function of earlier releases only, so
the ``L`` releases compose adaptively: ``L`` times the per-release zCDP (then converted to
``(epsilon, delta)``), or ``L`` times the per-release epsilon. :func:`noise.calibrate`
with ``compositions = L`` gets the scale from OpenDP's maps. Everything after (QR,
Rayleigh-Ritz, the ellipsoid) is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms import noise
from app.mechanisms.data import RowSource, StreamSum, as_source, iter_checked
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import PrivacyCost

PCA_NOISE = ("gaussian", "laplace")


#: Rows per matrix product in :func:`covariance` (BLAS sums them in an unknown order).
CHUNK_ROWS = 64


def sum_depth(n: int) -> int:
    """Roundings any term of :func:`covariance`'s sums goes through, at most: a chunk's
    BLAS product or column sum of ``<= CHUNK_ROWS`` rows (any order, products included:
    ``CHUNK_ROWS``), then a :class:`~app.mechanisms.data.StreamSum` over ``K <= n`` chunks
    (``bit_length(n)``)."""
    return CHUNK_ROWS + int(n).bit_length()


def covariance_rounding(n: int, d: int, k: int) -> float:
    """Bound ``E`` on ``||fl(A^ X) - A X||_F`` for ``||X||_2 <= 1``: ``d eps + gamma_d d
    (1 + eps) sqrt(k)`` with ``eps = gamma_{3h+6}``, ``h =`` :func:`sum_depth` ``(n)``.

    Entry by entry (``|x_i x_j|, |mu_i| <= 1``, ``|A_ij| <= 1``): the sums err by
    ``gamma_h n``, so ``fl(second / n)`` and ``mu`` by ``gamma_{h+1}``, ``fl(mu_i mu_j)`` by
    ``gamma_{2h+3}``, their difference by ``gamma_{3h+5}`` and the symmetrised ``A^`` by
    ``eps = gamma_{3h+6}``: ``||A^ - A||_F <= d eps``, hence ``||(A^ - A) X||_F <= d eps``.
    The product ``A^ X`` (``d`` terms an entry, any order) errs by ``gamma_d |A^| |X|``,
    whose Frobenius norm is at most ``gamma_d ||A^||_F ||X||_F <= gamma_d d (1 + eps)
    sqrt(k)`` (``||A||_F <= trace A <= d``).
    """
    h = sum_depth(n)
    eps = noise.gamma(3 * h + 6)
    return d * eps + noise.gamma(d) * d * (1.0 + eps) * math.sqrt(k)


def covariance_sensitivity(n: int, d: int, k: int) -> dict[str, float]:
    """Declared L2 and L1 sensitivity of ``A X`` for ``||X||_2 <= 1`` (``d x k``): exact
    ``4 d (n - 1) / n^2`` and ``sqrt(d k)`` times that (module docstring) through
    :func:`app.mechanisms.noise.float_sensitivity` with :func:`covariance_rounding` (and
    ``sqrt(d k)`` times it in L1).

    Relative allowance ``~ n (3h + 6 + d sqrt(k)) u / 2`` (``h =`` :func:`sum_depth`): at
    ``d = k = 30`` about ``1.2e-11`` at ``n = 569``, ``2.2e-10`` at ``10^4`` and ``2.3e-8``
    at ``10^6``, below ``10^-6`` up to ``n ~ 4 10^7``; at ``d = k = 100`` ``7e-8`` at
    ``10^6``, below ``10^-6`` up to ``n ~ 1.4 10^7``.
    """
    if n < 1 or d < 1 or k < 1:
        raise MechanismError(f"n ({n}), d ({d}) and k ({k}) must be positive")
    exact = 4.0 * d * (n - 1) / n**2  # 0 at n = 1: A is then 0 up to its rounding
    rounding = covariance_rounding(n, d, k)
    root = math.sqrt(d * k)
    return {
        "l2": noise.float_sensitivity(exact, rounding),
        "l1": noise.float_sensitivity(root * exact, root * rounding),
    }


def mean_sensitivity(n: int, d: int) -> dict[str, float]:
    """Declared L1 and L2 sensitivity of the ``mu`` of :func:`covariance`: exact ``2d/n``
    and ``2 sqrt(d)/n`` (rows in ``[-1, 1]^d``) through
    :func:`app.mechanisms.noise.float_sensitivity`, each ``mu_i`` within ``gamma_{h+1}``
    (``h =`` :func:`sum_depth`) of the exact mean: relative allowance ``n gamma_{h+1}``,
    ``4.7e-12`` at ``n = 569``, ``8.8e-11`` at ``10^4``, ``9.4e-9`` at ``10^6``."""
    if n < 1 or d < 1:
        raise MechanismError(f"n ({n}) and d ({d}) must be positive")
    e = noise.gamma(sum_depth(n) + 1)
    return {
        "l1": noise.float_sensitivity(2.0 * d / n, d * e),
        "l2": noise.float_sensitivity(2.0 * math.sqrt(d) / n, math.sqrt(d) * e),
    }


def covariance(X: ArrayLike | RowSource) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact ``(A, mu)`` in one streamed pass: ``A = (1/n) sum x x^T - mu mu^T``. Not private.

    Sums ``x x^T`` and ``x`` over chunks of :data:`CHUNK_ROWS` rows and the chunks with a
    :class:`~app.mechanisms.data.StreamSum`, so their rounding is bounded whatever the
    batches (:func:`sum_depth`, :func:`covariance_rounding`).
    """
    source = as_source(X)
    second, first = StreamSum(), StreamSum()
    for batch in iter_checked(source):
        for start in range(0, batch.shape[0], CHUNK_ROWS):
            chunk = batch[start : start + CHUNK_ROWS]
            second.add(chunk.T @ chunk)
            first.add(chunk.sum(axis=0))
    mu: NDArray[np.float64] = first.total() / source.n_rows
    A = second.total() / source.n_rows - np.outer(mu, mu)
    return (A + A.T) / 2.0, mu


def within_unit_norm(X: NDArray[np.float64]) -> NDArray[np.float64]:
    """``X`` itself when ``||X||_2 <= 1`` is certain, else ``X`` divided by a provable
    upper bound of its norm (a hair above it), so the result has ``||.||_2 <= 1``.

    :func:`gram_schmidt`'s columns are orthonormal only up to rounding (``||X||_2 = 1 +
    O(d k u)``), and the sensitivity of ``A X`` needs ``||X||_2 <= 1``. Bound:
    ``||X||_2^2 <= max_i sum_j |G_ij|`` (``G = X^T X``), and the computed ``G^`` is within
    ``gamma_d c_i c_j`` of ``G`` (``c_i^2 = G_ii <= G^_ii / (1 - gamma_d)``); the factor
    ``1 + 2 gamma_{k+8}`` covers the roundings of this bound. Dividing by ``c >=
    sqrt(bound) (1 + sqrt(k) u)`` (the factor ``1 + 2 (isqrt(k) + 3) u`` survives the two
    roundings of ``c``) keeps the rounded quotient in the unit ball: ``fl(X / c) = X / c +
    (X / c) o E`` with ``||(X / c) o E||_2 <= u ||X / c||_F <= sqrt(k) u ||X / c||_2``.
    For a QR factor the bound exceeds 1 by ``O((d + 2) k u)``, so ``X`` is in practice
    always scaled, by ``1 - O(10^-14)``.
    """
    d, k = X.shape
    G = X.T @ X
    g_d = noise.gamma(d)
    c2 = float(np.max(np.diag(G))) / (1.0 - g_d)
    rows = float(np.max(np.abs(G).sum(axis=1)))
    bound = (rows + g_d * k * c2) * (1.0 + 2.0 * noise.gamma(k + 8))
    if bound <= 1.0:
        return X
    factor = 1.0 + 2.0 * (math.isqrt(k) + 3) * noise.UNIT_ROUNDOFF
    out: NDArray[np.float64] = X / (math.sqrt(bound) * factor)
    return out


def gram_schmidt(W: NDArray[np.float64]) -> NDArray[np.float64]:
    """Orthonormal columns spanning ``W`` (reduced QR with a non-negative diagonal)."""
    Q, R = np.linalg.qr(W, mode="reduced")
    signs = np.where(np.diag(R) < 0, -1.0, 1.0)
    out: NDArray[np.float64] = Q * signs
    return out


def rayleigh_ritz(
    X_prev: NDArray[np.float64], W: NDArray[np.float64], d: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Axes and eigenvalues from the last noisy iterate (post-processing, module docstring).

    Returns ``(axes (d, k), eigenvalues (k,))`` sorted by decreasing eigenvalue, the
    eigenvalues clipped to ``[0, d]`` and capped to sum at most ``d`` (the trace bound).
    """
    M = X_prev.T @ W
    values, vectors = np.linalg.eigh((M + M.T) / 2.0)
    order = np.argsort(values)[::-1]
    axes = gram_schmidt(X_prev @ vectors[:, order])
    eigenvalues = np.clip(values[order], 0.0, float(d))
    total = float(eigenvalues.sum())
    if total > d:  # trace(A) = sum_i Var(x_i) <= d for rows in [-1, 1]^d
        eigenvalues *= d / total
    return axes, eigenvalues


@dataclass(frozen=True, eq=False)
class PrivatePCA:
    """Output of Algorithm 2: the noisy iterates and their post-processed eigenpairs.

    ``start`` is ``X^(0)`` (public randomness), ``iterates`` the ``L`` noisy matrices
    ``W^(l)`` (``(L, d, k)``); ``axes`` / ``eigenvalues`` come from :func:`rayleigh_ritz`
    on the last one. ``calibration`` is ``None`` only for the non-private reference used
    in tests (exact eigenpairs).
    """

    start: NDArray[np.float64]
    iterates: NDArray[np.float64]
    axes: NDArray[np.float64]
    eigenvalues: NDArray[np.float64]
    calibration: noise.NoiseCalibration | None
    step: str = "pca_subspace"

    def __post_init__(self) -> None:
        for name in ("start", "iterates", "axes", "eigenvalues"):
            value = np.array(getattr(self, name), dtype=np.float64, copy=True)
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        d, k = self.axes.shape
        if self.start.shape != (d, k) or self.iterates.shape[1:] != (d, k):
            raise MechanismError("PCA iterates, start and axes must all be (d, k)")
        if self.eigenvalues.shape != (k,):
            raise MechanismError(f"PCA eigenvalues must have shape ({k},)")

    @property
    def rank(self) -> int:
        return int(self.axes.shape[1])

    @property
    def iterations(self) -> int:
        return int(self.iterates.shape[0])

    @property
    def noise_norm(self) -> float:
        """Typical spectral norm of the noise in the ``k x k`` Rayleigh-Ritz matrix.

        ``X^T G`` has i.i.d. entries of standard deviation ``s`` (the noise's, by rotation
        invariance); its symmetric part has spectral norm about ``s sqrt(2k)``. Eigenvalue
        estimates below this are indistinguishable from noise. 0 for the exact reference.
        """
        if self.calibration is None:
            return 0.0
        return self.calibration.stddev * math.sqrt(2.0 * self.rank)

    @property
    def privacy_cost(self) -> PrivacyCost:
        if self.calibration is None:
            return PrivacyCost(epsilon=0.0, kind="non_private")
        return PrivacyCost.compose([self.calibration.cost_part(self.step)])

    def to_dict(self) -> dict[str, Any]:
        if self.calibration is None:
            raise MechanismError("a non-private PCA reference cannot be serialised")
        return {
            "step": self.step,
            "start": self.start.tolist(),
            "iterates": self.iterates.tolist(),
            "calibration": self.calibration.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivatePCA:
        """Rebuild from the noisy iterates; axes and eigenvalues are recomputed from them."""
        start = np.asarray(data["start"], dtype=np.float64)
        iterates = np.asarray(data["iterates"], dtype=np.float64)
        previous = start if iterates.shape[0] == 1 else gram_schmidt(iterates[-2])
        axes, eigenvalues = rayleigh_ritz(previous, iterates[-1], start.shape[0])
        return cls(
            start=start,
            iterates=iterates,
            axes=axes,
            eigenvalues=eigenvalues,
            calibration=noise.NoiseCalibration.from_dict(data["calibration"]),
            step=str(data["step"]),
        )


def private_subspace_iteration(
    X: ArrayLike | RowSource,
    *,
    rank: int,
    iterations: int,
    epsilon: float,
    delta: float,
    mechanism: str,
    rng: np.random.Generator,
    step: str = "pca_subspace",
    calibration: noise.NoiseCalibration | None = None,
) -> PrivatePCA:
    """Algorithm 2 of paper 000 with the corrections of the module docstring.

    ``mechanism`` is ``"gaussian"`` (``(epsilon, delta)``, zCDP over the ``L`` releases)
    or ``"laplace"`` (pure ``epsilon``, basic composition). One pass over the data builds
    ``A``; the ``L`` iterations then need no further pass. ``calibration``: the
    :func:`subspace_calibration` of these arguments, when the caller fixed it before
    reading any data (it is checked against them); otherwise it is computed here, also
    before the data are read.
    """
    source = as_source(X)
    n, d = source.n_rows, source.n_cols
    if calibration is None:
        calibration = subspace_calibration(
            n,
            d,
            rank=rank,
            iterations=iterations,
            epsilon=epsilon,
            delta=delta,
            mechanism=mechanism,
        )
    else:
        _check_pca_args(d, rank, iterations, mechanism)
        metric = "l2" if mechanism == "gaussian" else "l1"
        if (
            calibration.mechanism != mechanism
            or calibration.dimension != d * rank
            or calibration.compositions != iterations
            or calibration.sensitivity != covariance_sensitivity(n, d, rank)[metric]
            or calibration.target_epsilon != epsilon
            or calibration.target_delta != delta
        ):
            raise MechanismError("the PCA's noise calibration is not the one of its arguments")
    A, _ = covariance(source)
    start = gram_schmidt(rng.standard_normal((d, rank)))
    X_prev = start
    iterates = np.empty((iterations, d, rank), dtype=np.float64)
    for ell in range(iterations):
        if ell > 0:
            X_prev = gram_schmidt(iterates[ell - 1])
        iterates[ell] = noise.sample(calibration, A @ within_unit_norm(X_prev)).reshape(d, rank)
    axes, eigenvalues = rayleigh_ritz(X_prev, iterates[-1], d)
    return PrivatePCA(start, iterates, axes, eigenvalues, calibration, step)


def subspace_calibration(
    n: int,
    d: int,
    *,
    rank: int,
    iterations: int,
    epsilon: float,
    delta: float,
    mechanism: str,
) -> noise.NoiseCalibration:
    """The noise of :func:`private_subspace_iteration` on ``n`` rows of ``d`` columns: ``L =
    iterations`` releases of the ``d x rank`` product ``A X`` (public values only)."""
    _check_pca_args(d, rank, iterations, mechanism)
    sensitivity = covariance_sensitivity(n, d, rank)
    return noise.calibrate(
        mechanism,
        sensitivity=sensitivity["l2" if mechanism == "gaussian" else "l1"],
        epsilon=epsilon,
        delta=delta,
        dimension=d * rank,
        compositions=iterations,
    )


def exact_pca(X: ArrayLike | RowSource, rank: int) -> tuple[PrivatePCA, NDArray[np.float64]]:
    """Non-private reference (tests and the zero-noise path): exact top-``rank`` eigenpairs.

    Returns the record (``calibration=None``, privacy kind ``"non_private"``) and the
    exact mean.
    """
    A, mu = covariance(X)
    d = A.shape[0]
    _check_pca_args(d, rank, 1, "gaussian")
    values, vectors = np.linalg.eigh(A)
    order = np.argsort(values)[::-1][:rank]
    axes = vectors[:, order]
    eigenvalues = np.clip(values[order], 0.0, float(d))
    record = PrivatePCA(axes, (A @ axes)[None], axes, eigenvalues, None)
    return record, mu


def _check_pca_args(d: int, rank: int, iterations: int, mechanism: str) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= d:
        raise MechanismError(f"pca_rank ({rank!r}) must be an integer in [1, d = {d}]")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
        raise MechanismError(f"pca_iterations ({iterations!r}) must be a positive integer")
    if mechanism not in PCA_NOISE:
        raise MechanismError(f"pca_noise ({mechanism!r}) must be one of {PCA_NOISE}")
