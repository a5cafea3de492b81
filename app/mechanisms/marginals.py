"""Noisy one-dimensional histograms as a smooth-query synthesizer (issue 7, first step).

Why this exists
---------------
Paper 000 measures Chebyshev moments ``T_r(x)``; every row moves *every* moment, so the
L2 sensitivity of ``R`` moments is ``2 sqrt(R)/n`` and, on the paper's datasets at
``epsilon = 1``, even the ``d`` first-degree moments alone carry noise of standard
deviation ~0.13 (WDBC). A histogram is a local basis: under replace-one neighbours a row
leaves one bin and enters another, so the histogram of one column has L2 sensitivity
``sqrt(2)/n`` (L1 ``2/n``) *whatever the number of bins*, and the noisy frequencies can be
projected onto the probability simplex, which removes most of the noise when a column's
mass sits in a few bins. Smooth queries with ``sigma >= 4`` on the paper-000 protocol
depend almost only on the one-dimensional marginals (issue 7: a synthesizer that keeps
each column's exact distribution and shuffles columns independently scores 0.00-0.02x
the 0-DP baseline there), so the marginals are what to spend the budget on.

Mechanism (one measurement, then post-processing)
-------------------------------------------------
1. Per column, ``B + 2`` cells fixed by the declared ``[-1, 1]`` (public: they come from
   the curator's bounds, never from the data): the two bounds themselves as atoms
   ``{-1}`` and ``{1}`` (a clipped upload, or a column with many zeros at its lower bound,
   puts real mass there), and ``B`` equal-width bins of ``(-1, 1)``;
   ``h_{i,b} = #{x : x_i in cell b} / n``.
2. The vector ``h`` (``d (B + 2)`` values) is released once with OpenDP's vector Gaussian
   (``delta > 0``; zCDP converted to ``(epsilon, delta)``) or vector Laplace (``delta = 0``).
   Sensitivity under replace-one neighbours (DESIGN §2.2), proof: replacing row ``z`` by
   ``z'`` changes, in column ``i``, the cell of ``z_i`` by ``-1/n`` and the cell of ``z'_i``
   by ``+1/n`` (nothing if they coincide), so per column ``||Delta h_i||_1 <= 2/n`` and
   ``||Delta h_i||_2 <= sqrt(2)/n``; over ``d`` columns ``Delta_1 = 2d/n`` and
   ``Delta_2 = sqrt(2d)/n``. Both are attained (every coordinate of ``z`` and ``z'`` in
   different bins); :func:`histogram_sensitivity` returns them plus the rounding of
   ``counts / n`` (:func:`app.mechanisms.noise.float_sensitivity`; relative ``n u`` in L1,
   ``sqrt(2) n u`` in L2, ``1.6e-12`` at ``n = 10^4``) and the tests brute-force them.
3. Post-processing (free): each noisy column ``h_i`` is replaced by its Euclidean
   projection onto the simplex ``{p >= 0, sum p = 1}`` (the least-squares consistent
   marginal); ``C`` support points take, in every column independently, a cell with the
   projected probabilities (systematic allocation, so each cell gets ``round(C p_b)``
   points) and the bound itself for an atom, or a stratified uniform position inside a
   bin; columns are independently
   permuted. Weights are ``1/C``. This is the product of the estimated marginals.

Number of bins
--------------
More bins mean less discretisation bias (uniform placement inside a bin moves the
column's mean by up to half a bin) but more noise in any integrated quantity (a column's
mean sums ``B`` noisy frequencies). A smooth query over ``d`` columns is a product of
per-column factors, so its relative error is about the sum of the per-column ones, and
the two kinds add differently: the bias shares its sign across columns on real data
(skewed columns pile their mass at the same end of their bins), so it adds up to
``~ d beta / B``, while the noise is independent across columns and adds up to
``~ sqrt(d) gamma tau sqrt(B)`` (per-frequency noise ``tau``). The sum is smallest at
``B^{3/2} = 2 beta sqrt(d) / (gamma tau)``, i.e. ``B ~ d^{1/3} tau^{-2/3}``;
:func:`default_bins` uses ``B = clip(round(BIN_SCALE d^{1/3} tau^{-2/3}), 2, 64)``, a
rule computed from public quantities only (``n``, ``d``, ``epsilon``, ``delta``). The
``d^{1/3}`` factor matters on wide tables: on CRM (``d = 100``) it moves ``B`` from 8 to
14 and cut the worst-case error at ``sigma >= 4`` from ~0.33x to ~0.20x the 0-DP baseline,
while on WDBC, CTG and PKS it keeps the bins the rule without it chose (within one).
The atoms at the bounds are used when ``tau < 0.03`` (``ATOM_NOISE_LIMIT``): with more
noise an empty atom's noise puts spurious mass at the extremes. CRM (``tau = 0.041``; 18
columns hold over 5 % of their rows at the lower bound, up to 85 %) is the case against
raising the limit: atoms would cut the exact tree's error
(:mod:`~app.mechanisms.marginal_tree`) at ``sigma >= 6`` from 0.10-0.12x to 0.04-0.06x
the baseline, yet the private tree with atoms scored 0.23-0.27x against 0.18-0.20x
without (8 rounds), also with every atom below 3 or 4 noise standard deviations merged
into its edge bin. Without atoms, the heavy columns' bound mass smeared over the edge bin
(second moment too low) and the other columns' noise-spread tails (too high) cancel in
the sum over columns; keeping the heavy atoms removes only the first. Measured again
(exact rows, each value placed uniformly in its bin, the joint law kept): without atoms
the binning alone overestimates every worst-case query at ``sigma >= 4`` by 0.12-0.13x
the baseline at ``B = 14`` (0.26-0.28x at ``B = 8``), with atoms by 0.02-0.03x
(0.05-0.06x). A shape-constrained denoiser (each column's bins projected onto the
unimodal laws, by isotonic regression from every candidate mode) to remove the noise
spread tails did not rescue the atoms in the private tree (8 paired rounds on CRM;
atoms with it 0.22-0.29x at ``sigma >= 4`` against 0.19-0.22x for the default, and
0.25-0.29x without atoms, where it unmasks the binning bias). Cells whose noisy
frequency is below ``1 tau`` (``THRESHOLD``) are zeroed before the projection. The four
constants were chosen on the paper-000 protocol (``bench/smooth_marginals.py``; WDBC, CTG,
PKS, CRM at ``epsilon = 1``) and are public, data-independent choices.

What it does not do
-------------------
It keeps no dependence between columns: queries whose answer depends on the joint
distribution (small ``sigma``, kernels centred at real rows) see the product of the
marginals. Measuring pairwise moments with the remaining budget was tried and, at
``n`` in the hundreds, the extra noise cost more than the dependence it captured;
:mod:`app.mechanisms.marginal_tree` instead adds a private tree of coarse two-way tables
(with ``delta > 0``).

Standard errors
---------------
:meth:`MarginalMeasurements.stderrs` gives each answer the standard error of the DP noise
by the parametric bootstrap of :mod:`app.mechanisms.bootstrap` (the histograms simulated
under the released marginals, thresholded and projected again). Against the spread of
answers over independent releases of the same data (``bench/results/answer_stderr.md``, 20
releases a dataset at ``epsilon = 1``) it reads 0.51-1.26 of it (0.82-1.15 on the
uniform-centre queries), and on 400 releases of a small case, brute force, 0.99 (Laplace)
and 1.02 (Gaussian) (``tests/mechanisms/test_bootstrap.py``). The product law's own error
(the dependence it does not keep) is not in it. The bootstrap takes the thresholded
marginals as the truth; the plain projections instead (20 releases, side script) read
nearer 1 on the uniform-centre queries (CRM 1.03-1.06 against 0.82-0.84, PKS 1.08 against
0.98) but far below it on the row-centred ones (CRM ``sigma = 1``: 0.10 against 0.45;
halfway between the two laws: 0.89-0.91 and 0.25), where the cells a threshold zeroes
carry the answer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import isotonic_regression

from app.mechanisms import bootstrap, noise
from app.mechanisms.chebyshev import TensorExpansion
from app.mechanisms.data import RowSource, as_source, iter_checked
from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import PrivacyCost, check_budget
from app.mechanisms.queries import Query, answer, sample_support

FORMAT = "smooth_synthetic.marginals/1"
#: The ledger step name of the one measurement.
MEASURE_STEP = "marginals"
MIN_BINS, MAX_BINS = 2, 64
#: ``B = BIN_SCALE d^{1/3} tau^{-2/3}`` before clipping (module doc, "Number of bins").
BIN_SCALE = 0.36
#: Cells below this many noise standard deviations are treated as empty.
THRESHOLD = 1.0
#: The bounds get atoms of their own when the per-frequency noise is below this.
ATOM_NOISE_LIMIT = 0.03
#: ``C`` when ``grid_size`` is None.
DEFAULT_SUPPORT_SIZE = 10_000


def histogram_sensitivity(n: int, d: int) -> dict[str, float]:
    """Declared L1 and L2 sensitivity of ``d`` one-column frequency histograms: exact
    ``2d/n`` and ``sqrt(2d)/n`` (module doc, step 2) through
    :func:`app.mechanisms.noise.float_sensitivity`.

    The counts are exact integers and each frequency ``counts / n`` is one correctly
    rounded division, within ``u h`` of the exact ``h`` (``u = 2^-53``); a column's
    frequencies sum to 1, so the computed histograms are within ``d u`` of the exact ones
    in L1 and ``sqrt(d) u`` in L2 (``sum_b h_b^2 <= 1`` per column). Relative allowance:
    ``n u`` (L1) and ``sqrt(2) n u`` (L2), e.g. ``1.1e-10`` and ``1.6e-10`` at ``n = 10^6``.
    """
    if n < 1 or d < 1:
        raise MechanismError(f"n ({n}) and d ({d}) must be positive")
    u = noise.UNIT_ROUNDOFF
    return {
        "l1": noise.float_sensitivity(2.0 * d / n, d * u),
        "l2": noise.float_sensitivity(math.sqrt(2.0 * d) / n, math.sqrt(d) * u),
    }


def noise_calibration(
    n: int, d: int, epsilon: float, delta: float, cells: int = 1
) -> noise.NoiseCalibration:
    """The noise law of :func:`measure` for ``d`` histograms of ``cells`` cells: vector
    Gaussian (``delta > 0``, L2 sensitivity) or Laplace (L1). Public: no data is read."""
    check_budget(epsilon, delta)
    mechanism = "gaussian" if delta > 0 else "laplace"
    sens = histogram_sensitivity(n, d)["l2" if mechanism == "gaussian" else "l1"]
    return noise.calibrate(
        mechanism, sensitivity=sens, epsilon=epsilon, delta=delta, dimension=d * cells
    )


@functools.lru_cache(maxsize=256)
def noise_stddev(n: int, d: int, epsilon: float, delta: float) -> float:
    """Standard deviation of the noise on one frequency (the scale does not depend on the
    number of cells). A function of public numbers only, kept for the last 256 of them:
    :func:`resolve` asks for it twice, and OpenDP's conversion takes about a second at
    large ``delta``."""
    return noise_calibration(n, d, epsilon, delta).stddev


def default_bins(n: int, d: int, epsilon: float, delta: float) -> int:
    """``B = clip(round(BIN_SCALE d^{1/3} tau^{-2/3}), 2, 64)`` with ``tau`` the
    per-frequency noise stddev: the bias-noise balance of the module doc."""
    tau = noise_stddev(n, d, epsilon, delta)
    B = round(BIN_SCALE * d ** (1.0 / 3.0) * tau ** (-2.0 / 3.0))
    return int(min(MAX_BINS, max(MIN_BINS, B)))


def resolve(
    n: int,
    d: int,
    epsilon: float,
    delta: float,
    bins: int | None = None,
    bound_atoms: bool | None = None,
) -> tuple[int, bool]:
    """``(B, atoms)`` that :func:`measure` uses, from public values only (``bins=None``:
    :func:`default_bins`; ``bound_atoms=None``: atoms when the per-frequency noise is below
    ``ATOM_NOISE_LIMIT``)."""
    B = default_bins(n, d, epsilon, delta) if bins is None else bins
    if isinstance(B, bool) or not isinstance(B, int | np.integer) or not (2 <= B <= 4096):
        raise MechanismError(f"bins ({bins!r}) must be an integer in [2, 4096]")
    if bound_atoms is None:
        bound_atoms = noise_stddev(n, d, epsilon, delta) < ATOM_NOISE_LIMIT
    return int(B), bool(bound_atoms)


def project_to_simplex(v: ArrayLike) -> NDArray[np.float64]:
    """Euclidean projection of ``v`` onto ``{p >= 0, sum p = 1}`` (sort-based, exact).

    ``p = max(v - theta, 0)`` with ``theta`` the unique threshold making ``sum p = 1``
    (Held, Wolfe and Crowder 1974; Duchi et al. 2008, Fig. 1).
    """
    values = np.asarray(v, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise MechanismError("project_to_simplex needs a non-empty finite vector")
    u = np.sort(values)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, values.size + 1)
    rho = int(np.nonzero(u - css / k > 0)[0][-1])
    theta = css[rho] / (rho + 1)
    out: NDArray[np.float64] = np.maximum(values - theta, 0.0)
    out /= out.sum()
    return out


def denoise(values: ArrayLike, scale: float, threshold: float | None) -> NDArray[np.float64]:
    """Noisy frequencies (any shape, one law) made a probability law: the cells at or above
    ``threshold * scale`` projected onto the simplex (:func:`project_to_simplex`), the
    others 0 (``scale``: the noise standard deviation of a cell; an empty cell passes with
    probability ``Phi(-threshold)`` under Gaussian noise). ``threshold=None``, or no cell
    above it: the plain projection of every cell. Post-processing of public values only."""
    v = np.asarray(values, dtype=np.float64)
    flat = v.ravel()
    if threshold is not None:
        keep = flat >= threshold * scale
        if np.any(keep):
            out = np.zeros_like(flat)
            out[keep] = project_to_simplex(flat[keep])
            return out.reshape(v.shape)
    return project_to_simplex(flat).reshape(v.shape)


def unimodal_projection(v: ArrayLike) -> tuple[NDArray[np.float64], float]:
    """The Euclidean projection of ``v`` onto the unimodal vectors (non-decreasing, then
    non-increasing) and its squared distance ``||fit - v||^2``.

    A non-decreasing run followed by a non-increasing one is unimodal whatever values meet
    at the join, and each run's nearest fit is its isotonic regression (pool adjacent
    violators), so the projection is the best of the ``L + 1`` splits ``k``:

        fit = argmin_k || v - (inc(v[:k]) ++ dec(v[k:])) ||^2

    (Frisén 1986, "Unimodal regression", The Statistician 35; Stout 2008, "Unimodal
    regression via prefix isotonic regression", Comput. Stat. Data Anal. 53). Isotonic
    regression replaces each pooled block by its mean, so the fit keeps ``sum v`` and
    non-negativity: a law stays a law. ``O(L^2)`` here, by scipy's pool adjacent violators
    at every split (``L`` is a column's cell count, at most a few hundred).
    """
    values = np.asarray(v, dtype=np.float64)
    if values.ndim != 1 or values.size == 0 or not np.all(np.isfinite(values)):
        raise MechanismError("unimodal_projection needs a non-empty finite vector")
    best, best_distance = values, math.inf
    for k in range(values.size + 1):
        parts = []
        if k > 0:
            parts.append(isotonic_regression(values[:k], increasing=True).x)
        if k < values.size:
            parts.append(isotonic_regression(values[k:], increasing=False).x)
        fit = np.concatenate(parts)
        distance = float(np.sum((fit - values) ** 2))
        if distance < best_distance:
            best, best_distance = fit, distance
    return best, best_distance


@dataclass(frozen=True, eq=False)
class MarginalMeasurements:
    """The noisy histograms (``frequencies``, ``d x (B + 2)``) and how they were made."""

    n: int
    d: int
    epsilon: float
    delta: float
    bins: int
    atoms: bool
    frequencies: NDArray[np.float64]
    calibration: noise.NoiseCalibration

    @property
    def privacy_cost(self) -> PrivacyCost:
        """The one noisy measurement's cost, from its calibration."""
        return PrivacyCost.compose([self.calibration.cost_part(MEASURE_STEP)])

    @property
    def cells(self) -> int:
        return self.bins + 2 * self.atoms

    def __post_init__(self) -> None:
        freq = np.array(self.frequencies, dtype=np.float64, copy=True)
        if freq.shape != (self.d, self.cells):
            raise MechanismError(f"frequencies must have shape ({self.d}, {self.cells})")
        freq.setflags(write=False)
        object.__setattr__(self, "frequencies", freq)

    def marginals(self, threshold: float = THRESHOLD) -> NDArray[np.float64]:
        """Each column's noisy histogram, denoised and projected onto the simplex.

        Cells whose noisy frequency is below ``threshold`` noise standard deviations are
        set to 0, then the column is projected onto the simplex (:func:`denoise`).
        """
        tau = self.calibration.stddev
        return np.stack([denoise(row, tau, threshold) for row in self.frequencies])

    def chebyshev_moments(self, length: int) -> NDArray[np.float64]:
        """``m[i, k] = E T_k(X_i)``, ``k < length``, under column ``i``'s estimated marginal:
        :meth:`marginals` times :func:`cell_means` (the law :func:`synthesize_from` draws
        the support from). Post-processing only."""
        moments: NDArray[np.float64] = self.marginals() @ cell_means(self.bins, self.atoms, length)
        return moments

    def expectations(self, expansion: TensorExpansion) -> NDArray[np.float64]:
        """``(Q,)`` exact answers of separable queries under the product of the estimated
        marginals: ``sum_j w_j prod_i sum_k a_{jik} m[i, k]`` (:meth:`chebyshev_moments`);
        the same law the support is a sample of, without its sampling error."""
        return product_expectations(self.marginals(), self.bins, self.atoms, expansion)

    @functools.cached_property
    def noise_replicates(self) -> NDArray[np.float64]:
        """``(B, d, cells)``: the estimated marginals refitted from ``B =``
        :data:`app.mechanisms.bootstrap.REPLICATES` simulated measurements of the released
        law (:mod:`~app.mechanisms.bootstrap`): ``y* = p + z``, ``p`` = :meth:`marginals`,
        ``z`` from the measurement's own noise law and scale, refitted by
        :meth:`marginals` (threshold and projection). Post-processing only."""
        p = self.marginals()
        rng = np.random.default_rng(bootstrap.seed_of(self.frequencies))
        law = self.calibration
        replicates = []
        for _ in range(bootstrap.REPLICATES):
            simulated = p + bootstrap.simulated_noise(law.distribution, law.scale, p.shape, rng)
            replicates.append(replace(self, frequencies=simulated).marginals())
        return np.stack(replicates)

    def noise_replicate_arrays(
        self, progress: Callable[[float], None] | None = None
    ) -> dict[str, NDArray[np.float64]]:
        """:attr:`noise_replicates` as arrays to store beside the release (computed once,
        where the release is synthesised, instead of on its first answer). ``progress``
        (as :meth:`app.mechanisms.marginal_tree.TreeMeasurements.noise_replicate_arrays`)
        is told 1 once they are: these refits are quick."""
        arrays = {"p": self.noise_replicates}
        if progress is not None:
            progress(1.0)
        return arrays

    def restore_noise_replicates(self, arrays: Mapping[str, NDArray[Any]]) -> bool:
        """Take :attr:`noise_replicates` from :meth:`noise_replicate_arrays` of this
        release (shapes checked; ``False``, and nothing taken, if they do not fit)."""
        p = np.asarray(arrays.get("p", np.empty(0)), dtype=np.float64)
        if p.ndim != 3 or p.shape[0] < 2 or p.shape[1:] != (self.d, self.cells):
            return False
        self.__dict__["noise_replicates"] = p  # the cached_property's own slot
        return True

    def stderrs(self, expansion: TensorExpansion) -> NDArray[np.float64]:
        """``(Q,)`` standard errors of :meth:`expectations` from the DP noise: the spread of
        the answers under :attr:`noise_replicates` (parametric bootstrap). They do not
        include the error of the product law itself (the dependence between columns)."""
        return self.answers(expansion)[1]

    def answers(
        self, expansion: TensorExpansion
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(values, stderrs)``: :meth:`expectations` and :meth:`stderrs` together, the
        cells' Chebyshev means (:func:`cell_means`, the same for every law: cosines, up to
        ``cells x length`` of them) computed once for the released law and its replicates."""
        means = cell_means(self.bins, self.atoms, int(expansion.factors.shape[3]))
        values = product_expectations(self.marginals(), self.bins, self.atoms, expansion, means)
        replicated = [
            product_expectations(p, self.bins, self.atoms, expansion, means)
            for p in self.noise_replicates
        ]
        return values, bootstrap.standard_errors(np.stack(replicated))

    @property
    def parameters(self) -> dict[str, Any]:
        return {
            "method": "marginals",
            "bins": self.bins,
            "bound_atoms": self.atoms,
            "noise": self.calibration.mechanism,
            "noise_scale": self.calibration.scale,
            "noise_stddev": self.calibration.stddev,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "n": self.n,
            "d": self.d,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "bins": self.bins,
            "atoms": self.atoms,
            "frequencies": [[float(v) for v in row] for row in self.frequencies],
            "calibration": self.calibration.to_dict(),
            "privacy_cost": self.privacy_cost.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MarginalMeasurements:
        if data.get("format") != FORMAT:
            raise MechanismError(f"not a marginal measurement record (format {FORMAT!r})")
        measurements = cls(
            n=int(data["n"]),
            d=int(data["d"]),
            epsilon=float(data["epsilon"]),
            delta=float(data["delta"]),
            bins=int(data["bins"]),
            atoms=bool(data["atoms"]),
            frequencies=np.asarray(data["frequencies"], dtype=np.float64),
            calibration=noise.NoiseCalibration.from_dict(dict(data["calibration"])),
        )
        if measurements.privacy_cost.as_dict() != data["privacy_cost"]:
            raise MechanismError("the recorded privacy cost does not match the noise calibration")
        return measurements


def product_expectations(
    p: NDArray[np.float64],
    bins: int,
    atoms: bool,
    expansion: TensorExpansion,
    means: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """``(Q,)`` exact expectations of separable queries under the product law whose
    column ``i`` has cell probabilities ``p[i]`` (uniform inside a bin):
    ``sum_j w_j prod_i sum_k a_{jik} m[i, k]`` with ``m = p`` times :func:`cell_means`
    (``means``, when the caller has them for the expansion's length)."""
    if expansion.dim != p.shape[0]:
        raise MechanismError(
            f"the query has d = {expansion.dim} columns; the data has d = {p.shape[0]}"
        )
    if means is None:
        means = cell_means(bins, atoms, int(expansion.factors.shape[3]))
    m = p @ means
    per_column = np.einsum("qjik,ik->qji", expansion.factors, m)
    out: NDArray[np.float64] = np.einsum("qj,qj->q", expansion.weights, np.prod(per_column, axis=2))
    return out


def cell_means(bins: int, atoms: bool, length: int) -> NDArray[np.float64]:
    """``(cells, length)``: ``E T_k`` under each cell's law (public: no data).

    Atoms are the bounds themselves (``T_k(-1) = (-1)^k``, ``T_k(1) = 1``); a bin
    ``[a, b]`` holds the uniform density, so ``E T_k = (F_k(b) - F_k(a)) / (b - a)`` with
    the antiderivative ``F_0 = x``, ``F_1 = x^2 / 2`` and, for ``k >= 2``,
    ``F_k = (T_{k+1} / (k + 1) - T_{k-1} / (k - 1)) / 2``.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise MechanismError(f"length ({length!r}) must be a positive integer")
    edges = np.linspace(-1.0, 1.0, bins + 1)
    k = np.arange(length)
    theta = np.arccos(edges)[:, None]
    F = np.empty((bins + 1, length))
    F[:, 0] = edges
    if length > 1:
        F[:, 1] = edges**2 / 2.0
    high = k[k >= 2]
    if high.size:
        F[:, high] = (
            np.cos((high + 1) * theta) / (high + 1) - np.cos((high - 1) * theta) / (high - 1)
        ) / 2.0
    bin_means = np.diff(F, axis=0) / (2.0 / bins)  # (bins, length)
    if not atoms:
        return bin_means
    lower = np.where(k % 2 == 0, 1.0, -1.0)[None, :]
    out: NDArray[np.float64] = np.concatenate([lower, bin_means, np.ones((1, length))])
    return out


def cell_codes(batch: NDArray[np.float64], bins: int, atoms: bool) -> NDArray[np.int64]:
    """The cell of every value of ``batch`` (on ``[-1, 1]``): with atoms, ``0`` for the
    lower bound, ``1..bins`` for the bins and ``bins + 1`` for the upper bound."""
    codes: NDArray[np.int64] = np.clip(
        np.floor((batch + 1.0) * (bins / 2.0)).astype(np.int64), 0, bins - 1
    )
    if atoms:
        codes += 1
        codes[batch <= -1.0] = 0
        codes[batch >= 1.0] = bins + 1
    return codes


def exact_histograms(source: RowSource, bins: int, atoms: bool = True) -> NDArray[np.float64]:
    """``h_{i,b}`` of step 1 (``d x (bins + 2)``: atom ``{-1}``, the bins, atom ``{1}``;
    ``d x bins`` without the atoms).

    Streamed over row batches; never released without noise.
    """
    cells = bins + 2 * atoms
    counts = np.zeros((source.n_cols, cells), dtype=np.int64)
    for batch in iter_checked(source):
        codes = cell_codes(batch, bins, atoms)
        for i in range(source.n_cols):
            counts[i] += np.bincount(codes[:, i], minlength=cells)
    out: NDArray[np.float64] = counts / float(source.n_rows)
    return out


def measure(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    bins: int | None = None,
    bound_atoms: bool | None = None,
) -> MarginalMeasurements:
    """Release the ``d`` column histograms once, spending ``(epsilon, delta)`` (module doc).

    ``bins=None``: :func:`default_bins`. ``bound_atoms=None``: atoms at the bounds when the
    per-frequency noise is below ``ATOM_NOISE_LIMIT`` (with more noise, an empty atom's
    noise puts spurious mass at the extremes, which costs more than the atoms gain).
    """
    check_budget(epsilon, delta)
    source = as_source(X)
    n, d = source.n_rows, source.n_cols
    B, bound_atoms = resolve(n, d, epsilon, delta, bins, bound_atoms)
    # calibrated from public values before the rows are read (once: the read is drawn at it)
    law = noise_calibration(n, d, epsilon, delta, B + 2 * bound_atoms)
    frequencies = noise.sample(law, exact_histograms(source, B, bound_atoms).ravel())
    return MarginalMeasurements(
        n=n,
        d=d,
        epsilon=float(epsilon),
        delta=float(delta),
        bins=B,
        atoms=bound_atoms,
        frequencies=frequencies.reshape(d, B + 2 * bound_atoms),
        calibration=law,
    )


@dataclass(frozen=True, eq=False)
class MarginalRelease:
    """``C`` support points with weights ``1/C`` drawn from the product of the marginals."""

    points: NDArray[np.float64]
    weights: NDArray[np.float64]
    measurements: MarginalMeasurements
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def privacy_cost(self) -> PrivacyCost:
        return self.measurements.privacy_cost

    def sample(self, m: int, rng: np.random.Generator) -> NDArray[np.float64]:
        """``m`` rows drawn i.i.d. from the weighted support."""
        return sample_support(self.points, self.weights, m, rng)

    def answer(self, query: Query) -> float:
        """``sum_k w_k f(s_k)``."""
        return answer(query, self.points, self.weights)


def synthesize_from(
    measurements: MarginalMeasurements,
    rng: np.random.Generator,
    *,
    grid_size: int | None = None,
) -> MarginalRelease:
    """Post-process the noisy histograms into ``C`` support points (module doc, step 3)."""
    C = DEFAULT_SUPPORT_SIZE if grid_size is None else grid_size
    if isinstance(C, bool) or not isinstance(C, int | np.integer) or C < 1:
        raise MechanismError(f"grid_size ({grid_size!r}) must be a positive integer")
    B, d, atoms = measurements.bins, measurements.d, measurements.atoms
    width = 2.0 / B
    probabilities = measurements.marginals()
    points = np.empty((int(C), d), dtype=np.float64)
    for i in range(d):
        per_cell = _systematic_counts(probabilities[i], int(C), rng)
        first = 1 if atoms else 0
        pieces = [np.full(per_cell[0], -1.0)] if atoms else []
        for b in range(B):  # stratified in bin b: the k-th of c points at (k + u_k) / c
            c = int(per_cell[b + first])
            pieces.append(-1.0 + (b + (np.arange(c) + rng.uniform(size=c)) / c) * width)
        if atoms:
            pieces.append(np.full(per_cell[B + 1], 1.0))
        column = np.concatenate(pieces)
        points[:, i] = np.clip(column[rng.permutation(int(C))], -1.0, 1.0)
    weights = np.full(int(C), 1.0 / C)
    params = {**measurements.parameters, "C": int(C)}
    return MarginalRelease(points, weights, measurements, params)


def synthesize(
    X: ArrayLike | RowSource,
    epsilon: float,
    delta: float = 0.0,
    bins: int | None = None,
    grid_size: int | None = None,
    rng: np.random.Generator | None = None,
    bound_atoms: bool | None = None,
) -> MarginalRelease:
    """:func:`measure` then :func:`synthesize_from`."""
    measured = measure(X, epsilon, delta, bins, bound_atoms)
    return synthesize_from(
        measured, rng if rng is not None else np.random.default_rng(), grid_size=grid_size
    )


def _systematic_counts(p: NDArray[np.float64], C: int, rng: np.random.Generator) -> NDArray[Any]:
    """Counts per bin summing to ``C`` with ``|count_b - C p_b| < 1`` (systematic sampling)."""
    edges = np.concatenate([[0.0], np.cumsum(p)]) * C
    edges[-1] = C
    marks = np.arange(C) + rng.uniform()
    counts: NDArray[Any] = np.diff(np.searchsorted(marks, edges, side="left"))
    return counts


__all__ = [
    "MarginalMeasurements",
    "MarginalRelease",
    "cell_means",
    "default_bins",
    "histogram_sensitivity",
    "measure",
    "noise_stddev",
    "project_to_simplex",
    "resolve",
    "synthesize",
    "synthesize_from",
]
