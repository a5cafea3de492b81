"""Release type ``smooth_synopsis``: paper 001's noisy moment summary.

Measure: :func:`app.mechanisms.smooth_synopsis.measure` on the release's continuous columns.
The artifact ``synopsis.json`` is the synopsis itself (noisy moments, index set, noise
distribution and scale) plus the declared bounds, so that an analyst can answer queries
offline with the same public procedure (paper 001, Algorithm 2). Answers carry the
standard error of the known noise and an interval that also carries the truncation bound.
By default 5 % of epsilon buys the co-spread, one number that corrects Gaussian-kernel
answers for the dependence between columns (``co_spread: false`` spends it all on the
moments; :mod:`app.mechanisms.dependence`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.core.errors import InvalidRequest
from app.core.types import integral_number
from app.mechanisms import chebyshev
from app.mechanisms import smooth_synopsis as sy
from app.mechanisms.basis import (
    MAX_INDEX_SET_ENTRIES,
    MAX_INDEX_SET_SIZE,
    IndexSet,
    check_index_set_size,
)
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import ProductQuery
from app.releases import registry
from app.releases.adapters import smooth_queries
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage import sizes
from app.storage.source import EncryptedTableSource


class SynopsisParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    smoothness: Annotated[int, Field(ge=1, le=100), BeforeValidator(integral_number)] = Field(
        default=4, description="K of paper 001"
    )
    basis: Literal["auto", "nominal", "paper", "total_degree", "full_tensor"] = "auto"
    basis_size: Annotated[int, Field(ge=1), BeforeValidator(integral_number)] | None = None
    max_basis_size: Annotated[int, Field(ge=1, le=200_000), BeforeValidator(integral_number)] = (
        sy.DEFAULT_MAX_BASIS_SIZE
    )
    noise_mechanism: Literal["laplace", "gaussian"] | None = None
    co_spread: bool = Field(
        default=True,
        description="spend 5 % of epsilon on the co-spread that corrects Gaussian-kernel "
        "answers for the dependence between columns (when the basis admits it)",
    )


#: The most work a synopsis's measure may do, in row-moments: it reads every row once per
#: moment, ``n R``, and a moment of a larger index set costs more, so the count is weighted
#: by ``max(1, R / MEASURE_WORK_SIZE)`` (measured on 2 cores: 6-16 ns a row-moment for
#: R <= 10^4, 53 ns at R = 10^5, 77 ns at R = 10^6). At the limit the measure takes 10-27
#: minutes here. The default index sets of tables of up to 10^7 rows stay within it (8
#: 10^10 at d = 10, 5.8 10^10 at d = 100); a larger table's default is lowered to fit, and
#: a larger basis_size is refused at the request. Without it 10^8 rows (a 4.5 MB Parquet
#: file: rows of zeros compress to a few bits) with the default R = 8007 would measure for
#: 1.4 hours, and basis_size 10^6 on 10^5 rows for 2, holding a worker and every release
#: queued behind it.
MAX_MEASURE_WORK = 10**11
#: Bytes of one ``[column, degree]`` term of an index set in ``synopsis.json``, with its
#: separator (``[1999, 30], `` is 12).
JSON_TERM_BYTES = 32
MEASURE_WORK_SIZE = 10_000
#: Work one answers request may do, queries x R: every answer expands its query over the
#: whole index set. Measured in the API process (2 cores) on WDBC at R = 10^6, in blocks
#: of :data:`ANSWER_BLOCK_ENTRIES`: 0.4 s a product query of 30 Gaussian factors (50 took
#: 20 s) once the synopsis is loaded (11 s, once: it is cached); at R = 2 10^4, 2.2 s for
#: 1000. This bounds one request to about 12 s; without it 100 queries at R = 10^6 took
#: 38 s, and the 100,000 a request may hold would have taken hours.
MAX_ANSWER_WORK = 3 * 10**7
#: Work of an answer beside its ``R`` moments (:func:`answer_work`), in units of about
#: 0.4 microseconds, measured on WDBC at R = 60 and 5000 (2 cores,
#: ``bench/results/synopsis_answer_work.md``): a query's own cost (its parse, its share of
#: its block, its record: 150-300 us for one Gaussian factor), each factor's (80 us), each
#: coefficient of its expansion's length ``L`` (3 us: a product of ten Gaussian factors,
#: one of width 0.0005 on the normalised scale, has L = 23,500 and took 67 ms), and under
#: Laplace noise the saddlepoint quantile of its interval (200 us). Charged ``R`` alone,
#: 100,000 single-factor queries at R = 60 took 15-110 s, and as many such ten-factor
#: products passed (6 10^6 units) and would have taken 1.6 hours (fuzz audit).
QUERY_WORK = 375
FACTOR_WORK = 200
LENGTH_WORK = 8
SADDLEPOINT_WORK = 500
#: Pairs of kernels (centres of a mixture, monomials of a polynomial) times columns that
#: one unit of work covers: the truncation estimate of an answer is ``O(J^2 d L)``
#: (:func:`~app.mechanisms.chebyshev.truncation_estimate`, about 0.1 us a pair and a
#: column on WDBC). Charged ``J`` alone, one mixture of 3162 centres (30 s) or a 117-byte
#: polynomial in original units that expands to 2883 monomials (35 s) passed (review,
#: helper-35).
PAIR_COLUMNS_A_UNIT = 4
#: Entries of the ``(block, R)`` coefficient matrix :meth:`Synopsis.answer_many` builds a
#: block of queries at a time; each entry costs about 48 bytes with the arrays beside it
#: (100 queries at R = 10^6 took 4.7 GB, and a block of 256 would have taken 12 GB), so a
#: block holds at most 4 10^6 entries, about 200 MB: the default 256 queries up to
#: R = 15,625, fewer beyond.
ANSWER_BLOCK_ENTRIES = 4 * 10**6


def measure_work(n: int, size: int) -> float:
    """The weighted row-moments of measuring ``size`` moments over ``n`` rows."""
    return n * size * max(1.0, size / MEASURE_WORK_SIZE)


def largest_basis_size(n: int) -> int:
    """The largest R whose measure over ``n`` rows stays within :data:`MAX_MEASURE_WORK`
    (0 when not even one moment does)."""
    size = MAX_MEASURE_WORK // n
    if size > MEASURE_WORK_SIZE:
        size = math.isqrt(MAX_MEASURE_WORK * MEASURE_WORK_SIZE // n)
    while size > 0 and measure_work(n, size) > MAX_MEASURE_WORK:  # rounding of the root
        size -= 1
    return size


def _plan(
    info: DatasetInfo, epsilon: float, delta: float, params: SynopsisParams
) -> tuple[IndexSet, sy.BasisChoice, float]:
    largest = largest_basis_size(info.n_rows)
    if largest < 1:
        raise InvalidRequest(
            f"a synopsis of {info.n_rows} rows would read more than {MAX_MEASURE_WORK:.0e} "
            "row-moments (MAX_MEASURE_WORK): the table is too large for smooth_synopsis"
        )
    if params.basis_size is not None:  # refused from public numbers, before it is built
        check_index_set_size(info.d, params.basis_size)
        _check_measure_work(info.n_rows, params.basis_size, largest)
    index_set, choice, share = sy.plan(
        info.n_rows,
        info.d,
        epsilon=epsilon,
        delta=delta,
        smoothness=params.smoothness,
        # as asked: "paper" with a basis_size, or "full_tensor" with one that is no
        # t^d - 1, is refused (the request was released as total degree, and recorded as
        # the basis it asked for)
        basis=params.basis,
        basis_size=params.basis_size,
        # a default that would take longer to measure is lowered to fit (as one past
        # basis.MAX_INDEX_SET_ENTRIES is, in sy.choose_basis)
        max_basis_size=min(params.max_basis_size, largest),
        mechanism=params.noise_mechanism,
        co_spread=params.co_spread,
    )
    _check_measure_work(info.n_rows, index_set.size, largest)
    if (
        (params.basis_size is not None or params.basis == "paper")
        and params.max_basis_size < sy.DEFAULT_MAX_BASIS_SIZE
        and index_set.size > params.max_basis_size
    ):
        # a size fixed by basis_size or Theorem 3.1 past a cap the caller lowered: the
        # cap applies to every basis, as it does to the rules' choices
        fixed = "basis_size" if params.basis_size is not None else "basis 'paper'"
        raise InvalidRequest(
            f"{fixed} gives R = {index_set.size} functions, more than max_basis_size "
            f"({params.max_basis_size}); raise max_basis_size or ask for fewer functions"
        )
    return index_set, choice, share


def _check_measure_work(n: int, size: int, largest: int) -> None:
    if size > largest:
        raise InvalidRequest(
            f"R = {size} moments over {n} rows is more measurement "
            f"work than the limit of {MAX_MEASURE_WORK:.0e} weighted row-moments (about half "
            f"an hour): at most R = {largest} for this table; lower basis_size"
        )


def _preview(plan: tuple[IndexSet, sy.BasisChoice, float], epsilon: float) -> dict[str, Any]:
    index_set, choice, share = plan
    chosen = choice.chosen
    return {
        "resolved": {
            "basis": choice.to_dict(),
            "basis_size": index_set.size,
            "co_spread_epsilon": share * epsilon,
        },
        "accuracy": {
            "moment_stddev": chosen.coordinate_stddev,
            "predicted_stderr": chosen.predicted_stderr,
            "predicted_truncation": chosen.predicted_truncation,
            "predicted_halfwidth_95": chosen.predicted_halfwidth,
            "note": "for a representative query of the declared smoothness: one Gaussian "
            "kernel of width sqrt(K) with a uniform random centre (normalised scale). "
            "predicted_stderr is the noise standard error of the plain answer "
            "c_0 + <c, moments> (paper 001, Algorithm 2), root mean square over centres; "
            "answers add by default the independence extrapolation (and the co-spread "
            "correction), whose stderr depends on the data and was 1 to 2.1 times this "
            "one on WDBC and CTG (bench/results/preview_calibration.md). "
            "predicted_halfwidth_95 is the predicted half-width of a 95 % interval for "
            "that query; predicted_truncation is the worst-case truncation bound over "
            "every dataset (mean over centres), not a predicted error",
        },
    }


class SmoothSynopsis(registry.Mechanism):
    name: ClassVar[str] = "smooth_synopsis"
    description: ClassVar[str] = (
        "noisy Chebyshev moments (paper 001) answering smooth queries with standard errors"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = SynopsisParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = smooth_queries.FORMS

    def _checked_plan(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> tuple[IndexSet, sy.BasisChoice, float]:
        assert isinstance(params, SynopsisParams)
        if params.noise_mechanism == "gaussian" and delta <= 0:
            raise InvalidRequest("noise_mechanism 'gaussian' needs delta > 0")
        return _plan(info, epsilon, delta, params)  # refuses impossible index sets early

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        self._checked_plan(info, epsilon, delta, params)

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        assert isinstance(params, SynopsisParams)
        return _preview(_plan(info, epsilon, delta, params), epsilon)

    def checked_preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        """The check's plan (the basis choice: 50-500 ms) is the preview's: made once."""
        return _preview(self._checked_plan(info, epsilon, delta, params), epsilon)

    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        """``synopsis.json``: its ``R`` noisy moments (a float's JSON text and separator,
        at most 26 bytes) and index set (at most ``R d`` ``[column, degree]`` terms of at
        most :data:`JSON_TERM_BYTES` each, and a list of them per function), the
        columns' names and bounds, and the fixed parts (:data:`app.storage.sizes.
        JSON_ALLOWANCE`). ``R`` is the preview's ``basis_size`` (or the measure stage's);
        without one, the largest index set (:data:`app.mechanisms.basis.
        MAX_INDEX_SET_ENTRIES` entries)."""
        size = resolved.get("basis_size")
        if isinstance(size, int) and not isinstance(size, bool):
            R, entries = size, size * info.d
        else:
            R, entries = MAX_INDEX_SET_SIZE, MAX_INDEX_SET_ENTRIES
        return sizes.files(
            sizes.JSON_ALLOWANCE
            + 26 * R
            + 4 * R
            + JSON_TERM_BYTES * entries
            + sum(sizes.json_text(c.name) + 96 for c in info.columns)
        )

    def measure_read_share(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> float:
        """None: the moments are summed a block of rows at a time as the rows are read,
        and those blocks report the progress (:func:`sy.measure`'s ``progress``). A batch
        read reported its rows before any of their work: at ``R = 10^5`` a table of one
        batch stood at 0.99 through 25 s of moments, with no cancel noticed."""
        return 0.0

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        assert isinstance(params, SynopsisParams)
        index_set, _, share = _plan(info, epsilon, delta, params)
        synopsis = sy.measure(
            source,
            epsilon,
            delta,
            params.smoothness,
            rng=np.random.default_rng(),
            basis=index_set,
            mechanism=params.noise_mechanism,
            co_spread=share > 0,
            progress=progress,
        )
        document = synopsis.to_dict()
        return Measured(
            payload=document,
            privacy_cost=synopsis.privacy_cost,
            resolved={
                "basis_size": synopsis.size,
                "noise": synopsis.noise_distribution,
                "noise_scale": synopsis.noise_scale,
                "co_spread": synopsis.co_spread is not None,
            },
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
        document = {
            "synopsis": dict(payload),
            "columns": [{"name": c.name, "lower": c.lower, "upper": c.upper} for c in info.columns],
            "evaluation": {
                "normalisation": "x' = 2 (x - lower) / (upper - lower) - 1 per column",
                "basis": "T_r(x') = prod_i cos(r_i arccos x'_i) for the multi-indices r of "
                "synopsis.index_set (the constant T_0 = 1 has moment exactly 1)",
                "answer": "c_0 + sum_r c_r * moment_r, with c the Chebyshev coefficients of "
                "the query on the normalised scale (paper 001, Algorithm 2)",
                "stderr": "||c||_2 times the noise's standard deviation per moment",
                "co_spread": "synopsis.co_spread, when present: the noisy A = sum_{i != j} "
                "Cov(x_i^2, x_j^2) that multiplies Gaussian-kernel answers by "
                "exp(A / (2 d (d - 1)) [(sum_i k_i)^2 - sum_i k_i^2]), k_i = 1 / (2 s_i^2) "
                "(app.mechanisms.dependence)",
                "library": "app.mechanisms.smooth_synopsis.Synopsis.from_dict(doc['synopsis'])",
            },
        }
        (workdir / "synopsis.json").write_text(json.dumps(document))
        return Synthesized(
            artifacts={
                "synopsis.json": ArtifactInfo(
                    "synopsis.json",
                    "application/json",
                    "noisy moments, index set, noise, bounds and how to evaluate queries",
                )
            },
            summary={},
        )

    def load(self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path) -> Any:
        return sy.Synopsis.from_dict(dict(payload))

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        # a lower bound first, from sizes read off the JSON: a batch it already proves
        # over the limit is refused before it is parsed (64 MiB of 30-factor products
        # parsed for about 20 s before their work was refused)
        _check_work(loaded, len(queries), raw_answer_work(loaded, queries, info), at_least=True)
        parsed = smooth_queries.parse(queries, info)
        try:
            work = answer_work(loaded, parsed)
        except MechanismError as exc:
            # a query the expansion refuses, named by position (a mixture's width says no
            # position of its own: found by bisection on the work alone, nothing expanded)
            raise smooth_queries.refusal(
                exc, parsed, lambda batch: answer_work(loaded, batch)
            ) from None
        _check_work(loaded, len(parsed), work)
        block = max(1, min(sy.ANSWER_BLOCK, ANSWER_BLOCK_ENTRIES // loaded.size))

        def answer_many(batch: Sequence[Any]) -> Any:
            return loaded.answer_many(batch, block=block)

        try:
            answers = answer_many(parsed)
        except MechanismError as exc:
            raise smooth_queries.refusal(exc, parsed, answer_many) from None
        out = []
        for i in range(len(answers)):
            item = answers[i].as_dict()
            item["note"] = (
                "value: the synopsis answer plus independence_extrapolation (the truncated "
                "interaction terms predicted from the released one-column moments), times "
                "exp(dependence_log_factor) for Gaussian kernels (the dependence between "
                "columns measured by the released co-spread); stderr from the known noise "
                "(delta method, plus the product's second-order variance when no pair "
                "moment is released); interval: nominal 95 %, noise quantile (widened for "
                "that skewed product) combined with the estimated truncation error and "
                "an allowance for the dependence correction's own error (estimated from "
                "the released moments, not a bound: it can under-cover, README "
                "'Releases'), or "
                "the worst case when a Gaussian factor is narrower than the declared "
                "smoothness (within_smoothness false); "
                "worst_case_interval is centred on the plain answer (value minus "
                "independence_extrapolation), adds the truncation bound and holds for every "
                "dataset"
            )
            out.append(item)
        return out


def _check_work(synopsis: sy.Synopsis, queries: int, work: int, *, at_least: bool = False) -> None:
    registry.check_total_work(
        queries,
        work,
        MAX_ANSWER_WORK,
        costs=f"about 0.4 us each here: the {synopsis.size} moments of every answer, and "
        "its factors and the length of their Chebyshev expansions",
        smaller="use wider Gaussian factors (shorter expansions) or fewer factors",
        at_least=at_least,
    )


def _query_work(synopsis: sy.Synopsis) -> int:
    """Every answer's own work: its ``R`` moments, ``QUERY_WORK``, and under Laplace noise
    ``SADDLEPOINT_WORK`` (:func:`answer_work`)."""
    saddlepoint = SADDLEPOINT_WORK if synopsis.noise_distribution == "laplace" else 0
    return synopsis.size + QUERY_WORK + saddlepoint


def raw_answer_work(
    synopsis: sy.Synopsis, queries: Sequence[Mapping[str, Any]], info: DatasetInfo
) -> int:
    """A lower bound on :func:`answer_work` of the batch ``queries`` parses to, from
    :func:`smooth_queries.raw_sizes` (no query parsed): every query's ``R`` and own cost,
    a product's factors, and a product's or a mixture kernel's expansion at its shortest
    (a block's length is at least ``max_degree + 1``), leaving out what only the parse
    tells (the expansions' lengths, a polynomial's monomials, the kernels' pairs)."""
    sizes = smooth_queries.raw_sizes(queries, info)
    d, length = synopsis.d, synopsis.index_set.max_degree + 1
    return (
        _query_work(synopsis) * sizes.queries
        + FACTOR_WORK * sizes.product_factors
        + LENGTH_WORK * length * sizes.products
        + (FACTOR_WORK * d + LENGTH_WORK * length) * sizes.mixture_centers
    )


def answer_work(synopsis: sy.Synopsis, parsed: Sequence[object]) -> int:
    """The work of answering ``parsed`` on ``synopsis``, in the units of
    :data:`MAX_ANSWER_WORK`, from public sizes before anything is expanded: per query
    ``R + QUERY_WORK + FACTOR_WORK f + LENGTH_WORK L`` (``+ SADDLEPOINT_WORK`` under
    Laplace noise), ``f`` its one-column factors (``k d`` for a mixture of ``k`` centres,
    the monomials' ``k d`` for a polynomial) and ``L`` the length of its expansion
    (:func:`~app.mechanisms.chebyshev.separable_layout`; ``k L`` for ``k`` kernels), and
    for ``k`` kernels ``k^2 d / PAIR_COLUMNS_A_UNIT`` (their truncation estimate)."""
    d = synopsis.d
    work = _query_work(synopsis) * len(parsed)
    layout = chebyshev.separable_layout(
        parsed, d, min_length=synopsis.index_set.max_degree + 1, block=sy.ANSWER_BLOCK
    )
    for planned in layout:
        if planned.kind == "product" and planned.shape is not None:
            # every query of the block at its longest length (at most twice its own)
            rows, _, length = planned.shape
            work += rows * LENGTH_WORK * length
            for position in planned.positions:
                query = parsed[int(position)]
                assert isinstance(query, ProductQuery)
                work += FACTOR_WORK * sum(g is not None for g in query.factors)
        elif planned.shape is not None:
            rows, kernels, length = planned.shape
            work += rows * kernels * (FACTOR_WORK * d + LENGTH_WORK * length)
            work += rows * kernels * kernels * d // PAIR_COLUMNS_A_UNIT
    return work


registry.register(SmoothSynopsis())
