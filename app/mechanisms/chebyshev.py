"""Coefficients of a query in the tensor Chebyshev basis (paper 001, Algorithm 2 and §4).

Paper 001 answers a query ``q_f(D) = (1/n) sum_x f(x)`` from the noisy moments by
expanding ``g_f(theta) = f(cos theta_1, ..., cos theta_d)`` in the even trigonometric
polynomials ``cos(r_1 theta_1) ... cos(r_d theta_d)``. With ``x_i = cos theta_i`` these
are the tensor Chebyshev polynomials ``T_r(x) = prod_i T_{r_i}(x_i)`` of
:mod:`app.mechanisms.basis`, so the cosine series of ``g_f`` *is* the Chebyshev series

    f(x) = c_0 + sum_{r != 0} c_r T_r(x)        (c_0 = coefficient of T_0 = 1).

For an index set ``S`` (the released basis) this module returns ``c_0``, the vector
``(c_r)_{r in S}`` in the order of ``S`` and a **truncation bound** ``tau`` with

    sup_{x in [-1, 1]^d} |f(x) - c_0 - sum_{r in S} c_r T_r(x)|  <=  tau.        (*)

Since every moment satisfies ``|b_r| <= 1`` (``|T_r| <= 1`` on the cube), ``tau`` also
bounds ``|q_f(D) - c_0 - sum_{r in S} c_r b_r(D)|`` for every dataset ``D``: the error
that remains when the synopsis has no noise. Coefficients outside ``S`` are never dropped
silently; their mass is in ``tau``.

Separable queries (exact in any dimension)
------------------------------------------
A separable query is a weighted sum of products of 1-D functions,
``f(x) = sum_j w_j prod_i g_ji(x_i)`` (:class:`TensorExpansion`): Gaussian kernels and
their mixtures (isotropic :class:`~app.mechanisms.queries.GaussianMixture`, its batch,
and :class:`~app.mechanisms.queries.AnisotropicGaussianMixture` with one ``sigma`` per
column), products of 1-D functions (:class:`~app.mechanisms.queries.ProductQuery`) and
polynomials (:class:`~app.mechanisms.queries.Polynomial`). Each 1-D factor ``g`` gets
its Chebyshev coefficients ``a_k``, and the tensor coefficient of ``r`` is the product
``c_r = sum_j w_j prod_i a_{ji, r_i}``, evaluated only for the ``R`` indices of ``S`` and
only over each index's nonzero entries (a ``t^d`` tensor is never formed).

1-D coefficients come from function values at the ``N`` Chebyshev points of the first
kind ``x_k = cos(pi (k + 1/2) / N)`` through a type-II DCT (``scipy.fft.dct``):
``a_k = DCT(f)_k / N`` and ``a_0 = DCT(f)_0 / (2N)``. Sampling at ``N`` points folds each
coefficient ``a_m``, ``m >= N``, onto exactly one ``k < N`` (aliasing), so the computed
vector differs from the true expansion by at most ``2 sum_{m >= N} |a_m|`` in l1 norm.

* Gaussian factor ``exp(-(x - c)^2 / (2 s^2))``: entire; on the Bernstein ellipse
  ``E_rho`` its modulus is at most ``M(rho) = exp(((rho - 1/rho) / 2)^2 / (2 s^2))`` for
  every real ``c``, so ``|a_m| <= 2 M(rho) rho^-m`` (Trefethen, *Approximation Theory and
  Approximation Practice*, Thm 8.1) and ``sum_{m >= N} |a_m| <= 2 M(rho) rho^-N /
  (1 - 1/rho)``, minimised over a grid of ``rho``. ``N`` is the smallest number of points
  that makes this bound negligible (< 1e-16): the coefficients are exact to rounding, with
  a proven tail.
* Gaussian product factors (:class:`~app.mechanisms.queries.Gaussian1D`, one width per
  factor): the bound above is decreasing in ``s`` (``M(rho)`` is, for every ``rho``), so
  ``N`` and the tail are computed for the *width class* ``s_k = 2^(k/8) <= s``,
  ``k = floor(8 log2 s)``, and hold for every width of the class. Factors with the same
  ``N`` are sampled and transformed together (one DCT for all of them); ``N`` is about
  ``10 / s`` for narrow widths (``s = 0.01``: ``N = 1032``), and widths that need more
  than :data:`MAX_POINTS_1D` points (``s`` below about ``1.6e-4``) are refused.
* Monomials ``x^p``: exact, ``x^p = 2^(1-p) sum_k binom(p, k) T_{p-2k}(x)`` (the ``T_0``
  term halved).
* 1-D Chebyshev coefficient vectors: taken as given (exact).
* 1-D callables: ``N = 16, 32, ...`` until the upper half of the coefficients is below
  ``1e-14`` of their l1 norm (or the rounding floor); the tail estimate is twice that
  upper-half sum. This is an *estimate*, not a proof (``rigorous = False``).

Truncation bound of a separable query: with ``n_ji = ||a_ji||_1`` and ``e_ji`` the 1-D
tail bound, the l1 norm of the full tensor of kernel ``j`` is at most
``prod_i (n_ji + e_ji)``; subtracting what is kept gives

    tau = sum_j |w_j| [prod_i (n_ji + e_ji) - sum_{r in S u {0}} prod_i |a_{ji, r_i}|] + slack,

by the triangle inequality over the ``J`` kernels (cancellation between kernels is not
credited). ``slack`` covers floating-point rounding (``(d + 2 log2 R + 8) eps`` times the
kernel l1 norms).

General callables (small ``d``)
-------------------------------
A function known only through ``f(X)`` is interpolated on the ``N^d`` tensor grid of
Chebyshev points (``scipy.fft.dctn``), ``N`` doubled until the last quarter of the
coefficients is negligible or ``N^d`` reaches ``max_points``. The interpolant can be
damped with the generalized Jackson kernel of paper 001 §4 (the operator ``I_{t,K}`` of
eq. (2) applied in every variable, Fact 4.2): in the cosine basis it multiplies the
coefficient of ``cos(n theta)`` by

    lambda_n = - sum_{l=1}^{K+1} (-1)^l binom(K+1, l) H^(l n),

where ``H^(m) = int H_{t,r}(s) cos(m s) ds`` are the normalised Fourier coefficients of
``H_{t,r} = J_{t',r}``, ``J_{t',r}(s) ~ (sin(t' s/2) / sin(s/2))^(2r)``, ``r = ceil((K+3)/2)``,
``t' = floor(t/r) + 1`` (eq. (1)). ``lambda_0 = 1`` and ``lambda_n = 0`` for ``n > t``; the
damped coefficients are bounded (Lemma 4.3) and ``||g - I_{t,K} g||_inf = O(t^-K)`` for
``K``-smooth ``g`` (Theorem 4.1). Here ``t`` is the largest single-column degree of ``S``.
With the paper's constants ``lambda_n`` is close to 1 only for ``n`` well below
``t / r`` (e.g. ``K = 4``, ``t = 10``: ``lambda_2 = 1.46``), so for moderate ``t`` the damped
coefficients approximate worse than the interpolant's own. ``damping="auto"`` (default)
computes both and keeps the one with the smaller bound; ``"jackson"`` / ``"none"`` force
one. (The interpolant's coefficients are bounded as well: ``|c_k| <= 2 max |f|``.)

Its bound is ``tau = ||c_hat - c_S||_1 + eps_interp``: the l1 norm of everything the
released coefficients differ from the interpolant in (outside ``S`` and the damping
inside ``S``; rigorous relative to the interpolant), plus the interpolation error
estimated as twice the largest ``|f - p_N|`` over ``n_check`` random points plus the
l1 norm of the last quarter of the coefficients. The accuracy check reports
``max |f - p_S|`` on those random points (it must not exceed ``tau``). Only
``eps_interp`` is an estimate (``rigorous = False``). Dimensions above
:data:`MAX_CALLABLE_DIM` are refused: interpolation costs ``N^d`` evaluations.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.fft import dct, dctn

from app.mechanisms.basis import IndexSet, chebyshev_table
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    Gaussian1D,
    GaussianMixture,
    GaussianMixtureBatch,
    Polynomial,
    ProductQuery,
    Query,
)

EPS = float(np.finfo(np.float64).eps)

#: Largest dimension in which a general callable is interpolated on a tensor grid.
MAX_CALLABLE_DIM = 3

#: Largest number of grid points ``N^d`` for interpolating a general callable.
MAX_INTERPOLATION_POINTS = 1 << 21

#: Largest number of points for one 1-D factor (callables and Gaussians).
MAX_POINTS_1D = 1 << 16

#: A Gaussian factor's proven coefficient tail is pushed below this (absolute; the factor
#: is at most 1 on the cube).
GAUSSIAN_TAIL_TOLERANCE = 1e-16

#: Width classes per octave for Gaussian product factors (module docstring).
GAUSSIAN_WIDTH_CLASSES = 8

#: Relative size below which a 1-D factor's constant coefficient is treated as exactly 0
#: (its mass moves into the truncation bound); keeps the product ratios finite.
STRUCTURAL_ZERO = 1e-20

#: float64 elements of one work block: kernels x basis functions in :func:`restrict`, and
#: the factors of one block of :func:`separable_layout` (8 MiB).
DEFAULT_BLOCK_ELEMENTS = 1 << 20

_ONE_D_TOLERANCE = 1e-14


# --- 1-D Chebyshev transforms ------------------------------------------------------------


def chebyshev_points(n_points: int) -> NDArray[np.float64]:
    """Chebyshev points of the first kind ``x_k = cos(pi (k + 1/2) / N)``, ``k = 0..N-1``."""
    if n_points < 1:
        raise MechanismError(f"number of Chebyshev points ({n_points}) must be positive")
    k = np.arange(n_points, dtype=np.float64)
    out: NDArray[np.float64] = np.cos(np.pi * (k + 0.5) / n_points)
    return out


def coefficients_from_values(values: ArrayLike, axis: int = -1) -> NDArray[np.float64]:
    """Chebyshev coefficients of the interpolant through values at :func:`chebyshev_points`.

    ``a_k = DCT-II(f)_k / N`` and ``a_0 = DCT-II(f)_0 / (2N)`` along ``axis``.
    """
    v = np.asarray(values, dtype=np.float64)
    n_points = v.shape[axis]
    out: NDArray[np.float64] = dct(v, type=2, axis=axis) / n_points
    first = [slice(None)] * out.ndim
    first[axis] = slice(0, 1)
    out[tuple(first)] *= 0.5
    return out


def monomial_coefficients(p: int) -> NDArray[np.float64]:
    """Exact Chebyshev coefficients of ``x^p``: ``2^(1-p) sum_k binom(p, k) T_{p-2k}``."""
    if p < 0:
        raise MechanismError(f"monomial exponent ({p}) must be non-negative")
    out = np.zeros(p + 1, dtype=np.float64)
    if p == 0:
        out[0] = 1.0
        return out
    for k in range(p // 2 + 1):
        degree = p - 2 * k
        weight = math.comb(p, k) * 2.0 ** (1 - p)
        out[degree] += weight / 2.0 if degree == 0 else weight
    return out


@functools.lru_cache(maxsize=64)
def _dct_matrix(n_points: int) -> NDArray[np.float64]:
    """``(N, N)`` matrix of :func:`coefficients_from_values` (one GEMM beats many short DCTs)."""
    matrix = coefficients_from_values(np.eye(n_points), axis=1)
    matrix.setflags(write=False)
    return matrix


@functools.lru_cache(maxsize=4096)
def gaussian_tail_bound(sigma: float, n_points: int) -> float:
    """Proven bound on ``sum_{m >= N} |a_m|`` for ``exp(-(x - c)^2 / (2 sigma^2))``, any real c.

    Bernstein-ellipse bound (module docstring): ``min_rho 2 M(rho) rho^-N / (1 - 1/rho)``
    with ``log M(rho) = ((rho - 1/rho) / 2)^2 / (2 sigma^2)``, minimised over a fixed grid
    of ``rho`` (any ``rho > 1`` gives a valid bound).
    """
    rho = np.geomspace(1.0 + 1e-6, 1e8, 4000)
    half = (rho - 1.0 / rho) / 2.0
    log_bound = (
        math.log(2.0)
        + half * half / (2.0 * sigma * sigma)
        - n_points * np.log(rho)
        - np.log1p(-1.0 / rho)
    )
    return float(math.exp(min(float(np.min(log_bound)), 700.0)))


@functools.lru_cache(maxsize=4096)
def gaussian_points(sigma: float, min_points: int = 8) -> int:
    """Fewest points ``N >= min_points`` whose proven aliasing + tail error is negligible."""
    n_points = _gaussian_points_within(sigma, min_points, MAX_POINTS_1D)
    if n_points is None:
        raise MechanismError(
            f"sigma ({sigma:.3g}) is too small to expand on [-1, 1]: a Gaussian factor "
            f"needs more than {MAX_POINTS_1D} Chebyshev points (the smallest sigma expanded "
            f"is {min_gaussian_sigma(MAX_POINTS_1D, min_points):.3g} on the normalised scale)"
        )
    return n_points


def _gaussian_points_within(sigma: float, min_points: int, max_points: int) -> int | None:
    """:func:`gaussian_points`' search, ``None`` past ``max_points``."""
    n_points = max(int(min_points), 8)
    while 2.0 * gaussian_tail_bound(sigma, n_points) > GAUSSIAN_TAIL_TOLERANCE:
        n_points = math.ceil(n_points * 1.25)
        if n_points > max_points:
            return None
    return n_points


@functools.lru_cache(maxsize=64)
def min_gaussian_sigma(max_points: int, min_points: int = 8) -> float:
    """The smallest width (to 3 significant digits, rounded up) whose Gaussian factor
    :func:`gaussian_points` expands within ``max_points`` Chebyshev points from
    ``min_points`` (its search steps by 1.25 from there, so the threshold moves a little
    with it): found by bisection on ``log sigma``, as the points needed only grow as
    ``sigma`` shrinks."""
    low, high = math.log(1e-12), math.log(2.0)  # refused, expanded (8 points at sigma = 2)
    for _ in range(24):  # to 2e-6 of log sigma: finer than the 3 digits reported
        middle = (low + high) / 2.0
        if _gaussian_points_within(math.exp(middle), min_points, max_points) is None:
            low = middle
        else:
            high = middle
    sigma = math.exp(high)
    step = 10.0 ** (math.floor(math.log10(sigma)) - 2)
    return math.ceil(sigma / step) * step


def gaussian_factors(
    centers: NDArray[np.float64], sigma: NDArray[np.float64], min_length: int = 1
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """1-D coefficients of ``exp(-(x - c)^2 / (2 sigma_i^2))`` for every centre coordinate.

    ``centers`` has shape ``(..., d)`` and ``sigma`` ``(d,)``. Returns ``(A, e)`` with ``A``
    of shape ``(..., d, N)`` and ``e`` of shape ``(d,)``: a proven bound on the l1 distance
    between ``A[..., i, :]`` and the true infinite coefficient sequence (aliasing plus
    omitted tail, ``2 sum_{m >= N} |a_m|``, plus rounding of the DCT).
    """
    n_points = max(gaussian_points(float(s), max(min_length, 8)) for s in np.unique(sigma))
    x = chebyshev_points(n_points)
    inv = 1.0 / (2.0 * sigma * sigma)
    diff = x - centers[..., None]
    values = np.exp(-(diff * diff) * inv[:, None])
    factors = _last_axis_coefficients(values)
    rounding = 4.0 * n_points * EPS  # |values| <= 1
    tails = np.array(
        [2.0 * gaussian_tail_bound(float(s), n_points) + rounding for s in sigma],
        dtype=np.float64,
    )
    return factors, tails


def _last_axis_coefficients(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`coefficients_from_values` along the last axis (a GEMM for short vectors)."""
    n_points = values.shape[-1]
    if n_points <= 128:
        out: NDArray[np.float64] = values @ _dct_matrix(n_points)
        return out
    return coefficients_from_values(values)


def gaussian_width_class(sigma: float) -> float:
    """The largest class width ``s_k = 2^(k / 8) <= sigma`` (``k = floor(8 log2 sigma)``)."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise MechanismError(f"sigma ({sigma!r}) must be positive and finite")
    k = math.floor(GAUSSIAN_WIDTH_CLASSES * math.log2(sigma))
    width = math.pow(2.0, k / GAUSSIAN_WIDTH_CLASSES)
    if width > sigma:  # log2 rounded up across a class boundary
        width = math.pow(2.0, (k - 1) / GAUSSIAN_WIDTH_CLASSES)
    return width


@functools.lru_cache(maxsize=4096)
def _gaussian_class_points(width: float, min_length: int) -> tuple[int, float]:
    n_points = gaussian_points(width, max(min_length, 8))
    return n_points, 2.0 * gaussian_tail_bound(width, n_points) + 4.0 * n_points * EPS


@functools.lru_cache(maxsize=4096)
def gaussian_factor_points(sigma: float, min_length: int = 1) -> tuple[int, float]:
    """``(N, e)`` for a Gaussian product factor of width ``sigma``.

    ``N = gaussian_points(s_k, max(min_length, 8))`` and
    ``e = 2 gaussian_tail_bound(s_k, N) + 4 N eps`` for the width class ``s_k <= sigma``
    (:func:`gaussian_width_class`): ``e`` bounds the l1 distance between the ``N``
    coefficients from :func:`gaussian_factor_table` and the true coefficient sequence
    (aliasing and omitted tail, which only shrink as the width grows, plus DCT rounding;
    every value is at most 1).
    """
    width = gaussian_width_class(sigma)
    try:
        return _gaussian_class_points(width, int(min_length))
    except MechanismError:
        raise MechanismError(
            f"a Gaussian factor with sigma {sigma:.3g} is too narrow to expand on [-1, 1]: "
            f"it needs more than {MAX_POINTS_1D} Chebyshev points"
        ) from None


def gaussian_factor_table(
    centers: ArrayLike, sigma: ArrayLike, n_points: int
) -> NDArray[np.float64]:
    """``(K, N)`` coefficients of ``exp(-(x - c_k)^2 / (2 sigma_k^2))`` from ``N`` points.

    One row per factor (``centers`` and ``sigma`` of shape ``(K,)``), all sampled at the
    same :func:`chebyshev_points` and transformed together. The error of each row is
    bounded by :func:`gaussian_factor_points` when ``N`` is at least the ``N`` it gives
    for that row's width.
    """
    c = np.asarray(centers, dtype=np.float64).reshape(-1)
    s = np.asarray(sigma, dtype=np.float64).reshape(-1)
    if c.shape != s.shape:
        raise MechanismError(f"centers {c.shape} and sigma {s.shape} must have the same shape")
    diff = chebyshev_points(n_points)[None, :] - c[:, None]
    values = np.exp(-(diff * diff) / (2.0 * s * s)[:, None])
    return _last_axis_coefficients(values)


def callable_factor(
    g: Callable[[NDArray[np.float64]], ArrayLike], min_length: int = 1, *, name: str = "factor"
) -> tuple[NDArray[np.float64], float]:
    """Adaptive 1-D coefficients of a vectorised callable and an *estimated* l1 tail.

    ``N = 16, 32, ...`` until ``sum_{k >= N/2} |a_k| <= max(1e-14 ||a||_1, 4 N eps max|f|)``;
    the returned tail is twice that upper-half sum plus the rounding floor.
    """
    n_points = 16
    while n_points < min_length:
        n_points *= 2
    while True:
        x = chebyshev_points(n_points)
        values = np.asarray(g(x.copy()), dtype=np.float64)
        if values.shape != (n_points,):
            raise MechanismError(
                f"{name} must return one value per point; got shape {values.shape} "
                f"for {n_points} points"
            )
        if not np.all(np.isfinite(values)):
            raise MechanismError(f"{name} returned non-finite values on [-1, 1]")
        coef = coefficients_from_values(values)
        upper = float(np.abs(coef[n_points // 2 :]).sum())
        floor = 4.0 * n_points * EPS * float(np.max(np.abs(values)))
        if upper <= max(_ONE_D_TOLERANCE * float(np.abs(coef).sum()), floor):
            return coef, 2.0 * upper + floor
        if n_points * 2 > MAX_POINTS_1D:
            raise MechanismError(
                f"{name} is not smooth enough for a Chebyshev expansion: its coefficients "
                f"do not decay below {_ONE_D_TOLERANCE:g} of their l1 norm with "
                f"{MAX_POINTS_1D} points"
            )
        n_points *= 2


# --- generalized Jackson kernel (paper 001, §4.1) ----------------------------------------


def jackson_multipliers(t: int, smoothness: int, size: int) -> NDArray[np.float64]:
    """``lambda_n`` (``n < size``): paper 001's operator ``I_{t,K}`` (eq. (2)) on ``cos(n .)``.

    ``H_{t,r} = J_{t',r}`` with ``r = ceil((K+3)/2)``, ``t' = floor(t/r) + 1`` (eq. (1)),
    ``J_{t',r} ~ (sin(t's/2) / sin(s/2))^(2r)``. Its Fourier coefficients are the ``r``-fold
    convolution of the triangle ``(t' - |m|)_{|m| < t'}`` (the Fourier series of
    ``(sin(t's/2) / sin(s/2))^2``), normalised to ``H^(0) = 1`` (``int H = 1``). Then
    ``lambda_n = -sum_{l=1}^{K+1} (-1)^l binom(K+1, l) H^(l n)``; ``lambda_0 = 1`` and
    ``lambda_n = 0`` for ``n > r (t' - 1)``, in particular for ``n > t``.
    """
    if t < 1 or smoothness < 1 or size < 1:
        raise MechanismError(
            f"Jackson damping needs t ({t}), smoothness ({smoothness}) and size ({size}) >= 1"
        )
    r = math.ceil((smoothness + 3) / 2)
    t_prime = t // r + 1
    triangle = t_prime - np.abs(np.arange(-(t_prime - 1), t_prime, dtype=np.float64))
    series = np.ones(1)
    for _ in range(r):
        series = np.convolve(series, triangle)
        series /= series.max()
    centre = (series.size - 1) // 2
    h_hat = series[centre:] / series[centre]  # H^(m), m = 0..r(t'-1)
    out = np.zeros(size, dtype=np.float64)
    out[0] = 1.0
    for n in range(1, size):
        total = 0.0
        for ell in range(1, smoothness + 2):
            m = ell * n
            if m < h_hat.size:
                total += (-1) ** ell * math.comb(smoothness + 1, ell) * h_hat[m]
        out[n] = -total
    return out


# --- separable expansions ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TensorExpansion:
    """``Q`` separable functions ``f_q(x) = sum_j w_qj prod_i g_qji(x_i)``.

    ``factors[q, j, i, k]`` is the ``k``-th Chebyshev coefficient of ``g_qji`` (length
    ``L``), ``tails[q, j, i]`` bounds the l1 distance to its true coefficient sequence, and
    ``rigorous`` says whether that bound is proven (Gaussians, polynomials, coefficient
    vectors) or estimated (1-D callables). ``curvature[q, i] = 1 / (2 s_i^2)`` where every
    kernel of query ``q`` has a Gaussian factor of width ``s_i`` in column ``i`` (the
    coefficient of ``-x_i^2`` in its log; :mod:`app.mechanisms.dependence`), 0 elsewhere;
    ``None`` when no query has a Gaussian factor.
    """

    weights: NDArray[np.float64]
    factors: NDArray[np.float64]
    tails: NDArray[np.float64]
    method: str
    rigorous: bool = True
    curvature: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        w = np.asarray(self.weights, dtype=np.float64)
        a = np.asarray(self.factors, dtype=np.float64)
        e = np.asarray(self.tails, dtype=np.float64)
        if a.ndim != 4 or w.shape != a.shape[:2] or e.shape != a.shape[:3]:
            raise MechanismError(
                "a tensor expansion needs weights (Q, J), factors (Q, J, d, L) and tails "
                f"(Q, J, d); got {w.shape}, {a.shape}, {e.shape}"
            )
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(a)) and np.all(e >= 0)):
            raise MechanismError("expansion weights and coefficients must be finite")
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "factors", a)
        object.__setattr__(self, "tails", e)
        if self.curvature is not None:
            k = np.asarray(self.curvature, dtype=np.float64)
            if k.shape != (a.shape[0], a.shape[2]) or not np.all(np.isfinite(k) & (k >= 0)):
                raise MechanismError(
                    f"curvature must be finite, >= 0 and (Q, d) = {(a.shape[0], a.shape[2])}"
                )
            object.__setattr__(self, "curvature", k)

    @property
    def n_queries(self) -> int:
        return int(self.factors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.factors.shape[2])

    def uniform_expectation(self) -> NDArray[np.float64]:
        """``(Q,)`` expectations under the uniform law on the cube, from the coefficients.

        ``E T_k(U) = 0`` for odd ``k`` and ``-1 / (k^2 - 1)`` for even ``k`` (``1`` for
        ``k = 0``); exact up to the 1-D tails.
        """
        k = np.arange(self.factors.shape[3])
        m = np.where(k % 2 == 0, -1.0 / np.maximum(k * k - 1.0, 1.0), 0.0)
        m[0] = 1.0
        per_kernel = np.prod(self.factors @ m, axis=2)
        out: NDArray[np.float64] = np.einsum("qj,qj->q", self.weights, per_kernel)
        return out


def gaussian_expansion(
    centers: ArrayLike, weights: ArrayLike, sigma: ArrayLike, *, min_length: int = 1
) -> TensorExpansion:
    """Expansion of ``Q`` Gaussian mixtures: ``centers (Q, J, d)``, ``weights (Q, J)``.

    ``sigma`` is a scalar or ``(d,)`` (per-column widths).
    """
    c = np.asarray(centers, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if c.ndim != 3 or w.shape != c.shape[:2]:
        raise MechanismError(f"centers (Q, J, d) and weights (Q, J) mismatch: {c.shape}, {w.shape}")
    s = np.broadcast_to(np.asarray(sigma, dtype=np.float64), (c.shape[2],))
    if not (np.all(np.isfinite(s)) and np.all(s > 0)):
        raise MechanismError("sigma must be positive and finite in every column")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(w))):
        raise MechanismError("centers and weights must be finite")
    factors, tails = gaussian_factors(c, np.ascontiguousarray(s), min_length)
    return TensorExpansion(
        weights=w,
        factors=factors,
        tails=np.broadcast_to(tails, c.shape).copy(),
        method="gaussian",
        curvature=np.broadcast_to(0.5 / (s * s), (c.shape[0], c.shape[2])).copy(),
    )


def polynomial_expansion(query: Polynomial, *, min_length: int = 1) -> TensorExpansion:
    """Exact expansion of a sum of monomials (one kernel per monomial)."""
    length = max(int(query.exponents.max()) + 1, min_length)
    J, d = query.exponents.shape
    factors = np.zeros((1, J, d, length), dtype=np.float64)
    cache: dict[int, NDArray[np.float64]] = {}
    for j in range(J):
        for i in range(d):
            p = int(query.exponents[j, i])
            if p not in cache:
                cache[p] = monomial_coefficients(p)
            factors[0, j, i, : p + 1] = cache[p]
    rounding = 4.0 * length * EPS * np.abs(factors).sum(axis=3)
    return TensorExpansion(
        weights=query.coefficients[None, :].copy(),
        factors=factors,
        tails=rounding,
        method="polynomial",
    )


def product_expansion(query: ProductQuery, *, min_length: int = 1) -> TensorExpansion:
    """Expansion of ``weight * prod_i g_i(x_i)`` (:func:`product_expansions` of one query)."""
    return product_expansions([query], min_length=min_length)


def product_expansions(queries: Sequence[ProductQuery], *, min_length: int = 1) -> TensorExpansion:
    """One expansion (``J = 1``) of ``Q`` product queries ``w_q prod_i g_qi(x_i)``.

    Factor by factor, coefficients ``a`` and l1 tail bound ``e``:

    * ``None``: ``a = (1)``, ``e = 0``;
    * a coefficient vector: ``a`` as given, ``e = 4 |a| eps ||a||_1`` (rounding);
    * :class:`~app.mechanisms.queries.Gaussian1D`: ``N`` points and the proven ``e`` of
      :func:`gaussian_factor_points`, ``a`` from :func:`gaussian_factor_table` (all factors
      with the same ``N``, over all queries, in one transform);
    * a callable: :func:`callable_factor` (estimated tail: ``rigorous = False``).

    Vectors are padded with zeros to ``L = max(longest vector, min_length)``; ``weights``
    is ``(Q, 1)`` and ``tails`` ``(Q, 1, d)``.
    """
    if not queries:
        raise MechanismError("no queries to expand")
    d = queries[0].dim
    if any(q.dim != d for q in queries):
        raise MechanismError("all queries must have the same number of columns")
    Q = len(queries)
    tails = np.zeros((Q, d), dtype=np.float64)
    vectors: list[tuple[int, int, NDArray[np.float64]]] = []
    gaussians: dict[int, list[tuple[int, int, float, float]]] = {}
    rigorous = True
    length = max(int(min_length), 1)
    for q, query in enumerate(queries):
        for i, g in enumerate(query.factors):
            if g is None:
                continue
            if isinstance(g, Gaussian1D):
                n_points, tail = gaussian_factor_points(g.sigma, min_length)
                gaussians.setdefault(n_points, []).append((q, i, g.center, g.sigma))
                length = max(length, n_points)
            elif callable(g):
                coef, tail = callable_factor(g, min_length, name=f"factor {i}")
                vectors.append((q, i, coef))
                rigorous = False
                length = max(length, coef.size)
            else:
                coef = np.asarray(g, dtype=np.float64)
                tail = 4.0 * coef.size * EPS * float(np.abs(coef).sum())
                vectors.append((q, i, coef))
                length = max(length, coef.size)
            tails[q, i] = tail
    factors = np.zeros((Q, 1, d, length), dtype=np.float64)
    factors[:, 0, :, 0] = 1.0  # None: the constant 1 (every other vector overwrites a_0)
    curvature = np.zeros((Q, d), dtype=np.float64)
    for n_points, members in gaussians.items():
        rows, cols, centers, sigma = (np.asarray(v) for v in zip(*members, strict=True))
        factors[rows, 0, cols, :n_points] = gaussian_factor_table(centers, sigma, n_points)
        curvature[rows, cols] = 0.5 / (sigma * sigma)
    for q, i, coef in vectors:
        factors[q, 0, i, : coef.size] = coef
    return TensorExpansion(
        weights=np.array([[query.weight] for query in queries], dtype=np.float64),
        factors=factors,
        tails=tails[:, None, :],
        method="product",
        rigorous=rigorous,
        curvature=curvature if gaussians else None,
    )


def product_length(query: ProductQuery, min_length: int = 1) -> int | None:
    """The length ``L`` of :func:`product_expansion` without computing it (``None``: 1,
    vectors: their size, Gaussians: their ``N``), or ``None`` if a factor is a callable
    (its length is only known once it is resolved)."""
    length = max(int(min_length), 1)
    for i, g in enumerate(query.factors):
        if g is None:
            continue
        if isinstance(g, Gaussian1D):
            try:
                length = max(length, gaussian_factor_points(g.sigma, min_length)[0])
            except MechanismError as exc:
                raise MechanismError(f"factor {i}: {exc}") from None
        elif callable(g):
            return None
        else:
            length = max(length, int(g.size))
    return length


def expand(query: object, dim: int, *, min_length: int = 1) -> TensorExpansion | None:
    """The separable expansion of ``query``, or ``None`` if it is not a separable type."""
    if isinstance(query, GaussianMixtureBatch):
        _check_dim(query.dim, dim)
        return gaussian_expansion(query.centers, query.weights, query.sigma, min_length=min_length)
    if isinstance(query, GaussianMixture):
        _check_dim(query.dim, dim)
        return gaussian_expansion(
            query.centers[None], query.weights[None], query.sigma, min_length=min_length
        )
    if isinstance(query, AnisotropicGaussianMixture):
        _check_dim(query.dim, dim)
        return gaussian_expansion(
            query.centers[None], query.weights[None], query.sigma, min_length=min_length
        )
    if isinstance(query, Polynomial):
        _check_dim(query.dim, dim)
        return polynomial_expansion(query, min_length=min_length)
    if isinstance(query, ProductQuery):
        _check_dim(query.dim, dim)
        return product_expansion(query, min_length=min_length)
    return None


# --- coefficients on an index set --------------------------------------------------------


@dataclass(frozen=True, eq=False)
class QueryCoefficients:
    """Coefficients of ``Q`` queries on an index set ``S`` and their truncation bounds.

    ``constant[q]`` is ``c_0``, ``coefficients[q]`` the ``R`` coefficients in the order of
    ``S``, ``truncation_bound[q]`` the bound ``tau`` of (*) in the module docstring.
    ``rigorous`` is False when part of ``tau`` is an estimate (1-D callables, interpolated
    callables). ``check_residual`` is, for interpolated callables, ``max |f - p_S|`` over
    the random check points (``None`` otherwise).
    """

    constant: NDArray[np.float64]
    coefficients: NDArray[np.float64]
    truncation_bound: NDArray[np.float64]
    method: str
    rigorous: bool
    check_residual: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        c0 = np.asarray(self.constant, dtype=np.float64)
        c = np.asarray(self.coefficients, dtype=np.float64)
        tau = np.asarray(self.truncation_bound, dtype=np.float64)
        if c.ndim != 2 or c0.shape != (c.shape[0],) or tau.shape != c0.shape:
            raise MechanismError(
                "coefficients must be (Q, R) with constant and truncation_bound of shape (Q,)"
            )
        if not (np.all(tau >= 0) and np.all(np.isfinite(c0)) and np.all(np.isfinite(c))):
            raise MechanismError(
                "the query's coefficients or truncation bound are not finite numbers (they "
                "overflow a float); scale the query down"
            )
        for arr in (c0, c, tau):
            arr.setflags(write=False)
        object.__setattr__(self, "constant", c0)
        object.__setattr__(self, "coefficients", c)
        object.__setattr__(self, "truncation_bound", tau)

    @property
    def n_queries(self) -> int:
        return int(self.constant.shape[0])


def restrict(
    expansion: TensorExpansion,
    index_set: IndexSet,
    *,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
) -> QueryCoefficients:
    """``c_0``, ``(c_r)_{r in S}`` and the truncation bound of a separable expansion.

    ``c_r = sum_j w_j prod_i a_{ji, r_i}``. Each factor is scaled to unit l1 norm and
    divided by its constant term, so a kernel's coefficient is its product of constant
    terms times the ratios over the *support* of ``r`` only. For index sets closed under
    dropping a column (full tensors, total-degree sets) every ``r`` is its parent (``r``
    with its last nonzero column zeroed) times one ratio: one multiplication per index.
    Otherwise, and for factors whose constant term is (numerically, below
    :data:`STRUCTURAL_ZERO`) zero -- whose mass then goes into the bound -- the product
    runs over the support. Work is done in blocks of at most ``block_elements``
    (kernels x basis functions); the cost is ``O(Q J R)``.
    """
    if expansion.dim != index_set.dim:
        raise MechanismError(
            f"the query has d = {expansion.dim} columns but the index set has d = {index_set.dim}"
        )
    Q, J, d, L = expansion.factors.shape
    length = max(L, index_set.max_degree + 1)
    factors = expansion.factors
    if length > L:
        factors = np.concatenate([factors, np.zeros((Q, J, d, length - L))], axis=3)
    R = index_set.size
    constant = np.empty(Q, dtype=np.float64)
    coefficients = np.empty((Q, R), dtype=np.float64)
    bound = np.empty(Q, dtype=np.float64)
    step = max(1, block_elements // max(1, J * max(R, length * d)))
    slack_factor = (d + 2.0 * math.log2(R + 2) + 8.0) * EPS
    for start in range(0, Q, step):
        stop = min(Q, start + step)
        c0, coef, tau = _restrict_block(
            expansion.weights[start:stop],
            factors[start:stop],
            expansion.tails[start:stop],
            index_set,
            slack_factor,
        )
        constant[start:stop] = c0
        coefficients[start:stop] = coef
        bound[start:stop] = tau
    return QueryCoefficients(
        constant=constant,
        coefficients=coefficients,
        truncation_bound=bound,
        method=expansion.method,
        rigorous=expansion.rigorous,
    )


@dataclass(frozen=True, eq=False)
class TruncationEstimate:
    """Data-informed size of the truncation error ``e = sum_{r not in S} c_r b_r``.

    ``axis_tail[q] = sum_{i, k : k e_i not in S} |c_{k e_i}|``: a bound on the one-column
    part of ``e`` (``|b_r| <= 1``). These moments share a sign across columns on real
    data (``E T_2(x_i) < 0`` for every column concentrated inside its bounds), so no
    cancellation is assumed.

    ``cross_scale[q] = sqrt(sum_{r not in S, >= 2 columns} c_r^2 mu_r)`` with
    ``mu_r = prod_{i : r_i > 0} mu_i(r_i)`` and ``mu_i(k)`` an estimate of
    ``E T_k(x_i)^2``: the standard deviation of the interaction part when its moments
    have random signs and the Cauchy-Schwarz size ``b_r^2 <= E T_{r_i}(x_i)^2
    E T_{r_j}(x_j)^2`` (two columns). An estimate, not a bound.
    """

    axis_tail: NDArray[np.float64]
    cross_scale: NDArray[np.float64]


#: Elements of one ``(queries, J, J)`` working array of :func:`truncation_estimate`.
_PAIR_ELEMENTS = 1 << 21


def truncation_estimate(
    expansion: TensorExpansion,
    index_set: IndexSet,
    coefficients: NDArray[np.float64],
    mu: NDArray[np.float64],
) -> TruncationEstimate:
    """:class:`TruncationEstimate` of a separable expansion on ``index_set``.

    ``coefficients`` are the ``(Q, R)`` in-set coefficients from :func:`restrict`;
    ``mu`` is ``(d, M)`` with ``mu[:, 0] = 1`` (degrees past ``M - 1`` use
    ``mu[:, M - 1]``). With ``G_i(j, l) = sum_k a_{jik} a_{lik} mu_i(k)`` split as
    ``g_i + h_i`` (constant term ``g_i = a_{ji0} a_{li0}``, the rest ``h_i``), the
    weighted energy of every multi-index with at least two nonzero columns is the part
    of ``prod_i (g_i + h_i)`` with at least two ``h`` factors, accumulated column by
    column without subtraction::

        P2 <- P2 (g + h) + P1 h,   P1 <- P1 g + P0 h,   P0 <- P0 g,

    summed with ``w_j w_l``; the in-set part ``sum_{r in S} c_r^2 mu_r`` is then
    removed. Cost ``O(Q J^2 d L)``.
    """
    Q, J, d, L = expansion.factors.shape
    if expansion.dim != index_set.dim:
        raise MechanismError(
            f"the query has d = {expansion.dim} columns but the index set has d = {index_set.dim}"
        )
    length = max(L, index_set.max_degree + 1)
    a = expansion.factors
    if length > L:
        a = np.concatenate([a, np.zeros((Q, J, d, length - L))], axis=3)
    mu = np.asarray(mu, dtype=np.float64)
    if mu.ndim != 2 or mu.shape[0] != d or mu.shape[1] < 1:
        raise MechanismError(f"mu must be (d, M) with d = {d}; got {mu.shape}")
    if mu.shape[1] < length:
        mu = np.concatenate([mu, np.repeat(mu[:, -1:], length - mu.shape[1], axis=1)], axis=1)
    mu = mu[:, :length].copy()
    mu[:, 0] = 1.0
    deg = index_set.degrees
    support = np.count_nonzero(deg, axis=1)
    axis_in = np.zeros((d, length), dtype=bool)
    _, cols, ks = index_set.one_column_terms()
    axis_in[cols, ks] = True
    axis_in[:, 0] = True
    cross = np.flatnonzero(support >= 2)
    mu_cross = np.ones(cross.size)
    for i in range(d):
        k = deg[cross, i]
        mu_cross *= np.where(k > 0, mu[i, k], 1.0)
    w = expansion.weights
    a0 = a[..., 0]  # (Q, J, d)
    # product over the other columns of the constant terms, by prefix and suffix products
    ones = np.ones((Q, J, 1))
    prefix = np.cumprod(np.concatenate([ones, a0[:, :, :-1]], axis=2), axis=2)
    suffix = np.cumprod(np.concatenate([ones, a0[:, :, :0:-1]], axis=2), axis=2)[:, :, ::-1]
    others = prefix * suffix
    axis_coef = np.einsum("qj,qjik,qji->qik", w, a, others)
    axis_tail = np.where(axis_in[None], 0.0, np.abs(axis_coef)).sum(axis=(1, 2))
    total = _second_order_sum(w, a0, a[..., 1:] * np.sqrt(mu[None, None, :, 1:]))
    inside = (coefficients[:, cross] ** 2) @ mu_cross
    cross_scale = np.sqrt(np.maximum(total - inside, 0.0))
    return TruncationEstimate(axis_tail=axis_tail, cross_scale=cross_scale)


def _second_order_sum(
    w: NDArray[np.float64], g: NDArray[np.float64], h: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``sum_{j,l} w_qj w_ql [prod_i (G_ijl + H_ijl)]_{>= 2}`` per query ``q``, with
    ``G_ijl = g_qji g_qli`` and ``H_ijl = sum_k h_qjik h_qlik``, and ``[.]_{>= 2}`` the
    terms of the expanded product with at least two ``H`` factors: the recursion
    ``P2 <- P2 (G + H) + P1 H``, ``P1 <- P1 G + P0 H``, ``P0 <- P0 G`` over the columns.
    The cross-term mass of :func:`truncation_estimate` (``g`` the constant terms, ``h``
    the others scaled by ``sqrt(mu)``) and the second-order noise variance of
    :func:`independence_extrapolation` (``g`` the one-column factors, ``h`` the released
    coefficients scaled by the noise's sd) are both this. A few queries at a time, ``G``
    and ``H`` one column at a time: memory O(chunk J^2), not O(Q J^2 d), whatever the
    number of centres."""
    Q, J, d = g.shape
    total = np.empty(Q)
    chunk = max(1, _PAIR_ELEMENTS // (J * J))
    for start in range(0, Q, chunk):
        part = slice(start, start + chunk)
        p0 = np.ones((min(chunk, Q - start), J, J))
        p1 = np.zeros_like(p0)
        p2 = np.zeros_like(p0)
        for i in range(d):
            gi = g[part, :, None, i] * g[part, None, :, i]
            hi = np.einsum("qjk,qlk->qjl", h[part, :, i], h[part, :, i])
            p2 = p2 * (gi + hi) + p1 * hi
            p1 = p1 * gi + p0 * hi
            p0 = p0 * gi
        total[part] = np.einsum("qj,qjl,ql->q", w[part], p2, w[part])
    return total


@dataclass(frozen=True, eq=False)
class IndependenceExtrapolation:
    """The out-of-set terms a product of the released one-column moments predicts.

    ``value[q] = sum_j w_j sum_{r not in S, r_i <= K_i} prod_i a_{ji r_i} b_{r_i e_i}``
    and ``gradient[q]`` its derivative with respect to the ``R`` released moments (zero
    off the one-column terms ``k e_i``); ``excess_variance[q]`` the part of the variance
    of ``sum_j w_j prod_i F_ji`` that the gradient (delta method) leaves out, for the
    noise variance given (0 when none is); see :func:`independence_extrapolation`.
    """

    value: NDArray[np.float64]
    gradient: NDArray[np.float64]
    excess_variance: NDArray[np.float64] | None = None


def independence_extrapolation(
    expansion: TensorExpansion,
    index_set: IndexSet,
    moments: ArrayLike,
    noise_variance: float = 0.0,
) -> IndependenceExtrapolation | None:
    """Extrapolate the truncated interaction terms as if the columns were independent.

    For independent columns ``b_r = E prod_i T_{r_i}(x_i) = prod_i b_{r_i e_i}``, and the
    one-column moments ``b_{k e_i}`` (``k <= K_i``, the largest ``k`` with ``k e_i`` in
    ``S``) are released. A kernel ``prod_i g_i`` with ``g_i = sum_k a_ik T_k`` then has

        E prod_i g_i(x_i) ~ prod_i F_i,   F_i = sum_{k <= K_i} a_ik b_{k e_i}  (b_0 = 1),

    of which the terms with ``r`` in ``S`` are already in ``<c, b>``; the rest,

        X = prod_i F_i - sum_{r in S} prod_i a_{i r_i} b_{r_i e_i},

    is added to the answer (post-processing of the released moments). It is exact for
    independent columns up to the degrees past ``K_i``, and on dependent data it replaces
    ``b_r`` by the product of its marginal moments, which keeps the part of ``b_r`` that
    comes from each column's own law (for kernels, ``E T_2(x_i) E T_2(x_j)`` and the like:
    one sign across columns, so these terms add up; measured in
    ``bench/results/smooth_synopsis.md``).

    Implemented for ``S = {|r| <= D} u {k e_i : k <= K_i}`` with every ``K_i >= D``
    (total-degree and :func:`~app.mechanisms.basis.axis_total_degree` sets) by truncated
    polynomial products over the columns: with ``u_i(t) = sum_{k <= D} a_ik b_{k e_i} t^k``,
    ``sum_{|r| <= D} prod = sum_{m <= D} [t^m] prod_i u_i(t)``. The derivative with respect
    to ``b_{k e_i}`` is ``a_ik (prod_{l != i} F_l - I_ik)`` with ``I_ik`` the in-set part
    of the other columns' product (``sum_{m <= D - k} [t^m] prod_{l != i} u_l`` for
    ``k <= D``, ``prod_{l != i} a_l0`` above), from prefix and suffix products. Full
    tensors hold every such term already (``value = 0``). Other sets: ``None``.
    Cost ``O(Q J d (D^2 + K))``.

    **Second-order variance.** With released ``b_hat = b + eta``, ``eta`` independent with
    variance ``v = noise_variance``, each ``F_hat_ji = F_ji + e_ji`` carries the noise of its
    own column's moments only, so across columns the errors are independent and, with
    ``C_i(j, l) = Cov(e_ji, e_li) = v sum_{1 <= k <= K_i} a_jik a_lik``,

        Var(sum_j w_j prod_i F_hat_ji) = sum_{j,l} w_j w_l [prod_i (F_ji F_li + C_i(j, l))
                                                          - prod_i F_ji F_li]

    exactly (Gaussian or Laplace: only second moments enter). The delta method keeps the
    terms with one ``C`` factor; ``excess_variance`` is the rest (two or more ``C``
    factors), accumulated as in :func:`truncation_estimate` (``P2 <- P2 (g + h) + P1 h``
    ...) with ``g_i = F_hat_ji F_hat_li`` evaluated at the released moments and
    ``h_i = C_i``: both positive semi-definite in ``(j, l)``, so the result is ``>= 0``;
    evaluated at ``F_hat`` (``E F_hat F_hat' = F F' + C``) it errs on the large side. A
    product of ``d`` noisy factors is far from linear when ``C_i`` is comparable with
    ``F_i^2``: on WDBC (d = 30) at epsilon 0.1, Gaussian noise, the delta-method stderr
    was 0.78 of the answers' spread (``bench/results/interval_coverage.md``). Computed
    only for sets without interaction terms (``D = 1``), where the answer ``<c, b_hat> +
    X`` is exactly ``sum_j w_j prod_i F_hat_ji``; with pair moments released the answer
    replaces the in-set products by them and its second-order terms differ
    (``excess_variance`` is then None).
    """
    Q, J, d, L = expansion.factors.shape
    b = np.asarray(moments, dtype=np.float64)
    if b.shape != (index_set.size,):
        raise MechanismError(f"moments must have shape ({index_set.size},); got {b.shape}")
    if expansion.dim != index_set.dim:
        raise MechanismError(
            f"the query has d = {expansion.dim} columns but the index set has d = {index_set.dim}"
        )
    if index_set.kind == "full_tensor":
        return IndependenceExtrapolation(np.zeros(Q), np.zeros((Q, index_set.size)))
    structure = _axis_structure(index_set)
    if structure is None:
        return None
    D, K, position = structure
    length = max(L, int(K.max()) + 1)
    a = expansion.factors
    if length > L:
        a = np.concatenate([a, np.zeros((Q, J, d, length - L))], axis=3)
    table = np.zeros((d, length))  # b_{k e_i}, 0 past K_i
    table[:, 0] = 1.0
    known = position >= 0
    table[:, : position.shape[1]][known] = b[position[known]]
    scaled = a * table  # a_ik b_{k e_i}
    F = scaled.sum(axis=3)  # (Q, J, d)
    a0 = a[..., 0]
    u = scaled[..., : D + 1]  # (Q, J, d, D + 1)
    ones_poly = np.zeros((Q, J, D + 1))
    ones_poly[..., 0] = 1.0
    # prefix[i] = prod_{l < i}, suffix[i] = prod_{l > i}, as truncated polynomials
    prefix = np.empty((d, Q, J, D + 1))
    suffix = np.empty((d, Q, J, D + 1))
    prefix[0] = ones_poly
    suffix[d - 1] = ones_poly
    for i in range(1, d):
        prefix[i] = _poly_mul(prefix[i - 1], u[:, :, i - 1], D)
        suffix[d - 1 - i] = _poly_mul(suffix[d - i], u[:, :, d - i], D)
    full_poly = _poly_mul(prefix[d - 1], u[:, :, d - 1], D)
    F_prefix = np.cumprod(np.concatenate([np.ones((Q, J, 1)), F[:, :, :-1]], axis=2), axis=2)
    F_suffix = np.cumprod(np.concatenate([np.ones((Q, J, 1)), F[:, :, :0:-1]], axis=2), axis=2)
    F_others = F_prefix * F_suffix[:, :, ::-1]  # prod_{l != i} F_l
    A_prefix = np.cumprod(np.concatenate([np.ones((Q, J, 1)), a0[:, :, :-1]], axis=2), axis=2)
    A_suffix = np.cumprod(np.concatenate([np.ones((Q, J, 1)), a0[:, :, :0:-1]], axis=2), axis=2)
    A_others = A_prefix * A_suffix[:, :, ::-1]  # prod_{l != i} a_l0
    high = np.arange(length) > D
    inside = full_poly.sum(axis=2) + np.einsum(
        "qjik,qji->qj", np.where(high, scaled, 0.0), A_others
    )
    kernel = F_prefix[:, :, -1] * F[:, :, -1] - inside
    w = expansion.weights
    value = np.einsum("qj,qj->q", w, kernel)
    gradient = np.zeros((Q, index_set.size))
    for i in range(d):
        others_poly = _poly_mul(prefix[i], suffix[i], D)  # prod_{l != i} u_l
        cumulative = np.cumsum(others_poly, axis=2)  # [t^{<= m}]
        for k in range(1, int(K[i]) + 1):
            in_set = cumulative[..., D - k] if k <= D else A_others[:, :, i]
            gradient[:, position[i, k]] = np.einsum(
                "qj,qj->q", w, a[:, :, i, k] * (F_others[:, :, i] - in_set)
            )
    if D > 1 or np.count_nonzero(index_set.support >= 2):
        # pair moments released: the answer is not the bare product (see the docstring)
        return IndependenceExtrapolation(value=value, gradient=gradient)
    excess = np.zeros(Q)
    if noise_variance > 0.0:
        noisy = np.arange(length)[None, :] <= K[:, None]  # (d, length): k <= K_i
        noisy[:, 0] = False
        coef = np.where(noisy, a, 0.0)  # a_jik on the released degrees k >= 1
        excess = np.maximum(_second_order_sum(w, F, np.sqrt(noise_variance) * coef), 0.0)
    return IndependenceExtrapolation(value=value, gradient=gradient, excess_variance=excess)


def _poly_mul(p: NDArray[np.float64], q: NDArray[np.float64], degree: int) -> NDArray[np.float64]:
    """Coefficients up to ``t^degree`` of ``p(t) q(t)`` (last axis: the coefficients)."""
    out = np.zeros(np.broadcast_shapes(p.shape, q.shape))
    for m in range(degree + 1):
        for k in range(m + 1):
            out[..., m] += p[..., k] * q[..., m - k]
    return out


def _axis_structure(
    index_set: IndexSet,
) -> tuple[int, NDArray[np.int64], NDArray[np.int64]] | None:
    """``(D, K, position)`` when ``S = {|r| <= D} u {k e_i : k <= K_i}`` with ``K_i >= D``.

    ``position[i, k]`` is the row of ``k e_i`` in ``S`` (``-1`` if absent). ``None`` when
    ``S`` has another shape (a partial total-degree level, gaps in a column's degrees).
    """
    rows, cols, ks = index_set.one_column_terms()
    d = index_set.dim
    K = np.zeros(d, dtype=np.int64)
    np.maximum.at(K, cols, ks)
    counts = np.bincount(cols, minlength=d)
    if np.any(counts != K) or np.any(K == 0):
        return None
    multi = np.count_nonzero(index_set.degrees, axis=1) >= 2
    totals = index_set.total_degrees[multi]
    D = int(totals.max()) if totals.size else 1
    if int(K.min()) < D:
        return None
    expected = math.comb(D + d, d) - 1 - d * D  # multi-column indices with |r| <= D
    if int(multi.sum()) != expected or (totals.size and int(totals.max()) > D):
        return None
    position = np.full((d, int(K.max()) + 1), -1, dtype=np.int64)
    position[cols, ks] = rows
    return D, K, position


def _restrict_block(
    weights: NDArray[np.float64],
    factors: NDArray[np.float64],
    tails: NDArray[np.float64],
    index_set: IndexSet,
    slack_factor: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    Qb, J, d, L = factors.shape
    M = Qb * J
    a = factors.reshape(M, d, L)
    w = weights.reshape(M)
    norms = np.abs(a).sum(axis=2)  # n_ji, over the whole computed expansion
    safe = np.where(norms > 0, norms, 1.0)
    # only degrees up to the set's largest enter a product
    unit = a[:, :, : index_set.max_degree + 1] / safe[:, :, None]  # unit l1 norm factors
    a0 = unit[:, :, 0]
    zero = np.abs(a0) < STRUCTURAL_ZERO
    dropped = np.where(zero, np.abs(a0), 0.0).sum(axis=1)
    n_zero = zero.sum(axis=1)
    ratio = unit / np.where(zero, 1.0, a0)[:, :, None]
    scale = np.prod(norms, axis=1)
    kernel = w * scale * np.prod(np.where(zero, 1.0, a0), axis=1)
    kernel_c0 = np.where(n_zero == 0, kernel, 0.0)
    values = None
    chain = index_set.parent_chain if not np.any(n_zero) else None
    if chain is not None:
        values = _values_by_parents(ratio, kernel, chain)
    if values is None or not np.all(np.isfinite(values)):
        values = _values_by_groups(unit, ratio, kernel, w * scale, zero, n_zero, index_set)
    kept_abs = np.abs(kernel_c0) + np.abs(values).sum(axis=0)
    coef = values.reshape(index_set.size, Qb, J).sum(axis=2).T
    constant = kernel_c0.reshape(Qb, J).sum(axis=1)
    total = np.abs(w) * np.prod(norms + tails.reshape(M, d), axis=1)
    per_kernel = total - kept_abs + np.abs(w) * scale * dropped
    per_kernel = np.maximum(per_kernel, 0.0) + slack_factor * total
    bound = per_kernel.reshape(Qb, J).sum(axis=1)
    return constant, coef, bound


def _ratio_table(ratio: NDArray[np.float64]) -> NDArray[np.float64]:
    """``table[deg * d + col, m]``: basis.py's flat layout, one contiguous row per (deg, col)."""
    M, d, L = ratio.shape
    return np.ascontiguousarray(ratio.transpose(2, 1, 0)).reshape(L * d, M)


def _values_by_parents(
    ratio: NDArray[np.float64],
    kernel: NDArray[np.float64],
    chain: tuple[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]], ...],
) -> NDArray[np.float64]:
    """``(R, M)`` kernel coefficients, each index from its parent (one multiplication each)."""
    table = _ratio_table(ratio)
    R = sum(rows.size for rows, _, _ in chain)
    values = np.empty((R, kernel.size), dtype=np.float64)
    for rows, parents, last in chain:
        if parents.size and parents[0] < 0:
            values[rows] = table[last] * kernel[None, :]
        else:
            values[rows] = values[parents] * table[last]
    return values


def _values_by_groups(
    unit: NDArray[np.float64],
    ratio: NDArray[np.float64],
    kernel: NDArray[np.float64],
    kernel_scale: NDArray[np.float64],
    zero: NDArray[np.bool_],
    n_zero: NDArray[np.int64],
    index_set: IndexSet,
) -> NDArray[np.float64]:
    """``(R, M)`` kernel coefficients by products over each index's support (general path).

    Handles structural zeros (an index whose support misses a column with a zero constant
    term gets 0) and, if ratios of tiny constant terms overflow, multiplies the unit-norm
    factors over all ``d`` columns instead (every ``|factor| <= 1``: no overflow).
    """
    table = _ratio_table(ratio)
    M, d, _ = unit.shape
    out = np.empty((index_set.size, M), dtype=np.float64)
    any_zero = bool(np.any(n_zero))
    zero_t = np.ascontiguousarray(zero.T)
    for positions, flat in index_set._sparse:
        values = table[flat[:, 0]] * kernel[None, :]
        for p in range(1, flat.shape[1]):
            values *= table[flat[:, p]]
        if not np.all(np.isfinite(values)):
            degrees = index_set.degrees[positions]
            values = np.ones((positions.size, M))
            for i in range(d):
                values *= unit[:, i, degrees[:, i]].T
            values *= kernel_scale[None, :]
        if any_zero:
            cols = flat % d
            count = zero_t[cols[:, 0]].astype(np.int64)
            for p in range(1, cols.shape[1]):
                count += zero_t[cols[:, p]]
            values = np.where(count == n_zero[None, :], values, 0.0)
        out[positions] = values
    return out


# --- general callables: tensor interpolation with Jackson damping ------------------------


DAMPING = ("auto", "jackson", "none")


def interpolate(
    f: Callable[[NDArray[np.float64]], ArrayLike],
    index_set: IndexSet,
    *,
    smoothness: int,
    damping: str = "auto",
    rng: np.random.Generator | None = None,
    max_points: int = MAX_INTERPOLATION_POINTS,
    n_check: int = 256,
) -> QueryCoefficients:
    """Coefficients of a general ``f`` (rows of an ``(m, d)`` array -> ``(m,)`` values).

    Tensor interpolation at Chebyshev points, then ``damping``: ``"jackson"`` applies the
    generalized Jackson operator with ``t = max degree of S`` and ``K = smoothness``,
    ``"none"`` keeps the interpolant's coefficients, ``"auto"`` computes both and keeps
    the one with the smaller truncation bound (with the paper's constants the Jackson
    multipliers are close to 1 only for degrees well below ``t / ceil((K+3)/2)``, so the
    undamped coefficients usually win). Bound and accuracy check as in the module
    docstring. ``rng`` draws the check points (default: a fixed seed, so answers are
    reproducible).
    """
    if damping not in DAMPING:
        raise MechanismError(f"damping ({damping!r}) must be one of {DAMPING}")
    d = index_set.dim
    if d > MAX_CALLABLE_DIM:
        raise MechanismError(
            f"a general callable query can only be expanded for d <= {MAX_CALLABLE_DIM} "
            f"(tensor interpolation needs N^d evaluations); this synopsis has d = {d}. "
            "Use a separable query (Gaussian mixture, product of 1-D functions, polynomial)"
        )
    t = index_set.max_degree
    n_points = 16
    while n_points < 2 * (t + 1):
        n_points *= 2
    if n_points**d > max_points:
        raise MechanismError(
            f"interpolating in d = {d} up to degree {t} needs more than {max_points} points"
        )
    while True:
        c_hat, tail = _interpolate_grid(f, d, n_points)
        scale = float(np.abs(c_hat).sum())
        if tail <= 1e-13 * scale or (2 * n_points) ** d > max_points:
            break
        n_points *= 2
    generator = rng if rng is not None else np.random.default_rng(0x5EED)
    check = generator.uniform(-1.0, 1.0, size=(n_check, d))
    f_check = _call(f, check)
    interp_error = 2.0 * float(np.max(np.abs(f_check - _evaluate_tensor(c_hat, check)))) + tail
    idx = tuple(index_set.degrees.T)
    origin = (0,) * d
    candidates = []
    for mode in ("jackson", "none") if damping == "auto" else (damping,):
        c = c_hat
        if mode == "jackson":
            lam = jackson_multipliers(t, smoothness, n_points)
            for axis in range(d):
                shape = [1] * d
                shape[axis] = n_points
                c = c * lam.reshape(shape)
        kept = np.zeros_like(c)
        kept[idx] = c[idx]
        kept[origin] = c[origin]
        bound = float(np.abs(c_hat - kept).sum()) + interp_error + (d + 8.0) * EPS * max(scale, 1.0)
        candidates.append((bound, mode, kept))
    bound, mode, kept = min(candidates, key=lambda item: item[0])
    residual = float(np.max(np.abs(f_check - _evaluate_tensor(kept, check))))
    return QueryCoefficients(
        constant=np.array([kept[origin]]),
        coefficients=kept[idx][None, :],
        truncation_bound=np.array([bound]),
        method="interpolation_jackson" if mode == "jackson" else "interpolation",
        rigorous=False,
        check_residual=np.array([residual]),
    )


def _interpolate_grid(
    f: Callable[[NDArray[np.float64]], ArrayLike], d: int, n_points: int
) -> tuple[NDArray[np.float64], float]:
    x = chebyshev_points(n_points)
    grid = np.stack(np.meshgrid(*([x] * d), indexing="ij"), axis=-1).reshape(-1, d)
    values = _call(f, grid).reshape((n_points,) * d)
    c_hat: NDArray[np.float64] = dctn(values, type=2) / float(n_points**d)
    for axis in range(d):
        first = [slice(None)] * d
        first[axis] = slice(0, 1)
        c_hat[tuple(first)] *= 0.5
    high = np.zeros(c_hat.shape, dtype=bool)
    for axis in range(d):
        sl = [slice(None)] * d
        sl[axis] = slice(3 * n_points // 4, None)
        high[tuple(sl)] = True
    return c_hat, float(np.abs(c_hat[high]).sum())


def _call(
    f: Callable[[NDArray[np.float64]], ArrayLike], X: NDArray[np.float64]
) -> NDArray[np.float64]:
    values = np.asarray(f(X), dtype=np.float64)
    if values.shape != (X.shape[0],):
        raise MechanismError(
            f"the query must return one value per row; got shape {values.shape} "
            f"for {X.shape[0]} rows"
        )
    if not np.all(np.isfinite(values)):
        raise MechanismError("the query returned non-finite values on [-1, 1]^d")
    return values


def _evaluate_tensor(c: NDArray[np.float64], X: NDArray[np.float64]) -> NDArray[np.float64]:
    """``sum_r c_r T_r(x)`` for a full ``N^d`` coefficient tensor, one axis at a time."""
    n_points, d = c.shape[0], X.shape[1]
    tables = [chebyshev_table(X[:, i], n_points - 1) for i in range(d)]  # (N, m) each
    # contract the last axis first: (N^(d-1), N) @ (N, m) -> (N^(d-1), m), then pointwise
    out = c.reshape(-1, n_points) @ tables[d - 1]
    for i in range(d - 2, -1, -1):
        out = out.reshape(-1, n_points, X.shape[0])
        out = np.einsum("akm,km->am", out, tables[i])
    result: NDArray[np.float64] = out.reshape(X.shape[0])
    return result


# --- dispatch ----------------------------------------------------------------------------


def query_coefficients(
    query: object,
    index_set: IndexSet,
    *,
    smoothness: int = 4,
    damping: str = "auto",
    rng: np.random.Generator | None = None,
) -> QueryCoefficients:
    """Coefficients of any supported query on ``index_set`` (separable first, then callables).

    Separable types (module docstring) are exact in any dimension. Anything else with an
    ``evaluate(X)`` method (:class:`~app.mechanisms.queries.Query`) or a plain callable
    ``f(X)`` is interpolated when ``d <= MAX_CALLABLE_DIM`` and refused otherwise.
    """
    expansion = expand(query, index_set.dim, min_length=index_set.max_degree + 1)
    if expansion is not None:
        return restrict(expansion, index_set)
    if isinstance(query, Query):
        dim = getattr(query, "dim", index_set.dim)
        _check_dim(int(dim), index_set.dim)
        return interpolate(
            query.evaluate, index_set, smoothness=smoothness, damping=damping, rng=rng
        )
    if callable(query):
        return interpolate(query, index_set, smoothness=smoothness, damping=damping, rng=rng)
    raise MechanismError(
        f"query of type {type(query).__name__} is not supported: pass a Gaussian mixture, "
        "a ProductQuery, a Polynomial, or an object with evaluate(X) (d <= "
        f"{MAX_CALLABLE_DIM})"
    )


def stack_expansions(expansions: Sequence[TensorExpansion]) -> TensorExpansion:
    """One expansion of all queries, padding kernels (zero weight) and lengths (zeros)."""
    if not expansions:
        raise MechanismError("no queries to stack")
    d = expansions[0].dim
    if any(e.dim != d for e in expansions):
        raise MechanismError("all queries must have the same number of columns")
    J = max(e.factors.shape[1] for e in expansions)
    L = max(e.factors.shape[3] for e in expansions)
    Q = sum(e.n_queries for e in expansions)
    weights = np.zeros((Q, J))
    factors = np.zeros((Q, J, d, L))
    factors[:, :, :, 0] = 1.0  # padded kernels: constant 1 with weight 0
    tails = np.zeros((Q, J, d))
    curvature = np.zeros((Q, d))
    row = 0
    for e in expansions:
        q, j, _, ell = e.factors.shape
        weights[row : row + q, :j] = e.weights
        factors[row : row + q, :j] = 0.0
        factors[row : row + q, :j, :, :ell] = e.factors
        tails[row : row + q, :j] = e.tails
        if e.curvature is not None:
            curvature[row : row + q] = e.curvature
        row += q
    methods = sorted({e.method for e in expansions})
    return TensorExpansion(
        weights=weights,
        factors=factors,
        tails=tails,
        method="+".join(methods),
        rigorous=all(e.rigorous for e in expansions),
        curvature=None if all(e.curvature is None for e in expansions) else curvature,
    )


def is_separable(query: object) -> bool:
    """Whether :func:`expand` gives ``query`` an exact separable expansion (Gaussian
    mixtures, polynomials, products of 1-D functions)."""
    return isinstance(
        query,
        GaussianMixtureBatch
        | GaussianMixture
        | AnisotropicGaussianMixture
        | Polynomial
        | ProductQuery,
    )


@dataclass(frozen=True, eq=False)
class SeparableBlock:
    """One block of :func:`separable_blocks`, planned before anything is expanded: the
    ``positions`` of its queries, how they are expanded (``kind``: ``"gaussian"``, one
    :func:`gaussian_expansion`; ``"product"``, one :func:`product_expansions`;
    ``"stacked"``, :func:`expand` query by query and :func:`stack_expansions`) and the
    ``shape`` ``(rows, kernels, length)`` of the expansion it gives, whose ``factors``
    are ``(rows, kernels, d, length)`` (padding included). ``shape`` is ``None`` when a
    query's length is only known once it is expanded (a product with a callable factor)
    or the query has no separable form (refused when the block is expanded)."""

    positions: NDArray[np.int64]
    kind: str
    shape: tuple[int, int, int] | None


def separable_layout(
    queries: Sequence[object], dim: int, *, min_length: int = 1, block: int = 500
) -> list[SeparableBlock]:
    """The blocks of :func:`separable_blocks` and the shapes of their expansions, from
    the queries' sizes alone (centres, widths, exponents, factor lengths): what a caller
    needs to bound the work of answering them before anything is expanded."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    products: dict[int, list[tuple[int, int]]] = {}
    others: list[int] = []
    for position, query in enumerate(queries):
        if isinstance(query, GaussianMixture | AnisotropicGaussianMixture):
            _check_dim(query.dim, dim)
            sigma = np.broadcast_to(np.asarray(query.sigma, dtype=np.float64), (dim,))
            groups.setdefault((query.centers.shape, sigma.tobytes()), []).append(position)
        elif isinstance(query, ProductQuery):
            _check_dim(query.dim, dim)
            try:
                length = product_length(query, min_length)
            except MechanismError as exc:
                raise MechanismError(f"query {position}: {exc}") from None
            if length is None:
                others.append(position)
            else:
                key = 1 << (length - 1).bit_length()
                products.setdefault(key, []).append((position, length))
        else:
            others.append(position)
    out: list[SeparableBlock] = []
    for members in groups.values():
        first = queries[members[0]]
        assert isinstance(first, GaussianMixture | AnisotropicGaussianMixture)
        kernels = int(first.centers.shape[0])
        length = _gaussian_length(first.sigma, min_length)
        # at most ``block`` queries, and no more than DEFAULT_BLOCK_ELEMENTS coefficients
        # unless one query has more on its own
        size = kernels * dim * (length or 1)
        rows = max(1, min(block, DEFAULT_BLOCK_ELEMENTS // size))
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            shape = None if length is None else (len(chunk), kernels, length)
            out.append(SeparableBlock(np.asarray(chunk, dtype=np.int64), "gaussian", shape))
    for key, bucket in sorted(products.items()):
        rows = max(1, min(block, DEFAULT_BLOCK_ELEMENTS // (dim * key)))
        for start in range(0, len(bucket), rows):
            part = bucket[start : start + rows]
            shape = (len(part), 1, max(length for _, length in part))
            positions = np.asarray([p for p, _ in part], dtype=np.int64)
            out.append(SeparableBlock(positions, "product", shape))
    for start in range(0, len(others), block):
        chunk = others[start : start + block]
        shapes = [_expansion_shape(queries[p], min_length) for p in chunk]
        stacked = None
        if all(s is not None for s in shapes):
            known = [s for s in shapes if s is not None]
            stacked = (
                sum(s[0] for s in known),
                max(s[1] for s in known),
                max(s[2] for s in known),
            )
        out.append(SeparableBlock(np.asarray(chunk, dtype=np.int64), "stacked", stacked))
    return out


def _gaussian_length(sigma: ArrayLike, min_length: int) -> int | None:
    """The ``N`` of :func:`gaussian_factors` for these widths (``None`` for widths it
    refuses, which it names when the block is expanded)."""
    s = np.asarray(sigma, dtype=np.float64)
    if not (np.all(np.isfinite(s)) and np.all(s > 0)):
        return None
    return max(gaussian_points(float(w), max(min_length, 8)) for w in np.unique(s))


def _expansion_shape(query: object, min_length: int) -> tuple[int, int, int] | None:
    """``(rows, kernels, length)`` of :func:`expand` for a query of a stacked block, or
    ``None`` when it is only known once expanded (callable factors, other types)."""
    if isinstance(query, GaussianMixtureBatch):
        length = _gaussian_length(query.sigma, min_length)
        rows, kernels = query.centers.shape[:2]
        return None if length is None else (int(rows), int(kernels), length)
    if isinstance(query, Polynomial):
        kernels = int(query.exponents.shape[0])
        return 1, kernels, max(int(query.exponents.max()) + 1, min_length)
    return None


def separable_blocks(
    queries: Sequence[object], dim: int, *, min_length: int = 1, block: int = 500
) -> Iterator[tuple[NDArray[np.int64], TensorExpansion]]:
    """``(positions, expansion)`` covering every query of ``queries``, in blocks.

    Gaussian mixtures with the same number of centres and the same widths share one
    :func:`gaussian_expansion` per block of at most ``block`` queries (one DCT table), and
    of at most ``max(1, DEFAULT_BLOCK_ELEMENTS // (J d L))`` (``J`` centres, ``L``
    coefficients a factor: 8 MiB of factors, whatever the centres and widths). Product
    queries whose factors are all ``None``, coefficient vectors or
    :class:`~app.mechanisms.queries.Gaussian1D` share one :func:`product_expansions` per
    block, grouped by their length ``L`` rounded up to a power of two (so that padding at
    most doubles a block) and with at most ``max(1, DEFAULT_BLOCK_ELEMENTS // (d L))``
    queries per block (a narrow Gaussian does not inflate ``block`` others). The other
    separable queries (polynomials, products with callable factors) are expanded one by
    one and stacked (:func:`stack_expansions`). A query with no separable form is a
    :class:`MechanismError` naming its position. The blocks are those of
    :func:`separable_layout`, expanded one at a time (:func:`expand_block`).
    """
    for planned in separable_layout(queries, dim, min_length=min_length, block=block):
        yield planned.positions, expand_block(queries, planned, dim, min_length=min_length)


def expand_block(
    queries: Sequence[object], planned: SeparableBlock, dim: int, *, min_length: int = 1
) -> TensorExpansion:
    """The expansion of one block of :func:`separable_layout` (``queries`` the sequence
    it was planned on)."""
    members = [queries[int(i)] for i in planned.positions]
    if planned.kind == "gaussian":
        mixtures = [
            q for q in members if isinstance(q, GaussianMixture | AnisotropicGaussianMixture)
        ]
        assert len(mixtures) == len(members)
        centers = np.stack([m.centers for m in mixtures])
        weights = np.stack([m.weights for m in mixtures])
        return gaussian_expansion(centers, weights, mixtures[0].sigma, min_length=min_length)
    if planned.kind == "product":
        products = [q for q in members if isinstance(q, ProductQuery)]
        assert len(products) == len(members)
        return product_expansions(products, min_length=min_length)
    expansions = []
    for position, query in zip(planned.positions, members, strict=True):
        one = expand(query, dim, min_length=min_length)
        if one is None:
            raise MechanismError(
                f"query {position} ({type(query).__name__}) has no separable "
                "form (Gaussian mixture, product of 1-D functions or polynomial)"
            )
        expansions.append(one)
    return stack_expansions(expansions)


def _check_dim(query_dim: int, dim: int) -> None:
    if query_dim != dim:
        raise MechanismError(
            f"the query has d = {query_dim} columns but the synopsis has d = {dim}"
        )
