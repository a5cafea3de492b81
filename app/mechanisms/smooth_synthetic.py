"""``smooth_synthetic``: private synthetic data for smooth queries (paper 000).

Jin, Wang, Huang, Zhong, Wang, *Differentially Private Data Releasing for Smooth Queries
with Synthetic Database Output*: Algorithm 1 (noisy Chebyshev moments -> an L1-fitting LP
over candidate points -> a sampled synthetic database), its ``(epsilon, delta)`` variant
(§3.2), the practical variant with ``C`` candidates and ``R`` low-degree basis functions
(§3.4, appendix A.5), and Algorithm 2 (private subspace iteration) for the ellipsoid grid.

Two stages (DESIGN §2.4)
------------------------
:func:`measure` is the only code that reads rows. It spends the budget and returns
:class:`Measurements` (frozen, JSON round trip): the index set, the noisy moments
``b_hat_r = (1/n) sum_x T_r(x) + noise`` (Algorithm 1 steps 8-9), the noisy PCA iterates if
``grid="pca_ellipsoid"``, the noise calibrations and the :class:`PrivacyCost` with one
part per data-dependent step. :func:`synthesize_from` is pure post-processing of a
``Measurements``: candidate points, the LP ``min ||W u - b_hat||_1`` over the simplex
(step 20), weights and ``m`` sampled rows (steps 21-24); it can be re-run with other
parameters at no privacy cost. :func:`synthesize` is both (DESIGN §6).

Privacy (replace-one neighbours, ``n`` public; proofs in :mod:`noise` and :mod:`pca`)
------------------------------------------------------------------------------------
* ``moments``: ``R`` non-constant basis functions, each in ``[-1, 1]``, so the moment
  vector has L1 sensitivity ``2R/n``, L2 ``2 sqrt(R)/n``, per-coordinate ``2/n``. Every
  sensitivity here is declared with an allowance for floating-point rounding
  (:func:`app.mechanisms.noise.float_sensitivity`; :func:`noise.moment_sensitivity`,
  :func:`pca.covariance_sensitivity`, :func:`pca.mean_sensitivity`).
  ``noise_mechanism="laplace"`` (default when ``delta = 0``): Laplace scale ``2R/(n eps_m)``
  (Algorithm 1 step 9 corrected from the paper's ``t^d/(n eps)``). ``"gaussian"`` (default
  when ``delta > 0``): Gaussian under L2, zCDP -> ``(eps_m, delta_m)`` by OpenDP.
  ``"laplace_approx"``: the §3.2 Laplace with ``sqrt(R log(1/delta))`` scaling, accounted
  per coordinate in zCDP (the paper's literal constant is not ``(eps, delta)``-DP).
* ``pca_subspace`` (``grid="pca_ellipsoid"``): ``L`` adaptive releases of ``A X`` with L2
  sensitivity ``4d(n-1)/n^2`` (Gaussian, zCDP composition) or L1 ``4 d^{3/2} sqrt(k)
  (n-1)/n^2`` (Laplace, basic composition); eigenvalues by post-processing the last noisy
  iterate (not the paper's non-private ``sqrt(x^T A^2 x)``).
* centre of the ellipsoid: the column means are the first-degree moments
  ``T_1(x_i) = x_i``, so when the index set holds all of them the centre is their noisy
  values (post-processing, no extra budget). Otherwise a ``pca_centre`` step measures the
  mean (L1 sensitivity ``2d/n``, L2 ``2 sqrt(d)/n``) with its own share. The paper does not
  say how its centre was privatised (errata).
* Everything in :func:`synthesize_from` reads only those noisy values and public
  parameters, so it is post-processing and costs nothing.
The budget is split by basic composition: ``eps = sum eps_step``, ``delta = sum
delta_step`` (``delta`` goes to the steps that use it, in proportion to their epsilon);
each step's charge is OpenDP's map and never exceeds its share.

Defaults and the parameter rules
--------------------------------
* Theorem 3.1 (``delta = 0``): ``t = ceil(n^{1/(2d+K)})``, ``N = ceil(n^{K/(2d+K)})``,
  ``m = ceil(n^{1+(K+1)/(2d+K)})``, rounding ``L = ceil(n^{(d+K)/(2d+K)})``; Theorem 3.2
  (``delta > 0``) the same with its ``(3d+2K)`` exponents and ``log(1/delta)`` factors.
  ``K`` is ``smoothness``. ``grid="full"`` uses them as written: the full tensor basis
  ``{0..t-1}^d`` (``t >= 2``), the ``N^d`` grid and data snapped to it (steps 3-5).
* ``R`` (``basis_size=None``), appendix A.5: ``R = 0.5 n^{d/(2d+K)}`` (eps-DP) or
  ``0.5 n^{2d/(3d+2K)}`` (``(eps, delta)``), rounded. ``basis_rule="paper"`` uses it as
  written. The default ``basis_rule="paper_min_d"`` uses ``max(d, R_paper)``: measured on
  WDBC (issue 3), the paper's rule gives ``R = 10, 6, 4, 2, 2 < d = 30`` for ``K =
  sigma^2``, the vertex LP then puts all mass on ``R + 1`` random candidates and the
  result is no better than the data-independent uniform distribution; with every
  first-degree moment measured (``R >= d``) it is well below it (``bench/``).
* ``C`` (``grid_size=None``): ``10^4``, as in §4. ``m`` (``sample_size=None``): the
  Theorem's ``m``, capped at ``10^6`` rows (the sampling error is then below ``1e-3``;
  the uncapped ``m`` grows like ``n^{1 + (K+1)/(2d+K)}``).
* ``grid="hypercube"``: robustly below the 0-DP baseline in the benchmark. The ellipsoid
  grid is the paper's preferred one but needs ``n`` large against ``d^2 / epsilon``: the
  sensitivity of ``A X`` is ``4d/n``, and on the paper's datasets at ``epsilon <= 1`` no
  private eigenvalue rises above the noise (``SyntheticRelease.parameters`` reports
  ``pca_eigenvalues_above_noise``); the grid then acts as a random cloud around the noisy
  centre, which helps on some datasets and hurts on others (CRM, ``d = 100``). See
  ``bench/results/smooth_synthetic.md``.
* ``pca_share=0.2`` of the budget for Algorithm 2 (the paper does not give its split);
  ``pca_rank=None`` -> ``k = d`` and ``pca_iterations=None`` -> ``L = 1``: with the
  Gaussian noise the L2 sensitivity does not grow with ``k``, and every extra iteration
  divides the per-iteration budget, so one release of ``A X`` on a full orthonormal basis
  (the noisy covariance in a random basis) is the cheapest way to get all ``d`` axes; the
  paper's ``k``/``L`` are not stated for §4 and both are parameters. The private
  eigenvalues are clipped to ``[0, d]`` and scaled to sum to at most ``d`` (the trace
  bound for rows in ``[-1, 1]^d``); ``ellipsoid_radius="paper"`` uses radii
  ``sqrt(lambda_hat)``.
* ``solver="simplex"``: the vertex solution of the paper; ``"ipm"`` gives an interior
  optimum (mass spread over many candidates).

Standard errors
---------------
:func:`noise_replicates` bootstraps a release (:mod:`app.mechanisms.bootstrap`): the
released moments measured again at their own noise law and scale, each refitted on fresh
candidates, 20 times; the spread of a query's answers over the 20 supports is its standard
error (:class:`SupportReplicates`). It costs 20 syntheses (WDBC 1.8 s, CRM 19 s with the
vertex LP). Against the spread of answers over 20 independent releases of the same data
(``bench/results/answer_stderr_moments.md``, ``epsilon = 1, delta = 1e-9``, the library
defaults) it reads 0.89-1.18 of it on the uniform-centre queries and 0.59-1.92 on the
row-centred ones, and ``value +- 1.96 se`` holds the mean release's answer for 81-100 % of
the queries. It does not hold the truth: the fit's own error (``R + 1`` support points,
the dependence the moments leave out) dominates on CTG and PKS (noise share 0.09-0.23 on
the uniform-centre queries; covered 0-4 %), and on every dataset's row-centred queries
(0 %); on WDBC it covered 85-92 %, on CRM 51-64 %. Simulated around the released
support's own moments instead of ``b_hat`` it read 0.60-0.94 and 0.42-0.72 (the first run
of the benchmark; :func:`noise_replicates` says why).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from app.mechanisms import basis, bootstrap, grids, lp, noise, pca
from app.mechanisms.data import RowSource, as_source
from app.mechanisms.errors import MechanismError, bytes_text
from app.mechanisms.privacy import PrivacyCost, check_budget
from app.mechanisms.queries import Query, sample_support

GRIDS = ("full", "hypercube", "pca_ellipsoid")
BASIS_RULES = ("paper_min_d", "paper")
RADII = ("paper", "matched")
FORMAT = "smooth_synthetic.measurements/1"

#: ``C`` when ``grid_size`` is None (paper 000 §4).
DEFAULT_GRID_SIZE = 10_000
#: Cap on the default synthetic database size ``m``.
MAX_DEFAULT_SAMPLE_SIZE = 1_000_000
#: Largest ``R`` :func:`measure` accepts (noise alone takes ~45 us per value).
MAX_BASIS_SIZE = 100_000
#: Default memory ceiling for synthesis (LP matrix, candidates, sampled rows): 4 GiB.
DEFAULT_MAX_BYTES = 4 << 30


# --- parameter rules -----------------------------------------------------------------------


@dataclass(frozen=True)
class TheoremParameters:
    """``t, N, m, L`` of Theorem 3.1 (``delta = 0``) or 3.2 (``delta > 0``)."""

    t: int
    N: int
    m: int
    L: int


def theorem_parameters(n: int, d: int, smoothness: int, delta: float = 0.0) -> TheoremParameters:
    """Algorithm 1 step 1, or its §3.2 replacement when ``delta > 0``."""
    K = smoothness
    if delta == 0.0:
        e = 2 * d + K
        return TheoremParameters(
            t=math.ceil(n ** (1 / e)),
            N=math.ceil(n ** (K / e)),
            m=math.ceil(n ** (1 + (K + 1) / e)),
            L=math.ceil(n ** ((d + K) / e)),
        )
    e = 3 * d + 2 * K
    lg = math.log(1.0 / delta)
    return TheoremParameters(
        t=math.ceil(n ** (2 / e) * lg ** (-1 / e)),
        N=math.ceil(n ** (2 * K / e) * lg ** (-K / e)),
        m=math.ceil(n ** ((4 * d + 4 * K + 2) / e) * lg ** (-(2 * d + 2 * K + 1) / e)),
        L=math.ceil(n ** ((2 * d + 2 * K) / e) * lg ** (-(d + K) / e)),
    )


def paper_basis_size(n: int, d: int, smoothness: int, delta: float = 0.0) -> int:
    """Appendix A.5: ``R = 0.5 n^{d/(2d+K)}`` (eps-DP) or ``0.5 n^{2d/(3d+2K)}``, rounded."""
    K = smoothness
    exponent = d / (2 * d + K) if delta == 0.0 else 2 * d / (3 * d + 2 * K)
    value: float = 0.5 * float(n) ** exponent
    return max(1, round(value))


def default_basis_size(
    n: int, d: int, smoothness: int, delta: float = 0.0, rule: str = "paper_min_d"
) -> int:
    """``R`` for ``basis_size=None``: the paper's rule, or at least ``d`` (module docstring)."""
    if rule not in BASIS_RULES:
        raise MechanismError(f"basis_rule ({rule!r}) must be one of {BASIS_RULES}")
    R = paper_basis_size(n, d, smoothness, delta)
    return R if rule == "paper" else max(d, R)


# --- measurements --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Measurements:
    """Everything :func:`measure` released: the only input synthesis needs.

    ``moments`` are the noisy ``b_hat`` in the order of ``index_set``; ``moment_noise``
    is their calibration (``None`` only in the non-private test reference). ``pca`` is
    the Algorithm 2 record for the ellipsoid grid; ``centre`` a separately measured mean
    (only when the index set lacks some first-degree term). ``parameters`` holds every
    resolved parameter (JSON-safe).
    """

    n: int
    d: int
    epsilon: float
    delta: float
    smoothness: int
    grid: str
    index_set: basis.IndexSet
    moments: NDArray[np.float64]
    moment_noise: noise.NoiseCalibration | None
    privacy_cost: PrivacyCost
    parameters: Mapping[str, Any]
    pca: pca.PrivatePCA | None = None
    centre: NDArray[np.float64] | None = None
    centre_noise: noise.NoiseCalibration | None = None

    def __post_init__(self) -> None:
        if self.grid not in GRIDS:
            raise MechanismError(f"grid ({self.grid!r}) must be one of {GRIDS}")
        moments = np.array(self.moments, dtype=np.float64, copy=True)
        if moments.shape != (self.index_set.size,) or self.index_set.dim != self.d:
            raise MechanismError("moments must have one value per basis function of dimension d")
        moments.setflags(write=False)
        object.__setattr__(self, "moments", moments)
        if self.centre is not None:
            centre = np.array(self.centre, dtype=np.float64, copy=True)
            if centre.shape != (self.d,):
                raise MechanismError(f"centre must have shape ({self.d},)")
            centre.setflags(write=False)
            object.__setattr__(self, "centre", centre)
        if self.grid == "pca_ellipsoid" and self.pca is None:
            raise MechanismError("grid 'pca_ellipsoid' needs the private PCA measurement")
        private = self.privacy_cost.kind == "dp"
        if private and self.moment_noise is None:
            raise MechanismError("differentially private measurements need their noise record")
        object.__setattr__(self, "parameters", dict(self.parameters))

    @property
    def is_private(self) -> bool:
        return self.privacy_cost.kind == "dp"

    def noisy_centre(self) -> NDArray[np.float64]:
        """Ellipsoid centre: the measured mean, or the noisy first-degree moments, clipped."""
        if self.centre is not None:
            return np.clip(self.centre, -1.0, 1.0)
        positions = self.index_set.first_degree_positions()
        if np.any(positions < 0):
            raise MechanismError(
                "the index set lacks first-degree terms and no centre was measured"
            )
        out: NDArray[np.float64] = np.clip(self.moments[positions], -1.0, 1.0)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe record; ``from_dict(to_dict())`` reproduces it exactly."""
        if not self.is_private or self.moment_noise is None:
            raise MechanismError("only differentially private measurements can be serialised")
        return {
            "format": FORMAT,
            "n": self.n,
            "d": self.d,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "smoothness": self.smoothness,
            "grid": self.grid,
            "index_set": self.index_set.to_dict(),
            "moments": [float(v) for v in self.moments],
            "moment_noise": self.moment_noise.to_dict(),
            "privacy_cost": self.privacy_cost.as_dict(),
            "parameters": dict(self.parameters),
            "pca": None if self.pca is None else self.pca.to_dict(),
            "centre": None if self.centre is None else [float(v) for v in self.centre],
            "centre_noise": None if self.centre_noise is None else self.centre_noise.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurements:
        if data.get("format") != FORMAT:
            raise MechanismError(f"not a smooth_synthetic measurement record (format {FORMAT!r})")
        return cls(
            n=int(data["n"]),
            d=int(data["d"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            smoothness=int(data["smoothness"]),
            grid=str(data["grid"]),
            index_set=basis.IndexSet.from_dict(data["index_set"]),
            moments=np.asarray(data["moments"], dtype=np.float64),
            moment_noise=noise.NoiseCalibration.from_dict(data["moment_noise"]),
            privacy_cost=PrivacyCost.from_dict(data["privacy_cost"]),
            parameters=dict(data["parameters"]),
            pca=None if data["pca"] is None else pca.PrivatePCA.from_dict(data["pca"]),
            centre=None if data["centre"] is None else np.asarray(data["centre"], dtype=float),
            centre_noise=(
                None
                if data["centre_noise"] is None
                else noise.NoiseCalibration.from_dict(data["centre_noise"])
            ),
        )


@dataclass(frozen=True)
class NoisePlan:
    """The noise calibrations of one :func:`measure`, fixed from public values before any
    row is read: the ``R`` moments', and for ``grid="pca_ellipsoid"`` the private PCA's
    and (when the index set lacks a first-degree term) the centre's."""

    R: int
    moments: noise.NoiseCalibration
    pca_subspace: noise.NoiseCalibration | None = None
    pca_centre: noise.NoiseCalibration | None = None


@functools.lru_cache(maxsize=64)
def noise_plan(
    n: int,
    d: int,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    grid: str = "hypercube",
    basis_size: int | None = None,
    *,
    noise_mechanism: str | None = None,
    basis_rule: str = "paper_min_d",
    pca_share: float = 0.2,
    pca_rank: int | None = None,
    pca_iterations: int | None = None,
    pca_noise: str | None = None,
    centre_share: float = 0.05,
) -> NoisePlan:
    """The calibrations :func:`measure` will draw for an ``n x d`` table with these
    arguments, from public values only: a request is checked with it before any budget is
    reserved, and a budget no noise scale fits is a :class:`MechanismError` then, not in
    the worker. Kept for the last 64 requests (the check and the preview of one request
    ask for the same; ``laplace_approx`` composes ``R`` scalar maps per evaluation, about
    0.1 s at ``R = 1000`` and 0.6-1 s at ``R = 10^4`` for an ordinary budget, up to ~7 s at
    the extremes of the accepted range)."""
    plan = _public_plan(
        n,
        d,
        epsilon,
        delta,
        smoothness,
        grid,
        basis_size,
        noise_mechanism,
        basis_rule,
        pca_share,
        pca_rank,
        pca_iterations,
        pca_noise,
        centre_share,
    )
    return _calibrate_steps(plan)


def measure(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    grid: str = "hypercube",
    basis_size: int | None = None,
    rng: np.random.Generator | None = None,
    *,
    noise_mechanism: str | None = None,
    basis_rule: str = "paper_min_d",
    pca_share: float = 0.2,
    pca_rank: int | None = None,
    pca_iterations: int | None = None,
    pca_noise: str | None = None,
    centre_share: float = 0.05,
) -> Measurements:
    """Measure ``X`` (rows in ``[-1, 1]^d``) once, spending ``(epsilon, delta)``.

    See the module docstring for the privacy argument and the defaults. ``rng`` only
    draws the data-independent start ``X^(0)`` of Algorithm 2. Raises
    :class:`MechanismError` for invalid arguments or data. Every parameter and every noise
    calibration (:func:`noise_plan`) is fixed before the first row is read, so a budget
    that no noise scale fits fails before the data are touched.
    """
    source, plan = _plan(
        X,
        epsilon,
        delta,
        smoothness,
        grid,
        basis_size,
        noise_mechanism,
        basis_rule,
        pca_share,
        pca_rank,
        pca_iterations,
        pca_noise,
        centre_share,
    )
    calibrations = _calibrate_steps(plan)
    index_set = plan.index_set
    exact = basis.moments(_moment_source(source, plan), index_set)
    released = noise.release(calibrations.moments, exact, step="moments")
    parts = [released.calibration.cost_part("moments")]
    pca_record = None
    centre = centre_noise = None
    if grid == "pca_ellipsoid":
        assert calibrations.pca_subspace is not None
        pca_record = pca.private_subspace_iteration(
            source,
            rank=plan.pca_rank,
            iterations=plan.pca_iterations,
            epsilon=plan.budget["pca_subspace"][0],
            delta=plan.budget["pca_subspace"][1],
            mechanism=plan.pca_noise,
            rng=rng if rng is not None else np.random.default_rng(),
            calibration=calibrations.pca_subspace,
        )
        parts.extend(pca_record.privacy_cost.parts)
        if calibrations.pca_centre is not None:
            _, mean = pca.covariance(source)
            centre_noise = calibrations.pca_centre
            centre = noise.sample(centre_noise, mean)
            parts.append(centre_noise.cost_part("pca_centre"))
    cost = PrivacyCost.compose(parts)
    if not cost.within(epsilon, delta):
        raise RuntimeError("internal error: the composed privacy cost exceeds the request")
    return Measurements(
        n=plan.n,
        d=plan.d,
        epsilon=float(epsilon),
        delta=float(delta),
        smoothness=smoothness,
        grid=grid,
        index_set=index_set,
        moments=released.values,
        moment_noise=released.calibration,
        privacy_cost=cost,
        parameters=plan.parameters(),
        pca=pca_record,
        centre=centre,
        centre_noise=centre_noise,
    )


# --- synthesis -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SyntheticRelease:
    """A weighted support in ``[-1, 1]^d``, sampled rows, and how they were made.

    ``points`` / ``weights``: the candidates with positive LP weight (``weights`` sum to
    1); ``rows``: ``m`` rows drawn from them (the synthetic database of steps 21-24).
    ``parameters`` holds every resolved parameter (``t, N, R, C, m``, noise scale, grid,
    solver...), ``solver`` the LP report (status, objective, seconds, iterations) and
    ``seconds`` the time of each synthesis stage.
    """

    points: NDArray[np.float64]
    weights: NDArray[np.float64]
    rows: NDArray[np.float64]
    measurements: Measurements
    parameters: Mapping[str, Any]
    solver: Mapping[str, Any]
    seconds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        points = np.array(self.points, dtype=np.float64, copy=True)
        weights = np.array(self.weights, dtype=np.float64, copy=True)
        rows = np.array(self.rows, dtype=np.float64, copy=True)
        d = self.measurements.d
        if points.ndim != 2 or points.shape[1] != d or weights.shape != (points.shape[0],):
            raise MechanismError("points must be (k, d) with one weight per point")
        if np.any(weights < 0) or not math.isclose(float(weights.sum()), 1.0, abs_tol=1e-9):
            raise MechanismError("weights must be non-negative and sum to 1")
        if rows.ndim != 2 or rows.shape[1] != d:
            raise MechanismError("rows must be an (m, d) array")
        for array in (points, weights, rows):
            array.setflags(write=False)
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "parameters", dict(self.parameters))
        object.__setattr__(self, "solver", dict(self.solver))
        object.__setattr__(self, "seconds", dict(self.seconds))

    @property
    def privacy_cost(self) -> PrivacyCost:
        """What the measurements cost; synthesis itself is post-processing (free)."""
        return self.measurements.privacy_cost

    def sample(self, m: int, rng: np.random.Generator) -> NDArray[np.float64]:
        """``m`` rows drawn i.i.d. from the weighted support (steps 21-24)."""
        return sample_support(self.points, self.weights, m, rng)

    def answer(self, query: Query) -> float:
        """``q_f = sum_k w_k f(s_k)`` over the weighted support (the sampled rows' expectation)."""
        return float(self.weights @ query.evaluate(self.points))

    def answer_rows(self, query: Query) -> float:
        """``(1/m) sum_y f(y)`` over the sampled synthetic rows (the paper's ``q_f(D~)``)."""
        return float(np.mean(query.evaluate(self.rows)))


def moments_count(
    n: int,
    d: int,
    smoothness: int,
    delta: float,
    grid: str,
    basis_size: int | None = None,
    basis_rule: str = "paper_min_d",
) -> int:
    """``R``, the number of noisy moments :func:`measure` releases for these public values
    (its basis choice without building the basis): ``basis_size`` when given; on the full
    grid Theorem 3.1's ``t^d - 1`` with ``t = max(t, 2)``; otherwise
    :func:`default_basis_size`, lowered to :data:`MAX_BASIS_SIZE` and to
    :func:`app.mechanisms.basis.largest_index_set_size` ``(d)`` (``R x d`` entries). Refuses
    a ``basis_size`` or full tensor basis beyond those caps."""
    if grid not in GRIDS:
        raise MechanismError(f"grid ({grid!r}) must be one of {GRIDS}")
    if basis_size is not None:
        _check_positive_int("basis_size", basis_size)
        if basis_size > MAX_BASIS_SIZE:
            raise MechanismError(
                f"basis_size R ({basis_size}) must be at most {MAX_BASIS_SIZE}: the moments "
                "and the LP matrix grow with R"
            )
        basis.check_index_set_size(d, basis_size)
        return basis_size
    if grid == "full":
        t = max(theorem_parameters(n, d, smoothness, delta).t, 2)
        if t**d - 1 > basis.MAX_INDEX_SET_SIZE:
            raise MechanismError(
                f"grid 'full' measures the full tensor basis of t^d - 1 = {t}^{d} - 1 "
                f"moments, more than {basis.MAX_INDEX_SET_SIZE}; use grid 'hypercube' or "
                "'pca_ellipsoid'"
            )
        basis.check_index_set_size(d, t**d - 1, "the full grid's basis size")
        return int(t**d - 1)
    return min(
        default_basis_size(n, d, smoothness, delta, basis_rule),
        MAX_BASIS_SIZE,
        basis.largest_index_set_size(d),
    )


def synthesis_sizes(
    d: int,
    R: int,
    grid: str,
    theorem: TheoremParameters,
    *,
    grid_size: int | None = None,
    sample_size: int | None = None,
    solver: str = "simplex",
    grid_resolution: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> tuple[int, int, int]:
    """``(C, N, m)`` of a synthesis from ``R`` moments of ``d`` columns: candidates ``C``
    (``grid_size``, default :data:`DEFAULT_GRID_SIZE`; ``N^d`` on the full grid, ``N =
    grid_resolution`` or the Theorem's), grid resolution ``N`` (0: the continuous cube) and
    sample size ``m`` (default the Theorem's, capped at :data:`MAX_DEFAULT_SAMPLE_SIZE`).

    Refuses sizes whose LP (:func:`app.mechanisms.lp.lp_bytes`) with the candidates, or
    whose sampled rows, need more than ``max_bytes``: public values only, so a request is
    refused before any budget is spent on moments that could not be fitted.
    """
    if grid == "full":
        if grid_size is not None:
            raise MechanismError(
                "grid_size is C for grids 'hypercube' and 'pca_ellipsoid'; grid 'full' uses "
                "its N^d grid points as candidates (N from Theorem 3.1 or 3.2)"
            )
        N = grid_resolution if grid_resolution is not None else theorem.N
        _check_positive_int("grid_resolution", N)
        if N**d > max_bytes // (8 * d):  # its coordinates alone would not fit
            raise MechanismError(
                f"grid 'full' has N^d = {N}^{d} candidate points, more than fit in "
                f"{bytes_text(max_bytes)}; use grid 'hypercube'"
            )
        C = N**d
    else:
        C = DEFAULT_GRID_SIZE if grid_size is None else grid_size
        N = grid_resolution if grid_resolution is not None else 0
    _check_positive_int("grid_size", C)
    needed = lp.lp_bytes(R, C, solver) + 8 * C * d
    if needed > max_bytes:
        what = f"the {N}^{d} grid points" if grid == "full" else f"C = {C} candidates"
        lower = "use grid 'hypercube'" if grid == "full" else "lower basis_size or grid_size"
        raise MechanismError(
            f"the synthesis LP with R = {R} moments and {what} needs about "
            f"{bytes_text(needed)}, more than {bytes_text(max_bytes)}; {lower}"
        )
    m = sample_size if sample_size is not None else min(theorem.m, MAX_DEFAULT_SAMPLE_SIZE)
    _check_positive_int("sample_size", m)
    if 8 * m * d > max_bytes:
        raise MechanismError(
            f"sample_size m = {m} rows of {d} columns need more than "
            f"{bytes_text(max_bytes)}; lower it"
        )
    return C, N, m


def synthesize_from(
    measurements: Measurements,
    rng: np.random.Generator | None = None,
    *,
    grid_size: int | None = None,
    solver: str = "simplex",
    sample_size: int | None = None,
    rounding: int | None = None,
    grid_resolution: int | None = None,
    ellipsoid_radius: str = "paper",
    time_limit: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> SyntheticRelease:
    """Post-process ``measurements`` into a synthetic database (no privacy cost).

    ``grid_size`` is ``C`` (hypercube / ellipsoid); the full grid has ``N^d`` points with
    ``N = grid_resolution`` or the Theorem's ``N``. ``grid_resolution`` on the hypercube
    draws from the ``N^d`` grid instead of the continuous cube (appendix A.5's literal
    sampling). ``rounding=L`` rounds ``W`` and ``b_hat`` to multiples of ``1/L`` (steps
    10, 15). ``ellipsoid_radius``: ``"paper"`` (radius ``sqrt(lambda_hat)``, §3.4) or
    ``"matched"`` (``sqrt((k + 2) lambda_hat)``, whose uniform distribution has variance
    ``lambda_hat`` along each axis). Same measurements and same ``rng`` state give the
    same release.
    """
    started = time.perf_counter()
    rng = rng if rng is not None else np.random.default_rng()
    d, R = measurements.d, measurements.index_set.size
    params = dict(measurements.parameters)
    if solver not in lp.SOLVERS:
        raise MechanismError(f"solver ({solver!r}) must be one of {lp.SOLVERS}")
    if ellipsoid_radius not in RADII:
        raise MechanismError(f"ellipsoid_radius ({ellipsoid_radius!r}) must be one of {RADII}")
    if max_bytes < 1:
        raise MechanismError(f"max_bytes ({max_bytes!r}) must be positive")

    C, N, m = synthesis_sizes(
        d,
        R,
        measurements.grid,
        TheoremParameters(t=0, N=int(params["N"]), m=int(params["m"]), L=0),
        grid_size=grid_size,
        sample_size=sample_size,
        solver=solver,
        grid_resolution=grid_resolution,
        max_bytes=max_bytes,
    )
    candidates = _candidates(measurements, C, N, rng, ellipsoid_radius)
    t_grid = time.perf_counter()
    W = measurements.index_set.evaluate(candidates)
    b_hat = np.asarray(measurements.moments)
    if rounding is not None:
        W, b_hat = lp.round_to_grid(W, rounding), lp.round_to_grid(b_hat, rounding)
    t_matrix = time.perf_counter()
    solution = lp.fit_weights(W, b_hat, solver=solver, time_limit=time_limit)
    keep = solution.weights > 0
    points, weights = candidates[keep], solution.weights[keep]
    weights = weights / weights.sum()
    t_lp = time.perf_counter()
    rows = points[rng.choice(points.shape[0], size=m, p=weights)]
    t_end = time.perf_counter()

    params.update(
        {
            "C": C,
            "m": m,
            "solver": solver,
            "rounding": rounding,
            "grid_resolution": N if N else None,
            "ellipsoid_radius": ellipsoid_radius if measurements.grid == "pca_ellipsoid" else None,
            "support_size": int(points.shape[0]),
        }
    )
    if measurements.pca is not None:
        record = measurements.pca
        params["pca_noise_norm"] = record.noise_norm
        params["pca_eigenvalues_above_noise"] = int(np.sum(record.eigenvalues > record.noise_norm))
    return SyntheticRelease(
        points=points,
        weights=weights,
        rows=rows,
        measurements=measurements,
        parameters=params,
        solver=solution.info(),
        seconds={
            "candidates": t_grid - started,
            "matrix": t_matrix - t_grid,
            "lp": t_lp - t_matrix,
            "sample": t_end - t_lp,
            "total": t_end - started,
        },
    )


# --- standard errors -----------------------------------------------------------------------

#: A bootstrap replicate keeps the fewest heaviest support points that hold all but this
#: much of its mass (renormalised): an interior-point solution puts ~1e-12 on each of its
#: ``C`` candidates and its mass on about ``R`` of them (WDBC, ``R = 30``: 12 points hold
#: all but ``1e-9``), so a replicate stores tens of points, not ``C``. An answer moves by
#: at most ``2e-9 max |f|``.
REPLICATE_MASS_CUT = 1e-9


#: The largest refit :func:`noise_replicates` is run for, in units of ``C R`` (candidates
#: times moments) times :data:`SOLVER_WORK` (the IPM's factor): a refit's time grows about
#: linearly in it (0.35 us a unit with the vertex LP here: WDBC ``C = 10^4`` 0.07 s, CRM
#: ``C = 2 10^5`` 7 s; the IPM 5-9 times that), so 20 refits at the cap take ~2.5 min.
MAX_REPLICATE_WORK = 20_000_000
SOLVER_WORK = {"simplex": 1, "ipm": 8}


def replicate_work(release: SyntheticRelease) -> int:
    """The size of one bootstrap refit of ``release``: ``C R`` times the solver's factor
    (public sizes only), against :data:`MAX_REPLICATE_WORK`."""
    params = release.parameters
    C = int(params["C"])
    return C * release.measurements.index_set.size * SOLVER_WORK[str(params["solver"])]


@dataclass(frozen=True, eq=False)
class SupportReplicates:
    """The weighted supports of a moments release's parametric bootstrap
    (:func:`noise_replicates`): replicate ``b`` is ``points[o_b : o_b + sizes[b]]`` with
    ``weights`` likewise (``o_b`` the sum of the earlier sizes; each replicate's weights sum
    to 1)."""

    d: int
    points: NDArray[np.float64]
    weights: NDArray[np.float64]
    sizes: NDArray[np.int64]

    def __post_init__(self) -> None:
        points = np.array(self.points, dtype=np.float64, copy=True)
        weights = np.array(self.weights, dtype=np.float64, copy=True)
        sizes = np.array(self.sizes, dtype=np.int64, copy=True)
        if points.ndim != 2 or points.shape[1] != self.d or weights.shape != (points.shape[0],):
            raise MechanismError("replicate points must be (K, d) with one weight per point")
        if sizes.ndim != 1 or sizes.size < 2 or np.any(sizes < 1):
            raise MechanismError("a bootstrap needs at least two non-empty replicates")
        if int(sizes.sum()) != points.shape[0]:
            raise MechanismError("replicate sizes must add up to the number of points")
        if not np.all(np.isfinite(points)) or np.any(weights < 0):
            raise MechanismError("replicate points must be finite and weights non-negative")
        sums = np.add.reduceat(weights, self.offsets_of(sizes))
        if not np.allclose(sums, 1.0, rtol=0.0, atol=1e-9):
            raise MechanismError("each replicate's weights must sum to 1")
        for array in (points, weights, sizes):
            array.setflags(write=False)
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "sizes", sizes)

    @staticmethod
    def offsets_of(sizes: NDArray[np.int64]) -> NDArray[np.int64]:
        out: NDArray[np.int64] = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        return out

    @property
    def count(self) -> int:
        return int(self.sizes.size)

    def answers(self, query: Query) -> NDArray[np.float64]:
        """``(B,)`` answers ``sum_k w*_bk f(s*_bk)`` of the replicates."""
        terms = self.weights * query.evaluate(self.points)
        out: NDArray[np.float64] = np.add.reduceat(terms, self.offsets_of(self.sizes))
        return out

    def stderr(self, query: Query) -> float:
        """The bootstrap standard error of ``query``'s answer (the replicates' spread)."""
        return float(bootstrap.standard_errors(self.answers(query)[:, None])[0])

    def to_arrays(self) -> dict[str, NDArray[np.float64] | NDArray[np.int64]]:
        return {"points": self.points, "weights": self.weights, "sizes": self.sizes}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, NDArray[Any]], d: int) -> SupportReplicates:
        """Inverse of :meth:`to_arrays`; :class:`MechanismError` if they do not fit ``d``."""
        try:
            return cls(
                d=d,
                points=np.asarray(arrays["points"]),
                weights=np.asarray(arrays["weights"]),
                sizes=np.asarray(arrays["sizes"]),
            )
        except KeyError as exc:
            raise MechanismError(f"replicates lack {exc.args[0]!r}") from None


def noise_replicates(
    release: SyntheticRelease,
    replicates: int = bootstrap.REPLICATES,
    progress: Callable[[float], None] | None = None,
) -> SupportReplicates:
    """The parametric bootstrap of a moments release (:mod:`app.mechanisms.bootstrap`).

    The released moments ``b_hat`` are taken as the true moment vector (the plug-in
    estimate of the parameter the noise is added to) and measured again ``B`` times with
    the release's own noise law and scale, ``b*_b = b_hat + z_b``; each is refitted as the
    release was (:func:`synthesize_from` with its ``C``, grid, solver, rounding and radius:
    fresh candidates, the L1 LP). The spread of a query's answers over the ``B`` supports
    is the standard error of its answer.

    Why ``b_hat`` and not the moments of the released support, ``sum_k w_k T(s_k)``: the LP
    is an L1 projection onto the moments the candidates can reach, and the data's noisy
    moments lie outside them; simulated around the support's own moments (inside), the
    refits vary less than releases do. Against the spread over 10-12 independent releases
    (side script, ``epsilon = 1, delta = 1e-9``, pooled se / sd): WDBC uniform ``sigma = 4``
    0.66 (support) against 0.91 (``b_hat``), rows ``sigma = 2`` 0.57 against 0.95; CTG 0.67
    against 0.84 and 0.70 against 1.08. On a small case the two agree (0.96 / 0.95 at
    ``epsilon = 0.1``, 1.01 / 1.01 at ``epsilon = 1``; ``tests/mechanisms/test_bootstrap.py``)
    but on the ellipsoid grid (3 columns, 60 releases sharing one PCA, side script): 1.34
    around the support's moments at ``epsilon = 1``, 0.95-0.96 around ``b_hat``, and
    1.04-1.06 at ``epsilon = 0.2``.

    What is simulated: the moment noise and the candidates (both vary from one release of
    the same data to the next). What is held fixed: the private PCA of the ellipsoid grid
    and a separately measured centre (a centre taken from the first-degree moments moves
    with them). Post-processing of the release and public scales: no budget. The draws
    come from a generator seeded by the released moments and support
    (:func:`app.mechanisms.bootstrap.seed_of`), so every process gets the same supports.
    ``progress`` is called with the fraction of replicates done. Each replicate is one
    synthesis (0.08 s on WDBC with the vertex LP, 0.4 s with the IPM; up to ~1.4 s on CRM).
    """
    measurements = release.measurements
    calibration = measurements.moment_noise
    if calibration is None:
        raise MechanismError("a bootstrap needs the release's noise record")
    if replicates < 2:
        raise MechanismError(f"replicates ({replicates!r}) must be at least 2")
    params = release.parameters
    b_hat = np.asarray(measurements.moments)
    rng = np.random.default_rng(
        bootstrap.seed_of(measurements.moments, release.points, release.weights)
    )
    points, weights, sizes = [], [], []
    for _ in range(replicates):
        simulated = b_hat + bootstrap.simulated_noise(
            calibration.distribution, calibration.scale, b_hat.shape, rng
        )
        refit = synthesize_from(
            replace(measurements, moments=simulated),
            rng,
            grid_size=None if measurements.grid == "full" else int(params["C"]),
            solver=str(params["solver"]),
            sample_size=1,
            rounding=params.get("rounding"),
            grid_resolution=params.get("grid_resolution"),
            ellipsoid_radius=params.get("ellipsoid_radius") or "paper",
        )
        order = np.argsort(refit.weights)[::-1]
        held = np.cumsum(refit.weights[order])
        keep = order[: min(int(np.searchsorted(held, 1.0 - REPLICATE_MASS_CUT)) + 1, order.size)]
        points.append(refit.points[keep])
        weights.append(refit.weights[keep] / refit.weights[keep].sum())
        sizes.append(keep.size)
        if progress is not None:
            progress(len(sizes) / replicates)
    return SupportReplicates(
        d=measurements.d,
        points=np.concatenate(points),
        weights=np.concatenate(weights),
        sizes=np.asarray(sizes, dtype=np.int64),
    )


def synthesize(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    grid: str = "hypercube",
    grid_size: int | None = None,
    basis_size: int | None = None,
    rng: np.random.Generator | None = None,
    *,
    noise_mechanism: str | None = None,
    basis_rule: str = "paper_min_d",
    pca_share: float = 0.2,
    pca_rank: int | None = None,
    pca_iterations: int | None = None,
    pca_noise: str | None = None,
    centre_share: float = 0.05,
    solver: str = "simplex",
    sample_size: int | None = None,
    rounding: int | None = None,
    grid_resolution: int | None = None,
    ellipsoid_radius: str = "paper",
    time_limit: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> SyntheticRelease:
    """:func:`measure` then :func:`synthesize_from` (DESIGN §6); ``rng`` feeds both."""
    rng = rng if rng is not None else np.random.default_rng()
    measurements = measure(
        X,
        epsilon,
        delta,
        smoothness,
        grid,
        basis_size,
        rng,
        noise_mechanism=noise_mechanism,
        basis_rule=basis_rule,
        pca_share=pca_share,
        pca_rank=pca_rank,
        pca_iterations=pca_iterations,
        pca_noise=pca_noise,
        centre_share=centre_share,
    )
    return synthesize_from(
        measurements,
        rng,
        grid_size=grid_size,
        solver=solver,
        sample_size=sample_size,
        rounding=rounding,
        grid_resolution=grid_resolution,
        ellipsoid_radius=ellipsoid_radius,
        time_limit=time_limit,
        max_bytes=max_bytes,
    )


# --- internals -----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Plan:
    """Every resolved parameter of :func:`measure`, from public values only."""

    n: int
    d: int
    smoothness: int
    delta: float
    grid: str
    theorem: TheoremParameters
    R: int
    basis_kind: str
    basis_rule: str
    noise_mechanism: str
    pca_rank: int
    pca_iterations: int
    pca_noise: str
    pca_share: float
    budget: dict[str, tuple[float, float]]

    @functools.cached_property
    def index_set(self) -> basis.IndexSet:
        if self.basis_kind == "full_tensor":
            index_set = basis.full_tensor(self.d, max(self.theorem.t, 2))
        else:
            index_set = basis.total_degree(self.d, self.R)
        missing_first_degree = bool(np.any(index_set.first_degree_positions() < 0))
        if index_set.size != self.R or (
            self.grid == "pca_ellipsoid" and missing_first_degree != ("pca_centre" in self.budget)
        ):
            raise RuntimeError("internal error: the index set differs from the plan")
        return index_set

    def parameters(self) -> dict[str, Any]:
        return {
            "t": self.theorem.t,
            "N": self.theorem.N,
            "m": self.theorem.m,
            "L": self.theorem.L,
            "R": self.R,
            "R_paper": paper_basis_size(self.n, self.d, self.smoothness, self.delta),
            "basis": self.basis_kind,
            "basis_rule": self.basis_rule,
            "noise": self.noise_mechanism,
            "pca_rank": self.pca_rank if self.grid == "pca_ellipsoid" else None,
            "pca_iterations": self.pca_iterations if self.grid == "pca_ellipsoid" else None,
            "pca_noise": self.pca_noise if self.grid == "pca_ellipsoid" else None,
            "pca_share": self.pca_share if self.grid == "pca_ellipsoid" else None,
            "snapped_to_grid": self.grid == "full",
            "budget": {step: list(v) for step, v in self.budget.items()},
        }


def _check_arguments(
    epsilon: float,
    delta: float,
    smoothness: int,
    grid: str,
    basis_rule: str,
    noise_mechanism: str | None,
) -> str:
    """The checks of :func:`measure`'s arguments that need no ``n`` or ``d``; returns the
    moment noise mechanism."""
    check_budget(epsilon, delta)
    _check_positive_int("smoothness", smoothness)
    if grid not in GRIDS:
        raise MechanismError(f"grid ({grid!r}) must be one of {GRIDS}")
    if basis_rule not in BASIS_RULES:
        raise MechanismError(f"basis_rule ({basis_rule!r}) must be one of {BASIS_RULES}")
    mechanism = noise_mechanism or ("laplace" if delta == 0.0 else "gaussian")
    if mechanism not in noise.MECHANISMS:
        raise MechanismError(f"noise_mechanism ({mechanism!r}) must be one of {noise.MECHANISMS}")
    if mechanism != "laplace" and delta == 0.0:
        raise MechanismError(f"noise_mechanism {mechanism!r} needs delta > 0")
    return mechanism


def _plan(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float,
    smoothness: int,
    grid: str,
    basis_size: int | None,
    noise_mechanism: str | None,
    basis_rule: str,
    pca_share: float,
    pca_rank: int | None,
    pca_iterations: int | None,
    pca_noise: str | None,
    centre_share: float,
) -> tuple[RowSource, _Plan]:
    """Validate every argument and resolve every parameter before any data is read."""
    _check_arguments(epsilon, delta, smoothness, grid, basis_rule, noise_mechanism)
    source = as_source(X)
    plan = _public_plan(
        source.n_rows,
        source.n_cols,
        epsilon,
        delta,
        smoothness,
        grid,
        basis_size,
        noise_mechanism,
        basis_rule,
        pca_share,
        pca_rank,
        pca_iterations,
        pca_noise,
        centre_share,
    )
    return source, plan


def _public_plan(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    smoothness: int,
    grid: str,
    basis_size: int | None,
    noise_mechanism: str | None,
    basis_rule: str,
    pca_share: float,
    pca_rank: int | None,
    pca_iterations: int | None,
    pca_noise: str | None,
    centre_share: float,
) -> _Plan:
    """:func:`_plan` from ``n`` and ``d`` (public values) alone."""
    mechanism = _check_arguments(epsilon, delta, smoothness, grid, basis_rule, noise_mechanism)
    theorem = theorem_parameters(n, d, smoothness, delta)
    R = moments_count(n, d, smoothness, delta, grid, basis_size, basis_rule)
    kind = "full_tensor" if basis_size is None and grid == "full" else "total_degree"

    rank = d if pca_rank is None else pca_rank
    iterations = 1 if pca_iterations is None else pca_iterations
    pca_mech = pca_noise or ("laplace" if delta == 0.0 else "gaussian")
    budget: dict[str, tuple[float, float]]
    if grid == "pca_ellipsoid":
        pca._check_pca_args(d, rank, iterations, pca_mech)
        if pca_mech == "gaussian" and delta == 0.0:
            raise MechanismError("pca_noise 'gaussian' needs delta > 0")
        # the first R graded indices hold every T_1(x_i) = x_i once R >= d (a full tensor
        # basis always does): then the centre is their noisy values, else it is measured
        needs_centre = kind == "total_degree" and d > R
        shares = {"pca_subspace": pca_share}
        if needs_centre:
            shares = {"pca_subspace": pca_share - centre_share, "pca_centre": centre_share}
        for name, share in shares.items():
            if not (math.isfinite(share) and 0.0 < share < 1.0):
                raise MechanismError(
                    f"the budget share of step {name!r} ({share!r}) must lie in (0, 1); "
                    "check pca_share and centre_share"
                )
        shares["moments"] = 1.0 - sum(shares.values())
        if shares["moments"] <= 0.0:
            raise MechanismError("pca_share must leave a positive share for the moments")
        uses_delta = {"moments": mechanism != "laplace"}
        uses_delta.update({step: pca_mech == "gaussian" for step in shares if step != "moments"})
    else:
        shares = {"moments": 1.0}
        uses_delta = {"moments": mechanism != "laplace"}
    eps_parts = _split(epsilon, shares)
    delta_parts = _split(delta, {s: w for s, w in shares.items() if uses_delta[s]})
    budget = {step: (eps_parts[step], delta_parts.get(step, 0.0)) for step in shares}
    return _Plan(
        n=n,
        d=d,
        smoothness=smoothness,
        delta=float(delta),
        grid=grid,
        theorem=theorem,
        R=R,
        basis_kind=kind,
        basis_rule=basis_rule,
        noise_mechanism=mechanism,
        pca_rank=rank,
        pca_iterations=iterations,
        pca_noise=pca_mech,
        pca_share=pca_share,
        budget=budget,
    )


def _calibrate_steps(plan: _Plan) -> NoisePlan:
    """Every noise calibration of the plan's steps, as :func:`measure` draws them: the
    moments (:func:`noise.moment_sensitivity` of ``R`` in the mechanism's metric), and for
    the ellipsoid grid the PCA (:func:`pca.subspace_calibration`) and a measured centre."""

    def calibrated(
        what: str, calibrate: Callable[[], noise.NoiseCalibration]
    ) -> noise.NoiseCalibration:
        try:
            return calibrate()
        except MechanismError as exc:
            raise MechanismError(f"the noise of {what} cannot be calibrated: {exc}") from None

    mechanism = plan.noise_mechanism
    eps, dlt = plan.budget["moments"]
    sensitivity = noise.moment_sensitivity(plan.n, plan.R)[noise.METRIC[mechanism]]
    moments = calibrated(
        f"the R = {plan.R} moments (noise_mechanism {mechanism!r})",
        lambda: noise.calibrate(
            mechanism, sensitivity=sensitivity, epsilon=eps, delta=dlt, dimension=plan.R
        ),
    )
    subspace = centre = None
    if plan.grid == "pca_ellipsoid":
        sub_eps, sub_delta = plan.budget["pca_subspace"]
        subspace = calibrated(
            f"the private PCA (pca_noise {plan.pca_noise!r})",
            lambda: pca.subspace_calibration(
                plan.n,
                plan.d,
                rank=plan.pca_rank,
                iterations=plan.pca_iterations,
                epsilon=sub_eps,
                delta=sub_delta,
                mechanism=plan.pca_noise,
            ),
        )
        if "pca_centre" in plan.budget:
            centre_eps, centre_delta = plan.budget["pca_centre"]
            metric = "l1" if plan.pca_noise == "laplace" else "l2"
            centre = calibrated(
                f"the ellipsoid's centre (pca_noise {plan.pca_noise!r})",
                lambda: noise.calibrate(
                    plan.pca_noise,
                    sensitivity=pca.mean_sensitivity(plan.n, plan.d)[metric],
                    epsilon=centre_eps,
                    delta=centre_delta,
                    dimension=plan.d,
                ),
            )
    return NoisePlan(R=plan.R, moments=moments, pca_subspace=subspace, pca_centre=centre)


@dataclass(frozen=True)
class _SnappedSource:
    """Algorithm 1 steps 3-5: every coordinate moved to the nearest ``a_k`` of the grid."""

    inner: RowSource
    N: int

    @property
    def n_rows(self) -> int:
        return self.inner.n_rows

    @property
    def n_cols(self) -> int:
        return self.inner.n_cols

    def batches(self) -> Iterator[NDArray[np.float64]]:
        for batch in self.inner.batches():
            yield grids.snap_to_grid(np.asarray(batch, dtype=np.float64), self.N)


def _moment_source(source: RowSource, plan: _Plan) -> RowSource:
    return _SnappedSource(source, plan.theorem.N) if plan.grid == "full" else source


def _candidates(
    measurements: Measurements,
    C: int,
    N: int,
    rng: np.random.Generator,
    radius: str,
) -> NDArray[np.float64]:
    d = measurements.d
    if measurements.grid == "full":
        return grids.full_grid(d, N)
    if measurements.grid == "hypercube":
        return grids.hypercube(C, d, rng, resolution=N if N else None)
    record = measurements.pca
    assert record is not None  # checked in Measurements.__post_init__
    factor = 1.0 if radius == "paper" else float(record.rank + 2)
    radii = np.sqrt(factor * record.eigenvalues)
    return grids.ellipsoid(C, measurements.noisy_centre(), record.axes, radii, rng)


def _split(total: float, weights: Mapping[str, float]) -> dict[str, float]:
    """``total`` in proportion to ``weights``, rounded so the parts never sum above ``total``."""
    if not weights or total == 0.0:
        return dict.fromkeys(weights, 0.0)
    weight_sum = math.fsum(weights.values())
    parts = {step: total * w / weight_sum for step, w in weights.items()}
    while math.fsum(parts.values()) > total:
        largest = max(parts, key=lambda step: parts[step])
        parts[largest] = math.nextafter(parts[largest], 0.0)
    return parts


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{name} ({value!r}) must be a positive integer")


def _measure_without_noise(
    X: ArrayLike,
    *,
    smoothness: int = 4,
    grid: str = "hypercube",
    basis_size: int | None = None,
    pca_rank: int | None = None,
) -> Measurements:
    """TEST-ONLY, NOT PRIVATE: exact moments (and exact PCA) in a ``Measurements``.

    For checking the approximation error of the synthesis with the noise switched off. It
    is a separate private function, not a flag of :func:`measure`; its result carries the
    privacy kind ``"non_private"`` and cannot be serialised (:meth:`Measurements.to_dict`
    refuses it), so nothing built from it can be stored as a release.
    """
    source, plan = _plan(
        X,
        1.0,
        0.0,
        smoothness,
        grid,
        basis_size,
        None,
        "paper_min_d",
        0.2,
        pca_rank,
        1,
        None,
        0.05,
    )
    exact = basis.moments(_moment_source(source, plan), plan.index_set)
    record = centre = None
    if grid == "pca_ellipsoid":
        record, centre = pca.exact_pca(source, plan.pca_rank)
    return Measurements(
        n=plan.n,
        d=plan.d,
        epsilon=0.0,
        delta=0.0,
        smoothness=smoothness,
        grid=grid,
        index_set=plan.index_set,
        moments=exact,
        moment_noise=None,
        privacy_cost=PrivacyCost(epsilon=0.0, kind="non_private"),
        parameters=plan.parameters(),
        pca=record,
        centre=centre,
    )


__all__ = [
    "BASIS_RULES",
    "GRIDS",
    "Measurements",
    "NoisePlan",
    "SyntheticRelease",
    "TheoremParameters",
    "default_basis_size",
    "measure",
    "noise_plan",
    "paper_basis_size",
    "synthesize",
    "synthesize_from",
    "theorem_parameters",
]
