"""The one place where differential-privacy noise is drawn: OpenDP measurements.

Every noisy value a mechanism releases comes from :func:`sample` (or :func:`release`),
which builds an OpenDP measurement (``dp.m.make_laplace`` / ``dp.m.make_gaussian``) and
invokes it. numpy's ``laplace`` / ``normal`` are never used for privacy noise: their
floating-point samplers leak through the low-order bits (Mironov 2012). Only OpenDP's
``"contrib"`` feature is enabled; ``"floating-point"``, ``"idealized-numerics"`` and
``"honest-but-curious"`` stay off (DESIGN §2.3).

The privacy that is *charged* is what OpenDP's privacy map returns for the calibrated
scale and the declared sensitivity, and it is never more than what was requested.

Mechanisms (``mechanism=``)
---------------------------
``"laplace"`` -- pure ``epsilon``-DP vector Laplace under the L1 metric. Scale
  ``b = k * Delta_1 / epsilon`` for ``k`` adaptive releases (``compositions``), nudged up
  by a few ulps if OpenDP's map rounds above ``epsilon``. This is paper 000, Algorithm 1
  step 9, *corrected* to the true sensitivity (the paper writes ``Lap(t^d/(n eps))``;
  under replace-one neighbours the L1 sensitivity of ``R`` non-constant moments is
  ``2R/n``, see below).

``"laplace_approx"`` -- the ``(epsilon, delta)`` Laplace variant of paper 000 §3.2:
  i.i.d. Laplace noise whose scale grows like ``sqrt(R log(1/delta)) / (n epsilon)``
  instead of ``R / (n epsilon)``. The paper justifies it by "the composition theorem"
  without constants. Honest accounting: each of the ``R`` coordinates has sensitivity
  ``Delta_inf = 2/n``, so coordinate ``j`` alone is ``eps_0 = Delta_inf / b``-DP, hence
  ``eps_0^2 / 2``-zCDP (Bun & Steinke 2016, Prop. 3.3); zCDP composes additively over the
  ``R`` coordinates (and over ``k`` adaptive releases) to ``rho = k R eps_0^2 / 2``, which
  OpenDP converts to ``(epsilon, delta)``. The scale is found by searching OpenDP's map
  of exactly that construction (``make_pureDP_to_zCDP`` of a scalar Laplace, composed
  ``k R`` times, ``make_zCDP_to_approxDP``, ``make_fix_delta``); if the plain pure-DP
  bound ``k R Delta_inf / b`` is smaller, that is charged instead (with ``delta = 0``).
  The paper's *literal* scale ``sqrt(R log(1/delta)) / (n epsilon)`` is NOT
  ``(epsilon, delta)``-DP under replace-one neighbours: it ignores the factor 2 of the
  replace-one sensitivity and the ``sqrt(2)`` of advanced composition: at ``epsilon = 1,
  delta = 1e-10, n = 569`` it costs ``epsilon' = 2.28`` for ``R = 30`` and ``2.68`` for
  ``R >= 100`` (:func:`cost_of_scale` computes the figure for any scale; the tests pin
  it). It is not offered as a calibration. The calibrated scale is ``2.56x`` the literal
  one once the zCDP route wins (``R >~ 50``), and equals the pure scale below that.

``"gaussian"`` -- vector Gaussian under the L2 metric, accounted in zCDP
  (``rho = k Delta_2^2 / (2 s^2)``) and converted to ``(epsilon, delta)`` by OpenDP; the
  smallest scale whose ``epsilon`` at the requested ``delta`` is within budget is found
  by a root search over that map.

Mechanisms of several steps in one zCDP budget
----------------------------------------------
A mechanism that spends one ``(epsilon, delta)`` over several steps can account them in
zCDP, where ``rho`` adds up (also adaptively), and convert once: :func:`rho_budget` is the
largest ``rho`` whose OpenDP conversion stays within ``(epsilon, delta)``;
:func:`gaussian_scale_for_rho` and :func:`noisy_max_scale` the smallest vector-Gaussian and
noisy-max (Gumbel, OpenDP's ``make_noisy_max``) scales of a step's share ``rho``;
:func:`noisy_max` draws a selection and :func:`gaussian_at_scale` records a Gaussian step
drawn with :func:`sample` (``app.mechanisms.marginal_tree`` uses them).

Sensitivity of the moment vector (paper 000, Algorithm 1 step 8; DESIGN §2.2)
-------------------------------------------------------------------------------
``b_r(D) = (1/n) sum_{x in D} T_r(x)`` for ``R`` non-constant multi-indices ``r``.
Replace-one neighbours ``D ~ D'`` have the same ``n`` and differ in one row ``z -> z'``,
so ``b_r(D) - b_r(D') = (T_r(z) - T_r(z')) / n``. Every ``|T_r| <= 1`` on ``[-1, 1]^d``
(a product of cosines), hence ``|b_r(D) - b_r(D')| <= 2/n`` for every ``r``:

* L-infinity sensitivity ``2/n`` (per coordinate);
* L1 sensitivity ``<= R * 2/n = 2R/n``;
* L2 sensitivity ``<= sqrt(R) * 2/n = 2 sqrt(R)/n``.

All three are attained when the basis holds only first-degree terms ``T_1(x_i) = x_i``
(``z = (1, ..., 1)``, ``z' = (-1, ..., -1)``). The constant function is left out
because it is 1 on every dataset (it would add ``0`` sensitivity but count in ``R``).
:func:`moment_sensitivity` returns these plus the floating-point allowance below; the
tests brute-force them on random and adversarial neighbour pairs.

Floating-point rounding (every declared sensitivity)
----------------------------------------------------
OpenDP's guarantee needs the declared sensitivity to bound the change of the statistic
*as computed*, in float64, between neighbours; the bounds above are in exact arithmetic.
Each mechanism therefore (a) makes every computed per-row term obey the exact bound
(Chebyshev values clipped to ``[-1, 1]``, histogram counts exact integers, co-spread row
values clipped to ``[-lower, upper]``), so only the rounding of the sums, of the
division by ``n`` and of later arithmetic remains, and (b) bounds that rounding: if
every computed value ``f^(D)`` is within ``E`` (in the metric's norm) of the exact
``f(D)``, then

    ||f^(D) - f^(D')|| <= Delta + 2 E,

and :func:`float_sensitivity` declares ``(Delta + 2 E)(1 + 2^-48)`` (the factor covers
the few roundings in evaluating the formulas themselves; underflow, ``<= 2^-1074`` a step,
is far below it). Sums go through :mod:`app.mechanisms.data`'s bounded-depth summation
(``h = 2 bit_length(n)`` additions at most), so a sum of ``n`` terms ``|t| <= 1`` divided
by ``n`` is within ``gamma_{h+1}`` (:func:`gamma`, ``~ (h + 1) u``, ``u = 2^-53``) of the
exact mean. For the moments ``E = gamma_{h+1}`` per coordinate (``R gamma_{h+1}`` in L1,
``sqrt(R) gamma_{h+1}`` in L2), i.e. a relative allowance ``n gamma_{h+1} ~ (2 log2 n + 3)
n u``: ``1.3e-12`` at ``n = 569`` (``h = 20``), ``3.2e-11`` at ``10^4``, ``4.6e-9`` at
``10^6``; below ``10^-6`` up to ``n = 1.5 10^8``. The other mechanisms state theirs
(:func:`app.mechanisms.marginals.histogram_sensitivity`,
:func:`app.mechanisms.marginal_tree.pair_table_sensitivity`,
:func:`app.mechanisms.pca.covariance_sensitivity`, :func:`app.mechanisms.pca.mean_sensitivity`,
:func:`app.mechanisms.dependence.co_spread_sensitivity`;
:func:`app.mechanisms.marginal_tree.score_sensitivity` was the first). Records keep the
sensitivity they were calibrated with (:class:`NoiseCalibration`), so releases made
before the allowance load and answer as they did.

Time: OpenDP samples about 45 us per Laplace value and 110 us per Gaussian value on a
2-core machine (the Python-to-Rust conversion is not the cost), i.e. ~0.5 s / ~1.1 s for
``R = 10^4``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import opendp.prelude as dp
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq
from scipy.special import erfinv

from app.mechanisms.data import row_sum_depth
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import CostPart, PrivacyCost

dp.enable_features("contrib")

MECHANISMS = ("laplace", "laplace_approx", "gaussian")
#: Metric of the ``sensitivity`` each mechanism is calibrated to.
METRIC = {"laplace": "l1", "laplace_approx": "linf", "gaussian": "l2"}
_DISTRIBUTION = {"laplace": "laplace", "laplace_approx": "laplace", "gaussian": "gaussian"}


#: IEEE binary64 unit roundoff: ``fl(a op b) = (a op b)(1 + e)`` with ``|e| <= UNIT_ROUNDOFF``.
UNIT_ROUNDOFF = 2.0**-53
#: Relative margin of :func:`float_sensitivity` for rounding in the formulas themselves.
FORMULA_MARGIN = 2.0**-48


def gamma(k: int) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: ``prod_{i <= k} (1 + e_i)``, ``|e_i| <= u``,
    lies within ``gamma_k`` of 1, so ``k`` chained roundings err by at most ``gamma_k``
    relative (and ``gamma_a + gamma_b + gamma_a gamma_b <= gamma_{a+b}``)."""
    if k < 0 or k * UNIT_ROUNDOFF >= 0.5:
        raise MechanismError(f"gamma_k needs 0 <= k u < 1/2; got k = {k}")
    return k * UNIT_ROUNDOFF / (1.0 - k * UNIT_ROUNDOFF)


def float_sensitivity(exact: float, rounding: float) -> float:
    """Declared sensitivity of a statistic computed in floating point (module doc,
    "Floating-point rounding"): ``(exact + 2 rounding)(1 + 2^-48)``.

    ``exact`` is the sensitivity in exact arithmetic of the statistic whose per-row terms
    the code computes (a proof's ``Delta``; 0 for a statistic that is constant in exact
    arithmetic, which still moves by its rounding), ``rounding`` a bound ``E`` on the distance,
    in the same norm, between the computed and the exact statistic of any one dataset.
    Neighbours' computed values then differ by at most ``Delta + 2 E``; the factor
    ``1 + 2^-48 = 1 + 32 u`` rounds that up past the roundings of the (short) formulas that
    produced ``exact``, ``rounding`` and this sum.
    """
    if not (math.isfinite(exact) and exact >= 0):
        raise MechanismError(f"exact sensitivity ({exact!r}) must be finite and >= 0")
    if not (math.isfinite(rounding) and rounding >= 0):
        raise MechanismError(f"rounding bound ({rounding!r}) must be finite and >= 0")
    if exact == 0.0 and rounding == 0.0:
        raise MechanismError("a sensitivity of 0 cannot calibrate noise")
    return (exact + 2.0 * rounding) * (1.0 + FORMULA_MARGIN)


def mean_rounding(n: int) -> float:
    """Bound on ``|computed - exact|`` of a mean of ``n`` terms in ``[-1, 1]`` summed by
    :mod:`app.mechanisms.data`'s bounded-depth sums and divided by ``n``: ``gamma_{h+1}``,
    ``h =`` :func:`app.mechanisms.data.row_sum_depth` ``(n)`` (the sum errs by ``gamma_h n``,
    the division adds ``u`` relative)."""
    return gamma(row_sum_depth(n) + 1)


def moment_sensitivity(n: int, R: int) -> dict[str, float]:
    """Declared sensitivities of ``R`` non-constant Chebyshev moments under replace-one:
    exact ``2/n`` (L-inf), ``2R/n`` (L1), ``2 sqrt(R)/n`` (L2), each through
    :func:`float_sensitivity` with the rounding ``e = mean_rounding(n)`` per coordinate
    (``R e`` in L1, ``sqrt(R) e`` in L2; module doc)."""
    if n < 1 or R < 1:
        raise MechanismError(f"n ({n}) and R ({R}) must be positive")
    e = mean_rounding(n)
    return {
        "linf": float_sensitivity(2.0 / n, e),
        "l1": float_sensitivity(2.0 * R / n, R * e),
        "l2": float_sensitivity(2.0 * math.sqrt(R) / n, math.sqrt(R) * e),
    }


@dataclass(frozen=True)
class NoiseCalibration:
    """Noise scale for ``compositions`` releases of a ``dimension``-vector, and its cost.

    ``sensitivity`` is in the metric of the mechanism (``metric``: L1 for ``laplace``,
    per-coordinate L-infinity for ``laplace_approx``, L2 for ``gaussian``). ``epsilon`` /
    ``delta`` are what OpenDP's map charges for all ``compositions`` releases together
    (<= the requested ``target_epsilon`` / ``target_delta``).
    """

    mechanism: str
    sensitivity: float
    dimension: int
    scale: float
    epsilon: float
    delta: float
    target_epsilon: float
    target_delta: float
    compositions: int = 1
    accounting: str = "pure"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise MechanismError(
                f"noise mechanism ({self.mechanism!r}) must be one of {MECHANISMS}"
            )
        for name in ("sensitivity", "scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise MechanismError(f"{name} ({value!r}) must be positive and finite")
        if self.dimension < 1 or self.compositions < 1:
            raise MechanismError("dimension and compositions must be positive integers")
        if self.epsilon > self.target_epsilon * (1 + 1e-12) or self.delta > self.target_delta:
            raise MechanismError("the charged privacy exceeds the requested budget")

    @property
    def distribution(self) -> str:
        """``"laplace"`` or ``"gaussian"``: the law of each noise coordinate."""
        return _DISTRIBUTION[self.mechanism]

    @property
    def metric(self) -> str:
        return METRIC[self.mechanism]

    @property
    def stddev(self) -> float:
        """Standard deviation of one noise coordinate (``sqrt(2) b`` for Laplace(b))."""
        return self.scale * (math.sqrt(2.0) if self.distribution == "laplace" else 1.0)

    def cost_part(self, step: str) -> CostPart:
        return CostPart(step=step, epsilon=self.epsilon, delta=self.delta)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "distribution": self.distribution,
            "metric": self.metric,
            "sensitivity": self.sensitivity,
            "dimension": self.dimension,
            "scale": self.scale,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "target_epsilon": self.target_epsilon,
            "target_delta": self.target_delta,
            "compositions": self.compositions,
            "accounting": self.accounting,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoiseCalibration:
        return cls(
            mechanism=str(data["mechanism"]),
            sensitivity=float(data["sensitivity"]),
            dimension=int(data["dimension"]),
            scale=float(data["scale"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            target_epsilon=float(data["target_epsilon"]),
            target_delta=float(data["target_delta"]),
            compositions=int(data["compositions"]),
            accounting=str(data["accounting"]),
        )


@dataclass(frozen=True, eq=False)
class NoisyVector:
    """Noisy values released by one measurement step, with their calibration."""

    step: str
    values: NDArray[np.float64]
    calibration: NoiseCalibration

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float64, copy=True)
        if values.ndim != 1 or values.size != self.calibration.dimension:
            raise MechanismError(
                f"noisy values of step {self.step!r} must be a vector of length "
                f"{self.calibration.dimension}"
            )
        values.setflags(write=False)
        object.__setattr__(self, "values", values)

    @property
    def privacy_cost(self) -> PrivacyCost:
        return PrivacyCost.compose([self.calibration.cost_part(self.step)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "values": [float(v) for v in self.values],
            "calibration": self.calibration.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NoisyVector:
        return cls(
            step=str(data["step"]),
            values=np.asarray(data["values"], dtype=np.float64),
            calibration=NoiseCalibration.from_dict(data["calibration"]),
        )


def calibrate(
    mechanism: str,
    *,
    sensitivity: float,
    epsilon: float,
    delta: float = 0.0,
    dimension: int,
    compositions: int = 1,
) -> NoiseCalibration:
    """Smallest scale whose OpenDP-charged cost fits in ``(epsilon, delta)``.

    ``compositions`` releases (e.g. the ``L`` iterations of private subspace iteration,
    each adaptively chosen from earlier outputs) share the budget: basic composition for
    pure DP, additive zCDP otherwise (both hold under adaptive composition).
    """
    _check_request(mechanism, sensitivity, epsilon, delta, dimension, compositions)
    if mechanism == "laplace":
        # OpenDP rounds its map outward; step up a few ulps
        scale = _nudged(
            compositions * sensitivity / epsilon,
            lambda b: _pure_laplace_epsilon(b, sensitivity, dimension, compositions) > epsilon,
            _next_up,
            f"epsilon = {epsilon:.6g} for {dimension} value(s) of sensitivity "
            f"{sensitivity:.6g} (laplace noise)",
        )
        charged = _pure_laplace_epsilon(scale, sensitivity, dimension, compositions)
        return NoiseCalibration(
            mechanism, sensitivity, dimension, scale, charged, 0.0, epsilon, delta, compositions
        )

    def charged_epsilon(scale: float) -> float:
        try:
            return cost_of_scale(mechanism, scale, sensitivity, dimension, delta, compositions)[0]
        except dp.OpenDPException:  # the map overflows for absurdly small scales
            return math.inf

    scale = _smallest_scale(
        charged_epsilon,
        epsilon,
        _initial_scale(mechanism, sensitivity, epsilon, delta, dimension, compositions),
        f"epsilon = {epsilon:.6g} at delta = {delta:.6g} for {dimension} value(s) of "
        f"sensitivity {sensitivity:.6g}"
        + ("" if compositions == 1 else f", released {compositions} times")
        + f" ({mechanism} noise)",
    )
    eps, dlt = cost_of_scale(mechanism, scale, sensitivity, dimension, delta, compositions)
    accounting = "pure" if dlt == 0.0 else "zcdp"
    return NoiseCalibration(
        mechanism,
        sensitivity,
        dimension,
        scale,
        eps,
        dlt,
        epsilon,
        delta,
        compositions,
        accounting,
    )


def cost_of_scale(
    mechanism: str,
    scale: float,
    sensitivity: float,
    dimension: int,
    delta: float = 0.0,
    compositions: int = 1,
) -> tuple[float, float]:
    """``(epsilon, delta)`` that OpenDP's map charges for ``compositions`` releases at ``scale``.

    For ``laplace_approx`` the smaller of the zCDP route (at ``delta``) and the pure-DP
    route (``delta = 0``) is returned; see the module docstring.
    """
    if mechanism == "laplace":
        return _pure_laplace_epsilon(scale, sensitivity, dimension, compositions), 0.0
    if mechanism == "gaussian":
        gauss = dp.m.make_gaussian(
            dp.vector_domain(dp.atom_domain(T=float, nan=False), size=dimension),
            dp.l2_distance(T=float),
            scale=scale,
        )
        meas = _compose(gauss, compositions)
        eps, dlt = _fix_delta(meas, delta).map(sensitivity)
        return float(eps), float(dlt)
    if mechanism == "laplace_approx":
        pure = _pure_laplace_epsilon(scale, sensitivity * dimension, dimension, compositions)
        if delta <= 0.0:
            return pure, 0.0
        scalar = dp.m.make_laplace(
            dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale
        )
        meas = _compose(dp.c.make_pureDP_to_zCDP(scalar), dimension * compositions)
        eps, dlt = _fix_delta(meas, delta).map(sensitivity)
        if pure <= eps:
            return pure, 0.0
        return float(eps), float(dlt)
    raise MechanismError(f"noise mechanism ({mechanism!r}) must be one of {MECHANISMS}")


def paper_laplace_scale(n: int, R: int, epsilon: float, delta: float) -> float:
    """Paper 000 §3.2's literal scale ``sqrt(R log(1/delta)) / (n epsilon)`` (``t^d -> R``).

    Kept for reference only: it is not ``(epsilon, delta)``-DP under replace-one
    neighbours; ``cost_of_scale("laplace_approx", paper_laplace_scale(...), 2/n, R, delta)``
    gives what it actually costs.
    """
    return math.sqrt(R * math.log(1.0 / delta)) / (n * epsilon)


def sample(calibration: NoiseCalibration, values: ArrayLike) -> NDArray[np.float64]:
    """``values`` plus one draw of the calibrated noise, from OpenDP's sampler.

    One call is one release; a calibration with ``compositions = k`` budgets for ``k``
    calls. The sampler is OpenDP's vector Laplace (L1) or vector Gaussian (L2)
    measurement at ``calibration.scale``.
    """
    vector = np.ascontiguousarray(values, dtype=np.float64).ravel()
    if vector.size != calibration.dimension:
        raise MechanismError(
            f"values have length {vector.size}; the calibration is for {calibration.dimension}"
        )
    if not np.all(np.isfinite(vector)):
        raise MechanismError("values to privatise must be finite")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=calibration.dimension)
    if calibration.distribution == "laplace":
        meas = dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=calibration.scale)
    else:
        meas = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=calibration.scale)
    return np.asarray(meas(vector), dtype=np.float64)


@functools.lru_cache(maxsize=256)
def rho_budget(epsilon: float, delta: float) -> float:
    """The largest ``rho`` whose zCDP guarantee converts (OpenDP's
    ``make_zCDP_to_approxDP`` at ``delta``) to at most ``epsilon``. A function of public
    numbers only, kept for the last 256 of them (a tree's plan and its record ask for it
    more than once, and the search takes about a second at large ``delta``)."""
    _check_request("gaussian", 1.0, epsilon, delta, 1, 1)
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
    )
    converted = _fix_delta(unit, delta)

    def eps_at(rho: float) -> float:  # the unit Gaussian at d_in = sqrt(2 rho) is rho-zCDP
        try:
            return float(converted.map(math.sqrt(2.0 * rho))[0])
        except dp.OpenDPException:  # the map overflows far above any budget: too much
            return math.inf

    # bracket the root by doubling/halving from 1 (epsilon spans 1e-12 .. 1e6), then
    # solve on log(rho): rho ranges over many decades
    lo = hi = 1.0
    while eps_at(hi) <= epsilon:
        hi *= 2.0
    while eps_at(lo) > epsilon:
        lo /= 2.0
        if lo < 1e-300:
            raise MechanismError(f"no rho converts to epsilon {epsilon} at delta {delta}")
    if lo == hi:
        lo = hi / 2.0
    u = brentq(
        lambda v: eps_at(math.exp(v)) - epsilon, math.log(lo), math.log(hi), xtol=1e-14, rtol=1e-13
    )
    rho = _nudged(
        math.exp(u),
        lambda r: eps_at(r) > epsilon,
        lambda r: r * (1.0 - 1e-12),
        f"rho for epsilon = {epsilon:.6g} at delta = {delta:.6g}",
    )
    return float(rho)


#: :func:`gaussian_scale_floor` is shrunk by this relative margin, for its own rounding.
FLOOR_MARGIN = 1e-6


def gaussian_scale_floor(sensitivity: float, epsilon: float, delta: float) -> float:
    """A lower bound on the scale of Gaussian noise of L2 ``sensitivity`` (one value or a
    vector) that is ``(epsilon, delta)``-DP, in closed form: no OpenDP call (its
    conversions take 10-50 ms each near ``epsilon = 1e-12``, and the searches above call
    them dozens of times).

    ``(epsilon, delta)``-DP gives ``P(S) <= e^epsilon Q(S) + delta`` for the outputs'
    laws ``P, Q`` on neighbours, so their total variation distance is at most ``t =
    e^epsilon - 1 + delta``; that of two Gaussians of scale ``s`` whose means lie
    ``sensitivity`` apart is ``erf(sensitivity / (2 sqrt(2) s))``. Hence ``s >=
    sensitivity / (2 sqrt(2) erfinv(t))`` (``0``, no bound, when ``t >= 1``). OpenDP's
    maps are sound, so every Gaussian scale :func:`calibrate` returns is at least this;
    it is shrunk by :data:`FLOOR_MARGIN` for the rounding of its own arithmetic."""
    t = math.expm1(epsilon) + delta
    if t >= 1.0:
        return 0.0
    return sensitivity / (2.0 * math.sqrt(2.0) * float(erfinv(t))) * (1.0 - FLOOR_MARGIN)


def gaussian_scale_for_rho(sensitivity: float, rho: float) -> float:
    """``s = Delta_2 / sqrt(2 rho)`` (a vector Gaussian is ``Delta^2 / (2 s^2)``-zCDP),
    nudged up until OpenDP's map agrees."""
    return _nudged(
        sensitivity / math.sqrt(2.0 * rho),
        lambda s: _vector_gaussian(s).map(sensitivity) > rho,
        _next_up,
        f"gaussian noise of sensitivity {sensitivity:.6g} at rho = {rho:.6g}",
    )


def noisy_max_scale(sensitivity: float, rho: float) -> float:
    """Gumbel scale of one noisy-max selection that is ``rho``-zCDP for scores of
    L-infinity ``sensitivity`` (OpenDP's map: ``(sensitivity / scale)^2 / 2``)."""
    return _nudged(
        sensitivity / math.sqrt(2.0 * rho),
        lambda s: _noisy_max(s).map(sensitivity) > rho,
        _next_up,
        f"noisy max of sensitivity {sensitivity:.6g} at rho = {rho:.6g}",
    )


def noisy_max(scores: ArrayLike, scale: float) -> int:
    """Index of the largest of ``scores`` plus OpenDP's Gumbel noise at ``scale``. The
    scores go to OpenDP as a float64 array (its numpy path: half the time of a list of
    Python floats, each of which it checks one by one), NaN refused as before."""
    return int(_noisy_max(scale)(np.ascontiguousarray(scores, dtype=np.float64)))


def gaussian_at_scale(
    sensitivity: float, dimension: int, scale: float, epsilon: float, delta: float
) -> NoiseCalibration:
    """The record of a vector-Gaussian step at a given ``scale`` (one step of a mechanism
    budgeted in zCDP): its own ``(epsilon, delta)`` at ``delta`` from OpenDP's map, within
    the mechanism's ``(epsilon, delta)``; draw it with :func:`sample`."""
    eps, dlt = cost_of_scale("gaussian", scale, sensitivity, dimension, delta)
    return NoiseCalibration(
        "gaussian", sensitivity, dimension, scale, eps, dlt, epsilon, delta, 1, "zcdp"
    )


def release(calibration: NoiseCalibration, values: ArrayLike, *, step: str) -> NoisyVector:
    """One release of ``values`` (:func:`sample`) as the noisy vector of measurement step
    ``step``. The calibration is made beforehand, from public values (:func:`calibrate`):
    a measurement calibrates, then reads the rows, then releases, so that a budget no
    scale fits fails before the data are touched."""
    return NoisyVector(step=step, values=sample(calibration, values), calibration=calibration)


# --- internals ---------------------------------------------------------------------------


def _check_request(
    mechanism: str,
    sensitivity: float,
    epsilon: float,
    delta: float,
    dimension: int,
    compositions: int,
) -> None:
    if mechanism not in MECHANISMS:
        raise MechanismError(f"noise mechanism ({mechanism!r}) must be one of {MECHANISMS}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise MechanismError(f"sensitivity ({sensitivity!r}) must be positive and finite")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise MechanismError(f"epsilon ({epsilon!r}) must be a positive finite number")
    if not 0.0 <= delta < 1.0:
        raise MechanismError(f"delta ({delta!r}) must lie in [0, 1)")
    if mechanism in ("gaussian", "laplace_approx") and delta <= 0.0:
        raise MechanismError(f"the {mechanism} mechanism needs delta > 0; got delta = {delta!r}")
    if dimension < 1:
        raise MechanismError(f"dimension ({dimension}) must be a positive integer")
    if compositions < 1:
        raise MechanismError(f"compositions ({compositions}) must be a positive integer")


def _compose(meas: Any, k: int) -> Any:
    return meas if k == 1 else dp.c.make_composition([meas] * k)


def _vector_gaussian(scale: float) -> Any:
    return dp.m.make_gaussian(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l2_distance(T=float), scale=scale
    )


def _noisy_max(scale: float) -> Any:
    return dp.m.make_noisy_max(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.linf_distance(T=float),
        dp.zero_concentrated_divergence(),
        scale=scale,
    )


class _FixedDelta:
    """OpenDP's ``make_fix_delta(make_zCDP_to_approxDP(meas), delta)``, whose ``map``
    gives the same ``(epsilon, delta)``, found faster where it is ``(0, delta)``.

    Where the privacy profile's ``delta`` at ``epsilon = 0`` is already at most ``delta``
    (large ``delta``, small ``rho``), OpenDP's ``fix_delta`` still searches ``epsilon``
    down to 0: 70-340 ms a call against under 1 ms for the profile's ``delta(0)``, and
    the root searches at a corner such as ``epsilon = 1e-12, delta = 0.999`` make most of
    their calls there (2-8 s a request). The profile's ``delta(0) <= delta`` is OpenDP's
    own statement that the measurement is ``(0, delta)``-DP, and ``fix_delta`` answers
    ``(0.0, delta)`` then (``test_the_fixed_delta_shortcut_answers_as_opendp``, on a grid
    across the plateau's edge). Anywhere else, or if the profile cannot be evaluated,
    ``fix_delta`` itself answers."""

    def __init__(self, zcdp_meas: Any, delta: float) -> None:
        self.delta = delta
        self.profile: Any = dp.c.make_zCDP_to_approxDP(zcdp_meas)
        self.fixed: Any = dp.c.make_fix_delta(self.profile, delta=delta)

    def map(self, d_in: float) -> Any:
        try:
            at_zero = float(self.profile.map(d_in).delta(0.0))
        except dp.OpenDPException:
            at_zero = math.inf
        if at_zero <= self.delta:
            return (0.0, self.delta)
        return self.fixed.map(d_in)


def _fix_delta(zcdp_meas: Any, delta: float) -> _FixedDelta:
    return _FixedDelta(zcdp_meas, delta)


def _pure_laplace_epsilon(scale: float, sensitivity: float, dimension: int, k: int) -> float:
    lap = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=dimension),
        dp.l1_distance(T=float),
        scale=scale,
    )
    return float(_compose(lap, k).map(sensitivity))


def _initial_scale(
    mechanism: str,
    sensitivity: float,
    epsilon: float,
    delta: float,
    dimension: int,
    k: int,
) -> float:
    """Closed-form starting point: the classical Gaussian / advanced-composition scale."""
    log_term = math.sqrt(2.0 * math.log(1.25 / delta))
    if mechanism == "gaussian":
        return math.sqrt(k) * sensitivity * log_term / epsilon
    return math.sqrt(k * dimension) * sensitivity * log_term / epsilon


def _smallest_scale(charged: Any, target: float, guess: float, budget: str) -> float:
    """Smallest ``s`` with ``charged(s) <= target`` for a decreasing ``charged``.

    Brackets in powers of two around ``guess``, solves ``log charged(e^u) = log target``
    with Brent's method, then steps up until the map is within budget. ``budget`` says
    what was asked, for the message when no scale is found.

    The lower end is searched until the map overspends, however far below ``guess``: at a
    large ``delta`` OpenDP's conversion reaches ``epsilon = 0`` at a finite scale, and
    with a tiny ``epsilon`` the classical guess lies many decades above the answer (at
    ``epsilon = 1e-12, delta = 0.5`` the answer is about ``1e-12`` times the guess, where
    a fixed bracket of twelve decades gave up and called the map "not decreasing").
    Past twelve decades the step grows (squared each time, up to ``2^64``) and the last
    scale within budget becomes the upper end, so the search stays short.
    """
    lo = hi = guess
    while charged(hi) > target:
        hi *= 2.0
        if not math.isfinite(hi):
            raise MechanismError(
                f"no noise scale fits the budget: {budget}; OpenDP's privacy map charges "
                "more than epsilon at every scale up to the largest float (epsilon is too "
                "small for this delta and dimension): raise epsilon"
            )
    step = 2.0
    while charged(lo) <= target:
        if lo < hi * 1e-12:
            hi, step = lo, min(step * step, 2.0**64)
        lo /= step
        if lo < 1e-300:  # pragma: no cover - no noise at all would be within budget
            raise MechanismError(
                f"noise calibration failed: {budget}; OpenDP's privacy map stays within "
                "epsilon down to a scale of 1e-300"
            )

    def gap(u: float) -> float:
        # A large delta lets the map reach epsilon = 0 at a finite scale (OpenDP's
        # conversion returns 0 there); log(0) is clamped so the root search still brackets.
        return min(math.log(max(charged(math.exp(u)), 1e-300)), 700.0) - math.log(target)

    u = brentq(gap, math.log(lo), math.log(hi), xtol=1e-13, rtol=1e-13, maxiter=200)
    return _nudged(
        max(math.exp(u), lo), lambda s: charged(s) > target, lambda s: s * (1.0 + 1e-12), budget
    )


#: Most steps :func:`_nudged` takes. OpenDP rounds its maps outward by a few ulps, and a
#: root search leaves the scale within ``1e-13`` of the root, so a handful of steps do; a
#: map that needs this many is broken, and the calibration fails instead of looping.
MAX_NUDGES = 10_000


def _next_up(value: float) -> float:
    return math.nextafter(value, math.inf)


def _nudged(
    value: float, over: Callable[[float], bool], step: Callable[[float], float], what: str
) -> float:
    """``value`` stepped by ``step`` until ``over(value)`` is false (OpenDP's map within
    budget), at most :data:`MAX_NUDGES` times; ``what`` names the calibration for the
    message when that is not enough."""
    for _ in range(MAX_NUDGES):
        if not over(value):
            return value
        value = step(value)
    raise MechanismError(
        f"noise calibration failed: {what}; OpenDP's privacy map was still over budget "
        f"after {MAX_NUDGES} steps from the computed value"
    )
