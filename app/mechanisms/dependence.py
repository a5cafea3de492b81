"""The co-spread statistic: one private number for the dependence a product law misses.

Why (``smooth_synopsis``, "Dependence correction")
--------------------------------------------------
A Gaussian kernel is a product ``prod_i exp(h_i(x_i))`` with
``h_i = -(x_i - c_i)^2 / (2 s_i^2)``. The synopsis answers it, past the released interaction
moments, as if the columns were independent: ``prod_i E exp(h_i)``. The cumulant expansion
of ``log E exp(sum_i h_i)`` gives the first term that misses::

    log E prod_i e^{h_i} = sum_i log E e^{h_i} + 1/2 sum_{i != j} Cov(h_i, h_j) + ...

and ``Cov(h_i, h_j)`` splits into a part free of the centre,
``kappa_i kappa_j Cov(x_i^2, x_j^2)`` with ``kappa_i = 1 / (2 s_i^2)``, and parts linear and
quadratic in the centre coordinates (``Cov(x_i^2, x_j)``, ``Cov(x_i, x_j)``), whose signs
vary from query to query. The centre-free part only needs the *co-spread*

    A = sum_{i != j} Cov(x_i^2, x_j^2),

one number, which is cheap to measure privately; the others need ``d`` and ``d^2`` numbers
and drown in noise at the sizes of the benchmark data (worked out in the closing notes of
issue 4). Measured with exact statistics on the paper-000 protocol (one kernel, centre
``U[-1, 1]^d``): the mean ``|log truth - log independence answer|`` at ``sigma = 2`` falls
from 0.39 to 0.13 on CRM (d = 100), 0.10 to 0.056 on WDBC and 0.034 to 0.020 on PKS, and
is unchanged on CTG (0.014), whose columns barely co-spread.

For per-column widths the pairs are weighted by ``kappa_i kappa_j``; with one number the
pairs are taken as exchangeable, ``Cov(x_i^2, x_j^2) = A / (d (d - 1))``, so

    lambda = A / (2 d (d - 1)) [(sum_i kappa_i)^2 - sum_i kappa_i^2]     (= A / (8 s^4))

is the log-factor of every kernel of the query (exact to this order for equal widths).

Measurement (privacy)
---------------------
With a public centring ``m_i`` (the synopsis's released ``(1 + b_hat_{2 e_i}) / 2``,
clipped to ``[0, 1]``: post-processing of an earlier release, so adaptive composition
applies), each row contributes

    g(x) = (sum_i u_i)^2 - sum_i u_i^2 = sum_{i != j} u_i u_j,   u_i = x_i^2 - m_i,

whose mean over the rows estimates ``A`` (``E_x u_i u_j = Cov(x_i^2, x_j^2) + delta_i
delta_j`` for the centring errors ``delta_i = m_i - E x_i^2``). Since
``(sum u)^2 >= 0``, ``g >= -sum_i u_i^2 >= -lower`` with
``lower = sum_i max(m_i, 1 - m_i)^2 <= d`` (``u_i`` lies in ``[-m_i, 1 - m_i]``), and the
row values are clipped above at ``upper = CLIP_PER_COLUMN d`` (and below at ``-lower``,
which moves no exact value but catches the rounding of the computed ``g``). Under
replace-one neighbours the clipped mean moves by at most

    Delta_1 = (upper + lower) / n,

and it is released once with OpenDP's Laplace mechanism at the declared
:func:`co_spread_sensitivity` (``Delta_1`` plus the rounding of the mean, through
:func:`app.mechanisms.noise.float_sensitivity`) over ``epsilon``: pure ``epsilon``-DP
(``n``, ``d`` and the centring are public). ``upper = 4 d`` clipped no row
of WDBC, CTG or PKS and moved CRM's mean by 1 % (52.6 -> 52.0); ``2 d`` cost CRM 11 %.

Error of the estimate
---------------------
Two independent parts, both public: the Laplace noise (standard deviation ``sqrt(2) b``)
and the centring. With independent zero-mean centring errors of variance ``v`` (the
moments' noise: ``v = (s / 2)^2``), ``sum_{i != j} delta_i delta_j`` has mean 0 and
standard deviation ``v sqrt(2 d (d - 1))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtri

from app.mechanisms import noise
from app.mechanisms.data import RowSource, StreamSum, iter_checked, pairwise_total
from app.mechanisms.errors import MechanismError

#: Name of the measurement step (its part of the privacy cost).
STEP = "co_spread"
#: Rows' ``g`` values are clipped above at ``CLIP_PER_COLUMN * d`` (module docstring).
CLIP_PER_COLUMN = 4.0


def row_values(batch: NDArray[np.float64], centring: NDArray[np.float64]) -> NDArray[np.float64]:
    """``g(x) = (sum_i u_i)^2 - sum_i u_i^2`` with ``u_i = x_i^2 - m_i``, one per row.

    Elementwise operations only, column by column, so a row's computed value depends on
    that row alone (not on its place in a batch, as a vectorised reduction's order might).
    """
    u = batch * batch - centring[None, :]
    total = u[:, 0].copy()
    squares = u[:, 0] * u[:, 0]
    for i in range(1, u.shape[1]):
        total += u[:, i]
        squares += u[:, i] * u[:, i]
    out: NDArray[np.float64] = total * total - squares
    return out


def clip_bounds(centring: NDArray[np.float64]) -> tuple[float, float]:
    """``(lower, upper)``: ``g >= -lower`` always (in exact arithmetic; computed rows are
    clipped to it too); rows are clipped above at ``upper``."""
    m = np.asarray(centring, dtype=np.float64)
    lower = float(np.sum(np.maximum(m, 1.0 - m) ** 2))
    return lower, CLIP_PER_COLUMN * m.size


def co_spread_sensitivity(n: int, lower: float, upper: float) -> float:
    """Declared L1 sensitivity of the clipped mean: exact ``(upper + lower) / n`` (module
    docstring) through :func:`app.mechanisms.noise.float_sensitivity`.

    Every row's computed value is clipped to ``[-lower, upper]``, and the ``n`` of them are
    summed with :mod:`app.mechanisms.data`'s bounded-depth sums and divided by ``n``, so
    the computed mean is within ``gamma_{h+1} max(lower, upper)`` of the exact mean of the
    clipped values (``h =`` :func:`app.mechanisms.data.row_sum_depth`). Relative allowance
    at most ``2 n gamma_{h+1}``: ``2.7e-12`` at ``n = 569``, ``6.4e-11`` at ``10^4``,
    ``9.1e-9`` at ``10^6``.
    """
    if n < 1 or not (lower >= 0 and upper > 0):
        raise MechanismError("the co-spread sensitivity needs n >= 1, lower >= 0, upper > 0")
    return noise.float_sensitivity((upper + lower) / n, noise.mean_rounding(n) * max(lower, upper))


def clipped_mean(source: RowSource, centring: NDArray[np.float64]) -> float:
    """The statistic :func:`measure` releases: the mean over rows of ``g`` clipped to
    ``[-lower, upper]``, summed as :func:`co_spread_sensitivity` assumes."""
    lower, upper = clip_bounds(centring)
    totals = StreamSum()
    for batch in iter_checked(source):
        if batch.shape[0]:
            totals.add(pairwise_total(np.clip(row_values(batch, centring), -lower, upper)))
    return float(totals.total()) / source.n_rows


@dataclass(frozen=True, eq=False)
class CoSpread:
    """The released co-spread ``A_hat`` and what is publicly known of its error.

    ``measurement`` holds the noisy value and its Laplace calibration;
    ``centring_stddev`` is the standard deviation of the centring term (module docstring,
    "Error of the estimate"); ``lower`` and ``upper`` are the clipping bounds used.
    """

    measurement: noise.NoisyVector
    d: int
    lower: float
    upper: float
    centring_stddev: float

    def __post_init__(self) -> None:
        if self.measurement.calibration.dimension != 1:
            raise MechanismError("the co-spread is one number")
        if self.d < 2:
            raise MechanismError("the co-spread needs at least two columns")
        if not (math.isfinite(self.centring_stddev) and self.centring_stddev >= 0):
            raise MechanismError("centring_stddev must be finite and >= 0")

    @property
    def value(self) -> float:
        return float(self.measurement.values[0])

    @property
    def stddev(self) -> float:
        """Standard deviation of ``A_hat - A``: Laplace noise and centring, in quadrature."""
        return math.hypot(self.measurement.calibration.stddev, self.centring_stddev)

    def quantile(self, level: float) -> float:
        """Half-width ``q`` with ``P(|A_hat - A| <= q) >= level``, approximately: the Laplace
        quantile ``b log(1 / (1 - level))`` and the normal one of the centring term, in
        quadrature."""
        laplace = self.measurement.calibration.scale * math.log(1.0 / (1.0 - level))
        return math.hypot(laplace, float(ndtri(0.5 + level / 2.0)) * self.centring_stddev)

    def pair_weight(self, curvature: ArrayLike) -> NDArray[np.float64]:
        """``[(sum_i kappa_i)^2 - sum_i kappa_i^2] / (2 d (d - 1))`` per query: the
        log-factor is ``pair_weight * A`` (module docstring)."""
        k = np.asarray(curvature, dtype=np.float64)
        if k.ndim != 2 or k.shape[1] != self.d:
            raise MechanismError(f"curvature must be (Q, {self.d}); got {k.shape}")
        total = k.sum(axis=1)
        out: NDArray[np.float64] = (total * total - np.einsum("qi,qi->q", k, k)) / (
            2.0 * self.d * (self.d - 1)
        )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "statistic": "A = sum_{i != j} Cov(x_i^2, x_j^2)",
            "measurement": self.measurement.to_dict(),
            "d": self.d,
            "lower": self.lower,
            "upper": self.upper,
            "centring_stddev": self.centring_stddev,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CoSpread:
        return cls(
            measurement=noise.NoisyVector.from_dict(data["measurement"]),
            d=int(data["d"]),
            lower=float(data["lower"]),
            upper=float(data["upper"]),
            centring_stddev=float(data["centring_stddev"]),
        )


def measure(
    source: RowSource,
    centring: ArrayLike,
    epsilon: float,
    *,
    centring_variance: float,
) -> CoSpread:
    """Release ``A_hat`` = the clipped mean of ``g`` plus Laplace noise (module docstring).

    ``centring`` must be public (released earlier or declared); ``centring_variance`` is
    the variance of each centring error, for the error model.
    """
    m = np.asarray(centring, dtype=np.float64)
    d = source.n_cols
    if m.shape != (d,) or not np.all((m >= 0.0) & (m <= 1.0)):
        raise MechanismError(f"the centring must be {d} values in [0, 1]")
    if d < 2:
        raise MechanismError("the co-spread needs at least two columns")
    lower, upper = clip_bounds(m)
    # calibrated from public values (n, the released centring) before the rows are read
    calibration = noise.calibrate(
        "laplace",
        sensitivity=co_spread_sensitivity(source.n_rows, lower, upper),
        epsilon=epsilon,
        dimension=1,
    )
    measurement = noise.release(calibration, [clipped_mean(source, m)], step=STEP)
    return CoSpread(
        measurement=measurement,
        d=d,
        lower=lower,
        upper=upper,
        centring_stddev=float(centring_variance) * math.sqrt(2.0 * d * (d - 1)),
    )
