"""Linear queries on ``[-1, 1]^d``: ``q_f(D) = (1/|D|) sum_{x in D} f(x)`` (paper 000, §2).

A query is anything with ``evaluate(X) -> (n,)`` values of ``f`` on the rows of ``X``
(:class:`Query`); :func:`answer` turns it into a (weighted) linear query answer. Releases
answer a query on their weighted support, ``sum_k w_k f(s_k)`` (DESIGN §1).

:class:`GaussianMixture` is the query family of paper 000's experiments (§2, §4):
``f(x) = sum_j a_j exp(-||x - c_j||^2 / (2 sigma^2))`` (``K``-smooth with norm <= 1 for
``K <= sigma^2`` when ``sum |a_j| <= 1``, Proposition 2.1). :class:`GaussianMixtureBatch`
holds many such queries with one ``sigma`` and answers them all at once with one matrix
product over every centre of every query (the benchmark's ``10^4`` queries x ``J = 10``).
Both give the exact expectation under the uniform distribution on ``[-1, 1]^d`` (the
0-DP baseline that ignores the data): the Gaussian factorises over coordinates and

    (1/2) int_{-1}^{1} exp(-(x - c)^2 / (2 sigma^2)) dx
        = (sigma/2) sqrt(pi/2) [erf((1 - c)/(sigma sqrt 2)) + erf((1 + c)/(sigma sqrt 2))].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.polynomial.chebyshev import chebval
from numpy.typing import ArrayLike, NDArray
from scipy.special import erfc

from app.mechanisms.errors import MechanismError

#: Work-space budget of one evaluation block, in float64 elements (points x centres): 16 MiB.
DEFAULT_BLOCK_ELEMENTS = 1 << 21


@runtime_checkable
class Query(Protocol):
    """A function ``f`` on ``[-1, 1]^d``, evaluated row-wise."""

    def evaluate(self, X: ArrayLike) -> NDArray[np.float64]:
        """``(n,)`` values ``f(x)`` for the ``n`` rows ``x`` of ``X``."""
        ...


def answer(query: Query, points: ArrayLike, weights: ArrayLike | None = None) -> float:
    """``sum_k w_k f(s_k)`` over weighted points (``weights=None``: the plain mean)."""
    pts, w = _points_and_weights(points, weights)
    if w is None:
        return float(np.mean(query.evaluate(pts)))
    keep = w > 0
    return float(np.dot(w[keep], query.evaluate(pts[keep])))


def sample_support(
    points: NDArray[np.float64], weights: NDArray[np.float64], m: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``m`` rows drawn i.i.d. from the weighted support (``P(s_k) = w_k``)."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise MechanismError(f"m ({m!r}) must be a positive integer")
    out: NDArray[np.float64] = points[rng.choice(points.shape[0], size=m, p=weights)]
    return out


@dataclass(frozen=True, eq=False)
class GaussianMixture:
    """``f(x) = sum_j a_j exp(-||x - c_j||^2 / (2 sigma^2))``; ``centers`` is ``(J, d)``."""

    centers: NDArray[np.float64]
    weights: NDArray[np.float64]
    sigma: float

    def __post_init__(self) -> None:
        centers, weights = _check_mixture(self.centers, self.weights, self.sigma, batched=False)
        object.__setattr__(self, "centers", centers)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "sigma", float(self.sigma))

    @property
    def dim(self) -> int:
        return int(self.centers.shape[1])

    def evaluate(
        self, X: ArrayLike, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
    ) -> NDArray[np.float64]:
        pts = _as_points(X, self.dim)
        out = np.empty(pts.shape[0], dtype=np.float64)
        aug = _augmented_centers(self.centers, self.sigma)
        step = max(1, block_elements // self.centers.shape[0])
        for start in range(0, pts.shape[0], step):
            kernel = _kernel_block(pts[start : start + step], aug)
            out[start : start + step] = kernel @ self.weights
        return out

    def answer(self, points: ArrayLike, weights: ArrayLike | None = None) -> float:
        return answer(self, points, weights)

    def uniform_expectation(self) -> float:
        """Exact ``E f(U)`` for ``U`` uniform on ``[-1, 1]^d`` (the 0-DP baseline)."""
        return float(np.exp(_uniform_log_factors(self.centers, self.sigma)) @ self.weights)


@dataclass(frozen=True, eq=False)
class GaussianMixtureBatch:
    """``Q`` Gaussian-mixture queries with one ``sigma``.

    ``centers`` is ``(Q, J, d)`` and ``weights`` is ``(Q, J)``.
    """

    centers: NDArray[np.float64]
    weights: NDArray[np.float64]
    sigma: float

    def __post_init__(self) -> None:
        centers, weights = _check_mixture(self.centers, self.weights, self.sigma, batched=True)
        object.__setattr__(self, "centers", centers)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "sigma", float(self.sigma))

    @classmethod
    def random(
        cls, n_queries: int, n_centers: int, dim: int, sigma: float, rng: np.random.Generator
    ) -> GaussianMixtureBatch:
        """Paper 000 §4: ``a_j ~ U[0, 1]``, ``c_j ~ U[-1, 1]^d``, ``J = n_centers``."""
        weights = rng.uniform(0.0, 1.0, size=(n_queries, n_centers))
        centers = rng.uniform(-1.0, 1.0, size=(n_queries, n_centers, dim))
        return cls(centers=centers, weights=weights, sigma=sigma)

    def __len__(self) -> int:
        return int(self.centers.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centers.shape[2])

    def query(self, i: int) -> GaussianMixture:
        return GaussianMixture(self.centers[i], self.weights[i], self.sigma)

    def answers(
        self,
        points: ArrayLike,
        weights: ArrayLike | None = None,
        *,
        block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    ) -> NDArray[np.float64]:
        """``(Q,)`` answers ``sum_k w_k f_q(s_k)`` (plain mean when ``weights`` is None).

        All ``Q J`` centres go into one matrix product per block of points:
        ``||s - c||^2 = ||s||^2 + ||c||^2 - 2 s.c``; points with zero weight are skipped.
        Cost: about 6 ns per (point, centre) pair on one core (``5 10^4`` points x ``10^5``
        centres: ~30 s), so a vertex LP solution with ``R + 1`` support points is cheap.
        """
        pts, w = _points_and_weights(points, weights)
        if pts.shape[1] != self.dim:
            raise MechanismError(f"points must have {self.dim} columns; got {pts.shape[1]}")
        if w is None:
            w = np.full(pts.shape[0], 1.0 / pts.shape[0])
        keep = w > 0
        pts, w = pts[keep], w[keep]
        aug = _augmented_centers(self.centers.reshape(-1, self.dim), self.sigma)
        totals = np.zeros(aug.shape[1], dtype=np.float64)
        step = max(1, block_elements // aug.shape[1])
        for start in range(0, pts.shape[0], step):
            kernel = _kernel_block(pts[start : start + step], aug)
            totals += w[start : start + step] @ kernel
        out: NDArray[np.float64] = np.einsum(
            "qj,qj->q", totals.reshape(self.weights.shape), self.weights
        )
        return out

    def uniform_expectations(self) -> NDArray[np.float64]:
        """``(Q,)`` exact expectations under the uniform distribution on ``[-1, 1]^d``."""
        factors = np.exp(_uniform_log_factors(self.centers, self.sigma))
        out: NDArray[np.float64] = np.einsum("qj,qj->q", factors, self.weights)
        return out


# --- internals ---------------------------------------------------------------------------


def _check_mixture(
    centers: ArrayLike, weights: ArrayLike, sigma: float, *, batched: bool
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    c = np.array(centers, dtype=np.float64, copy=True)
    a = np.array(weights, dtype=np.float64, copy=True)
    ndim = 3 if batched else 2
    shape = "(Q, J, d)" if batched else "(J, d)"
    if c.ndim != ndim or c.shape[-1] == 0 or c.shape[-2] == 0:
        raise MechanismError(f"centers must be a non-empty {shape} array; got shape {c.shape}")
    if a.shape != c.shape[:-1]:
        raise MechanismError(f"weights must have shape {c.shape[:-1]}; got {a.shape}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(a))):
        raise MechanismError("centers and weights must be finite")
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma > 0):
        raise MechanismError(f"sigma ({sigma!r}) must be a positive finite number")
    c.setflags(write=False)
    a.setflags(write=False)
    return c, a


def _as_points(X: ArrayLike, d: int) -> NDArray[np.float64]:
    pts = np.asarray(X, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != d:
        raise MechanismError(f"points must be a (m, {d}) array; got shape {pts.shape}")
    return pts


def _points_and_weights(
    points: ArrayLike, weights: ArrayLike | None
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[0] == 0:
        raise MechanismError(f"points must be a non-empty (m, d) array; got shape {pts.shape}")
    if weights is None:
        return pts, None
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (pts.shape[0],):
        raise MechanismError(f"weights must have shape ({pts.shape[0]},); got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise MechanismError("weights must be finite and non-negative")
    return pts, w


def _augmented_centers(centers: NDArray[np.float64], sigma: float) -> NDArray[np.float64]:
    """``(d + 2, M)`` matrix ``[c / sigma^2; -1 / (2 sigma^2); -||c||^2 / (2 sigma^2)]``.

    With a point augmented as ``[p, ||p||^2, 1]``, one matrix product gives
    ``-||p - c||^2 / (2 sigma^2)`` for every (point, centre) pair.
    """
    inv = 1.0 / (2.0 * sigma * sigma)
    aug = np.empty((centers.shape[1] + 2, centers.shape[0]), dtype=np.float64)
    aug[:-2] = centers.T * (2.0 * inv)
    aug[-2] = -inv
    aug[-1] = -inv * np.einsum("ij,ij->i", centers, centers)
    return aug


def _kernel_block(
    pts: NDArray[np.float64], aug_centers: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``exp(-||p - c||^2 / (2 sigma^2))`` for every (point, centre) pair: one GEMM, one exp.

    Rounding can leave an argument a few ulps above 0 where ``p = c``; ``exp`` of it is
    ``1 + O(1e-15)``, so no clipping pass is spent on it.
    """
    aug = np.empty((pts.shape[0], pts.shape[1] + 2), dtype=np.float64)
    aug[:, :-2] = pts
    aug[:, -2] = np.einsum("ij,ij->i", pts, pts)
    aug[:, -1] = 1.0
    kernel = aug @ aug_centers
    np.exp(kernel, out=kernel)
    return kernel


def _uniform_log_factors(centers: NDArray[np.float64], sigma: float) -> NDArray[np.float64]:
    """``sum_i log((1/2) int_{-1}^{1} exp(-(x - c_i)^2 / (2 sigma^2)) dx)`` per centre.

    By symmetry the integral depends on ``|c|``; ``erfc((|c| - 1)/s) - erfc((|c| + 1)/s)``
    equals ``erf((1 - c)/s) + erf((1 + c)/s)`` and keeps its precision for centres far
    outside the cube (a factor that underflows to 0 gives ``log = -inf``, i.e. ``f = 0``).
    """
    scale = sigma * math.sqrt(2.0)
    c = np.abs(centers)
    per_dim = (
        (sigma / 2.0)
        * math.sqrt(math.pi / 2.0)
        * (erfc((c - 1.0) / scale) - erfc((c + 1.0) / scale))
    )
    with np.errstate(divide="ignore"):
        out: NDArray[np.float64] = np.log(per_dim).sum(axis=-1)
    return out


# --- separable query families (appended for smooth_synopsis; see app.mechanisms.chebyshev) ---


@dataclass(frozen=True, eq=False)
class AnisotropicGaussianMixture:
    """``f(x) = sum_j a_j exp(-sum_i (x_i - c_ji)^2 / (2 sigma_i^2))`` with per-column ``sigma``.

    ``sigma`` is a scalar or a length-``d`` vector. This is the form a Gaussian-mixture
    query given in original units takes on the normalised ``[-1, 1]^d`` scale (each column
    has its own width after the curator's min/max normalisation). With equal widths it is
    :class:`GaussianMixture`.
    """

    centers: NDArray[np.float64]
    weights: NDArray[np.float64]
    sigma: NDArray[np.float64]

    def __post_init__(self) -> None:
        c = np.asarray(self.centers, dtype=np.float64)
        if c.ndim != 2 or c.shape[1] == 0:
            raise MechanismError(f"centers must be a non-empty (J, d) array; got shape {c.shape}")
        sigma = np.array(self.sigma, dtype=np.float64, copy=True)
        if sigma.ndim == 0:
            sigma = np.full(c.shape[1], float(sigma))
        if sigma.shape != (c.shape[1],):
            raise MechanismError(
                f"sigma must be a scalar or a vector of length d = {c.shape[1]}; "
                f"got shape {sigma.shape}"
            )
        if not (np.all(np.isfinite(sigma)) and np.all(sigma > 0)):
            raise MechanismError("sigma must be positive and finite in every column")
        centers, weights = _check_mixture(self.centers, self.weights, 1.0, batched=False)
        sigma.setflags(write=False)
        object.__setattr__(self, "centers", centers)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "sigma", sigma)

    @property
    def dim(self) -> int:
        return int(self.centers.shape[1])

    def evaluate(
        self, X: ArrayLike, *, block_elements: int = DEFAULT_BLOCK_ELEMENTS
    ) -> NDArray[np.float64]:
        """Values on the rows of ``X``: the isotropic kernel on ``x / sigma`` and ``c / sigma``."""
        pts = _as_points(X, self.dim) / self.sigma
        out = np.empty(pts.shape[0], dtype=np.float64)
        aug = _augmented_centers(self.centers / self.sigma, 1.0)
        step = max(1, block_elements // self.centers.shape[0])
        for start in range(0, pts.shape[0], step):
            kernel = _kernel_block(pts[start : start + step], aug)
            out[start : start + step] = kernel @ self.weights
        return out

    def answer(self, points: ArrayLike, weights: ArrayLike | None = None) -> float:
        return answer(self, points, weights)

    def uniform_expectation(self) -> float:
        """Exact ``E f(U)`` for ``U`` uniform on ``[-1, 1]^d`` (per-column erfc factors)."""
        scale = self.sigma * math.sqrt(2.0)
        c = np.abs(self.centers)
        per_dim = (
            (self.sigma / 2.0)
            * math.sqrt(math.pi / 2.0)
            * (erfc((c - 1.0) / scale) - erfc((c + 1.0) / scale))
        )
        return float(np.prod(per_dim, axis=1) @ self.weights)


@dataclass(frozen=True)
class Gaussian1D:
    """The one-column Gaussian kernel ``g(x) = exp(-(x - center)^2 / (2 sigma^2))``.

    A :class:`ProductQuery` factor given by its parameters rather than as a callable, so
    that :mod:`app.mechanisms.chebyshev` expands it exactly (proven coefficient tail) and
    many of them at once, instead of resolving an opaque function adaptively.
    """

    center: float
    sigma: float

    def __post_init__(self) -> None:
        for name in ("center", "sigma"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
                raise MechanismError(f"Gaussian factor {name} ({value!r}) must be a number")
            object.__setattr__(self, name, float(value))
        if not math.isfinite(self.center):
            raise MechanismError(f"Gaussian factor center ({self.center!r}) must be finite")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise MechanismError(
                f"Gaussian factor sigma ({self.sigma!r}) must be positive and finite"
            )

    def evaluate(self, x: ArrayLike) -> NDArray[np.float64]:
        """``exp(-(x - center)^2 / (2 sigma^2))`` elementwise."""
        diff = np.asarray(x, dtype=np.float64) - self.center
        out: NDArray[np.float64] = np.exp(-(diff * diff) / (2.0 * self.sigma * self.sigma))
        return out


Factor = Callable[[NDArray[np.float64]], ArrayLike] | Gaussian1D | NDArray[np.float64] | None


@dataclass(frozen=True, eq=False)
class ProductQuery:
    """``f(x) = weight * prod_i g_i(x_i)``: a product of one-dimensional functions.

    Each factor is a vectorised callable ``g_i(x) -> values`` on ``[-1, 1]``, a
    :class:`Gaussian1D` kernel, a vector of 1-D Chebyshev coefficients ``(a_0, a_1, ...)``
    meaning ``g_i = sum_k a_k T_k``, or ``None`` for the constant 1 (the query does not
    depend on column ``i``).
    """

    factors: tuple[Factor, ...]
    weight: float = 1.0

    def __post_init__(self) -> None:
        factors = tuple(self.factors)
        if not factors:
            raise MechanismError("a product query needs one factor per column; got none")
        checked: list[Factor] = []
        for i, g in enumerate(factors):
            if g is None or callable(g) or isinstance(g, Gaussian1D):
                checked.append(g)
                continue
            coef = np.array(g, dtype=np.float64, copy=True)
            if coef.ndim != 1 or coef.size == 0:
                raise MechanismError(
                    f"factor {i} must be a callable, a Gaussian1D, None or a non-empty vector of "
                    f"Chebyshev coefficients; got an array of shape {coef.shape}"
                )
            if not np.all(np.isfinite(coef)):
                raise MechanismError(f"factor {i} has non-finite Chebyshev coefficients")
            coef.setflags(write=False)
            checked.append(coef)
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight)):
            raise MechanismError(f"weight ({self.weight!r}) must be a finite number")
        object.__setattr__(self, "factors", tuple(checked))
        object.__setattr__(self, "weight", float(self.weight))

    @property
    def dim(self) -> int:
        return len(self.factors)

    def evaluate(self, X: ArrayLike) -> NDArray[np.float64]:
        pts = _as_points(X, self.dim)
        out = np.full(pts.shape[0], self.weight, dtype=np.float64)
        for i, g in enumerate(self.factors):
            if g is None:
                continue
            if isinstance(g, Gaussian1D):
                values = g.evaluate(pts[:, i])
            elif callable(g):
                values = np.asarray(g(pts[:, i].copy()), dtype=np.float64)
                if values.shape != (pts.shape[0],):
                    raise MechanismError(
                        f"factor {i} must return one value per point; got shape {values.shape}"
                    )
            else:
                values = np.asarray(chebval(pts[:, i], g), dtype=np.float64)
            out *= values
        return out


@dataclass(frozen=True, eq=False)
class Polynomial:
    """``f(x) = sum_j a_j prod_i x_i^(p_ji)``: a sum of monomials.

    ``exponents`` is a ``(J, d)`` array of non-negative integers, ``coefficients`` is
    ``(J,)``.
    """

    exponents: NDArray[np.int64]
    coefficients: NDArray[np.float64]

    def __post_init__(self) -> None:
        raw = np.asarray(self.exponents)
        if raw.ndim != 2 or raw.shape[0] == 0 or raw.shape[1] == 0:
            raise MechanismError(f"exponents must be a non-empty (J, d) array; got {raw.shape}")
        if not np.issubdtype(raw.dtype, np.integer) or np.any(raw < 0):
            raise MechanismError("exponents must be non-negative integers")
        exponents = np.array(raw, dtype=np.int64, copy=True)
        coefficients = np.array(self.coefficients, dtype=np.float64, copy=True)
        if coefficients.shape != (exponents.shape[0],):
            raise MechanismError(
                f"coefficients must have shape ({exponents.shape[0]},); got {coefficients.shape}"
            )
        if not np.all(np.isfinite(coefficients)):
            raise MechanismError("polynomial coefficients must be finite")
        exponents.setflags(write=False)
        coefficients.setflags(write=False)
        object.__setattr__(self, "exponents", exponents)
        object.__setattr__(self, "coefficients", coefficients)

    @property
    def dim(self) -> int:
        return int(self.exponents.shape[1])

    def evaluate(self, X: ArrayLike) -> NDArray[np.float64]:
        pts = _as_points(X, self.dim)
        out = np.zeros(pts.shape[0], dtype=np.float64)
        for a, p in zip(self.coefficients, self.exponents, strict=True):
            out += a * np.prod(pts ** p[None, :], axis=1)
        return out
