"""``smooth_synopsis``: the noisy moment summary of paper 001 and its public evaluation.

Wang, Fan, Zhang, Wang, *Efficient Algorithm for Privately Releasing Smooth Queries*
(NIPS 2013), paper 001.

Measure (Algorithm 1)
---------------------
For an index set ``S`` of ``R`` non-constant multi-indices the summary is the vector of
moments ``b_r = (1/n) sum_{x in D} T_r(x)``, ``T_r(x) = prod_i cos(r_i arccos x_i)``
(:func:`app.mechanisms.basis.moments`), plus noise drawn by OpenDP
(:mod:`app.mechanisms.noise`):

* ``delta = 0``: vector Laplace, scale ``b = Delta_1 / epsilon`` with the L1 sensitivity
  ``Delta_1 = 2R/n`` (paper 001 writes ``Lap(t^d / (n eps))``; under replace-one
  neighbours each ``|b_r(D) - b_r(D')| <= 2/n`` because ``|T_r| <= 1``, and the constant
  ``r = 0`` is left out: it is exactly 1);
* ``delta > 0``: vector Gaussian with the L2 sensitivity ``Delta_2 = 2 sqrt(R)/n``, the
  scale found from OpenDP's zCDP map so the charged ``(epsilon, delta)`` fits the request.

Both are declared with an allowance for the floating-point rounding of the computed
moments (:func:`app.mechanisms.noise.moment_sensitivity` through
:func:`app.mechanisms.noise.float_sensitivity`: relative ``3.2e-11`` at ``n = 10^4``).

**Privacy.** Two statistics of the data are released: the moment vector, protected by
one Laplace (pure ``epsilon``-DP) or Gaussian (``(epsilon, delta)``-DP) measurement
calibrated to its sensitivity under replace-one neighbours, and (by default, when the
index set admits it) the co-spread, one number measured afterwards with the Laplace
mechanism at ``CO_SPREAD_SHARE epsilon`` (:mod:`app.mechanisms.dependence`, which derives
its sensitivity; its centring comes from the released moments, so adaptive composition
applies). The costs add up to the request: the moments get ``(1 - CO_SPREAD_SHARE)
epsilon`` and ``delta``. ``n`` and ``d`` are public (DESIGN §2.2), and the index set and
the split are chosen from public parameters only (``n, d, epsilon, delta, K``; never
from the data; :func:`plan`), so everything else in a :class:`Synopsis` -- answers,
standard errors, intervals -- is post-processing.

Evaluate (Algorithm 2)
----------------------
A query ``f`` has the Chebyshev expansion ``f = c_0 + sum_r c_r T_r``
(:mod:`app.mechanisms.chebyshev`); its answer from the synopsis is

    answer = c_0 + <c_S, b_hat>                                   (Algorithm 2)

(``T_0 = 1`` and its moment is exactly 1, so ``c_0`` carries no noise). With
``b_hat = b + eta`` the error is ``<c_S, eta> + e_trunc`` where
``|e_trunc| = |sum_{r not in S} c_r b_r| <= tau`` (the truncation bound) for every
dataset. The noise term has mean 0 and standard error

    stderr = s ||c_S||_2,   s = sqrt(2) b (Laplace) or sigma (Gaussian).

Independence extrapolation (the default for separable queries)
---------------------------------------------------------------
For Gaussian mixtures, products of 1-D functions and polynomials, the answer also adds

    X = sum_j w_j [prod_i F_ji - sum_{r in S} prod_i a_{ji r_i} b_hat_{r_i e_i}],
    F_ji = sum_{k <= K_i} a_{jik} b_hat_{k e_i},

the out-of-set terms that the released one-column moments predict if the columns were
independent (``b_r ~ prod_i b_{r_i e_i}``;
:func:`app.mechanisms.chebyshev.independence_extrapolation`, for total-degree sets with
each column's own degrees up to ``K_i``). It is post-processing of the released moments.
On real data most of the truncation error is of this form (each column's own law seen
by every kernel: measured on the paper-000 protocol with exact moments, CRM sigma = 4,
the worst-case truncation error fell from 0.47x to 0.12x the 0-DP baseline, and on
independent or one-factor test data the median error fell ~3x); what is left is the
dependence ``b_r - prod_i b_{r_i e_i}`` and the degrees past ``K_i``. The answer is then
not linear in ``b_hat``: its stderr is the delta-method ``s ||c_S + grad X||_2`` and the
noise quantile is taken for that linear statistic. When no pair moment is released
(``D = 1``) the answer is exactly ``sum_j w_j prod_i F_hat_ji``, a product of ``d``
independent noisy factors: far from linear when the noise is comparable with the
``F_ji``. There the stderr adds the exact variance past the delta method
(:func:`app.mechanisms.chebyshev.independence_extrapolation`, ``excess_variance``) and the
noise half-width is multiplied by :func:`product_skew_factor` ``(s)``, with ``s |value|``
the delta-method stderr capped by ``sqrt(sqrt(2 excess) |value|)`` (the log-normal
relation ``excess ~ value^2 s^4 / 2``, which is 0 for a single noisy factor, a linear
answer); the half-width never exceeds the worst case ``q s ||c_S|| + tau + |X|``.
``extrapolate=False`` gives the plain
Algorithm-2 answer; ``Answer.extrapolation`` is the added term and
``worst_case_interval`` stays centred on the plain answer.

Dependence correction (Gaussian kernels, with a co-spread)
----------------------------------------------------------
The extrapolation treats the columns as independent. For a Gaussian kernel
``prod_i exp(h_i)``, ``h_i = -(x_i - c_i)^2 / (2 s_i^2)``, the first missing term of the
cumulant expansion, ``1/2 sum_{i != j} Cov(h_i, h_j)``, has a part free of the centre that
one number carries: the co-spread ``A = sum_{i != j} Cov(x_i^2, x_j^2)``
(:mod:`app.mechanisms.dependence`). A synopsis that holds ``A_hat`` multiplies the answer
of a query whose Gaussian factors (mixture kernels or :class:`Gaussian1D` product factors)
all have width ``s_i >= 1.5`` by ``exp(lambda)``,

    lambda = A_hat / (2 d (d - 1)) [(sum_i k_i)^2 - sum_i k_i^2],   k_i = 1 / (2 s_i^2)

(``A_hat / (8 s^4)`` for equal widths; ``k_i = 0`` in columns without a Gaussian factor),
and adds the error of ``A_hat`` (Laplace noise and centring,
:attr:`~app.mechanisms.dependence.CoSpread.stddev`) to the stderr and the noise half-width
in quadrature. The correction is kept for a query when its mean squared error, sized by
the data-free magnitude ``u`` of the answer (the query's expectation under the uniform
law), is below the uncorrected one's: ``e^{2 lambda} se^2 + (u lambda' sd_A)^2 <= se^2 +
((e^lambda - 1) u)^2`` (``lambda' = lambda / A_hat``); where it is not (noise-dominated
answers, which scaling would only amplify), the answer stays uncorrected and its interval
is widened by the estimated bias ``|e^lambda - 1| |answer|``. ``se`` there is the answer's
``stderr``, which for synopses without pair moments includes the product's second-order
variance (section "Independence extrapolation"): since c118fd3 more of their
noise-dominated answers stay uncorrected, so their *value* changed too (CRM, epsilon 1,
width 2: 3-4 % of answers, root mean squared error on those 0.00086 -> 0.00050; WDBC
0.1 %). Where it is kept, the
correction is itself uncertain -- the expansion is cut after the centre-free part of its
second cumulant, leaving the centre-dependent covariances (``Cov(x_i, x_j) c_i c_j``,
``Cov(x_i^2, x_j) c_j``) and the higher cumulants, the latter one power of ``k`` smaller
-- and the interval takes a bias of up to ``min(1, c k_max) |e^lambda - 1| |answer|``
(``c =`` :data:`CO_SPREAD_MODEL_ERROR` ``= 4``: half the correction at width 2, an eighth
at width 4, 1/32 at width 8). Without it, on WDBC at epsilon 10 and width 2 (noise
small, lambda ~0.11) the corrected answers overshot the truth in 85 % of queries by up
to 3 of their spread and the intervals covered 0.82-0.91 (one query in 10 % of
releases); the constant was chosen there, so it is a calibration on WDBC, checked on a
one-factor synthetic case (coverage 0.21 -> 1.00, tests) and on CTG, PKS and CRM at
epsilon 1 (within their Monte Carlo error) and epsilon 10
(``bench/results/smooth_synopsis_coverage*_eps10.md``: 0.94-1.00 in every cell; CRM width
2 0.83 -> 1.00 Laplace, 0.58 -> 1.00 Gaussian, half / q95 ~1.8). On CRM ``c = 2`` would
leave single queries at 0.20-0.65 (``bench/results/co_spread_model_error_sensitivity.md``):
4 is about what it needs too, with little margin. ``Answer.dependence`` is the
``lambda`` applied (0 when none). Kernels narrower than 1.5 vary too much over the cube for
a second-order term (measured: at width 1 it overshoots) and are left alone. Measured on
the paper-000 protocol, eps = 1, 1000 queries, 20 paired rounds (the same moments answered
with and without ``A_hat``): CRM (d = 100) at sigma = 2, coverage of the 95 % interval
0.80 -> 0.99, median relative error 0.28 -> 0.18, mean 1.65x -> 1.32x the 0-DP baseline,
worst case 1.34x -> 1.47x (a corrected answer scales its noise too); at sigma = 4 coverage
0.971 -> 0.981, errors level. WDBC sigma = 2: coverage 0.90 -> 0.95, mean error 0.64x ->
0.72x (an earlier 10-round run: 0.71x -> 0.59x; ``A_hat`` is noisy at n = 569: standard
deviation 6.8 for ``A ~ 14``). CTG and PKS: within the noise. Release-level coverage with
standard errors: ``bench/results/smooth_synopsis_coverage.md``.

The noise half-width is ``q_level * stderr``, where ``q_level`` is the
two-sided ``level`` quantile of ``<c_S, eta> / stderr``: the normal quantile for Gaussian
noise (exact), and for Laplace noise the Lugannani-Rice saddlepoint quantile of the
weighted Laplace sum (its cumulant generating function is
``K(u) = -sum_r log(1 - b^2 c_r^2 u^2)``). A normal approximation would under-cover when
``c_S`` sits on a few coordinates (one coordinate: the exact factor is
``log(1/(1 - level)) / sqrt 2 = 2.118`` at 95 %, not 1.96); the saddlepoint factor moves
from 2.12 to 1.96 as ``c_S`` spreads and over-covers by less than 0.1 % (tests).

Intervals
---------
``worst_case_interval = answer +- (q_level * stderr + tau)`` covers ``q_f(D)`` with
probability at least ``level`` for every dataset. But ``tau`` is attained only by point
masses at the corners of the cube; on the benchmark data it is 6 to 10^6 times the actual
truncation error, and those intervals covered ~100 % of queries at a nominal 95 %. The
returned ``interval`` is ``answer +- halfwidth`` with

    halfwidth = cv(axis_tail / spread) spread,
    spread = sqrt((q_level stderr / z_level)^2 + cross_scale^2)

(capped at the worst case), where ``cv(t)`` solves ``P(|Z + t| <= cv) = level``
(:func:`bias_aware_critical_value`: the noise and the interaction terms as one normal
error, the one-column tail as a bias of at most ``axis_tail``; ``cv(0) = z_level`` and
``cv(t) -> t + z_one_sided``; the earlier ``sqrt(...) + axis_tail`` over-covered where the
tail was comparable with the noise: pooled over 40 releases per sigma, CTG 0.978 ->
0.970, PKS 0.978 -> 0.975, ``bench/results/smooth_synopsis_coverage.md``), from
:func:`app.mechanisms.chebyshev.truncation_estimate`:

* ``axis_tail = sum |c_{k e_i}|`` over the one-column terms ``T_k(x_i)`` outside ``S``: a
  bound on that part (``|b| <= 1``), treated as a bias rather than a random term because
  on real data these moments share a sign across columns (``E T_2(x_i) = 2 E x_i^2 - 1 <
  0`` for every column concentrated inside its bounds) and add up without cancelling;
* ``cross_scale^2 = sum c_r^2 mu_r`` over the interaction terms (two or more columns)
  outside ``S``, with ``mu_r = prod_i mu_i(r_i)`` and ``mu_i(k)`` an estimate of
  ``E T_k(x_i)^2 = (1 + E T_2k(x_i)) / 2`` read off the released ``b_hat_{2k e_i}`` when
  ``S`` holds it (:attr:`Synopsis.mu`) and :data:`TYPICAL_MU` otherwise: the standard
  deviation of that part if its moments had random signs and the Cauchy-Schwarz size
  ``b_r^2 <= E T_{r_i}(x_i)^2 E T_{r_j}(x_j)^2``. With the extrapolation what is left of
  a two-column term is the covariance ``b_r - b_{r_i e_i} b_{r_j e_j}``, whose
  Cauchy-Schwarz size has variances in place of second moments, so extrapolated answers
  use :attr:`Synopsis.centred_mu` (``mu`` less ``max(b_hat_{k e_i}^2 - s^2, 0)``; on CTG
  and PKS this narrowed the interval by up to a third where it over-covered). This is
  an *estimate*, combined with the noise in quadrature.

Everything here is post-processing of the released moments (and the co-spread). What
it cannot see is dependence between columns beyond the co-spread: when the columns are
strongly correlated the interaction moments add up coherently and the estimate is too
small; on CRM (d = 100) at ``sigma = 2`` the intervals covered 60-80 % of the queries
without the co-spread and 94-99 % with it. ``worst_case_interval`` remains valid for every
dataset.

Two regimes where the estimated interval under-covered, measured on WDBC at epsilon 0.1,
1 and 10 (``bench/results/interval_coverage.md``; 0.93-1.00 in the other cells). At
epsilon 10 and width-2 kernels (0.90 Laplace, R = 120, no pair moments; 0.84 Gaussian,
R = 585) the noise is small and the error is the co-spread correction's: the
noise-free extrapolated answers fall short of the truth in every query (by ~3.4 of the
answers' spread), ``e^lambda`` (lambda ~0.11) overshoots, and the corrected answers' mean
missed by 0.7-0.8 of their spread, mostly upwards; the worst query was covered in 10 %
(Gaussian) and 36 % (Laplace) of releases. The interval now carries the correction's
own error (section "Dependence correction", :data:`CO_SPREAD_MODEL_ERROR`). Paired on
the same 40 releases x 150 queries: Gaussian 0.816 -> 0.987 (worst query 0.10 -> 0.82),
Laplace 0.913 -> 0.998 (0.38 -> 0.93), at 0.83 -> 1.52 and 1.03 -> 1.73 half / q95;
width 4 and 8 cells move by at most 0.05 half / q95, width 2 at epsilon 1 by 0.12-0.17.

The other regime, Gaussian noise at epsilon 0.1, width 2 (was 0.85; ``D = 1``, R = 60):
the extrapolated answer is a product of thirty noisy one-column sums, skewed
(skewness 2.8, excess kurtosis 11), and its delta-method stderr was 0.78 of the answers'
spread, the misses all on the low side (a low answer came with a small stderr). For
``D = 1`` sets the stderr now adds the exact second-order variance of the product and
the noise half-width is widened by :func:`product_skew_factor`, the symmetric
half-width that covers at ``level`` when the product's error is log-normal (module
section "Independence extrapolation"). Paired on the same 40 releases x 150 queries
(binomial se ~0.02): 0.861 -> 0.941, half / q95 1.04 -> 1.77 (a symmetric interval
about a right-skewed answer is wide); Laplace epsilon 0.1 width 2, which already covered
1.000 (its noise part 0.65, made up by the one-column tail), widens from 2.12 to 2.77
half / q95; every cell with pair moments (``D >= 2``) is unchanged.

The estimate is made for queries of the declared smoothness ``K``. A query with a Gaussian
factor narrower than that class (width ``s`` with ``s^2 < K`` on the normalised scale,
Proposition 2.1; read off the expansion's curvature ``1 / (2 s^2)``) varies faster than the
basis resolves, and centred where the data concentrate its truncated interaction terms add
up coherently: an audit measured 0-11 % coverage of the estimated 95 % interval for
row-centred kernels of width 0.3 on four wine columns (the same query missed in every
release). Such queries get ``halfwidth = max(worst + |extrapolation|, noise_halfwidth)``,
the worst case, which holds for every dataset, and ``within_smoothness = False``. Factors
given as 1-D callables carry no width and keep the estimate (their tails are estimated
too: ``rigorous = False``).

Choice of the index set (public parameters only)
-------------------------------------------------
``basis="paper"`` is Theorem 3.1: the full tensor ``{0..t-1}^d`` with
``t = ceil(n^(1/(2d+K)))``. For real ``n`` and ``d`` this is either far too large
(``t^d`` functions) or uninformative, so the default ``basis="auto"`` chooses from the
noise level: for each candidate -- complete total-degree sets ``|r| <= D`` (``D = 1, 2,
...``), the same extended by each column's own ``T_k``, ``k <= K`` (``K = D+1 .. D+12``,
:func:`app.mechanisms.basis.axis_total_degree`; ``D <= 4``, ``d >= 2``) and full tensors
``t = 2, 3, ...`` up to ``max_basis_size`` functions -- it predicts the interval
half-width ``W(S) = z sqrt(s(R)^2 E ||c_S||^2 + cross(S)^2) + axis(S)`` (the terms of
"Intervals" with ``mu = TYPICAL_MU``) of a
*representative K-smooth query*, one Gaussian kernel ``exp(-||x - c||^2 / (2K))`` (width
``sigma = sqrt(K)``: ``K``-smooth with norm <= 1 for ``K <= sigma^2``, paper 000
Prop. 2.1) with centre ``c ~ U[-1, 1]^d``, and keeps the smallest ``W``. ``s(R)`` is the
calibrated noise standard deviation for ``R`` moments, and since the kernel is a product
over columns with independent centre coordinates, both expectations factorise
(``E prod_i = prod_i E``) and are computed exactly from 1-D quadrature over ``c``, and for
total-degree sets by truncated polynomial powers (no enumeration). This trades noise
(growing like ``R`` or ``sqrt R``) against truncation (shrinking with the degree) for
queries of the declared smoothness; ``basis_size=R`` forces the ``R`` lowest-total-degree
functions instead (paper 000 §3.4).

The one-column extension matters on real data: with ``D = 1`` alone the missing
``E T_2(x_i)`` terms dominated the error (WDBC, sigma = 4: truncation 10x the noise),
and measuring them (``R = 2d``) cut the worst-case error from 0.69x to ~0.4x the 0-DP
baseline (``bench/results/smooth_synopsis.md``). ``basis="nominal"`` instead takes the
narrowest candidate whose predicted worst-case ``tau`` is at most 10 % of the predicted
noise half-width, so that even ``worst_case_interval`` covers close to 95 % (at most
``P(|Z| <= 1.1 z) = 96.9 %``), bought with a much larger basis and more noise.

Service notes
-------------
* Store ``Synopsis.to_dict()`` (JSON, exact round trip); answer later with
  ``Synopsis.from_dict(doc).answer_many(queries)`` -- no data needed. ``Answer.as_dict()``
  gives ``value``, ``stderr``, ``interval`` and its two parts.
* A Gaussian-mixture query in original units (centre ``c``, widths ``s_i``) on a column
  normalised by ``x' = 2 (x - lo_i) / (hi_i - lo_i) - 1`` is the
  :class:`~app.mechanisms.queries.AnisotropicGaussianMixture` with centre
  ``2 (c_i - lo_i) / (hi_i - lo_i) - 1`` and ``sigma_i = 2 s_i / (hi_i - lo_i)``.
* :func:`choose_basis` needs no data: it can preview ``R``, the noise scale and the
  predicted stderr / truncation of a request before any budget is spent.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr, ndtri

from app.mechanisms import dependence, noise
from app.mechanisms.basis import (
    MAX_INDEX_SET_SIZE,
    IndexSet,
    axis_total_degree,
    check_index_set_size,
    count_total_degree,
    full_tensor,
    largest_index_set_size,
    moments,
    total_degree,
)
from app.mechanisms.chebyshev import (
    IndependenceExtrapolation,
    QueryCoefficients,
    TensorExpansion,
    TruncationEstimate,
    expand,
    gaussian_expansion,
    gaussian_factors,
    independence_extrapolation,
    is_separable,
    query_coefficients,
    restrict,
    separable_blocks,
    truncation_estimate,
)
from app.mechanisms.data import RowSource, as_source, progress_part
from app.mechanisms.dependence import CoSpread
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import PrivacyCost, check_budget
from app.mechanisms.queries import (
    GaussianMixtureBatch,
)

MECHANISM_ID = "smooth_synopsis"
#: 2 added the optional ``co_spread`` (documents of version 1 have none and still load).
FORMAT_VERSION = 2
READABLE_FORMAT_VERSIONS = (1, 2)
MEASURE_STEP = "moments"

#: Default largest index set the automatic rule considers (moments cost ``O(n R)``,
#: answering ``10^4`` Gaussian-mixture queries costs ``O(10^5 R)``).
DEFAULT_MAX_BASIS_SIZE = 20_000

BASIS_RULES = ("auto", "nominal", "paper", "total_degree", "full_tensor")

#: ``basis="nominal"``: largest predicted truncation bound, as a share of the predicted
#: 95 % noise half-width, for the interval to stay close to its nominal coverage.
NOMINAL_TRUNCATION_SHARE = 0.1

#: ``mu_i(k)``, the size of ``E T_k(x_i)^2`` assumed where the synopsis does not measure it
#: (``E T_k^2 = (1 + E T_2k) / 2``; exactly 1/2 under the arcsine law, ~1/2 under the
#: uniform one; 1 only for point masses at the bounds).
TYPICAL_MU = 0.5

#: Largest one-column degree beyond the total degree that the rule tries (``K <= D + 12``),
#: and the largest total degree it extends so (higher ones already hold high one-column
#: degrees).
MAX_AXIS_EXTRA = 12
MAX_AXIS_TOTAL_DEGREE = 4

#: Queries per block in :meth:`Synopsis.answer_many`.
ANSWER_BLOCK = 256

#: Share of ``epsilon`` spent on the co-spread (module docstring, "Dependence correction").
CO_SPREAD_SHARE = 0.05
#: Error allowed for an applied co-spread correction, per unit of the query's largest
#: curvature ``k = 1 / (2 s^2)``: a bias of up to ``min(1, c k) |e^lambda - 1| |answer|``
#: (module docstring, "Dependence correction"; half the correction at width 2, an eighth
#: at width 4). Chosen on WDBC at epsilon 10, width 2 (``bench/results/interval_coverage.md``):
#: a calibration, not a derived constant.
CO_SPREAD_MODEL_ERROR = 4.0
#: The correction applies to queries whose Gaussian factors all have width ``s >= 1.5``
#: on the normalised scale (``1 / (2 s^2) <= 2 / 9``): narrower kernels vary too much
#: over the cube for the second-order cumulant term (module docstring).
CO_SPREAD_MAX_CURVATURE = 2.0 / 9.0

#: Entries of the index set gathered at once by :meth:`_RepresentativeQuery.index_set_sums`.
_SUMS_BLOCK_ENTRIES = 1 << 20

# Laplace saddlepoint: coordinates kept exactly (the rest is lumped as a Gaussian term),
# and the effective number of coordinates above which the normal quantile is used.
_SADDLEPOINT_TERMS = 64
_NORMAL_NEFF = 1e4


# --- resolved basis ----------------------------------------------------------------------


@dataclass(frozen=True)
class BasisCandidate:
    """One index set considered by the rule and its predicted accuracy (representative query)."""

    kind: str
    parameter: int
    size: int
    coordinate_stddev: float
    predicted_stderr: float
    predicted_truncation: float
    predicted_axis_tail: float = 0.0
    predicted_cross_scale: float = 0.0
    axis_degree: int = 0

    @property
    def predicted_halfwidth(self) -> float:
        """``W = z sqrt(stderr^2 + cross_scale^2) + axis_tail`` at 95 % (module docstring)."""
        z = float(ndtri(0.975))
        return z * math.hypot(self.predicted_stderr, self.predicted_cross_scale) + (
            self.predicted_axis_tail
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "parameter": self.parameter,
            "axis_degree": self.axis_degree,
            "size": self.size,
            "coordinate_stddev": self.coordinate_stddev,
            "predicted_stderr": self.predicted_stderr,
            "predicted_truncation": self.predicted_truncation,
            "predicted_axis_tail": self.predicted_axis_tail,
            "predicted_cross_scale": self.predicted_cross_scale,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BasisCandidate:
        return cls(
            kind=str(data["kind"]),
            parameter=int(data["parameter"]),
            size=int(data["size"]),
            coordinate_stddev=float(data["coordinate_stddev"]),
            predicted_stderr=float(data["predicted_stderr"]),
            predicted_truncation=float(data["predicted_truncation"]),
            predicted_axis_tail=float(data.get("predicted_axis_tail", 0.0)),
            predicted_cross_scale=float(data.get("predicted_cross_scale", 0.0)),
            axis_degree=int(data.get("axis_degree", 0)),
        )


@dataclass(frozen=True)
class BasisChoice:
    """How the index set was chosen: the rule, the chosen set and what was predicted.

    ``candidates`` lists every set the rule compared (just the chosen one for explicit
    choices). Predictions are for the representative query of smoothness ``smoothness``
    (module docstring) and depend on public parameters only.
    """

    rule: str
    smoothness: int
    chosen: BasisCandidate
    candidates: tuple[BasisCandidate, ...] = field(default=())
    paper_t: int = 0

    def __post_init__(self) -> None:
        if self.rule not in (*BASIS_RULES, "custom"):
            raise MechanismError(f"basis rule ({self.rule!r}) must be one of {BASIS_RULES}")
        if self.smoothness < 1:
            raise MechanismError(f"smoothness ({self.smoothness}) must be a positive integer")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "smoothness": self.smoothness,
            "paper_t": self.paper_t,
            "chosen": self.chosen.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BasisChoice:
        return cls(
            rule=str(data["rule"]),
            smoothness=int(data["smoothness"]),
            chosen=BasisCandidate.from_dict(data["chosen"]),
            candidates=tuple(BasisCandidate.from_dict(c) for c in data["candidates"]),
            paper_t=int(data["paper_t"]),
        )


def paper_t(n: int, d: int, smoothness: int) -> int:
    """Theorem 3.1 of paper 000 / Algorithm 1 of paper 001: ``t = ceil(n^(1/(2d+K)))``."""
    return max(2, math.ceil(math.pow(n, 1.0 / (2 * d + smoothness))))


def choose_basis(
    n: int,
    d: int,
    *,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    basis: str | IndexSet = "auto",
    basis_size: int | None = None,
    max_basis_size: int = DEFAULT_MAX_BASIS_SIZE,
    mechanism: str | None = None,
) -> tuple[IndexSet, BasisChoice]:
    """The index set for a release, from public parameters only (module docstring).

    ``basis``: ``"auto"`` (noise-aware rule over total-degree and full-tensor sets),
    ``"nominal"`` (the same candidates, restricted to those whose predicted truncation
    bound is at most :data:`NOMINAL_TRUNCATION_SHARE` of the predicted 95 % noise
    half-width, so that intervals cover close to their nominal level; falls back to
    ``"auto"`` when no candidate qualifies),
    ``"total_degree"`` / ``"full_tensor"`` (the rule within that family), ``"paper"``
    (Theorem 3.1's ``t``), or an :class:`IndexSet`. ``basis_size=R`` fixes the size: the
    ``R`` lowest-total-degree functions, or for ``"full_tensor"`` the set with
    ``t^d - 1 = R``. Usable without data, e.g. to preview the accuracy of a request.

    A set of more than :func:`~app.mechanisms.basis.largest_index_set_size` ``(d)``
    functions (``R x d`` entries past :data:`~app.mechanisms.basis.MAX_INDEX_SET_ENTRIES`)
    is refused before it is built when ``basis_size`` or ``"paper"`` fixes it; the rules
    consider no larger candidate (``max_basis_size`` is lowered to fit).
    """
    index_set, choice, _ = _choose_basis(
        n,
        d,
        epsilon=epsilon,
        delta=delta,
        smoothness=smoothness,
        basis=basis,
        basis_size=basis_size,
        max_basis_size=max_basis_size,
        mechanism=mechanism,
    )
    return index_set, choice


def _choose_basis(
    n: int,
    d: int,
    *,
    epsilon: float,
    delta: float,
    smoothness: int,
    basis: str | IndexSet,
    basis_size: int | None,
    max_basis_size: int,
    mechanism: str | None,
    fixed: IndexSet | None = None,
    stats: _RepresentativeQuery | None = None,
) -> tuple[IndexSet, BasisChoice, _RepresentativeQuery]:
    """:func:`choose_basis`, and the representative query it priced the sets with.

    :func:`plan` chooses for two budgets. ``fixed`` is the set that ``basis_size`` or
    ``"paper"`` gives, already built by the first choice (those sets do not depend on the
    budget), and ``stats`` that choice's representative query, which keeps the sums of
    the last set it priced: the second choice builds and sums nothing again.
    """
    check_budget(epsilon, delta)
    _check_positive("n", n)
    _check_positive("d", d)
    _check_positive("smoothness", smoothness)
    _check_positive("max_basis_size", max_basis_size)
    mech = _mechanism(delta, mechanism)
    if stats is None:
        stats = _RepresentativeQuery(d, smoothness)

    def candidate(
        kind: str, parameter: int, index_set: IndexSet | None = None, axis: int = 0
    ) -> BasisCandidate:
        if kind == "total_degree_complete":
            size = count_total_degree(d, parameter)
            sums = stats.total_degree_sums(parameter)
            kind = "total_degree"
        elif kind == "axis_total_degree":
            size = count_total_degree(d, parameter) + d * (axis - parameter)
            sums = stats.total_degree_sums(parameter, axis)
        elif kind == "full_tensor":
            size = parameter**d - 1
            sums = stats.full_tensor_sums(parameter)
        else:
            assert index_set is not None
            size = index_set.size
            sums = stats.index_set_sums(index_set)
        s = _coordinate_stddev(mech, n, size, epsilon, delta)
        return BasisCandidate(
            kind=kind,
            parameter=parameter if kind in ("full_tensor", "axis_total_degree") else size,
            size=size,
            coordinate_stddev=s,
            predicted_stderr=s * math.sqrt(max(sums.variance, 0.0)),
            predicted_truncation=max(stats.total_l1 - sums.kept_l1, 0.0),
            predicted_axis_tail=sums.axis_tail,
            predicted_cross_scale=sums.cross_scale,
            axis_degree=axis,
        )

    t_paper = paper_t(n, d, smoothness)
    if isinstance(basis, IndexSet):
        if basis.dim != d:
            raise MechanismError(f"the index set has d = {basis.dim}; the data has d = {d}")
        chosen = candidate("custom", basis.size, basis)
        return basis, BasisChoice("custom", smoothness, chosen, (chosen,), t_paper), stats
    if basis not in BASIS_RULES:
        raise MechanismError(f"basis ({basis!r}) must be one of {BASIS_RULES} or an IndexSet")
    if basis == "paper":
        if basis_size is not None:
            raise MechanismError("basis='paper' sets t itself; leave basis_size=None")
        if fixed is None:
            if t_paper**d - 1 <= MAX_INDEX_SET_SIZE:  # full_tensor refuses larger ones
                check_index_set_size(d, t_paper**d - 1, "the paper's full tensor basis")
            fixed = full_tensor(d, t_paper)
        index_set = fixed
        chosen = candidate("full_tensor", t_paper)
        return index_set, BasisChoice("paper", smoothness, chosen, (chosen,), t_paper), stats
    if basis_size is not None:
        _check_positive("basis_size", basis_size)
        if basis == "full_tensor":
            t = round((basis_size + 1) ** (1.0 / d))
            if t**d - 1 != basis_size:
                raise MechanismError(
                    f"basis_size ({basis_size}) is not t^d - 1 for any t (d = {d}); "
                    "a full tensor basis has t^d - 1 functions"
                )
            check_index_set_size(d, basis_size)
            index_set = fixed if fixed is not None else full_tensor(d, t)
            chosen = candidate("full_tensor", t)
        else:
            check_index_set_size(d, basis_size)
            index_set = fixed if fixed is not None else total_degree(d, basis_size)
            chosen = candidate("custom", basis_size, index_set)
            chosen = dataclasses.replace(chosen, kind="total_degree", parameter=basis_size)
        return index_set, BasisChoice(basis, smoothness, chosen, (chosen,), t_paper), stats
    limit = min(max_basis_size, largest_index_set_size(d))  # a larger default is lowered
    candidates: list[BasisCandidate] = []
    if basis in ("auto", "nominal", "total_degree"):
        degrees = _thinned(lambda D: count_total_degree(d, D), 1, limit)
        candidates += [candidate("total_degree_complete", D) for D in degrees]
    if basis in ("auto", "nominal") and d >= 2:  # in d = 1 the total-degree sets are these
        for D in (D for D in degrees if D <= MAX_AXIS_TOTAL_DEGREE):
            for K in range(D + 1, D + MAX_AXIS_EXTRA + 1):
                if count_total_degree(d, D) + d * (K - D) > limit:
                    break
                candidates.append(candidate("axis_total_degree", D, axis=K))
    if basis in ("auto", "nominal", "full_tensor"):
        ts = _thinned(lambda t: t**d - 1, 2, limit)
        candidates += [candidate("full_tensor", t) for t in ts]
    if not candidates:
        if limit < max_basis_size:
            raise MechanismError(
                f"no {basis} index set in d = {d} columns has at most {limit} functions, the "
                "most whose R x d entries are built (MAX_INDEX_SET_ENTRIES); pass a "
                f"basis_size of at most {limit}"
            )
        raise MechanismError(
            f"no {basis} index set in d = {d} has at most max_basis_size = {limit} functions; "
            "raise max_basis_size or pass basis_size"
        )
    best = min(candidates, key=lambda c: (c.predicted_halfwidth, c.size))
    if basis == "nominal":
        z = float(ndtri(0.975))
        small_bias = [
            c
            for c in candidates
            if c.predicted_truncation <= NOMINAL_TRUNCATION_SHARE * z * c.predicted_stderr
        ]
        if small_bias:
            best = min(small_bias, key=lambda c: (c.predicted_halfwidth, c.size))
    if best.kind == "full_tensor":
        index_set = full_tensor(d, best.parameter)
    elif best.kind == "axis_total_degree":
        index_set = axis_total_degree(d, best.parameter, best.axis_degree)
    else:
        index_set = total_degree(d, best.size)
    return index_set, BasisChoice(basis, smoothness, best, tuple(candidates), t_paper), stats


def _thinned(size: Callable[[int], int], first: int, limit: int) -> list[int]:
    """Parameters ``p = first, first+1, ...`` with ``size(p) <= limit``, each kept only if
    its size exceeds the last kept one by 10 % (at most ~100 candidates in small ``d``),
    plus the largest."""
    kept: list[int] = []
    p = first
    last = 0
    while size(p) <= limit:
        if size(p) >= 1.1 * last:
            kept.append(p)
            last = size(p)
        p += 1
    if p - 1 >= first and (not kept or kept[-1] != p - 1):
        kept.append(p - 1)
    return kept


@dataclass(frozen=True)
class _SetSums:
    """Representative-query sums for one index set (see :class:`_RepresentativeQuery`)."""

    variance: float  # E ||c_S||_2^2
    kept_l1: float  # E sum_{r in S u 0} |c_r| (for the worst-case bound)
    axis_tail: float  # E sum_{k e_i not in S} |c_{k e_i}|
    cross_scale: float  # sqrt(E sum_{r not in S, >= 2 columns} c_r^2 mu_r), mu = TYPICAL_MU


class _RepresentativeQuery:
    """Per-column statistics of ``exp(-(x - c)^2 / (2K))`` with ``c ~ U[-1, 1]``.

    ``a1[k] = E|a_k(c)|`` and ``a2[k] = E a_k(c)^2`` by 64-point Gauss-Legendre quadrature
    over ``c``; ``n1 = E ||a(c)||_1`` plus the proven 1-D tail. Column statistics multiply
    because the centre's coordinates are independent. The interaction energy with
    weights ``mu_r = TYPICAL_MU^{#columns of r}`` is accumulated by the recursion of
    :func:`app.mechanisms.chebyshev.truncation_estimate` (no subtraction of near-equal
    numbers), graded by total degree where the set is a total-degree set.
    """

    def __init__(self, d: int, smoothness: int, length: int = 64) -> None:
        nodes, weights = np.polynomial.legendre.leggauss(64)
        factors, tails = gaussian_factors(nodes[:, None], np.array([math.sqrt(smoothness)]), length)
        a = factors[:, 0, :]
        self.d = d
        self.a1 = (weights / 2.0) @ np.abs(a)
        self.a2 = (weights / 2.0) @ (a * a)
        self.total_l1 = float((self.a1.sum() + tails[0]) ** d)
        self.cross_all = self._cross(TYPICAL_MU * float(self.a2[1:].sum()))
        self._last: tuple[IndexSet, _SetSums] | None = None  # index_set_sums' last

    def _cross(self, h: float) -> float:
        """Sum over ``>= 2``-column indices of ``prod_i`` (``a2[0]`` or ``h``)."""
        g = float(self.a2[0])
        p0, p1, p2 = 1.0, 0.0, 0.0
        for _ in range(self.d):
            p0, p1, p2 = p0 * g, p1 * g + p0 * h, p2 * (g + h) + p1 * h
        return p2

    def _graded(self, a: NDArray[np.float64], degree: int) -> float:
        """``sum_{|r| <= degree} prod_i a[r_i]`` by a truncated polynomial power."""
        base = a[: min(degree + 1, a.size)]  # short: the tail past len(a) is ~0
        power = np.zeros(degree + 1)
        power[0] = 1.0
        for _ in range(self.d):
            power = np.convolve(power, base)[: degree + 1]
        return float(power.sum())

    def _graded_cross(self, degree: int) -> float:
        """The in-set part of :meth:`_cross` for ``{|r| <= degree}``, graded by degree."""
        g = float(self.a2[0])
        # h is zero past a2's length: convolving with the short h keeps each step
        # O(degree * len(a2)) (in d = 1 the candidate degrees reach max_basis_size, and a
        # full-length h made planning a one-column release take seconds)
        top = min(degree + 1, self.a2.size)
        h = np.zeros(top)
        h[1:top] = TYPICAL_MU * self.a2[1:top]
        p0 = np.zeros(degree + 1)
        p0[0] = 1.0
        p1 = np.zeros(degree + 1)
        p2 = np.zeros(degree + 1)
        for _ in range(self.d):
            p2 = np.convolve(p2, h)[: degree + 1] + p2 * g + np.convolve(p1, h)[: degree + 1]
            p1 = p1 * g + np.convolve(p0, h)[: degree + 1]
            p0 = p0 * g
        return float(p2.sum())

    def _axis(self, kept: NDArray[np.bool_]) -> float:
        """``d E|a_0|^(d-1) sum_{k >= 1 not kept} E|a_k|`` (one column's terms)."""
        out = ~kept
        out[0] = False
        return float(self.d * float(self.a1[0]) ** (self.d - 1) * self.a1[out].sum())

    def _kept(self, up_to: int) -> NDArray[np.bool_]:
        kept = np.zeros(self.a1.size, dtype=bool)
        kept[: up_to + 1] = True
        return kept

    def total_degree_sums(self, degree: int, axis_degree: int | None = None) -> _SetSums:
        """``{0 < |r| <= degree}`` plus ``k e_i`` for ``k <= axis_degree`` (default: degree)."""
        axis = degree if axis_degree is None else axis_degree
        g2, g1 = float(self.a2[0]), float(self.a1[0])
        extra = slice(degree + 1, axis + 1)
        v = self._graded(self.a2, degree) - g2**self.d
        v += self.d * g2 ** (self.d - 1) * float(self.a2[extra].sum())
        kept = self._graded(self.a1, degree)
        kept += self.d * g1 ** (self.d - 1) * float(self.a1[extra].sum())
        cross = math.sqrt(max(self.cross_all - self._graded_cross(degree), 0.0))
        return _SetSums(v, kept, self._axis(self._kept(axis)), cross)

    def full_tensor_sums(self, t: int) -> _SetSums:
        v = float(self.a2[:t].sum()) ** self.d - float(self.a2[0]) ** self.d
        inside = self._cross(TYPICAL_MU * float(self.a2[1:t].sum()))
        cross = math.sqrt(max(self.cross_all - inside, 0.0))
        return _SetSums(v, float(self.a1[:t].sum()) ** self.d, self._axis(self._kept(t - 1)), cross)

    def index_set_sums(self, index_set: IndexSet) -> _SetSums:
        """The sums of any set (``O(R d)``; the last set's are kept, :func:`_choose_basis`)."""
        if self._last is not None and self._last[0] is index_set:
            return self._last[1]
        out = self._index_set_sums(index_set)
        self._last = (index_set, out)
        return out

    def _index_set_sums(self, index_set: IndexSet) -> _SetSums:
        # degrees past the computed length have coefficients below the proven 1-D tail
        a1 = np.zeros(max(self.a1.size, index_set.max_degree + 1))
        a2 = np.zeros_like(a1)
        a1[: self.a1.size] = self.a1
        a2[: self.a2.size] = self.a2
        # the per-index products, a block of rows at a time (the gathered (rows, d) tables
        # are the large temporaries: a whole set's took several times its own memory),
        # then summed over the whole set as one vector
        deg = index_set.degrees
        multi = index_set.support >= 2
        v_terms = np.empty(index_set.size)
        kept_terms = np.empty(index_set.size)
        cross_terms = np.empty(int(multi.sum()))
        done = 0
        step = max(1, _SUMS_BLOCK_ENTRIES // self.d)
        for start in range(0, index_set.size, step):
            block = deg[start : start + step]
            v_terms[start : start + step] = np.prod(a2[block], axis=1)
            kept_terms[start : start + step] = np.prod(a1[block], axis=1)
            cross_rows = block[multi[start : start + step]]
            weighted = np.where(cross_rows > 0, TYPICAL_MU * a2[cross_rows], a2[0])
            cross_terms[done : done + cross_rows.shape[0]] = np.prod(weighted, axis=1)
            done += cross_rows.shape[0]
        v = float(v_terms.sum())
        kept = float(kept_terms.sum()) + float(a1[0]) ** self.d
        inside = float(cross_terms.sum()) if cross_terms.size else 0.0
        cross = math.sqrt(max(self.cross_all - inside, 0.0))
        # per column, which degrees its one-column terms cover
        kept_axis = np.zeros((self.d, a1.size), dtype=bool)
        _, cols, ks = index_set.one_column_terms()
        kept_axis[cols, ks] = True
        kept_axis[:, 0] = True
        missing = np.where(kept_axis, 0.0, a1[None, :]).sum()
        axis_tail = float(a1[0]) ** (self.d - 1) * float(missing)
        return _SetSums(v, kept, axis_tail, cross)


# --- the synopsis ------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """One answer: ``value``, its ``stderr`` and the ``level`` interval.

    ``low, high = value -+ halfwidth`` with ``halfwidth = cv(axis_tail / spread) spread``,
    ``spread = sqrt((noise_halfwidth / z)^2 + cross_scale^2)`` (module docstring,
    "Intervals"; :func:`bias_aware_critical_value`);
    ``noise_halfwidth = q_level * stderr``. ``truncation_bound`` is the worst case over
    all datasets; ``worst_case_interval`` uses it in place of the estimate.
    ``within_smoothness`` is False for a query with a Gaussian factor narrower than the
    declared smoothness, whose interval is then the worst case (module docstring).
    """

    value: float
    stderr: float
    truncation_bound: float
    noise_halfwidth: float
    level: float
    method: str
    rigorous: bool
    halfwidth: float
    extrapolation: float = 0.0
    worst_case_halfwidth: float = math.inf
    dependence: float = 0.0
    within_smoothness: bool = True

    @property
    def low(self) -> float:
        return self.value - self.halfwidth

    @property
    def high(self) -> float:
        return self.value + self.halfwidth

    @property
    def interval(self) -> tuple[float, float]:
        return self.low, self.high

    @property
    def truncation_estimate(self) -> float:
        """The width the estimated truncation error adds: ``halfwidth - noise_halfwidth``."""
        return self.halfwidth - self.noise_halfwidth

    @property
    def worst_case_interval(self) -> tuple[float, float]:
        """``plain -+ (q_level ||c_S|| s + truncation_bound)`` around the plain answer
        ``plain = value - extrapolation`` (Algorithm 2): valid for every dataset."""
        centre = self.value - self.extrapolation
        return centre - self.worst_case_halfwidth, centre + self.worst_case_halfwidth

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form: value, stderr, interval and how it is made up."""
        return {
            "value": self.value,
            "stderr": self.stderr,
            "interval": [self.low, self.high],
            "level": self.level,
            "noise_halfwidth": self.noise_halfwidth,
            "truncation_estimate": self.truncation_estimate,
            "independence_extrapolation": self.extrapolation,
            "dependence_log_factor": self.dependence,
            "truncation_bound": self.truncation_bound,
            "worst_case_interval": list(self.worst_case_interval),
            "method": self.method,
            "rigorous": self.rigorous,
            "within_smoothness": self.within_smoothness,
        }


@dataclass(frozen=True, eq=False)
class Answers:
    """Vectorised :class:`Answer` for ``Q`` queries (arrays of shape ``(Q,)``)."""

    values: NDArray[np.float64]
    stderr: NDArray[np.float64]
    truncation_bound: NDArray[np.float64]
    noise_halfwidth: NDArray[np.float64]
    level: float
    rigorous: NDArray[np.bool_]
    methods: tuple[str, ...]
    halfwidth: NDArray[np.float64]
    extrapolation: NDArray[np.float64]
    worst_case_halfwidth: NDArray[np.float64]
    dependence: NDArray[np.float64]
    within_smoothness: NDArray[np.bool_]

    @property
    def low(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.values - self.halfwidth
        return out

    @property
    def high(self) -> NDArray[np.float64]:
        out: NDArray[np.float64] = self.values + self.halfwidth
        return out

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def __getitem__(self, i: int) -> Answer:
        return Answer(
            value=float(self.values[i]),
            stderr=float(self.stderr[i]),
            truncation_bound=float(self.truncation_bound[i]),
            noise_halfwidth=float(self.noise_halfwidth[i]),
            level=self.level,
            method=self.methods[i],
            rigorous=bool(self.rigorous[i]),
            halfwidth=float(self.halfwidth[i]),
            extrapolation=float(self.extrapolation[i]),
            worst_case_halfwidth=float(self.worst_case_halfwidth[i]),
            dependence=float(self.dependence[i]),
            within_smoothness=bool(self.within_smoothness[i]),
        )


@dataclass(frozen=True, eq=False)
class Synopsis:
    """A released ``smooth_synopsis``: the noisy moments and everything needed to use them.

    ``moments[j]`` is the noisy ``b_hat_r`` of the ``j``-th index of ``index_set``;
    ``calibration`` is the public noise law (distribution, scale, sensitivity, charged
    cost). Data live on ``[-1, 1]^d`` (the service normalises with declared bounds).
    """

    index_set: IndexSet
    moments: NDArray[np.float64]
    calibration: noise.NoiseCalibration
    n: int
    smoothness: int
    basis: BasisChoice
    co_spread: CoSpread | None = None

    def __post_init__(self) -> None:
        values = np.array(self.moments, dtype=np.float64, copy=True)
        if values.shape != (self.index_set.size,):
            raise MechanismError(
                f"moments must be a vector of length R = {self.index_set.size}; "
                f"got shape {values.shape}"
            )
        if not np.all(np.isfinite(values)):
            raise MechanismError("moments must be finite")
        if self.calibration.dimension != self.index_set.size:
            raise MechanismError(
                f"the noise calibration is for {self.calibration.dimension} values; "
                f"the index set has R = {self.index_set.size}"
            )
        _check_positive("n", self.n)
        _check_positive("smoothness", self.smoothness)
        if self.co_spread is not None and self.co_spread.d != self.index_set.dim:
            raise MechanismError(
                f"the co-spread is for d = {self.co_spread.d}; the index set has "
                f"d = {self.index_set.dim}"
            )
        values.setflags(write=False)
        object.__setattr__(self, "moments", values)

    # -- public noise law and cost

    @property
    def d(self) -> int:
        return self.index_set.dim

    @property
    def size(self) -> int:
        """``R``, the number of released moments."""
        return self.index_set.size

    @property
    def noise_distribution(self) -> str:
        return self.calibration.distribution

    @property
    def noise_scale(self) -> float:
        """Laplace scale ``b`` or Gaussian standard deviation ``sigma`` of each coordinate."""
        return self.calibration.scale

    @property
    def privacy_cost(self) -> PrivacyCost:
        parts = [self.calibration.cost_part(MEASURE_STEP)]
        if self.co_spread is not None:
            parts.append(self.co_spread.measurement.calibration.cost_part(dependence.STEP))
        return PrivacyCost.compose(parts)

    # -- answering

    def coefficients(
        self, query: object, *, rng: np.random.Generator | None = None
    ) -> QueryCoefficients:
        """``c_0``, ``c_S`` and the truncation bound of ``query`` (:mod:`.chebyshev`)."""
        return query_coefficients(query, self.index_set, smoothness=self.smoothness, rng=rng)

    def evaluate(
        self,
        query: object,
        *,
        level: float = 0.95,
        rng: np.random.Generator | None = None,
        extrapolate: bool = True,
    ) -> Answer:
        """Answer, standard error and ``level`` interval of one query (Algorithm 2, plus
        the independence extrapolation of separable queries unless ``extrapolate`` is
        False; module docstring, "Independence extrapolation")."""
        _check_level(level)
        expansion = expand(query, self.d, min_length=self.index_set.max_degree + 1)
        if expansion is not None:
            out = self._answers_separable(expansion, level, extrapolate)
        else:
            out = self._answers_general(self.coefficients(query, rng=rng), level)
        if len(out) != 1:
            raise MechanismError("evaluate() takes one query; use answer_many() for a batch")
        return out[0]

    def answer(self, query: object, *, extrapolate: bool = True) -> float:
        """``c_0 + <c_S, b_hat>`` (the public evaluation of paper 001, Algorithm 2) plus,
        for separable queries, the independence extrapolation (module docstring)."""
        return self.evaluate(query, extrapolate=extrapolate).value

    def stderr(self, query: object, *, extrapolate: bool = True) -> float:
        """Standard error of :meth:`answer` from the known noise: ``s ||c_S||_2``, or
        ``s ||c_S + grad X||_2`` with the extrapolation (delta method)."""
        return self.evaluate(query, extrapolate=extrapolate).stderr

    def interval(self, query: object, level: float = 0.95) -> tuple[float, float]:
        """``answer -+ halfwidth`` (module docstring, "Intervals")."""
        return self.evaluate(query, level=level).interval

    def answer_many(
        self,
        queries: GaussianMixtureBatch | Sequence[object],
        *,
        level: float = 0.95,
        block: int = ANSWER_BLOCK,
        extrapolate: bool = True,
    ) -> Answers:
        """Answers of many queries, vectorised.

        A :class:`GaussianMixtureBatch` (and, in a sequence, Gaussian mixtures with the
        same number of centres and widths:
        :func:`~app.mechanisms.chebyshev.separable_blocks`) is expanded ``block`` queries
        at a time: 1-D coefficient tables from one DCT per block, the ``(block, R)``
        coefficient matrix by products over each index's nonzero entries, then one
        matrix-vector product with the moments.
        """
        _check_level(level)
        if isinstance(queries, GaussianMixtureBatch):
            return self._answer_batch(queries, level, block, extrapolate)
        items = list(queries)
        if not items:
            raise MechanismError("answer_many() needs at least one query")
        for i, q in enumerate(items):
            if isinstance(q, GaussianMixtureBatch):
                raise MechanismError(
                    f"item {i} is a GaussianMixtureBatch; pass a batch on its own, not in a list"
                )
        separable = np.array([i for i, q in enumerate(items) if is_separable(q)], dtype=np.int64)
        general = [i for i, q in enumerate(items) if not is_separable(q)]
        parts: list[tuple[NDArray[np.int64], Answers]] = []
        blocks = separable_blocks(
            [items[i] for i in separable],
            self.d,
            min_length=self.index_set.max_degree + 1,
            block=block,
        )
        for positions, expansion in blocks:
            answers = self._answers_separable(expansion, level, extrapolate)
            parts.append((separable[positions], answers))
        for i in general:
            answers = self._answers_general(self.coefficients(items[i]), level)
            parts.append((np.asarray([i]), answers))
        return _merge(parts, len(items), level)

    # -- internals

    def _answer_batch(
        self, batch: GaussianMixtureBatch, level: float, block: int, extrapolate: bool
    ) -> Answers:
        if batch.dim != self.d:
            raise MechanismError(
                f"the queries have d = {batch.dim} columns but the synopsis has d = {self.d}"
            )
        sigma = np.full(self.d, batch.sigma)
        return self._answer_gaussian(batch.centers, batch.weights, sigma, level, block, extrapolate)

    def _answer_gaussian(
        self,
        centers: NDArray[np.float64],
        weights: NDArray[np.float64],
        sigma: NDArray[np.float64],
        level: float,
        block: int,
        extrapolate: bool,
    ) -> Answers:
        pieces = []
        min_length = self.index_set.max_degree + 1
        for start in range(0, centers.shape[0], block):
            expansion = gaussian_expansion(
                centers[start : start + block],
                weights[start : start + block],
                sigma,
                min_length=min_length,
            )
            pieces.append(self._answers_separable(expansion, level, extrapolate))
        return _concatenate(pieces, level)

    @functools.cached_property
    def mu(self) -> NDArray[np.float64]:
        """``mu[i, k]``, the estimate of ``E T_k(x_i)^2`` behind the interaction scale of
        the plain (Algorithm 2) answer.

        ``T_k^2 = (1 + T_2k) / 2``, so where the synopsis holds the one-column moment
        ``b_{2k e_i}`` the estimate is ``clip((1 + b_hat) / 2, 0, 1)`` (post-processing of
        the noisy moments); elsewhere :data:`TYPICAL_MU`. ``mu[:, 0] = 1``; the last column
        (degree ``max_degree // 2 + 1``) is never measured and stands for all higher degrees.
        """
        size = self.index_set.max_degree // 2 + 2
        out = np.full((self.d, size), TYPICAL_MU)
        out[:, 0] = 1.0
        one, cols, k = self.index_set.one_column_terms()
        even = (k % 2 == 0) & (k // 2 < size)
        out[cols[even], k[even] // 2] = np.clip((1.0 + self.moments[one[even]]) / 2.0, 0.0, 1.0)
        out.setflags(write=False)
        return out

    @functools.cached_property
    def centred_mu(self) -> NDArray[np.float64]:
        """``mu`` less ``(E T_k(x_i))^2`` where ``b_{k e_i}`` is released: the estimate of
        ``Var T_k(x_i)`` behind the interaction scale of the extrapolated answer.

        After the independence extrapolation the interaction terms left are
        ``b_r - prod_i b_{r_i e_i}``, for two columns the covariance
        ``Cov(T_k(x_i), T_l(x_j))``, whose Cauchy-Schwarz size is
        ``Var T_k(x_i) Var T_l(x_j)`` (module docstring, "Intervals").
        ``max(b_hat^2 - s^2, 0)`` estimates ``(E T_k)^2`` (``b_hat^2 - s^2`` is unbiased;
        ``s`` the noise standard deviation); the result is clipped to ``[0, 1]``.
        """
        out = np.array(self.mu)
        one, cols, k = self.index_set.one_column_terms()
        low = (k > 0) & (k < out.shape[1])
        mean_sq = np.maximum(self.moments[one[low]] ** 2 - self.calibration.stddev**2, 0.0)
        out[cols[low], k[low]] = np.clip(out[cols[low], k[low]] - mean_sq, 0.0, 1.0)
        out.setflags(write=False)
        return out

    def _answers_separable(
        self, expansion: TensorExpansion, level: float, extrapolate: bool
    ) -> Answers:
        """Answers of a separable batch, computed on its power-of-two rescaling
        (:func:`_unit_expansion`) and scaled back: every output is of degree one in the
        query's scale, and the sums of squares behind the standard errors and the
        interaction scale overflowed past ~1e154 (a finite answer was refused) and
        underflowed below ~1e-154 (a zero-width interval)."""
        expansion, exponents = _unit_expansion(expansion)
        return _scale_answers(self._answers_unit(expansion, level, extrapolate), exponents)

    def _answers_general(self, coef: QueryCoefficients, level: float) -> Answers:
        """Answers of non-separable queries, on their rows' power-of-two rescaling (as
        :meth:`_answers_separable`)."""
        coef, exponents = _unit_coefficients(coef)
        return _scale_answers(self._answers(coef, level, None), exponents)

    def _answers_unit(self, expansion: TensorExpansion, level: float, extrapolate: bool) -> Answers:
        coef = restrict(expansion, self.index_set)
        mu = self.centred_mu if extrapolate else self.mu
        estimate = truncation_estimate(expansion, self.index_set, coef.coefficients, mu)
        extrapolation = (
            independence_extrapolation(
                expansion, self.index_set, self.moments, self.calibration.stddev**2
            )
            if extrapolate
            else None
        )
        narrow = None
        if expansion.curvature is not None:  # 1 / (2 s^2) > 1 / (2 K): s^2 < K
            narrow = np.any(expansion.curvature > 0.5 / self.smoothness, axis=1)
        return self._answers(
            coef,
            level,
            estimate,
            extrapolation,
            expansion=expansion if extrapolate else None,
            narrow=narrow,
        )

    def _answers(
        self,
        coef: QueryCoefficients,
        level: float,
        estimate: TruncationEstimate | None,
        extrapolation: IndependenceExtrapolation | None = None,
        plain_half: NDArray[np.float64] | None = None,
        *,
        expansion: TensorExpansion | None = None,
        narrow: NDArray[np.bool_] | None = None,
    ) -> Answers:
        """``plain_half`` (optional): ``q_level s ||c_S||``, which depends on ``coef`` and
        the public noise law only, when the caller already has it. ``expansion`` (of the
        same queries) turns on the dependence correction of its Gaussian factors when the
        synopsis holds a co-spread (module docstring, "Dependence correction")."""
        _check_level(level)
        c = coef.coefficients
        plain = coef.constant + c @ self.moments
        if plain_half is None:
            plain_half = self._noise_halfwidth(c, level)
        worst = plain_half + coef.truncation_bound
        if extrapolation is None:
            extra = np.zeros(c.shape[0])
            effective = c
            noise_half = plain_half
        else:  # the answer is no longer linear in the moments: delta method
            extra = extrapolation.value
            effective = c + extrapolation.gradient
            noise_half = self._noise_halfwidth(effective, level)
        stderr = self.calibration.stddev * np.sqrt(np.einsum("qr,qr->q", effective, effective))
        if extrapolation is not None and extrapolation.excess_variance is not None:
            # the answer is a product of noisy one-column sums (D = 1): its stderr with the
            # variance past the delta method, its noise half-width by the log-normal model
            # whose log-variance that excess gives (module docstring, "Independence
            # extrapolation")
            excess = extrapolation.excess_variance
            size = np.abs(plain + extra)
            # log-sd s of the product times |value|: the delta method's stderr, but no more
            # than what the excess implies (log-normal: excess ~ value^2 s^4 / 2), which is
            # 0 for an answer linear in the noise (one noisy factor)
            log_sd = np.minimum(stderr, np.sqrt(np.sqrt(2.0 * excess) * size))
            skewed = noise_half * product_skew_factor(size, log_sd, level)
            stderr = np.sqrt(stderr**2 + excess)
            # never past the worst case (|value - truth| <= worst + |X| whenever the plain
            # answer is within its worst-case interval), never below the delta method's
            noise_half = np.maximum(np.minimum(skewed, worst + np.abs(extra)), noise_half)
        log_factor = np.zeros(c.shape[0])
        bias = np.zeros(c.shape[0])
        co_spread = self.co_spread
        if expansion is not None and expansion.curvature is not None and co_spread is not None:
            # module docstring, "Dependence correction": e^lambda (plain + X) for queries
            # whose Gaussian factors are wide enough, where its mean squared error (sized
            # by the data-free magnitude u of the answer) is below the uncorrected one's;
            # elsewhere the uncorrected answer, whose estimated bias widens the interval
            wide = np.all(expansion.curvature <= CO_SPREAD_MAX_CURVATURE, axis=1)
            weight = np.where(wide, co_spread.pair_weight(expansion.curvature), 0.0)
            lam = weight * co_spread.value
            growth = np.exp(lam)
            u = np.abs(expansion.uniform_expectation())
            use = (growth * stderr) ** 2 + (u * weight * co_spread.stddev) ** 2 <= (
                stderr**2 + (np.expm1(lam) * u) ** 2
            )
            value = plain + extra
            corrected = growth * value
            log_factor = np.where(use, lam, 0.0)
            # an applied correction is itself uncertain (the cumulant expansion is cut after
            # its second, centre-free term): a bias of up to min(1, c k_max) of its size;
            # unapplied, the bias it would have removed
            step = np.abs(corrected - value)
            model = np.minimum(1.0, CO_SPREAD_MODEL_ERROR * expansion.curvature.max(axis=1))
            bias = np.where(use, model, 1.0) * step
            lam_error = np.abs(corrected * weight)  # d(answer) / d(A_hat)
            stderr = np.where(use, np.hypot(growth * stderr, lam_error * co_spread.stddev), stderr)
            noise_half = np.where(
                use,
                np.hypot(growth * noise_half, lam_error * co_spread.quantile(level)),
                noise_half,
            )
            extra = np.where(use, corrected, value) - plain
        factor = np.exp(log_factor)
        if estimate is None:  # no separable form: only the worst case is available
            halfwidth = worst + np.abs(extra)
        else:
            z = float(ndtri(0.5 + level / 2.0))
            # noise and interaction terms as one normal error of standard deviation
            # ``spread``; the one-column tail (and an unapplied correction) as a bias of
            # at most ``shift``: the bias-aware critical value (module docstring)
            spread = np.hypot(noise_half / z, factor * estimate.cross_scale)
            shift = factor * estimate.axis_tail + bias
            # no noise nor interaction left (a query whose in-set coefficients are all
            # zero, e.g. a Chebyshev factor past the released degrees): the interval is
            # the bias bound itself, the limit of spread * h(shift / spread) as spread -> 0
            # (0 * h(inf) was NaN: an interval of [null, null])
            positive = spread > 0
            ratio = np.divide(shift, spread, out=np.zeros_like(shift), where=positive)
            halfwidth = np.where(positive, spread * bias_aware_critical_value(ratio, level), shift)
            # capped by the worst case (|value - truth| <= worst + |X| whenever the plain
            # answer is within its worst-case interval), never below the noise half-width
            cap = np.maximum(worst + np.abs(extra), noise_half)
            halfwidth = np.minimum(halfwidth, cap)
            if narrow is not None:  # outside the declared class: the estimate fails there
                halfwidth = np.where(narrow, cap, halfwidth)
        return Answers(
            values=plain + extra,
            stderr=stderr,
            truncation_bound=coef.truncation_bound.copy(),
            noise_halfwidth=noise_half,
            level=level,
            rigorous=np.full(c.shape[0], coef.rigorous),
            methods=(coef.method,) * c.shape[0],
            halfwidth=halfwidth,
            extrapolation=extra,
            worst_case_halfwidth=worst,
            dependence=log_factor,
            within_smoothness=np.ones(c.shape[0], dtype=bool)
            if narrow is None
            else np.logical_not(narrow),
        )

    def _noise_halfwidth(self, c: NDArray[np.float64], level: float) -> NDArray[np.float64]:
        """``q_level s ||c||_2`` for the linear statistic ``<c, eta>`` of the noise."""
        stderr = self.calibration.stddev * np.sqrt(np.einsum("qr,qr->q", c, c))
        out: NDArray[np.float64] = noise_quantile_factor(self.noise_distribution, c, level) * stderr
        return out

    # -- JSON

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (what analysts download); :meth:`from_dict` restores it exactly."""
        return {
            "format": MECHANISM_ID,
            "format_version": FORMAT_VERSION,
            "paper": "001: Wang, Fan, Zhang, Wang (NIPS 2013), Algorithms 1 and 2",
            "n": self.n,
            "d": self.d,
            "domain": {
                "bounds": [-1.0, 1.0],
                "basis": "T_r(x) = prod_i cos(r_i arccos x_i), x in [-1, 1]^d",
                "constant_moment": 1.0,
                "answer": "c_0 + sum_j c_{r_j} moments[j]",
            },
            "smoothness": self.smoothness,
            "index_set": self.index_set.to_dict(),
            "moments": [float(v) for v in self.moments],
            "noise": self.calibration.to_dict(),
            "privacy_cost": self.privacy_cost.as_dict(),
            "basis_choice": self.basis.to_dict(),
            "co_spread": None if self.co_spread is None else self.co_spread.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Synopsis:
        if data.get("format") != MECHANISM_ID:
            raise MechanismError(f"not a {MECHANISM_ID} document (format = {data.get('format')!r})")
        if data.get("format_version") not in READABLE_FORMAT_VERSIONS:
            raise MechanismError(
                f"format_version ({data.get('format_version')!r}) is not supported; "
                f"expected one of {READABLE_FORMAT_VERSIONS}"
            )
        if data.get("domain", {}).get("bounds") != [-1.0, 1.0]:
            raise MechanismError("the synopsis must be on the [-1, 1]^d domain")
        index_set = IndexSet.from_dict(data["index_set"])
        if index_set.dim != int(data["d"]):
            raise MechanismError(f"index set has d = {index_set.dim}; the record says {data['d']}")
        synopsis = cls(
            index_set=index_set,
            moments=np.asarray(data["moments"], dtype=np.float64),
            calibration=noise.NoiseCalibration.from_dict(data["noise"]),
            n=int(data["n"]),
            smoothness=int(data["smoothness"]),
            basis=BasisChoice.from_dict(data["basis_choice"]),
            co_spread=None
            if data.get("co_spread") is None
            else CoSpread.from_dict(data["co_spread"]),
        )
        if synopsis.privacy_cost.as_dict() != data["privacy_cost"]:
            raise MechanismError("the recorded privacy cost does not match the noise calibration")
        return synopsis


#: :func:`measure`'s progress once the moments are summed, when the co-spread (a second
#: read of ``O(n d)`` work, against the moments' ``O(n R)``) follows.
MOMENTS_PROGRESS = 0.95


def measure(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    basis_size: int | None = None,
    rng: np.random.Generator | None = None,
    *,
    basis: str | IndexSet = "auto",
    max_basis_size: int = DEFAULT_MAX_BASIS_SIZE,
    mechanism: str | None = None,
    co_spread: bool = True,
    progress: Callable[[float], None] | None = None,
) -> Synopsis:
    """Release the noisy moment summary of ``X`` (paper 001, Algorithm 1).

    ``X`` is an ``(n, d)`` array or a :class:`RowSource` on ``[-1, 1]^d``. Noise: Laplace
    for ``delta = 0``, Gaussian for ``delta > 0`` (``mechanism`` overrides: one of
    :data:`app.mechanisms.noise.MECHANISMS`). The index set follows ``basis`` /
    ``basis_size`` (:func:`choose_basis`), from ``n``, ``d``, ``epsilon``, ``delta`` and
    ``smoothness`` only. ``rng`` is accepted for the library-wide signature; the synopsis
    uses no post-processing randomness (the privacy noise comes from OpenDP, which
    cannot be seeded).

    With ``co_spread`` (the default) and an index set it applies to
    (:func:`co_spread_applies`), :data:`CO_SPREAD_SHARE` of ``epsilon`` buys the
    co-spread after the moments (module docstring, "Dependence correction"): the index
    set is chosen for the moments' share, and if the set it gives does not admit the
    co-spread, it is chosen again for the whole ``epsilon`` and none is measured. Both
    steps are decided by public parameters before any row is read.

    ``progress``, if given, is called with the share of the work done: the rows whose
    moments are summed (:func:`~app.mechanisms.basis.moments`), up to
    :data:`MOMENTS_PROGRESS` when a co-spread follows, then 1.0. It draws no noise.
    """
    check_budget(epsilon, delta)
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise MechanismError("rng must be a numpy.random.Generator or None")
    source = as_source(X)
    n, d = source.n_rows, source.n_cols
    mech = _mechanism(delta, mechanism)
    index_set, choice, share = plan(
        n,
        d,
        epsilon=epsilon,
        delta=delta,
        smoothness=smoothness,
        basis=basis,
        basis_size=basis_size,
        max_basis_size=max_basis_size,
        mechanism=mech,
        co_spread=co_spread,
    )
    moments_epsilon = epsilon * (1.0 - share)
    sensitivity = noise.moment_sensitivity(n, index_set.size)
    # calibrated from public values before the first read: a budget no scale fits fails
    # with nothing read
    calibration = noise.calibrate(
        mech,
        sensitivity=sensitivity[_METRIC[mech]],
        epsilon=moments_epsilon,
        delta=delta,
        dimension=index_set.size,
    )
    top = MOMENTS_PROGRESS if share else 1.0
    exact = moments(source, index_set, progress=progress_part(progress, 0.0, top))
    noisy = noise.sample(calibration, exact)
    spread = None
    if share:
        spread = dependence.measure(
            source,
            _co_spread_centring(index_set, noisy),
            epsilon - calibration.epsilon,
            centring_variance=(calibration.stddev / 2.0) ** 2,
        )
    if progress is not None:
        progress(1.0)
    return Synopsis(
        index_set=index_set,
        moments=noisy,
        calibration=calibration,
        n=n,
        smoothness=smoothness,
        basis=choice,
        co_spread=spread,
    )


def plan(
    n: int,
    d: int,
    *,
    epsilon: float,
    delta: float = 0.0,
    smoothness: int = 4,
    basis: str | IndexSet = "auto",
    basis_size: int | None = None,
    max_basis_size: int = DEFAULT_MAX_BASIS_SIZE,
    mechanism: str | None = None,
    co_spread: bool = True,
) -> tuple[IndexSet, BasisChoice, float]:
    """``(index_set, choice, share)`` of :func:`measure`, from public parameters only:
    the index set is chosen for ``(1 - CO_SPREAD_SHARE) epsilon`` and the co-spread gets
    ``share = CO_SPREAD_SHARE`` of ``epsilon`` when it applies to that set; otherwise the
    set is chosen for the whole ``epsilon`` and ``share = 0``."""

    def choose(
        budget: float,
        fixed: IndexSet | None = None,
        stats: _RepresentativeQuery | None = None,
    ) -> tuple[IndexSet, BasisChoice, _RepresentativeQuery]:
        return _choose_basis(
            n,
            d,
            epsilon=budget,
            delta=delta,
            smoothness=smoothness,
            basis=basis,
            basis_size=basis_size,
            max_basis_size=max_basis_size,
            mechanism=mechanism,
            fixed=fixed,
            stats=stats,
        )

    fixed = stats = None
    if co_spread and d >= 2:
        index_set, choice, stats = choose(epsilon * (1.0 - CO_SPREAD_SHARE))
        if co_spread_applies(index_set):
            return index_set, choice, CO_SPREAD_SHARE
        if basis_size is not None or basis == "paper":
            fixed = index_set  # the same set for any budget: reused, not built again
        del index_set  # otherwise one set at a time
    index_set, choice, _ = choose(epsilon, fixed, stats)
    return index_set, choice, 0.0


def co_spread_applies(index_set: IndexSet) -> bool:
    """Whether the co-spread can be measured and used with ``index_set``: ``d >= 2``,
    every column's ``T_2`` is released (its centring) and no released interaction has two
    columns of degree >= 2 (those moments already carry ``Cov(x_i^2, x_j^2)``)."""
    if index_set.dim < 2:
        return False
    _, cols, k = index_set.one_column_terms()
    if np.unique(cols[k == 2]).size != index_set.dim:
        return False
    d = index_set.dim
    return not any(
        bool(np.any(np.count_nonzero(flat >= 2 * d, axis=1) >= 2))  # flat = degree d + column
        for _, flat in index_set._sparse
        if flat.shape[1] >= 2
    )


def _co_spread_centring(index_set: IndexSet, noisy: NDArray[np.float64]) -> NDArray[np.float64]:
    """``m_i = clip((1 + b_hat_{2 e_i}) / 2, 0, 1)``, the released estimate of ``E x_i^2``
    (``x^2 = (1 + T_2(x)) / 2``)."""
    rows, cols, k = index_set.one_column_terms()
    out = np.empty(index_set.dim)
    out[cols[k == 2]] = np.clip((1.0 + noisy[rows[k == 2]]) / 2.0, 0.0, 1.0)
    return out


# --- noise quantiles ---------------------------------------------------------------------


def noise_quantile_factor(
    distribution: str, coefficients: ArrayLike, level: float = 0.95
) -> NDArray[np.float64]:
    """``q`` with ``P(|<c, eta>| <= q * sd(<c, eta>)) = level`` for each row ``c``.

    Gaussian noise: ``ndtri((1 + level) / 2)`` exactly. Laplace noise (i.i.d., any
    scale): the Lugannani-Rice saddlepoint approximation of the weighted Laplace sum
    (module docstring), from its ``64`` largest ``|c_r|`` exactly and the rest as a
    Gaussian term of the same variance; rows whose effective number of coordinates
    ``(sum c^2)^2 / sum c^4`` exceeds ``10^4`` use the normal quantile (excess kurtosis
    ``< 3 10^-4``). Rows with ``c = 0`` get the normal quantile (their stderr is 0).
    """
    _check_level(level)
    c = np.atleast_2d(np.asarray(coefficients, dtype=np.float64))
    z = float(ndtri(0.5 + level / 2.0))
    out = np.full(c.shape[0], z)
    if distribution == "gaussian":
        return out
    if distribution != "laplace":
        raise MechanismError(f"noise distribution ({distribution!r}) must be laplace or gaussian")
    # the factor depends on each row's direction only: scale rows to max |c| = 1 first, so
    # that c^4 cannot overflow (a polynomial in original units can have |c| ~ 1e70)
    top = np.abs(c).max(axis=1, keepdims=True)
    c = c / np.where(top > 0, top, 1.0)
    sq = c * c
    s2 = sq.sum(axis=1)
    s4 = (sq * sq).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where(s4 > 0, s2 * s2 / np.where(s4 > 0, s4, 1.0), np.inf)
    rows = np.flatnonzero(n_eff < _NORMAL_NEFF)
    if rows.size:
        out[rows] = _laplace_saddlepoint_factor(c[rows], 1.0 - level)
    return out


def _laplace_saddlepoint_factor(c: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """Solve ``2 P_LR(X >= x) = alpha`` for ``X = sum_r c_r L_r``, ``L_r ~ Laplace(1)``.

    Parametrised by the saddlepoint ``u = tau / max|c|``, ``tau in (0, 1)``:
    ``x = K'(u)``, ``w = sqrt(2 (u x - K(u)))``, ``v = u sqrt(K''(u))``,
    ``P(X >= x) ~ Phi(-w) + phi(w) (1/v - 1/w)``; bisection on ``log tau``.
    """
    a = np.abs(c)
    m = min(_SADDLEPOINT_TERMS, a.shape[1])
    top = -np.partition(-a, m - 1, axis=1)[:, :m] if m < a.shape[1] else a
    rest = np.maximum((a * a).sum(axis=1) - (top * top).sum(axis=1), 0.0)  # Gaussian lump
    umax = top.max(axis=1)
    sd = np.sqrt(2.0 * (a * a).sum(axis=1))
    lo = np.full(a.shape[0], math.log(1e-12))
    hi = np.full(a.shape[0], math.log1p(-1e-12))
    top_scaled = top / umax[:, None]
    rest_scaled = rest / (umax * umax)

    def tail(log_tau: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        tau = np.exp(log_tau)[:, None]
        y = (top_scaled * tau) ** 2  # c_r^2 u^2 with u = tau / umax
        one = 1.0 - y
        k = -np.log(one).sum(axis=1) + rest_scaled * tau[:, 0] ** 2
        k1 = (2.0 * y / one).sum(axis=1) + 2.0 * rest_scaled * tau[:, 0] ** 2  # u K'(u)
        k2 = (2.0 * y * (1.0 + y) / one**2).sum(axis=1) + 2.0 * rest_scaled * tau[:, 0] ** 2
        w = np.sqrt(np.maximum(2.0 * (k1 - k), 1e-300))  # u x - K(u) with x = K'(u)
        v = np.sqrt(k2)  # u sqrt(K''(u))
        x = k1 / (tau[:, 0] / umax)
        p = ndtr(-w) + np.exp(-0.5 * w * w) / math.sqrt(2.0 * math.pi) * (1.0 / v - 1.0 / w)
        return 2.0 * p, x

    # Phase 1: the saddlepoint where x(u) = z sd / 2. Below it w is small and the
    # Lugannani-Rice correction 1/v - 1/w cancels catastrophically; the quantile lies above.
    target = 0.5 * float(ndtri(1.0 - alpha / 2.0)) * sd
    for _ in range(40):  # 2^-40 of the log-bracket: ~3e-11 relative in tau
        mid = 0.5 * (lo + hi)
        _, x = tail(mid)
        below = x < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    hi = np.full(a.shape[0], math.log1p(-1e-12))
    # Phase 2: 2 P(X >= x(u)) decreases in u; bisection for alpha.
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        p, _ = tail(mid)
        above = p > alpha
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    _, x = tail(0.5 * (lo + hi))
    out: NDArray[np.float64] = x / sd
    return out


# --- helpers -----------------------------------------------------------------------------

_METRIC = {"laplace": "l1", "laplace_approx": "linf", "gaussian": "l2"}


def bias_aware_critical_value(t: ArrayLike, level: float) -> NDArray[np.float64]:
    """``h`` with ``P(|Z + t| <= h) = level`` for ``Z ~ N(0, 1)``: the half-width, in
    standard deviations, of the shortest interval ``estimate -+ h sd`` that covers at
    ``level`` whenever the estimate's bias is at most ``t`` standard deviations
    (Armstrong and Kolesar, "Simple and honest confidence intervals in nonparametric
    regression", Quant. Econ. 2020, eq. (2)). ``h`` runs from the two-sided normal
    quantile at ``t = 0`` to ``t + z_one_sided`` for large ``t`` (the old rule
    ``z + t`` over-covers in between); found by bisection on
    ``[t + z_one_sided, t + z_two_sided]``, where the coverage is monotone, to 1e-12.
    """
    t = np.abs(np.asarray(t, dtype=np.float64))
    low = t + float(ndtri(level))
    high = t + float(ndtri(0.5 + level / 2.0))
    for _ in range(60):
        mid = 0.5 * (low + high)
        covered = ndtr(mid - t) - ndtr(-mid - t) >= level
        high = np.where(covered, mid, high)
        low = np.where(covered, low, mid)
    out: NDArray[np.float64] = high
    return out


def product_skew_factor(
    magnitude: ArrayLike, product_sd: ArrayLike, level: float
) -> NDArray[np.float64]:
    """``m >= 1`` that widens the noise half-width of an extrapolated answer, a product of
    noisy factors: with ``s = product_sd / |value|`` (the delta-method relative error of
    the product, i.e. the standard deviation of its logarithm) and the product's error
    taken as log-normal, ``truth / value = exp(s Z)``, the symmetric interval
    ``value -+ x |value|`` covers when ``log(1 - x) <= s Z <= log(1 + x)``; ``x`` solves
    ``Phi(log(1 + x) / s) - Phi(log(1 - x) / s) = level`` (the second term 0 for
    ``x >= 1``) and ``m = x / (z_level s)``. ``m -> 1`` as ``s -> 0`` (``x ~ z s``); at
    ``s = 0.5``, ``m = 1.61`` at 95 % (the log-normal's mean is ``value``,
    so ``log(truth / value) ~ N(s^2 / 2, s^2)``). Module docstring, "Independence extrapolation".
    Found by bisection on ``[0, e^{z s} - 1]`` (the upper end always covers), to 1e-12
    relative.
    """
    v = np.abs(np.asarray(magnitude, dtype=np.float64))
    sd = np.abs(np.asarray(product_sd, dtype=np.float64))
    z = float(ndtri(0.5 + level / 2.0))
    ok = (sd > 0) & np.isfinite(v) & np.isfinite(sd)
    s = np.divide(sd, v, out=np.full_like(sd, np.inf), where=ok & (v > 0))
    s = np.minimum(s, 30.0)  # e^{z s + s^2 / 2} stays finite (m is then ~1e200: capped later)
    shift = s * s / 2.0
    low = np.zeros_like(s)
    high = np.expm1(z * s + shift)
    for _ in range(80):
        mid = 0.5 * (low + high)
        with np.errstate(divide="ignore", invalid="ignore"):
            lower = np.where(mid < 1.0, ndtr((np.log1p(-np.minimum(mid, 1.0)) - shift) / s), 0.0)
            covered = ndtr((np.log1p(mid) - shift) / s) - lower >= level
        high = np.where(covered, mid, high)
        low = np.where(covered, low, mid)
    out: NDArray[np.float64] = np.where(ok & (s > 1e-8), high / np.maximum(z * s, 1e-300), 1.0)
    return np.maximum(out, 1.0)


def _mechanism(delta: float, mechanism: str | None) -> str:
    if mechanism is None:
        return "laplace" if delta == 0.0 else "gaussian"
    if mechanism not in noise.MECHANISMS:
        raise MechanismError(f"mechanism ({mechanism!r}) must be one of {noise.MECHANISMS}")
    return mechanism


def _coordinate_stddev(mechanism: str, n: int, R: int, epsilon: float, delta: float) -> float:
    """Noise standard deviation of one coordinate when ``R`` moments are released.

    Laplace and Gaussian scales are linear in the sensitivity and do not depend on ``R``
    otherwise, so one OpenDP calibration at unit sensitivity serves every candidate (the
    release itself is calibrated exactly in :func:`measure`).
    """
    sensitivity = noise.moment_sensitivity(n, R)[_METRIC[mechanism]]
    if mechanism in ("laplace", "gaussian"):
        return sensitivity * _unit_stddev(mechanism, epsilon, delta)
    calibration = noise.calibrate(
        mechanism, sensitivity=sensitivity, epsilon=epsilon, delta=delta, dimension=R
    )
    return calibration.stddev


@functools.lru_cache(maxsize=64)
def _unit_stddev(mechanism: str, epsilon: float, delta: float) -> float:
    return noise.calibrate(
        mechanism, sensitivity=1.0, epsilon=epsilon, delta=delta, dimension=1
    ).stddev


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise MechanismError(f"{name} ({value!r}) must be a positive integer")


def _check_level(level: float) -> None:
    if not (isinstance(level, float | int) and 0.0 < level < 1.0):
        raise MechanismError(f"level ({level!r}) must lie in (0, 1)")


def _exponents(magnitudes: NDArray[np.float64]) -> NDArray[np.int64]:
    """``e`` with ``magnitudes / 2^e`` in ``[1/2, 1)`` (0 where the magnitude is 0)."""
    out: NDArray[np.int64] = np.frexp(magnitudes)[1].astype(np.int64)
    return out


def _unit_expansion(
    expansion: TensorExpansion,
) -> tuple[TensorExpansion, NDArray[np.int64]]:
    """``(f', e)`` with ``f_q = 2^{e_q} f'_q``: each query's weights divided by a power of
    two near the largest ``|w_qj|``, and each column's factor coefficients (and their tail
    bounds) by one near the largest ``|a_qjik|`` over the query's kernels ``j`` and degrees
    ``k``. Powers of two rescale exactly; the query stays the same function up to its
    factor ``2^{e_q}``, and its largest weight and coefficients are in ``[1/2, 1)``."""
    w_exp = _exponents(np.abs(expansion.weights).max(axis=1))  # (Q,)
    a_exp = _exponents(np.abs(expansion.factors).max(axis=(1, 3)))  # (Q, d)
    if not (np.any(w_exp) or np.any(a_exp)):
        return expansion, w_exp
    unit = dataclasses.replace(
        expansion,
        weights=np.ldexp(expansion.weights, -w_exp[:, None]),
        factors=np.ldexp(expansion.factors, -a_exp[:, None, :, None]),
        tails=np.ldexp(expansion.tails, -a_exp[:, None, :]),
    )
    return unit, w_exp + a_exp.sum(axis=1)


def _unit_coefficients(
    coef: QueryCoefficients,
) -> tuple[QueryCoefficients, NDArray[np.int64]]:
    """``(coef', e)`` with each query's ``c_0``, ``c_S`` and truncation bound divided by a
    power of two ``2^{e_q}`` near the largest of them (as :func:`_unit_expansion`)."""
    top = np.maximum(
        np.abs(coef.coefficients).max(axis=1, initial=0.0),
        np.maximum(np.abs(coef.constant), coef.truncation_bound),
    )
    exponents = _exponents(np.where(np.isfinite(top), top, 0.0))
    if not np.any(exponents):
        return coef, exponents
    unit = dataclasses.replace(
        coef,
        constant=np.ldexp(coef.constant, -exponents),
        coefficients=np.ldexp(coef.coefficients, -exponents[:, None]),
        truncation_bound=np.ldexp(coef.truncation_bound, -exponents),
        check_residual=None
        if coef.check_residual is None
        else np.ldexp(coef.check_residual, -exponents),
    )
    return unit, exponents


def _scale_answers(answers: Answers, exponents: NDArray[np.int64]) -> Answers:
    """``answers`` of the rescaled queries times ``2^{e_q}``: values, standard errors and
    every half-width are of degree one in a query's scale (a value past the float range
    becomes infinite and is refused as before); the dependence factor, the flags and the
    level do not move."""
    if not np.any(exponents):
        return answers
    return dataclasses.replace(
        answers,
        values=np.ldexp(answers.values, exponents),
        stderr=np.ldexp(answers.stderr, exponents),
        truncation_bound=np.ldexp(answers.truncation_bound, exponents),
        noise_halfwidth=np.ldexp(answers.noise_halfwidth, exponents),
        halfwidth=np.ldexp(answers.halfwidth, exponents),
        extrapolation=np.ldexp(answers.extrapolation, exponents),
        worst_case_halfwidth=np.ldexp(answers.worst_case_halfwidth, exponents),
    )


def _concatenate(pieces: Sequence[Answers], level: float) -> Answers:
    return Answers(
        values=np.concatenate([p.values for p in pieces]),
        stderr=np.concatenate([p.stderr for p in pieces]),
        truncation_bound=np.concatenate([p.truncation_bound for p in pieces]),
        noise_halfwidth=np.concatenate([p.noise_halfwidth for p in pieces]),
        level=level,
        rigorous=np.concatenate([p.rigorous for p in pieces]),
        methods=tuple(m for p in pieces for m in p.methods),
        halfwidth=np.concatenate([p.halfwidth for p in pieces]),
        extrapolation=np.concatenate([p.extrapolation for p in pieces]),
        worst_case_halfwidth=np.concatenate([p.worst_case_halfwidth for p in pieces]),
        dependence=np.concatenate([p.dependence for p in pieces]),
        within_smoothness=np.concatenate([p.within_smoothness for p in pieces]),
    )


def _merge(parts: Sequence[tuple[NDArray[np.int64], Answers]], size: int, level: float) -> Answers:
    values = np.empty(size)
    stderr = np.empty(size)
    bound = np.empty(size)
    half = np.empty(size)
    width = np.empty(size)
    extra = np.empty(size)
    worst = np.empty(size)
    log_factor = np.empty(size)
    rigorous = np.empty(size, dtype=bool)
    within = np.empty(size, dtype=bool)
    methods = [""] * size
    for indices, answers in parts:
        values[indices] = answers.values
        stderr[indices] = answers.stderr
        bound[indices] = answers.truncation_bound
        half[indices] = answers.noise_halfwidth
        width[indices] = answers.halfwidth
        extra[indices] = answers.extrapolation
        worst[indices] = answers.worst_case_halfwidth
        log_factor[indices] = answers.dependence
        rigorous[indices] = answers.rigorous
        within[indices] = answers.within_smoothness
        for i, method in zip(indices, answers.methods, strict=True):
            methods[int(i)] = method
    return Answers(
        values,
        stderr,
        bound,
        half,
        level,
        rigorous,
        tuple(methods),
        width,
        extra,
        worst,
        log_factor,
        within,
    )
