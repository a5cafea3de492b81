"""Release type ``smooth_synthetic``: a synthetic database for smooth queries.

Three methods (``params.method``); each measures the release's continuous columns, normalised
to ``[-1, 1]`` with the declared bounds, once, and everything after is post-processing.

With no ``method``, a request gets ``"tree"`` when ``delta > 0`` (and ``d >= 2``, and the
histograms resolve to at least 4 cells) and ``"marginals"`` otherwise
(:func:`default_method`; the release stores the resolved method).

``method="marginals"``: :func:`app.mechanisms.marginals.measure` releases the
``d`` one-column histograms (``B`` bins, plus atoms at the bounds when the noise is low) in
one noisy measurement; L1 sensitivity ``2d/n`` and L2 ``sqrt(2d)/n`` under replace-one
neighbours whatever ``B`` (declared with the rounding allowance of
:func:`app.mechanisms.marginals.histogram_sensitivity`). Synthesis projects each noisy
histogram onto the simplex and draws ``C`` support points from the product of the
marginals. On the paper-000 protocol (WDBC, CTG, PKS, CRM at ``epsilon = 1``;
``bench/results/smooth_marginals.md``) it beats the moment LP on every dataset and query
family; it is the only histogram method for pure ``epsilon``-DP. It keeps no dependence
between columns: queries whose answer depends on the joint distribution see the product
of the marginals.

``method="tree"`` (``delta > 0``): :func:`app.mechanisms.marginal_tree.measure` releases the
same histograms with half the budget (in zCDP), selects a spanning tree of column pairs
with OpenDP's noisy max (MST's select step) and releases the selected pairs' coarse
two-way tables; synthesis and answers use the Markov-tree law that joins them, with each
column's coarse margin estimated from its histogram and its tables together, and inside a
pair of coarse groups the shape of a Gaussian copula fitted to the pair's table
and each edge's dependence tempered (:func:`app.mechanisms.marginal_tree.temper_tree`)
(post-processing; releases stored before version 4 of the record keep the law that is
uniform inside a pair of groups, those before version 5 the untempered copula, and
answer as they did). On the same
protocol (``bench/results/smooth_marginals.md``, 10 rounds) it is level with or better than
``marginals`` on the uniform-centre queries (WDBC ``sigma >= 4``: 0.19-0.21x ->
0.18-0.19x the 0-DP baseline) and better on the row-centred ones, which test joint
structure (``sigma = 1``: PKS 0.29x -> 0.10x, CTG 0.46x -> 0.25x; MST 0.21x and 0.27x).

``method="moments"``: paper 000 (:func:`app.mechanisms.smooth_synthetic.measure`): noisy
Chebyshev moments, an LP fit over candidate points, sampled rows.

Privacy: the release's ``(epsilon, delta)`` is spent by that one measurement (for
``moments`` with ``grid="pca_ellipsoid"``, its PCA and centre steps are composed with it by
basic composition; :mod:`app.mechanisms.smooth_synthetic`); synthesis
(free, re-runnable with other post-processing parameters: ``grid_size``, ``sample_size``,
and for ``moments`` ``solver``, ``ellipsoid_radius``) reads only the stored measurements.
The measurement payload records its method (its ``format``) and synthesis follows it.

Artifacts, in original units and the same for every method: ``sample.csv``/``.parquet``
(``m`` synthetic rows) and ``support.csv``/``.parquet`` (the weighted support points, with
a ``weight`` column, named ``support_weight`` where a released column is ``weight``:
:func:`weight_column`). Answers are exact for the released synthetic distribution: for
``marginals`` and ``tree`` the expectation under the released law (the support is a sample
of it), for ``moments`` ``q_f = sum_k w_k f(s_k)`` on the weighted support; their distance
to the true answer comes from the DP noise and from the dependence between columns the law
does not hold. ``marginals`` and ``tree`` answers carry the noise's standard error
(``stderrs`` of the measurements: a parametric bootstrap, :mod:`app.mechanisms.bootstrap`,
whose laws the synthesis stage computes and stores as the artifact :data:`REPLICATES_FILE`;
a version synthesised before that computes them on its first answer); the model's error
has no per-query bound, so no interval is given (``bench/results/answer_stderr.md``
measures both). ``moments`` answers carry the standard error of the same kind
(:func:`app.mechanisms.smooth_synthetic.noise_replicates`: moments simulated from the
released support, each refitted by the LP on fresh candidates), whose 20 weighted supports
the synthesis stage stores in the same artifact; a version synthesised before that, or
whose refits failed, answers without one and says to re-synthesise
(``bench/results/answer_stderr_moments.md``). A ``smooth_synopsis`` release gives answers
with calibrated intervals. The work of one answers request is bounded
(:data:`MAX_ANSWER_WORK`, counted by :func:`answer_work` and :func:`support_work` before
anything is expanded or evaluated).
"""

from __future__ import annotations

import functools
import json
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr

from app.core.errors import InvalidRequest
from app.core.types import integral_number
from app.mechanisms import bootstrap, marginal_tree, marginals, noise
from app.mechanisms import smooth_synthetic as ss
from app.mechanisms.chebyshev import SeparableBlock, expand_block, separable_layout
from app.mechanisms.errors import MechanismError, SolverError
from app.mechanisms.queries import (
    AnisotropicGaussianMixture,
    GaussianMixture,
    Polynomial,
    ProductQuery,
    sample_support,
)
from app.mechanisms.queries import answer as weighted_answer
from app.releases import registry
from app.releases.adapters import smooth_queries, smooth_synopsis
from app.releases.payloads import pack, unpack
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage import sizes
from app.storage.artifacts import sample_chunk_rows, write_csv_and_parquet
from app.storage.source import EncryptedTableSource

NOTE = (
    "exact for the released synthetic distribution (weighted support); the error against "
    "the data comes from the DP noise through the fit and has no per-query bound; this "
    "version has no standard errors (synthesised before they were computed, or their "
    "refits failed or were too large: its release.json says which): re-synthesise it for "
    "them, at no privacy cost"
)
#: The measurement records of the methods whose answers are exact under a released law.
LAWS: dict[str, type[marginals.MarginalMeasurements] | type[marginal_tree.TreeMeasurements]] = {
    "marginals": marginals.MarginalMeasurements,
    "tree": marginal_tree.TreeMeasurements,
}
#: Largest ``R`` a ``moments`` request with ``noise_mechanism="laplace_approx"`` takes: its
#: privacy map composes ``R`` scalar Laplace maps (~7 ms per evaluation at ``R = 1000``,
#: ~70 ms at ``10^4``, ~0.7 s at ``10^5``; a calibration takes ~12 evaluations, ~105 at the
#: extremes of the accepted budgets), and the request is calibrated before it is accepted.
#: Past ``R ~ 50`` its scale equals the Gaussian's at ordinary budgets (both zCDP), and
#: Laplace noise of that scale has ``sqrt(2)`` times the standard deviation.
MAX_LAPLACE_APPROX_SIZE = 10_000
#: The measure stage's progress share of the tree's first read (its one-way histograms);
#: the pair counts (a second read) and the selection rounds take the rest, reported by
#: :func:`app.mechanisms.marginal_tree.measure` (:meth:`SmoothSynthetic.measure_read_share`).
TREE_READ_SHARE = 0.3
#: The artifact that keeps a marginals or tree release's bootstrap replicates.
REPLICATES_FILE = "noise_replicates.npz"
#: The artifact that keeps a tree release's fitted law (what its answers are computed from).
TREE_LAW_FILE = "tree_law.npz"
#: What the standard error of a marginals or tree answer is (``bench/results/answer_stderr.md``
#: for the coverage figures: 20 releases a dataset of WDBC, CTG, PKS, CRM at the defaults).
BOOTSTRAP_NOTE = (
    "stderr: the standard error the DP noise gives this answer, by a parametric bootstrap "
    f"({bootstrap.REPLICATES} sets of measurements simulated under the released law at "
    "the release's own noise scales, each refitted as the release was); it leaves out the "
    "error of the model, which has no per-query bound, so no interval is given: value +- "
    "1.96 stderr held the truth for 47-97 % of kernels of sigma >= 4 (on the [-1, 1] "
    "scale) but for 0-76 % of kernels of sigma <= 2 centred near data rows in the "
    "benchmark; use a smooth_synopsis release for intervals"
)
MARGINALS_NOTE = (
    "value: exact for the released synthetic distribution (the product of the noisy "
    "one-column marginals, uniform within each bin; the downloadable support is a sample "
    "of it); its error against the data comes from the DP noise and from the dependence "
    "between columns, which this release does not keep. " + BOOTSTRAP_NOTE
)
TREE_NOTE = (
    "value: exact for the released synthetic distribution (the noisy one-column marginals "
    "joined by a private tree of coarse two-way tables; the downloadable support is a "
    "sample of it); its error against the data comes from the DP noise and from the "
    "dependence the tree does not hold. " + BOOTSTRAP_NOTE
)
MOMENTS_NOTE = (
    "value: exact for the released synthetic distribution (the weighted support; the "
    "sample is drawn from it); its error against the data comes from the DP noise and the "
    "random candidates through the LP fit. stderr: the standard error they give this "
    f"answer, by a parametric bootstrap ({bootstrap.REPLICATES} sets of moments simulated "
    "from the released support at the release's own noise scale, each refitted as the "
    "release was, on fresh candidates; a private PCA of the ellipsoid grid is held fixed); "
    "it leaves out the error of the fit itself, which has no per-query bound, so no "
    "interval is given: value +- 1.96 stderr held the truth for 0-92 % of kernels of "
    "sigma >= 2 centred uniformly in [-1, 1]^d (the fit's error dominating on two of the "
    "four benchmark datasets) and for none centred near data rows; use a smooth_synopsis "
    "release for intervals"
)

#: The work one answers request may do, in units of about 1 ns here (2 cores, shared):
#: :func:`answer_work` for a ``marginals`` or ``tree`` release, :func:`support_work` for
#: ``moments``, counted from public sizes (kernels, coefficients, cells, support points)
#: before anything is expanded or evaluated; a batch over it is a 422 that says about how
#: many queries like it fit. Timed at the bound on WDBC (569 x 30) in the API's answer
#: path (``SmoothSynthetic.answer``, parsing included) with one-factor products of widths
#: 1 and 0.03, five-factor products of width 0.1, mixtures of 10 centres of width 1 and
#: of 100 of width 0.3 (normalised units), on the shared machine (load ~3) and beside a
#: process multiplying matrices on both cores: trees of 6 and 93 cells a column 1.1-5.3
#: s, and of 6, 30 and 93 (``pair_bins`` 16 above 6) 2.8-11.7 s; ``marginals`` of 4096
#: bins 1.0-4.5 s, and of 512 and 4096 2.8-9.5 s; ``moments`` on an IPM support of 10^5
#: points (``grid_size`` 10^5) 3.4-5.3 s and 5.2-15.9 s. So a request at the bound takes
#: up to about 15 s, as the other answer bounds promise. Without it the audit measured
#: 21 s for 10,000 one-factor products and 224 s (2.2 GB) for 100,000 on a tree, and 134
#: s for 30,000 mixtures of 10 centres on a tree or on 4096 bins; that moments support
#: took 36 s for 10,000 products and 30 s for 2,000 mixtures.
MAX_ANSWER_WORK = 8 * 10**9
#: :func:`answer_work`'s weights (``marginals``, ``tree``), from the parts timed alone: a
#: query's fixed cost (its answer's dict; Python per query, 20-70 us), a coefficient to
#: expand for a polynomial or another stacked query (Python per monomial: up to 70 ns),
#: for a block of Gaussian mixtures (exponentials and one DCT: 19-23 ns, timed again on
#: 10^4 mixtures of 10 centres of widths 0.1-4 with the machine shared; weighted 100 at
#: first, which refused the paper-000 protocol's 10^4 mixtures of width 4 on a default
#: ``marginals`` release, answered in 2.6 s) and for a product (its own factors only: 2-12
#: ns), an entry ``(cell, coefficient)`` of the cells' Chebyshev means (cosines: 25-80 ns).
QUERY_WORK = 20_000
EXPANSION_WORK = 100
MIXTURE_EXPANSION_WORK = 40
PRODUCT_EXPANSION_WORK = 10
CELL_MEAN_WORK = 150
#: :func:`support_work`'s weights (``moments``): a point and column of a kernel (a
#: mixture's exponential, a product's factor, the points' copy: 0.5-1 ns), and of a
#: polynomial's monomial (a power: 10-20 ns).
SUPPORT_WORK = 2
POLYNOMIAL_SUPPORT_WORK = 30


@dataclass(frozen=True, eq=False)
class MomentSupport:
    """A loaded ``moments`` release: the weighted support its answers are exact for, and
    its bootstrap supports (``None`` when the version has none)."""

    points: NDArray[np.float64]
    weights: NDArray[np.float64]
    replicates: ss.SupportReplicates | None


class SyntheticParams(BaseModel):
    """Measure-time parameters (fixed once measured) and post-processing parameters
    (``grid_size``, ``sample_size``, and for ``moments`` ``solver``, ``ellipsoid_radius``:
    re-synthesis may change them at no privacy cost). ``bins``, ``bound_atoms`` apply to
    ``method="marginals"`` and ``"tree"`` (defaults: :mod:`app.mechanisms.marginals`),
    ``pair_bins``, ``pair_grouping`` to ``"tree"`` only
    (:mod:`app.mechanisms.marginal_tree`); the fields from ``smoothness`` to
    ``ellipsoid_radius`` except ``grid_size``, ``sample_size`` to ``method="moments"`` only
    (defaults: :mod:`app.mechanisms.smooth_synthetic`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["marginals", "tree", "moments"] | None = Field(
        default=None,
        description="None (default): 'tree' when delta > 0 and there are two or more "
        "columns, 'marginals' otherwise (the release stores the resolved method); "
        "'marginals': noisy one-column histograms, product of the marginals; 'tree': the "
        "same histograms joined by a private tree of coarse two-way tables (needs "
        "delta > 0); 'moments': paper 000's noisy Chebyshev moments and LP fit",
    )
    #: Whether ``method`` came from :func:`default_method` rather than the request.
    _method_defaulted: bool = PrivateAttr(default=False)
    # marginals and tree
    bins: Annotated[int, Field(ge=2, le=4096), BeforeValidator(integral_number)] | None = Field(
        default=None,
        description="bins per column (None: from n, d, epsilon, delta; marginals, tree)",
    )
    bound_atoms: bool | None = Field(
        default=None,
        description="cells of their own for the declared bounds (None: when the noise is "
        "low; marginals, tree)",
    )
    # tree only
    pair_bins: Annotated[int, Field(ge=2, le=16), BeforeValidator(integral_number)] | None = Field(
        default=None,
        description="coarse groups per column in the two-way tables (None: "
        f"{marginal_tree.DEFAULT_PAIR_BINS}; tree only)",
    )
    pair_grouping: Literal["blend", "quantile", "equal"] | None = Field(
        default=None,
        description="how a column's cells merge into its coarse groups: 'quantile' (equal "
        "mass under the released one-way marginal), 'equal' (equal width) or 'blend' "
        "(equal mass under the half-and-half mixture of the released marginal and the "
        "uniform law); None: 'quantile' when a pair table's per-cell noise exceeds "
        "1 / pair_bins^2, else 'blend' when a one-way cell's noise is below half an "
        "average cell's mass, else 'equal'; tree only",
    )
    # moments only
    smoothness: Annotated[int, Field(ge=1, le=100), BeforeValidator(integral_number)] = Field(
        default=4, description="K of paper 000"
    )
    grid: Literal["hypercube", "pca_ellipsoid", "full"] = "hypercube"
    basis_size: (
        Annotated[int, Field(ge=1, le=ss.MAX_BASIS_SIZE), BeforeValidator(integral_number)] | None
    ) = None
    basis_rule: Literal["paper_min_d", "paper"] = "paper_min_d"
    noise_mechanism: Literal["laplace", "gaussian", "laplace_approx"] | None = None
    pca_share: float = Field(default=0.2, gt=0, lt=1)
    pca_rank: Annotated[int, Field(ge=1), BeforeValidator(integral_number)] | None = None
    pca_iterations: Annotated[int, Field(ge=1, le=100), BeforeValidator(integral_number)] | None = (
        None
    )
    pca_noise: Literal["laplace", "gaussian"] | None = None
    centre_share: float = Field(default=0.05, gt=0, lt=1)
    # post-processing (grid_size, sample_size: every method; solver, ellipsoid_radius: moments)
    grid_size: (
        Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(integral_number)] | None
    ) = Field(default=None, description="support size C (every method)")
    solver: Literal["simplex", "ipm"] = "simplex"
    sample_size: (
        Annotated[int, Field(ge=1, le=ss.MAX_DEFAULT_SAMPLE_SIZE), BeforeValidator(integral_number)]
        | None
    ) = Field(
        default=None,
        description="synthetic rows m (every method)",
    )
    ellipsoid_radius: Literal["paper", "matched"] = "paper"


POST_PROCESSING = frozenset({"grid_size", "solver", "sample_size", "ellipsoid_radius"})
#: Parameters of ``method="moments"`` only (refused, when set, with ``"marginals"``).
MOMENTS_ONLY = frozenset(
    {
        "smoothness",
        "grid",
        "basis_size",
        "basis_rule",
        "noise_mechanism",
        "pca_share",
        "pca_rank",
        "pca_iterations",
        "pca_noise",
        "centre_share",
        "solver",
        "ellipsoid_radius",
    }
)
#: The parameters each method takes beyond the shared ones (a parameter set for another
#: method is refused with a 422 that names the methods taking it).
METHOD_PARAMS: dict[str, frozenset[str]] = {
    "moments": MOMENTS_ONLY,
    "marginals": frozenset({"bins", "bound_atoms"}),
    "tree": frozenset({"bins", "bound_atoms", "pair_bins", "pair_grouping"}),
}


def foreign_params(method: str, names: set[str]) -> tuple[list[str], str]:
    """``(wrong, owners)``: the names in ``names`` that belong to other methods only, and
    those methods as ``"'a' or 'b'"``."""
    specific = frozenset().union(*METHOD_PARAMS.values())
    wrong = sorted((names & specific) - METHOD_PARAMS[method])
    owners = sorted({m for n in wrong for m, taken in METHOD_PARAMS.items() if n in taken})
    return wrong, " or ".join(repr(m) for m in owners)


class SmoothSynthetic(registry.Mechanism):
    name: ClassVar[str] = "smooth_synthetic"
    description: ClassVar[str] = (
        "synthetic database for smooth queries. Method 'marginals' (the default at "
        "delta = 0): noisy one-column histograms projected onto the simplex and rows drawn "
        "from the product of the marginals (no dependence between columns); method 'tree' "
        "(the default at delta > 0): the same histograms joined by a private tree of coarse "
        "two-way tables (select-measure-generate); method "
        "'moments': paper 000's noisy Chebyshev moments, an LP fit over candidate points, "
        "sampled rows. One measurement spends the budget; synthesis is post-processing"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = SyntheticParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = smooth_queries.FORMS
    post_processing: ClassVar[frozenset[str]] = POST_PROCESSING

    def _measure_kwargs(self, params: SyntheticParams) -> dict[str, Any]:
        return {
            "smoothness": params.smoothness,
            "grid": params.grid,
            "basis_size": params.basis_size,
            "noise_mechanism": params.noise_mechanism,
            "basis_rule": params.basis_rule,
            "pca_share": params.pca_share,
            "pca_rank": params.pca_rank,
            "pca_iterations": params.pca_iterations,
            "pca_noise": params.pca_noise,
            "centre_share": params.centre_share,
        }

    def _noise_plan(
        self, info: DatasetInfo, epsilon: float, delta: float, params: SyntheticParams
    ) -> ss.NoisePlan:
        """Every noise calibration :func:`app.mechanisms.smooth_synthetic.measure` will draw
        for a ``moments`` request (public values; remembered for the request's preview):
        a budget no noise scale fits is refused before anything is reserved."""
        return ss.noise_plan(info.n_rows, info.d, epsilon, delta, **self._measure_kwargs(params))

    def resolve_params(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> BaseModel:
        """``method=None`` becomes :func:`default_method` (stored with the release)."""
        assert isinstance(params, SyntheticParams)
        if params.method is not None:
            return params
        method = default_method(info.n_rows, info.d, epsilon, delta, params)
        resolved = params.model_copy(update={"method": method})
        resolved._method_defaulted = True
        return resolved

    def _concrete(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> SyntheticParams:
        """``params`` with ``method`` resolved (a caller may skip :meth:`resolve_params`)."""
        resolved = self.resolve_params(info, epsilon, delta, params)
        assert isinstance(resolved, SyntheticParams)
        return resolved

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        self._checked_tree(info, epsilon, delta, params)

    def checked_preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        """The check's tree plan (bins, rho and three noise scales from OpenDP's searches)
        is the preview's: made once. (A ``moments`` plan is remembered by
        :func:`~app.mechanisms.smooth_synthetic.noise_plan`; ``marginals`` checks make none.)"""
        fixed = self._checked_tree(info, epsilon, delta, params)
        if fixed is None:
            return self.preview(info, epsilon, delta, params)
        concrete = self._concrete(info, epsilon, delta, params)
        return _preview_tree(info, epsilon, delta, concrete, fixed)

    def _checked_tree(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> marginal_tree.TreePlan | None:
        """:meth:`check`, returning the tree's plan (``None`` for the other methods)."""
        params = self._concrete(info, epsilon, delta, params)
        fixed: marginal_tree.TreePlan | None = None
        assert params.method is not None
        wrong, owners = foreign_params(params.method, set(params.model_fields_set))
        if wrong:
            default = " (the default)" if params._method_defaulted else ""
            raise InvalidRequest(
                f"params {', '.join(wrong)} apply to method {owners} only; this request "
                f"uses method {params.method!r}{default}: set method {owners} or remove them"
            )
        if params.method == "tree":
            fixed = _tree_plan(info, epsilon, delta, params)
        if params.method == "moments":
            if params.noise_mechanism in ("gaussian", "laplace_approx") and delta <= 0:
                raise InvalidRequest(f"noise_mechanism {params.noise_mechanism!r} needs delta > 0")
            if params.pca_noise == "gaussian" and delta <= 0:
                raise InvalidRequest("pca_noise 'gaussian' needs delta > 0")
            if params.pca_rank is not None and params.pca_rank > info.d:
                raise InvalidRequest(f"pca_rank ({params.pca_rank}) must be at most d ({info.d})")
            # paper 000's moments are measured as a synopsis's are, every row once per moment
            size = ss.moments_count(
                info.n_rows,
                info.d,
                params.smoothness,
                delta,
                params.grid,
                params.basis_size,
                params.basis_rule,
            )
            largest = smooth_synopsis.largest_basis_size(info.n_rows)
            if size > largest:
                raise InvalidRequest(
                    f"R = {size} moments over {info.n_rows} rows is more measurement work than "
                    f"the limit of {smooth_synopsis.MAX_MEASURE_WORK:.0e} weighted row-moments "
                    f"(about half an hour): at most R = {largest} for this table; set a "
                    "smaller basis_size, or use method 'marginals' or 'tree'"
                )
            if params.noise_mechanism == "laplace_approx" and size > MAX_LAPLACE_APPROX_SIZE:
                raise InvalidRequest(
                    f"noise_mechanism 'laplace_approx' takes at most R = "
                    f"{MAX_LAPLACE_APPROX_SIZE} moments (this request has R = {size}): its "
                    "privacy map composes R scalar Laplace maps, and calibrating it takes "
                    "seconds to a minute beyond that; use noise_mechanism 'gaussian' (at "
                    "this many moments its scale is the same for ordinary budgets, with a "
                    "smaller standard deviation), or a smaller basis_size"
                )
        self.check_synthesis(info, epsilon, delta, params)
        if params.method == "moments":
            # last: the cheap refusals above come first
            self._noise_plan(info, epsilon, delta, params)
        return fixed

    def check_synthesis(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> None:
        """The memory the synthesis needs, from public values: the support and sample of
        ``marginals``/``tree``; the LP, candidates and sample of ``moments``
        (:func:`app.mechanisms.smooth_synthetic.synthesis_sizes` with the ``R`` that
        :func:`~app.mechanisms.smooth_synthetic.measure` will release)."""
        params = self._concrete(info, epsilon, delta, params)
        if params.method in ("marginals", "tree"):
            _marginal_sizes(info.d, info.n_rows, params)
            return
        n, d, K = info.n_rows, info.d, params.smoothness
        R = ss.moments_count(n, d, K, delta, params.grid, params.basis_size, params.basis_rule)
        ss.synthesis_sizes(
            d,
            R,
            params.grid,
            ss.theorem_parameters(n, d, K, delta),
            grid_size=params.grid_size,
            sample_size=params.sample_size,
            solver=params.solver,
            max_bytes=ss.DEFAULT_MAX_BYTES,
        )

    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        """:func:`artifact_bytes` of the method the release uses."""
        return artifact_bytes(info, delta, self._concrete(info, epsilon, delta, params), resolved)

    def shown_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Without the fields of the methods this release does not use (a ``tree``
        release stores the moment LP's defaults too, and showed them)."""
        method = params.get("method")
        if method not in METHOD_PARAMS:
            return dict(params)
        wrong, _ = foreign_params(method, set(params))
        return {k: v for k, v in params.items() if k not in wrong}

    def post_processing_for(self, stored: Mapping[str, Any]) -> frozenset[str]:
        wrong, _ = foreign_params(stored.get("method", "moments"), set(POST_PROCESSING))
        return POST_PROCESSING - set(wrong)

    def check_post_processing(self, stored: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
        method = stored.get("method", "moments")
        wrong, owners = foreign_params(method, set(changes))
        if wrong:
            allowed = ", ".join(sorted(self.post_processing_for(stored)))
            raise InvalidRequest(
                f"params {', '.join(wrong)} apply to method {owners} only; this release "
                f"uses method {method!r} (re-synthesis may change {allowed})"
            )

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        params = self._concrete(info, epsilon, delta, params)
        if params.method == "marginals":
            return _preview_marginals(info, epsilon, delta, params)
        if params.method == "tree":
            return _preview_tree(info, epsilon, delta, params)
        calibrations = self._noise_plan(info, epsilon, delta, params)
        R = calibrations.R
        theorem = ss.theorem_parameters(info.n_rows, info.d, params.smoothness, delta)
        calibration = calibrations.moments
        mechanism = calibration.mechanism
        accuracy: dict[str, Any] = {
            "noise": calibration.distribution,
            "noise_scale": calibration.scale,
            "moment_stddev": calibration.stddev,
            "note": "standard deviation of each noisy moment; answers of K-smooth "
            "queries inherit it through the fit (paper 000 Theorem 3.1)",
        }
        return {
            "resolved": {
                "method": "moments",
                "d": info.d,
                "n": info.n_rows,
                "basis_size": R,
                "grid": params.grid,
                "grid_size": params.grid_size or ss.DEFAULT_GRID_SIZE,
                "noise_mechanism": mechanism,
                "theorem": {"t": theorem.t, "N": theorem.N, "m": theorem.m, "L": theorem.L},
            },
            "accuracy": accuracy,
        }

    def measure_read_share(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> float:
        """The tree's first read (its one-way histograms) is followed by the pair counts
        (a second read) and the selection, which it reports; the other methods' reads
        are their work."""
        method = self._concrete(info, epsilon, delta, params).method
        return TREE_READ_SHARE if method == "tree" else 1.0

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        params = self._concrete(info, epsilon, delta, params)
        if params.method == "marginals":
            histograms = marginals.measure(
                source, epsilon, delta, bins=params.bins, bound_atoms=params.bound_atoms
            )
            return Measured(
                payload=pack(histograms.to_dict()),
                privacy_cost=histograms.privacy_cost,
                resolved=dict(histograms.parameters),
            )
        if params.method == "tree":
            tree = marginal_tree.measure(
                source,
                epsilon,
                delta,
                bins=params.bins,
                bound_atoms=params.bound_atoms,
                pair_bins=params.pair_bins,
                grouping=params.pair_grouping,
                progress=progress,
            )
            return Measured(
                payload=pack(tree.to_dict()),
                privacy_cost=tree.privacy_cost,
                resolved=tree.parameters,
            )
        measurements = ss.measure(
            source,
            epsilon,
            delta,
            rng=np.random.default_rng(),
            **self._measure_kwargs(params),
        )
        return Measured(
            payload=pack(measurements.to_dict()),
            privacy_cost=measurements.privacy_cost,
            resolved={"method": "moments", **measurements.parameters},
        )

    def synthesize(
        self,
        payload: Mapping[str, Any],
        info: DatasetInfo,
        params: BaseModel,
        rng: np.random.Generator,
        workdir: Path,
        progress: ProgressFn,
    ) -> Synthesized:
        """Follows the method recorded in the payload (its ``format``), not ``params.method``."""
        assert isinstance(params, SyntheticParams)
        if payload_method(payload) in LAWS:
            return _synthesize_law(payload, info, params, rng, workdir, progress)
        measurements = ss.Measurements.from_dict(unpack(payload))
        release = ss.synthesize_from(
            measurements,
            rng,
            grid_size=params.grid_size,
            solver=params.solver,
            sample_size=params.sample_size,
            ellipsoid_radius=params.ellipsoid_radius,
        )
        progress(0.3)
        started = time.perf_counter()
        extra: dict[str, ArtifactInfo] = {}
        replicates, bootstrap_report = _moment_replicates(release, progress)
        if replicates is not None:
            _save_arrays(workdir / REPLICATES_FILE, replicates.to_arrays())
            extra[REPLICATES_FILE] = ArtifactInfo(
                REPLICATES_FILE,
                "application/octet-stream",
                f"the {replicates.count} weighted supports of the answers' parametric "
                "bootstrap (numpy .npz; post-processing of the released measurements)",
            )
        seconds = {**release.seconds, "noise_replicates": time.perf_counter() - started}
        summary = {
            "parameters": {"method": "moments", **release.parameters},
            "solver": dict(release.solver),
            "seconds": seconds,
            "support_points": int(release.points.shape[0]),
            "rows": int(release.rows.shape[0]),
            "noise_replicates": bootstrap_report,
        }
        return _write_artifacts(
            info,
            workdir,
            release.rows,
            release.points,
            release.weights,
            summary,
            "solver report",
            extra,
        )

    def load(self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path) -> Any:
        """Marginals and tree: the measurements (answers use their law, not the support);
        moments: the weighted support."""
        method = payload_method(payload)
        if method in LAWS:
            law = LAWS[method].from_dict(unpack(payload))
            _restore_replicates(law, artifacts)
            return law
        # a missing file is a FileNotFoundError: the answers service reads the release
        # again (two publishes since it read the version pruned it), then refuses it
        points = np.load(artifacts / "support_normalized.npy")
        weights = np.load(artifacts / "weights.npy")
        replicates = _load_support_replicates(artifacts, info.d)
        if not artifacts.is_dir():  # pruned after the support was read: its replicates may
            # have been taken with it (answers without a standard error); read it again
            raise FileNotFoundError(artifacts)
        return MomentSupport(points, weights, replicates)

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        # a lower bound first, from sizes read off the JSON: a batch it already proves
        # over the limit is refused before it is parsed (64 MiB of 30-factor products
        # parsed for about 20 s before their work was refused)
        sizes = smooth_queries.raw_sizes(queries, info)
        if isinstance(loaded, marginals.MarginalMeasurements | marginal_tree.TreeMeasurements):
            check_answer_work(loaded, raw_answer_work(loaded, sizes), sizes.queries, True)
        else:
            check_support_work(loaded, sizes.queries, raw_support_work(loaded, sizes), True)
        parsed = smooth_queries.parse(queries, info)
        if isinstance(loaded, marginals.MarginalMeasurements | marginal_tree.TreeMeasurements):
            product = isinstance(loaded, marginals.MarginalMeasurements)
            note = MARGINALS_NOTE if product else TREE_NOTE
            values, errors = np.empty(len(parsed)), np.empty(len(parsed))
            d = loaded.d
            try:  # a query's own refusal (too narrow a Gaussian) names the query, found by
                # planning halves of the batch (no expansion: the batch's work is unchecked)
                layout = separable_layout(parsed, d)
            except MechanismError as exc:
                plan = functools.partial(separable_layout, dim=d)
                raise smooth_queries.refusal(exc, parsed, plan) from None
            try:
                check_answer_work(loaded, _layout_work(loaded, layout), len(parsed))
            except MechanismError as exc:  # the batch's work
                raise InvalidRequest(f"queries: {exc}") from None
            try:
                for planned in layout:
                    expansion = expand_block(parsed, planned, d)
                    values[planned.positions], errors[planned.positions] = loaded.answers(expansion)
            except MechanismError as exc:  # within the work checked: bisected by expanding
                raise smooth_queries.refusal(exc, parsed, lambda part: _expand(part, d)) from None
            return [
                {"value": float(v), "stderr": float(e), "interval": None, "note": note}
                for v, e in zip(values, errors, strict=True)
            ]
        support: MomentSupport = loaded
        replicates = support.replicates
        check_support_work(support, len(parsed), sum(support_work(support, q) for q in parsed))
        out = []
        for position, query in enumerate(parsed):
            try:
                value = weighted_answer(query, support.points, support.weights)
                stderr = None if replicates is None else replicates.stderr(query)
            except MechanismError as exc:
                raise InvalidRequest(f"queries.{position}: {exc}") from None
            note = NOTE if replicates is None else MOMENTS_NOTE
            out.append({"value": value, "stderr": stderr, "interval": None, "note": note})
        return out


def _expand(parsed: Sequence[Any], d: int) -> None:
    """Expand every block of ``parsed`` (a :class:`MechanismError` for a query that cannot
    be expanded): what :func:`smooth_queries.refusal` bisects to name it."""
    for planned in separable_layout(parsed, d):
        expand_block(parsed, planned, d)


def answer_work(layout: Sequence[SeparableBlock], *, d: int, cells: int, groups: int | None) -> int:
    """The work of answering the blocks of ``layout`` (value and standard error) under a
    ``marginals`` law (``groups=None``) or a ``tree`` law, in the units of
    :data:`MAX_ANSWER_WORK`, from public sizes alone. A block of ``Q`` queries of ``J``
    kernels with ``L`` coefficients a factor (``E = Q J d L`` coefficients in ``d``
    columns), on ``c = cells`` cells a column, is answered under ``W = 1 +``
    :data:`app.mechanisms.bootstrap.REPLICATES` laws:

    * every method: ``QUERY_WORK`` a query, and ``EXPANSION_WORK`` a coefficient to expand
      the block (:func:`~app.mechanisms.chebyshev.expand_block`; ``MIXTURE_EXPANSION_WORK``
      for a block of Gaussian mixtures, one vectorised expansion; ``PRODUCT_EXPANSION_WORK``
      for products, whose factors other than their own are constants);
    * ``marginals`` (:meth:`app.mechanisms.marginals.MarginalMeasurements.answers`):
      ``CELL_MEAN_WORK c L + 3 W E``: the cells' Chebyshev means
      (:func:`~app.mechanisms.marginals.cell_means`, cosines) once, whatever the number of
      queries, then under each law every coefficient contracted with the moments;
    * ``tree`` (:meth:`~app.mechanisms.marginal_tree.TreeMeasurements.answers`): the
      cells' means and every kernel's factor averaged on every cell, once
      (:func:`~app.mechanisms.marginal_tree.cell_values`: ``CELL_MEAN_WORK c L +
      E (c / 4 + 20)``), then belief propagation over the tree under each law, a message
      a kernel and column, ``W Q J d (c (g + 48) / 4 + 50)``, ``g = groups`` the groups
      of a column in the law's edge tables (``c`` for the copula law, ``pair_bins`` for
      the block law of releases before version 4).
    """
    laws = 1 + bootstrap.REPLICATES
    work = 0
    for planned in layout:
        assert planned.shape is not None  # JSON queries have no callable factors
        rows, kernels, length = planned.shape
        entries = rows * kernels * d * length
        expanding = {"product": PRODUCT_EXPANSION_WORK, "gaussian": MIXTURE_EXPANSION_WORK}.get(
            planned.kind, EXPANSION_WORK
        )
        work += QUERY_WORK * len(planned.positions) + expanding * entries
        if groups is None:
            work += CELL_MEAN_WORK * cells * length + laws * 3 * entries
        else:
            work += CELL_MEAN_WORK * cells * length + entries * (cells // 4 + 20)
            work += laws * rows * kernels * d * (cells * (groups + 48) // 4 + 50)
    return work


Law = marginals.MarginalMeasurements | marginal_tree.TreeMeasurements


def _law_sizes(law: Law) -> tuple[int, str, int | None]:
    """``(cells, kind, groups)`` of a law: its cells a column, ``"tree"`` or
    ``"product"``, and the groups of a column in its edge tables (``None``: marginals)."""
    if isinstance(law, marginal_tree.TreeMeasurements):
        cells = law.one_way.cells
        return cells, "tree", cells if law.joint_model == "copula" else law.pair_bins
    return law.cells, "product", None


def _layout_work(law: Law, layout: Sequence[SeparableBlock]) -> int:
    cells, _, groups = _law_sizes(law)
    return answer_work(layout, d=law.d, cells=cells, groups=groups)


def raw_answer_work(law: Law, sizes: smooth_queries.RawSizes) -> int:
    """A lower bound on :func:`answer_work` of the batch whose JSON has ``sizes``
    (:func:`smooth_queries.raw_sizes`, no query parsed): every block at least one
    coefficient long, every query at least one kernel (a mixture its centres), expanded
    at the cheapest rate, and the cells' means once."""
    cells, _, groups = _law_sizes(law)
    if sizes.queries == 0:
        return 0
    laws = 1 + bootstrap.REPLICATES
    kernels = sizes.queries - sizes.mixtures + sizes.mixture_centers
    if groups is None:
        per_kernel = laws * 3
    else:
        per_kernel = cells // 4 + 20 + laws * (cells * (groups + 48) // 4 + 50)
    cheapest = min(PRODUCT_EXPANSION_WORK, MIXTURE_EXPANSION_WORK, EXPANSION_WORK)
    return (
        QUERY_WORK * sizes.queries
        + CELL_MEAN_WORK * cells
        + kernels * law.d * (cheapest + per_kernel)
    )


def check_answer_work(law: Law, work: int, queries: int, at_least: bool = False) -> None:
    """422 for a batch whose :func:`answer_work` (``work``; with ``at_least``, a lower
    bound on it) exceeds :data:`MAX_ANSWER_WORK`, before anything is expanded or a law
    fitted."""
    cells, kind, _ = _law_sizes(law)
    registry.check_total_work(
        queries,
        work,
        MAX_ANSWER_WORK,
        costs=f"about 1 ns each here, from the queries' kernels and Chebyshev coefficients "
        f"on the {cells} cells of each of {law.d} columns, under this {kind} law and its "
        f"{bootstrap.REPLICATES} bootstrap laws",
        smaller="use wider Gaussian factors (fewer Chebyshev coefficients), fewer centres "
        "or monomials, or lower powers",
        at_least=at_least,
    )


def support_work(support: MomentSupport, query: object) -> int:
    """The work of answering ``query`` on a ``moments`` release, in the units of
    :data:`MAX_ANSWER_WORK`: it is evaluated at every point of the weighted support and
    of its bootstrap supports, ``n`` points of ``d`` columns: ``SUPPORT_WORK n d (k + 1)``
    for a mixture of ``k`` centres (the ``+ 1`` the points' copy), ``SUPPORT_WORK n (d +
    10 f + a)`` for a product of ``f`` factors with ``a`` coefficients in its polynomial
    or Chebyshev factors (the copy, a factor's values, Clenshaw's recurrence), and
    ``POLYNOMIAL_SUPPORT_WORK n d k`` for a polynomial of ``k`` monomials (a power of
    every coordinate each)."""
    n, d = (int(v) for v in support.points.shape)
    if support.replicates is not None:
        n += int(support.replicates.points.shape[0])
    if isinstance(query, Polynomial):
        return POLYNOMIAL_SUPPORT_WORK * n * d * int(query.exponents.shape[0])
    if isinstance(query, GaussianMixture | AnisotropicGaussianMixture):
        return SUPPORT_WORK * n * d * (int(query.centers.shape[0]) + 1)
    assert isinstance(query, ProductQuery)
    factors = [g for g in query.factors if g is not None]
    coefficients = sum(int(np.size(g)) for g in factors if isinstance(g, np.ndarray))
    return SUPPORT_WORK * n * (d + 10 * len(factors) + coefficients)


def raw_support_work(support: MomentSupport, sizes: smooth_queries.RawSizes) -> int:
    """A lower bound on the :func:`support_work` of the batch whose JSON has ``sizes``
    (:func:`smooth_queries.raw_sizes`, no query parsed): its products without their
    coefficients, its mixtures, and its polynomials at one monomial each."""
    n, d = (int(v) for v in support.points.shape)
    if support.replicates is not None:
        n += int(support.replicates.points.shape[0])
    return (
        SUPPORT_WORK * n * (d * sizes.products + 10 * sizes.product_factors)
        + SUPPORT_WORK * n * d * (sizes.mixture_centers + sizes.mixtures)
        + POLYNOMIAL_SUPPORT_WORK * n * d * sizes.polynomials
    )


def check_support_work(
    support: MomentSupport, queries: int, work: int, at_least: bool = False
) -> None:
    """422 for a batch whose :func:`support_work` (``work``; with ``at_least``, a lower
    bound on it) exceeds :data:`MAX_ANSWER_WORK`, before any query is evaluated."""
    n = int(support.points.shape[0])
    replicates = support.replicates
    also = (
        ""
        if replicates is None
        else f" and the {int(replicates.points.shape[0])} of its bootstrap supports"
    )
    registry.check_total_work(
        queries,
        work,
        MAX_ANSWER_WORK,
        costs=f"about 1 ns each here: every query is evaluated at the {n} support points{also}",
        smaller="use fewer centres or monomials, or re-synthesise the release with a smaller "
        "grid_size or the simplex solver (fewer support points)",
        at_least=at_least,
    )


def default_method(
    n: int, d: int, epsilon: float, delta: float, params: SyntheticParams | None = None
) -> Literal["marginals", "tree"]:
    """The method of a request that names none: ``"tree"`` when ``delta > 0`` and
    ``d >= 2`` (it needs zCDP and a pair of columns; on the paper-000 protocol it is level
    with ``"marginals"`` on the uniform-centre queries and better on the row-centred ones:
    ``bench/results/smooth_marginals.md``) and each column's histogram has at least
    :data:`app.mechanisms.marginal_tree.DEFAULT_PAIR_BINS` cells, ``"marginals"``
    otherwise, and above :data:`app.mechanisms.marginal_tree.MAX_TREE_COLUMNS` columns
    (the tree's selection grows as ``d^3``) or
    :data:`app.mechanisms.marginal_tree.MAX_PAIR_COUNT_WORK` (counting every pair's
    table grows as ``n d^2``). A request that sets ``pair_bins`` or
    ``pair_grouping`` asks for the tree.

    The cells: with a small budget for ``n`` and ``d`` the histograms resolve to 2 or 3
    cells (WDBC, 569 rows, at ``epsilon <= 0.3``, ``delta = 1e-9``), too few for the
    tree's ``4 x 4`` tables, and ``"marginals"`` was as good or better there (6 releases,
    the paper-000 families, against a tree of ``cells x cells`` tables: WDBC ``epsilon =
    0.3`` uniform 0.22-0.26x the 0-DP baseline against 0.23-0.32x, rows 0.84x and 0.38x
    against 0.90x and 0.51x; CTG ``epsilon = 0.1`` rows 0.65x and 0.24x against 0.74x and
    0.37x, uniform level; CRM level; WDBC ``epsilon = 0.1`` 0.03x behind on uniform)."""
    if delta <= 0 or d < 2:
        return "marginals"
    if d > marginal_tree.MAX_TREE_COLUMNS:
        return "marginals"
    if params is not None and {"pair_bins", "pair_grouping"} & params.model_fields_set:
        return "tree"
    work = marginal_tree.pair_count_work(n, d, marginal_tree.DEFAULT_PAIR_BINS)
    if work > marginal_tree.MAX_PAIR_COUNT_WORK:
        return "marginals"
    bins, atoms = params.bins if params else None, params.bound_atoms if params else None
    try:
        B, with_atoms = marginals.resolve(n, d, epsilon, delta, bins, atoms)
    except MechanismError:
        return "tree"  # the request's checks give the reason
    cells = B + 2 * with_atoms
    return "tree" if cells >= marginal_tree.DEFAULT_PAIR_BINS else "marginals"


def payload_method(payload: Mapping[str, Any]) -> Literal["marginals", "tree", "moments"]:
    """The method that made a stored measurement, from its ``format``."""
    fmt = payload.get("format")
    if fmt == marginals.FORMAT:
        return "marginals"
    if fmt in marginal_tree.FORMATS:
        return "tree"
    if fmt == ss.FORMAT:
        return "moments"
    raise MechanismError(f"unknown smooth_synthetic measurement format {fmt!r}")


def artifact_bytes(
    info: DatasetInfo, delta: float, params: SyntheticParams, resolved: Mapping[str, Any]
) -> int:
    """An upper bound on the bytes of a synthesis's artifacts (:mod:`app.storage.sizes`):
    ``sample.csv``/``.parquet`` (``m`` rows of ``d`` floats), ``support.csv``/``.parquet``
    (``C`` rows of ``d + 1``), ``support_normalized.npy`` and ``weights.npy``,
    ``release.json``, and :data:`REPLICATES_FILE`: for ``marginals`` the
    ``bootstrap.REPLICATES`` laws' ``d x cells`` frequencies; for ``tree`` those laws and
    the fitted one (:data:`TREE_LAW_FILE`), each at most ``3 d cells`` values (``p``,
    ``P``, ``group``) and ``d - 1`` edge tables of ``cells^2``; for ``moments`` the
    replicates' supports, each at most ``C`` points of ``d + 1`` values (an LP's basic
    solution has at most ``C`` non-zero weights). ``cells`` (``bins`` plus two atoms) and
    ``R`` come from ``resolved``: the preview's, or the measure stage's stored one."""
    n, d = info.n_rows, info.d
    if params.method in LAWS:
        C, m = _marginal_sizes(d, n, params)
        bins = resolved.get("bins", params.bins if params.bins is not None else marginals.MAX_BINS)
        cells = int(bins) + 2 * bool(resolved.get("bound_atoms", True))
        if params.method == "tree":
            # p, P, group and the edge tables of one law
            law = [d * cells, d * cells, d * cells, max(d - 1, 0) * cells * cells]
            extra = [
                sizes.npz_bytes([bootstrap.REPLICATES * v for v in law]),
                sizes.npz_bytes(law),
            ]
        else:
            extra = [sizes.npz_bytes([bootstrap.REPLICATES * d * cells])]
    else:
        R = int(resolved.get("basis_size", resolved.get("R", 0)))
        theorem = ss.theorem_parameters(n, d, params.smoothness, delta)
        C, _, m = ss.synthesis_sizes(
            d,
            R,
            params.grid,
            theorem,
            grid_size=params.grid_size,
            sample_size=params.sample_size,
            solver=params.solver,
            max_bytes=ss.DEFAULT_MAX_BYTES,
        )
        points = bootstrap.REPLICATES * C
        extra = [sizes.npz_bytes([points * d, points, bootstrap.REPLICATES])]
    return sizes.files(
        *table_bytes(info, m),
        *table_bytes(info, C, weights=True),
        sizes.npy_bytes(C * d),
        sizes.npy_bytes(C),
        *extra,
        sizes.JSON_ALLOWANCE + 64 * d,  # release.json (a tree's edges grow with d)
    )


def table_bytes(info: DatasetInfo, rows: int, *, weights: bool = False) -> tuple[int, int]:
    """Upper bounds on :func:`_write_rows`'s two files (CSV, Parquet): ``rows`` rows of
    the release's float columns (and the weights)."""
    names = [*info.names, *([weight_column(info.names)] if weights else [])]
    chunk = max(1, sample_chunk_rows(info.d + 1))
    return (
        sizes.csv_bytes(rows, [sizes.CSV_FLOAT_CELL] * len(names), names),
        sizes.parquet_bytes(rows, [sizes.PARQUET_FLOAT_CELL] * len(names), names, chunk),
    )


def _marginal_sizes(d: int, n: int, params: SyntheticParams) -> tuple[int, int]:
    """``(C, m)`` of a marginals synthesis: ``m`` defaults to ``n`` (capped like the moment
    path's default); refuses sizes whose points and rows would not fit in memory (one copy
    of each: :func:`_write_rows` writes them a chunk at a time)."""
    C = params.grid_size if params.grid_size is not None else marginals.DEFAULT_SUPPORT_SIZE
    m = params.sample_size if params.sample_size is not None else min(n, ss.MAX_DEFAULT_SAMPLE_SIZE)
    if 8 * d * (C + m) > ss.DEFAULT_MAX_BYTES:
        raise MechanismError(
            f"grid_size C = {C} and sample_size m = {m} of {d} columns need more than "
            f"{ss.DEFAULT_MAX_BYTES >> 30} GiB; lower them"
        )
    return C, m


def _preview_marginals(
    info: DatasetInfo, epsilon: float, delta: float, params: SyntheticParams
) -> dict[str, Any]:
    """The resolution of :func:`marginals.measure` (bins, atoms, noise), from public values."""
    n, d = info.n_rows, info.d
    bins, atoms = marginals.resolve(n, d, epsilon, delta, params.bins, params.bound_atoms)
    calibration = marginals.noise_calibration(n, d, epsilon, delta, bins + 2 * atoms)
    return {
        "resolved": {
            "method": "marginals",
            "d": d,
            "n": n,
            "bins": bins,
            "bound_atoms": atoms,
            "grid_size": _marginal_sizes(d, n, params)[0],
            "noise_mechanism": calibration.mechanism,
        },
        "accuracy": {
            "noise": calibration.distribution,
            "noise_scale": calibration.scale,
            "frequency_stddev": calibration.stddev,
            "note": "standard deviation of the noise on each cell frequency of a column's "
            "histogram, before the projection onto the simplex (which removes much of it); "
            "answers are exact for the product of the estimated marginals, which keeps no "
            "dependence between columns",
        },
    }


def _tree_plan(
    info: DatasetInfo, epsilon: float, delta: float, params: SyntheticParams
) -> marginal_tree.TreePlan:
    """:func:`marginal_tree.plan` (public values only), or a 422 naming what is wrong."""
    if delta <= 0:
        raise InvalidRequest("method 'tree' is accounted in zCDP and needs delta > 0")
    try:
        return marginal_tree.plan(
            info.n_rows,
            info.d,
            epsilon,
            delta,
            params.bins,
            params.bound_atoms,
            params.pair_bins,
            params.pair_grouping,
        )
    except MechanismError as exc:
        raise InvalidRequest(f"method 'tree': {exc}") from None


def _preview_tree(
    info: DatasetInfo,
    epsilon: float,
    delta: float,
    params: SyntheticParams,
    fixed: marginal_tree.TreePlan | None = None,
) -> dict[str, Any]:
    """The preview of a tree request, of its plan (``fixed``, made by the check) or of
    one made here."""
    if fixed is None:
        fixed = _tree_plan(info, epsilon, delta, params)
    return {
        "resolved": {
            **fixed.as_dict(),
            "d": info.d,
            "n": info.n_rows,
            "grid_size": _marginal_sizes(info.d, info.n_rows, params)[0],
        },
        "accuracy": {
            "noise": "gaussian",
            "noise_scale": fixed.one_way_scale,
            "frequency_stddev": fixed.one_way_scale,
            "pair_frequency_stddev": fixed.pair_scale,
            "note": "standard deviations of the noise on each cell frequency of a column's "
            "histogram and of a two-way table, before the projections onto the simplex; "
            "answers are exact for the tree law, which keeps the dependence along the "
            "selected tree of column pairs only",
        },
    }


def _synthesize_law(
    payload: Mapping[str, Any],
    info: DatasetInfo,
    params: SyntheticParams,
    rng: np.random.Generator,
    workdir: Path,
    progress: ProgressFn,
) -> Synthesized:
    """``marginals`` and ``tree``: ``C`` support points drawn from the released law, then
    ``m`` rows drawn from the support."""
    started = time.perf_counter()
    law = LAWS[payload_method(payload)].from_dict(unpack(payload))
    if isinstance(law, marginal_tree.TreeMeasurements):
        C, m = _marginal_sizes(law.d, law.one_way.n, params)
        points, weights = marginal_tree.support(law, rng, grid_size=C)
        parameters = {**law.parameters, "C": C}
    else:
        C, m = _marginal_sizes(law.d, law.n, params)
        release = marginals.synthesize_from(law, rng, grid_size=C)
        points, weights, parameters = release.points, release.weights, dict(release.parameters)
    support_done = time.perf_counter()
    rows = sample_support(points, weights, m, rng)
    progress(0.6)
    sampled = time.perf_counter()
    # the answers' standard errors (a function of the measurements alone, the same on
    # every synthesis): computed here, in the background, not on the first answer
    # the tree's refits take most of its synthesis: progress moves from 0.6 to 0.8 with them
    replicated = law.noise_replicate_arrays(progress=lambda done: progress(0.6 + 0.2 * done))
    _save_arrays(workdir / REPLICATES_FILE, replicated)
    extra = {
        REPLICATES_FILE: ArtifactInfo(
            REPLICATES_FILE,
            "application/octet-stream",
            f"the {bootstrap.REPLICATES} laws of the answers' parametric bootstrap (numpy "
            ".npz; post-processing of the released measurements)",
        )
    }
    if isinstance(law, marginal_tree.TreeMeasurements):
        # the law the support was drawn from, fitted above: stored so that the first
        # answer on a freshly loaded release does not fit it again
        _save_arrays(workdir / TREE_LAW_FILE, law.model_arrays())
        extra[TREE_LAW_FILE] = ArtifactInfo(
            TREE_LAW_FILE,
            "application/octet-stream",
            "the tree law the answers are computed from (numpy .npz: fine marginals p, "
            "coarse marginals P, cell groups, edge tables joint over the edges in "
            "release.json; post-processing of the released measurements)",
        )
    progress(0.8)
    summary = {
        "parameters": {**parameters, "m": m},
        "seconds": {
            "support": support_done - started,
            "sample": sampled - support_done,
            "noise_replicates": time.perf_counter() - sampled,
        },
        "support_points": int(points.shape[0]),
        "rows": int(rows.shape[0]),
    }
    return _write_artifacts(info, workdir, rows, points, weights, summary, "", extra)


def _moment_replicates(
    release: ss.SyntheticRelease, progress: ProgressFn
) -> tuple[ss.SupportReplicates | None, str]:
    """A moments release's bootstrap supports and a line for ``release.json``; ``None``
    when one refit is too large (:data:`app.mechanisms.smooth_synthetic.MAX_REPLICATE_WORK`)
    or the LP solver fails on one: the standard errors are not worth failing the release
    for, its answers say they are missing, and a re-synthesis tries again."""
    if ss.replicate_work(release) > ss.MAX_REPLICATE_WORK:
        return None, (
            f"not computed: {bootstrap.REPLICATES} refits of C = {release.parameters['C']} "
            f"candidates and R = {release.measurements.index_set.size} moments with solver "
            f"{release.parameters['solver']!r} would take too long; re-synthesise with a "
            "smaller grid_size (or the simplex solver) for standard errors"
        )
    try:
        replicates = ss.noise_replicates(release, progress=lambda f: progress(0.3 + 0.6 * f))
    except SolverError as exc:
        return None, f"not computed: {exc}"
    return replicates, f"{int(replicates.sizes.sum())} support points"


def _save_arrays(path: Path, arrays: Mapping[str, NDArray[Any]]) -> None:
    """``arrays`` as a ``.npz`` artifact (plain numeric arrays: nothing is pickled; no
    ``allow_pickle`` argument, which numpy before 2.1 would store as one more array)."""
    named: dict[str, Any] = dict(arrays)
    np.savez(path, **named)


def _stored_arrays(stored: Path) -> dict[str, NDArray[Any]] | None:
    """The arrays of a ``.npz`` artifact, read in full, or ``None``: missing (a version
    synthesised before the artifact was stored, or one whose bootstrap refits failed or
    were skipped) or unreadable."""
    if not stored.is_file():
        return None
    try:
        with np.load(stored, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def _restore_replicates(
    law: marginals.MarginalMeasurements | marginal_tree.TreeMeasurements, artifacts: Path
) -> None:
    """The stored bootstrap laws and a tree release's fitted law, if they fit this release
    (otherwise they are computed on the first answer: the same values, later)."""
    arrays = _stored_arrays(artifacts / REPLICATES_FILE)
    if arrays is not None:
        law.restore_noise_replicates(arrays)
    if isinstance(law, marginal_tree.TreeMeasurements):
        fitted = _stored_arrays(artifacts / TREE_LAW_FILE)
        if fitted is not None:
            law.restore_model(fitted)


def _load_support_replicates(artifacts: Path, d: int) -> ss.SupportReplicates | None:
    """The stored bootstrap supports of a moments release, or ``None`` (none stored, or
    a file that is unreadable or does not fit: its answers then have no standard error)."""
    arrays = _stored_arrays(artifacts / REPLICATES_FILE)
    if arrays is None:
        return None
    try:
        return ss.SupportReplicates.from_arrays(arrays, d)
    except MechanismError:
        return None


def weight_column(names: Sequence[str]) -> str:
    """The name of the support files' weights column: ``weight``, or where a released
    column has that name (a ``weight`` column's values were overwritten by the weights),
    the first of ``support_weight``, ``support_weight_2``, ... that none has."""
    taken = set(names)
    if "weight" not in taken:
        return "weight"
    candidates = ("support_weight", *(f"support_weight_{k}" for k in range(2, len(taken) + 3)))
    return next(c for c in candidates if c not in taken)


def _write_rows(
    info: DatasetInfo,
    workdir: Path,
    stem: str,
    normalised: NDArray[np.float64],
    weights: NDArray[np.float64] | None = None,
    chunk_rows: int | None = None,
) -> None:
    """``<stem>.csv`` and ``<stem>.parquet``: the rows in original units (and the
    weights, in :func:`weight_column`), converted and written ``chunk_rows`` at a time
    (default :func:`sample_chunk_rows`). The whole table at once held three copies of the
    rows (the original units, the columns sliced out of them, Parquet's buffered row
    group: a 4.5 GB rise for 1.5 GB of rows) where :func:`_marginal_sizes` counts one. The
    same values and text as the whole table's; the Parquet file has a row group a chunk."""
    n, names = normalised.shape[0], info.names
    step = max(1, chunk_rows if chunk_rows is not None else sample_chunk_rows(len(names) + 1))
    weight_name = weight_column(names)

    def chunks() -> Iterator[pa.Table]:
        # range(0, 0 or 1): an empty table still gets its header and schema
        for start in range(0, max(n, 1), step):
            rows = info.to_original(normalised[start : start + step])
            columns = {name: rows[:, j] for j, name in enumerate(names)}
            if weights is not None:
                columns[weight_name] = weights[start : start + step]
            del rows
            yield pa.table(columns)

    write_csv_and_parquet(workdir / f"{stem}.csv", workdir / f"{stem}.parquet", chunks())


def _write_artifacts(
    info: DatasetInfo,
    workdir: Path,
    rows_normalized: NDArray[np.float64],
    points: NDArray[np.float64],
    weights: NDArray[np.float64],
    summary: dict[str, Any],
    report: str,
    extra: Mapping[str, ArtifactInfo] | None = None,
) -> Synthesized:
    """The artifacts of every method (same files, so downloads and answers are shared),
    and ``extra`` ones a method wrote itself."""
    _write_rows(info, workdir, "sample", rows_normalized)
    _write_rows(info, workdir, "support", points, weights)
    np.save(workdir / "support_normalized.npy", points)
    np.save(workdir / "weights.npy", weights)
    (workdir / "release.json").write_text(json.dumps(_json_safe(summary), indent=1))
    parquet = "application/vnd.apache.parquet"
    support = (
        f"weighted support points, original units (weights in column {weight_column(info.names)!r})"
    )
    return Synthesized(
        artifacts={
            "sample.csv": ArtifactInfo("sample.csv", "text/csv", "synthetic rows, original units"),
            "sample.parquet": ArtifactInfo(
                "sample.parquet", parquet, "synthetic rows, original units"
            ),
            "support.csv": ArtifactInfo("support.csv", "text/csv", support),
            "support.parquet": ArtifactInfo("support.parquet", parquet, support),
            "release.json": ArtifactInfo(
                "release.json",
                "application/json",
                "resolved parameters" + (f" and {report}" if report else ""),
            ),
            **(extra or {}),
        },
        summary=_json_safe(summary),
    )


def ss_sensitivity(n: int, R: int, mechanism: str) -> float:
    """The moment vector's sensitivity in the noise's metric (:data:`noise.METRIC`)."""
    return noise.moment_sensitivity(n, R)[noise.METRIC[mechanism]]


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(pack(value), default=str))


registry.register(SmoothSynthetic())
