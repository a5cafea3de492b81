"""Candidate support points for the synthesis LP (paper 000, Algorithm 1 and §3.4).

Everything here is post-processing: it uses public parameters, an injected
``numpy.random.Generator`` and, for the ellipsoid, quantities that were already measured
with noise. No function reads data.

* :func:`full_grid` -- Algorithm 1's grid ``A^d`` with ``a_k = (2k + 1 - N) / N``,
  ``k = 0..N-1`` (cell centres of ``N`` equal cells per axis), ``N^d`` points.
* :func:`hypercube` -- ``C`` points drawn uniformly from ``[-1, 1]^d`` (or, with
  ``resolution=N``, uniformly from the ``N^d`` grid, the literal sampling of appendix A.5).
* :func:`ellipsoid` -- ``C`` points uniform in the ellipsoid ``centre + sum_j r_j v_j u_j``
  (``|v| <= 1``) spanned by the private principal axes ``u_j`` with radii ``r_j``
  (``sqrt(lambda_hat_j)`` in §3.4), clipped to ``[-1, 1]^d``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms.errors import MechanismError

#: Largest number of points :func:`full_grid` builds.
MAX_FULL_GRID_POINTS = 2_000_000


def grid_axis(N: int) -> NDArray[np.float64]:
    """``a_k = (2k + 1 - N) / N`` for ``k = 0..N-1`` (Algorithm 1, notations)."""
    _check_count("N", N)
    out: NDArray[np.float64] = (2.0 * np.arange(N) + 1.0 - N) / N
    return out


def full_grid(d: int, N: int) -> NDArray[np.float64]:
    """All ``N^d`` points of ``A^d``, last coordinate varying fastest."""
    _check_count("d", d)
    _check_count("N", N)
    if N**d > MAX_FULL_GRID_POINTS:
        raise MechanismError(
            f"the full grid has N^d = {N}^{d} points, more than {MAX_FULL_GRID_POINTS}; "
            "use grid='hypercube' or grid='pca_ellipsoid' with grid_size=C"
        )
    axis = grid_axis(N)
    mesh = np.meshgrid(*([axis] * d), indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


def snap_to_grid(X: NDArray[np.float64], N: int) -> NDArray[np.float64]:
    """Nearest point of ``A`` per coordinate (Algorithm 1 steps 3-5).

    ``a_k`` is the centre of the cell that holds ``x``: ``k = floor(N (x + 1) / 2)``.
    """
    k = np.clip(np.floor((X + 1.0) * (N / 2.0)), 0, N - 1)
    out: NDArray[np.float64] = (2.0 * k + 1.0 - N) / N
    return out


def hypercube(
    C: int, d: int, rng: np.random.Generator, *, resolution: int | None = None
) -> NDArray[np.float64]:
    """``C`` uniform points of ``[-1, 1]^d`` (``resolution=N``: of the grid ``A^d``)."""
    _check_count("grid_size", C)
    _check_count("d", d)
    if resolution is None:
        return rng.uniform(-1.0, 1.0, size=(C, d))
    return grid_axis(resolution)[rng.integers(0, resolution, size=(C, d))]


def ellipsoid(
    C: int,
    centre: ArrayLike,
    axes: ArrayLike,
    radii: ArrayLike,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """``C`` points uniform in ``{centre + U diag(radii) v : |v| <= 1}``, clipped to the cube.

    ``U`` (``axes``) is ``d x k`` with orthonormal columns. A uniform point of the unit
    ``k``-ball is ``g / |g| * w^(1/k)`` with ``g ~ N(0, I_k)`` and ``w ~ U[0, 1]``.
    """
    _check_count("grid_size", C)
    c = np.asarray(centre, dtype=np.float64)
    U = np.asarray(axes, dtype=np.float64)
    r = np.asarray(radii, dtype=np.float64)
    if U.ndim != 2 or c.shape != (U.shape[0],) or r.shape != (U.shape[1],):
        raise MechanismError(
            f"ellipsoid shapes disagree: centre {c.shape}, axes {U.shape}, radii {r.shape}"
        )
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(U)) and np.all(np.isfinite(r))):
        raise MechanismError("ellipsoid centre, axes and radii must be finite")
    if np.any(r < 0):
        raise MechanismError("ellipsoid radii must be non-negative")
    k = U.shape[1]
    g = rng.standard_normal((C, k))
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    norms[norms == 0.0] = 1.0
    ball = g / norms * rng.uniform(0.0, 1.0, size=(C, 1)) ** (1.0 / k)
    points = c + (ball * r) @ U.T
    out: NDArray[np.float64] = np.clip(points, -1.0, 1.0)
    return out


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{name} ({value!r}) must be a positive integer")
