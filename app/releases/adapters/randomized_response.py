"""Release type ``randomized_response``: mechanism E of paper 004 over the product domain of
the chosen columns, with the paper's estimators for statistical queries.

The domain is the product of each chosen column's values: a categorical column's declared
categories, a binary column's {0, 1}, and a continuous column's ``2^bits`` equal cells of
its declared range (§V-A; ``bits`` defaults to ``default_bits(n)``, i.e. ``2^{2k} ~
sqrt(n)``). At most one chosen column may be of kind ``public``: it is released unchanged
beside the perturbed codes (its values were declared public by the curator) and lets
heterogeneous queries pick a row function per public value.

The released database (downloadable as ``sample.csv``/``sample.parquet``) holds, per row,
the perturbed cell in original units (labels, 0/1, cell midpoints) and the public value.
"""

from __future__ import annotations

import bisect
import json
import math
import unicodedata
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from app.core.errors import InvalidRequest
from app.core.types import integral_number
from app.mechanisms import randomized_response as rr
from app.mechanisms.errors import MechanismError
from app.releases import registry
from app.releases.payloads import pack, unpack
from app.releases.registry import (
    ArtifactInfo,
    DatasetInfo,
    Measured,
    ProgressFn,
    Synthesized,
)
from app.storage import sizes
from app.storage.artifacts import sample_chunk_rows, write_csv_and_parquet
from app.storage.source import EncryptedTableSource

MAX_TABLE_DOMAIN = 100_000
#: Work one answers request may do, in units of about 100 ns: its queries times the work
#: of one answer, ``entries + PUBLIC_VALUE_WORK x public values``. An answer reads the
#: released rows counted by (public value, code) (``RRRelease.cell_counts``, counted once
#: per loaded release, every group in one numpy pass): 50 to 100 ns an entry. A release
#: with a public column is also charged for a ``by_public`` query's own size, one
#: condition per public value, parsed in Python into cells; values whose cells coincide
#: share one conjunction, the others each cost one more. ``bench/results/rr_by_public.md``
#: times two queries: one whose 10^5 values select a few hundred distinct conjunctions
#: (1.8 s an answer at 10^6 rows; 4.3 s before values shared them,
#: ``rr_by_public_before.md``) and one whose values mostly select their own (5.0 s at
#: 10^5 values and 10^6 rows, 3.7 s at 2 10^5 rows, 0.69 s at 10^4 values over 9 10^5
#: entries, where each entry also costs more); the slower needs (seconds / 100 ns -
#: entries) / public values = 370 to 593, so a value is charged 600. This bounds one
#: request to about 15 s (7 to 14 s in that run; at the former 250, 25 to 33 s); the
#: counts are of released values only.
MAX_ANSWER_WORK = 15 * 10**7
PUBLIC_VALUE_WORK = 600
#: The measure holds the n released rows (codes read, their concatenation, the perturbed
#: copy), about :data:`MEASURE_ROW_BYTES` a row, and a public column's values as Python
#: strings and a fixed-width copy, about :data:`PUBLIC_ROW_BYTES` more (peak RSS of the
#: measure, 2 cores: +546 MiB at 10^7 rows and +2715 MiB at 5 10^7 of one binary column,
#: 57 bytes a row; +1092 MiB at 5 10^6 rows with 11-character public values, 229). A
#: request over :data:`MAX_MEASURE_BYTES` is refused: rows cost a few bits of a Parquet
#: file (5 10^7 of them took 187 KB), and 10^9 would have taken some 57 GB of the
#: worker's memory. The limit is smooth_synthetic's memory limit; it admits 6.7 10^7 rows,
#: 1.3 10^7 with a public column (the benchmarks go to 10^7).
MEASURE_ROW_BYTES = 64
PUBLIC_ROW_BYTES = 256
MAX_MEASURE_BYTES = 4 << 30
#: Level of the answers' intervals.
LEVEL = 0.95


class RRParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    bits: Annotated[int, Field(ge=1, le=16), BeforeValidator(integral_number)] | None = Field(
        default=None,
        description="cells per continuous column = 2^bits; default: paper 004 §V-A "
        "(2^{2k} ~ sqrt(n))",
    )


# Query forms ---------------------------------------------------------------------------

Condition = str | int | float | bool | list[str | int | float | bool] | dict[str, list[float]]


class ConjunctionQuery(BaseModel):
    """Fraction of rows whose columns take the listed values (all conditions at once).
    ``where`` maps a column to a value, a list of values, or ``{"between": [lo, hi]}``
    (continuous columns: the cells whose midpoint lies in the range, original units). A
    binary column's values are 0, 1, false and true, as its uploaded cells; a categorical
    column's are its declared categories (compared as text), never a boolean. Accepted by
    ``randomized_response`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"type": "conjunction", "where": {"diagnosis": "M"}},
                {"type": "conjunction", "where": {"diagnosis": ["M"]}, "estimator": "proper"},
            ]
        },
    )

    type: Literal["conjunction"]
    where: dict[str, Condition] = Field(min_length=1)
    estimator: Literal["unbiased", "proper"] = "unbiased"


#: A table query's values lie in [-MAX_TABLE_VALUE, MAX_TABLE_VALUE], so that squares and
#: sums of squares stay finite (1e155 overflowed: a 500).
MAX_TABLE_VALUE = 1e100


def _table_value(value: float) -> float:
    if not abs(value) <= MAX_TABLE_VALUE:
        raise ValueError(
            f"must lie in [-{MAX_TABLE_VALUE:g}, {MAX_TABLE_VALUE:g}] (squares must stay finite)"
        )
    return value


class TableQuery(BaseModel):
    """Mean over rows of ``values[cell]``: one value per cell of the release's domain
    (small domains; the example is for a release of one two-category column). Accepted by
    ``randomized_response`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"type": "table", "values": [0.0, 1.0]}]},
    )

    type: Literal["table"]
    values: list[Annotated[float, Field(allow_inf_nan=False), AfterValidator(_table_value)]]
    estimator: Literal["unbiased", "proper"] = "unbiased"


class HeterogeneousQuery(BaseModel):
    """A row function chosen by the row's public value: ``by_public`` maps every value of
    the public column (they are released, see ``sample.csv``) to a ``where`` conjunction.
    Accepted by ``randomized_response`` releases (of a public column)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "type": "heterogeneous",
                    "by_public": {"north": {"diagnosis": "M"}, "south": {"diagnosis": "B"}},
                }
            ]
        },
    )

    type: Literal["heterogeneous"]
    by_public: dict[str, dict[str, Condition]] = Field(min_length=1)
    estimator: Literal["unbiased", "proper"] = "unbiased"


RRQuery = Annotated[ConjunctionQuery | TableQuery | HeterogeneousQuery, Field(discriminator="type")]
_QUERIES: TypeAdapter[list[RRQuery]] = TypeAdapter(list[RRQuery])


def _power_of_two(size: int) -> str:
    """``size`` as a power of two ("2^1100", "about 2^70.2"): a domain of many columns is
    far beyond a float (``{:.3g}`` of 2^1100 raised OverflowError, a 500)."""
    if size & (size - 1) == 0:
        return f"2^{size.bit_length() - 1}"
    return f"about 2^{math.log2(size):.1f}"  # math.log2 takes an int of any size


def _every_row(estimator: str, answered: dict[str, list[float]]) -> dict[str, Any]:
    """The answer to a conjunction that allows every value of its columns: 1, exactly."""
    item: dict[str, Any] = {
        "value": 1.0,
        "stderr": 0.0,
        "interval": [1.0, 1.0],
        "error_bound": 0.0,
        "estimator": estimator,
        "note": "the conditions allow every value of their columns: every row satisfies "
        "them, so the fraction is 1, exactly (no noise enters it)",
    }
    if any(answered.values()):
        item["answered_ranges"] = {k: v for k, v in answered.items() if v}
    return item


@dataclass(frozen=True)
class _Columns:
    """What the conditions of one answers request look up, built once per request (a
    ``by_public`` query has a ``where`` per public value): the perturbed columns by name,
    each categorical column's categories by label, and each continuous column's
    ``2^bits`` cell midpoints and ``2^bits + 1`` cell edges in original units (ascending:
    ``lower < upper``)."""

    perturbed: list[registry.ColumnInfo]
    index: dict[str, int]
    labels: dict[int, dict[str, int]]
    midpoints: dict[int, list[float]]
    edges: dict[int, list[float]]

    @classmethod
    def of(cls, perturbed: list[registry.ColumnInfo], bits: int) -> _Columns:
        cells = 1 << bits
        labels, midpoints, edges = {}, {}, {}
        for j, column in enumerate(perturbed):
            if column.kind == "categorical":
                assert column.categories is not None
                # each category by its NFC form, but for a form two categories share (a
                # dataset declared before such pairs were refused), and by its own text
                forms: dict[str, int | None] = {}
                for k, label in enumerate(column.categories):
                    form = unicodedata.normalize("NFC", label)
                    forms[form] = None if form in forms else k
                labels[j] = {form: k for form, k in forms.items() if k is not None}
                labels[j].update((label, k) for k, label in enumerate(column.categories))
            elif column.kind == "continuous":
                mid = rr.cell_midpoints(np.arange(cells), bits)
                midpoints[j] = column.to_original(mid).tolist()
                edge = -1.0 + 2.0 * np.arange(cells + 1, dtype=np.float64) / cells
                edges[j] = column.to_original(edge).tolist()
        index = {c.name: j for j, c in enumerate(perturbed)}
        return cls(perturbed, index, labels, midpoints, edges)


class RandomizedResponse(registry.Mechanism):
    name: ClassVar[str] = "randomized_response"
    description: ClassVar[str] = (
        "perturbed database of the same size (paper 004, mechanism E) with unbiased "
        "estimators for statistical queries"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset(
        {"categorical", "binary", "continuous", "public"}
    )
    #: A public column is released row by row as stored: the epsilon-DP guarantee is over
    #: neighbours that replace one row's perturbed values and agree on the public column
    #: (paper 004's public attributes). Stated with every release of this type.
    guarantee: ClassVar[str] = (
        "differential privacy (epsilon-DP, replace-one) of the perturbed columns; a column "
        "declared public is released as stored, so neighbouring datasets agree on it"
    )
    Params: ClassVar[type[BaseModel]] = RRParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = (
        ConjunctionQuery,
        TableQuery,
        HeterogeneousQuery,
    )

    # -- the domain

    def _bits(self, info: DatasetInfo, params: BaseModel) -> int:
        assert isinstance(params, RRParams)
        return params.bits if params.bits is not None else rr.default_bits(info.n_rows)

    def _domain(self, info: DatasetInfo, params: BaseModel) -> tuple[rr.Domain, list[int]]:
        bits = self._bits(info, params)
        cards = []
        for column in info.columns:
            if column.kind == "categorical":
                assert column.categories is not None
                cards.append(len(column.categories))
            elif column.kind == "binary":
                cards.append(2)
            elif column.kind == "continuous":
                cards.append(1 << bits)
        size = math.prod(cards)
        if size > rr.MAX_DOMAIN_SIZE:
            raise InvalidRequest(
                f"the domain of these columns has {_power_of_two(size)} cells; at most 2^62"
            )
        if size < 2:
            raise InvalidRequest("the chosen columns have a single cell: nothing to release")
        return rr.Domain(tuple(cards)), cards

    def _perturbed(self, info: DatasetInfo) -> list[registry.ColumnInfo]:
        return [c for c in info.columns if c.kind != "public"]

    def _public(self, info: DatasetInfo) -> registry.ColumnInfo | None:
        public = [c for c in info.columns if c.kind == "public"]
        return public[0] if public else None

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        if delta:
            raise InvalidRequest("randomized_response is epsilon-DP: use delta = 0")
        if len([c for c in info.columns if c.kind == "public"]) > 1:
            raise InvalidRequest("at most one public column per release")
        if not self._perturbed(info):
            raise InvalidRequest("choose at least one categorical, binary or continuous column")
        row_bytes = MEASURE_ROW_BYTES + (PUBLIC_ROW_BYTES if self._public(info) else 0)
        if info.n_rows * row_bytes > MAX_MEASURE_BYTES:
            raise InvalidRequest(
                f"randomized_response holds the released rows in memory, about {row_bytes} "
                f"bytes a row: {info.n_rows} rows are more than its limit of "
                f"{MAX_MEASURE_BYTES >> 30} GiB; at most {MAX_MEASURE_BYTES // row_bytes} rows "
                "(upload a sample of the table as its own dataset"
                + (", or release it without the public column)" if self._public(info) else ")")
            )
        domain, _ = self._domain(info, params)
        if rr.replace_threshold(domain.size, epsilon) >= 1 << 64:
            raise InvalidRequest(
                f"with {domain.size} cells and epsilon {epsilon:g} the release would be pure "
                "noise; use fewer columns, categories or bits, or a larger epsilon"
            )

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        domain, cards = self._domain(info, params)
        summary = rr.preview(info.n_rows, domain.size, epsilon)
        return {
            "resolved": {
                "domain_size": domain.size,
                "cardinalities": dict(
                    zip([c.name for c in self._perturbed(info)], cards, strict=True)
                ),
                "bits": self._bits(info, params),
                "public_column": getattr(self._public(info), "name", None),
                "keep_probability": summary.keep_probability,
            },
            "accuracy": {
                "rmse_bound": summary.rmse_bound,
                "rmse_worst_case": summary.rmse_worst_case,
                "note": "bound (20) of paper 004 on the RMS error of a statistical query "
                "whose row function has range 1; the unbiased estimate's RMS error is at "
                "most rmse_worst_case, half of it, for every database (a row's variance is "
                "at most 1/4), and the proper estimate's at most rmse_bound",
                "useful": summary.useful,
                "warning": summary.warning,
            },
        }

    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        """``sample.csv`` and ``sample.parquet`` (``n`` rows of the release's columns: a
        category's text as declared, a binary's 0/1, a continuous cell's midpoint as a
        float, a public cell's text of at most its declared ``max_bytes``, enforced at
        upload, 1024 by default: :data:`app.datasets.schemas.MAX_CELL_BYTES`) and
        ``release.json`` (its domain's names and cardinalities), bounded by
        :mod:`app.storage.sizes`."""
        csv_cells, parquet_cells = [], []
        for column in info.columns:
            if column.kind == "categorical":
                assert column.categories is not None
                longest = max(len(c.encode()) for c in column.categories)
                csv_cells.append(sizes.csv_text_cell(longest))
                parquet_cells.append(sizes.parquet_text_cell(longest))
            elif column.kind == "public":
                assert column.max_bytes is not None
                csv_cells.append(sizes.csv_text_cell(column.max_bytes))
                parquet_cells.append(sizes.parquet_text_cell(column.max_bytes))
            else:  # binary (an int8: "0" or "1"), continuous (a float)
                binary = column.kind == "binary"
                csv_cells.append(2 if binary else sizes.CSV_FLOAT_CELL)
                parquet_cells.append(
                    sizes.PARQUET_INT32_CELL if binary else sizes.PARQUET_FLOAT_CELL
                )
        n, names = info.n_rows, info.names
        chunk = max(1, sample_chunk_rows(len(names)))
        return sizes.files(
            sizes.csv_bytes(n, csv_cells, names),
            sizes.parquet_bytes(n, parquet_cells, names, chunk),
            sizes.JSON_ALLOWANCE + sum(sizes.json_text(name) + 32 for name in names),
        )

    # -- measure: the only step that reads rows

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        domain, _ = self._domain(info, params)
        bits = self._bits(info, params)
        perturbed = self._perturbed(info)
        public = self._public(info)
        # each batch's cells are encoded as they are read: only the n codes are held (the
        # release is n rows), not every column's cells, their concatenation and their stack
        code_parts: list[np.ndarray] = []
        public_parts: list[np.ndarray] = []
        for batch in source.codes():
            cells = []
            for column in perturbed:
                values = batch.column(column.name).to_numpy(zero_copy_only=False)
                if column.kind == "continuous":
                    cells.append(rr.discretize(np.asarray(values, dtype=np.float64), bits))
                else:
                    cells.append(np.asarray(values, dtype=np.int64))
            code_parts.append(domain.encode(np.column_stack(cells)))
            if public is not None:
                public_parts.append(np.asarray(batch.column(public.name).to_pylist(), dtype=object))
        codes = np.concatenate(code_parts) if code_parts else np.empty(0, dtype=np.int64)
        public_values: list[str] | None = None
        public_codes = None
        if public is not None:
            texts = np.concatenate(public_parts).astype(str)
            uniques, public_codes = np.unique(texts, return_inverse=True)
            public_values = [str(u) for u in uniques]
        release = rr.release(codes, domain, epsilon, public=public_codes)
        payload = {
            "release": release.to_dict(),
            "bits": bits,
            "public_values": public_values,
        }
        return Measured(
            payload=pack(payload),
            privacy_cost=release.privacy_cost,
            resolved={
                "domain_size": domain.size,
                "cardinalities": list(domain.cardinalities),
                "bits": bits,
                "keep_probability": release.keep_probability,
                "replace_probability": release.replace_probability,
                "epsilon_effective": release.epsilon_effective,
            },
        )

    # -- post-processing

    def load(
        self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path
    ) -> dict[str, Any]:
        data = unpack(payload)
        return {
            "release": rr.RRRelease.from_dict(data["release"]),
            "bits": int(data["bits"]),
            "public_values": data["public_values"],
        }

    def _decoded_table(
        self, loaded: Mapping[str, Any], info: DatasetInfo, start: int = 0, stop: int | None = None
    ) -> pa.Table:
        """The released rows ``start:stop`` (default: all) in original units, with the
        public column, in the release's column order (the request's ``columns``, or the
        declared order): the public column used to come last wherever it stood."""
        release: rr.RRRelease = loaded["release"]
        domain = release.domain
        assert domain is not None
        cells = domain.decode(release.codes[start:stop])
        columns: dict[str, Any] = {}
        for j, column in enumerate(self._perturbed(info)):
            values = cells[:, j]
            if column.kind == "categorical":
                assert column.categories is not None
                columns[column.name] = pa.array(np.asarray(column.categories, dtype=object)[values])
            elif column.kind == "binary":
                columns[column.name] = pa.array(values.astype(np.int8))
            else:
                mid = rr.cell_midpoints(values, loaded["bits"])
                columns[column.name] = pa.array(column.to_original(mid))
        public = self._public(info)
        if public is not None and release.public is not None:
            names = np.asarray(loaded["public_values"], dtype=object)
            columns[public.name] = pa.array(names[release.public[start:stop]])
        return pa.table({name: columns[name] for name in info.names if name in columns})

    def synthesize(
        self,
        payload: Mapping[str, Any],
        info: DatasetInfo,
        params: BaseModel,
        rng: np.random.Generator,
        workdir: Path,
        progress: ProgressFn,
    ) -> Synthesized:
        loaded = self.load(payload, info, workdir)
        release: rr.RRRelease = loaded["release"]
        self._write_sample(loaded, info, workdir, progress)
        description = {
            "mechanism": "randomized_response (paper 004, mechanism E)",
            "rows": release.n,
            "domain": {
                "columns": [c.name for c in self._perturbed(info)],
                "cardinalities": list(release.cardinalities or ()),
                "bits_per_continuous_column": loaded["bits"],
            },
            "keep_probability": release.keep_probability,
            "replace_probability": release.replace_probability,
            "estimator": "unbiased estimate of mean_i phi(x_i): "
            "(mean_i phi(y_i) - rho * mean_cells phi) / (1 - rho), rho = replace_probability",
            "epsilon": release.epsilon,
            "epsilon_effective": release.epsilon_effective,
        }
        (workdir / "release.json").write_text(json.dumps(description, indent=1))
        return Synthesized(
            artifacts={
                "sample.csv": ArtifactInfo(
                    "sample.csv", "text/csv", "the perturbed database (original units)"
                ),
                "sample.parquet": ArtifactInfo(
                    "sample.parquet",
                    "application/vnd.apache.parquet",
                    "the perturbed database (original units)",
                ),
                "release.json": ArtifactInfo(
                    "release.json",
                    "application/json",
                    "domain and perturbation probabilities, for offline estimation",
                ),
            },
            summary={"rows": release.n},
        )

    def _write_sample(
        self, loaded: Mapping[str, Any], info: DatasetInfo, workdir: Path, progress: ProgressFn
    ) -> None:
        """``sample.csv`` and ``sample.parquet``, decoded and written
        :func:`sample_chunk_rows` rows at a time, as smooth_synthetic writes its samples:
        the whole table at once held every row decoded (the categories as Python
        strings), its Arrow table and Parquet's buffered row groups beside the n codes.
        The same values and text as the whole table's; the Parquet file has a row group a
        chunk (or more: Parquet's own limit). ``progress``: the rows written over n."""
        release: rr.RRRelease = loaded["release"]
        n = release.n
        width = len(self._perturbed(info)) + (self._public(info) is not None)
        step = max(1, sample_chunk_rows(width))

        def chunks() -> Iterator[pa.Table]:
            # range(0, 0 or 1): an empty sample still gets its header and schema
            for start in range(0, max(n, 1), step):
                yield self._decoded_table(loaded, info, start, start + step)
                progress(min(n, start + step) / max(n, 1))  # that chunk is written

        write_csv_and_parquet(workdir / "sample.csv", workdir / "sample.parquet", chunks())

    # -- answers

    def _terms(
        self,
        where: Mapping[str, Condition],
        columns: _Columns,
        answered: dict[str, list[float]] | None = None,
    ) -> dict[int, tuple[int, ...] | range]:
        """The cells of each condition (hashable: a tuple, or the run of a continuous
        column's cells as a ``range``). A continuous column's ``between`` takes the cells
        whose midpoint lies in the range; the range those cells cover (original units) is
        written into ``answered``: that is what the answer estimates, not the range asked."""
        terms: dict[int, tuple[int, ...] | range] = {}
        for name, condition in where.items():
            j = columns.index.get(name)
            if j is None:
                raise InvalidRequest(
                    f"column {name!r} is not a perturbed column of this release "
                    f"({sorted(columns.index)})"
                )
            column = columns.perturbed[j]
            values = condition if isinstance(condition, list) else [condition]
            if column.kind == "categorical":
                if any(isinstance(v, bool) for v in values):  # str(True) could match "True"
                    raise InvalidRequest(
                        f"column {name!r} is categorical: name a category, not true or false"
                    )
                # categories match in Unicode normal form C, as cells did at upload (a
                # category's own text first: see _Columns)
                labels = columns.labels[j]
                asked = [
                    text if (text := str(v)) in labels else unicodedata.normalize("NFC", text)
                    for v in values
                ]
                missing = [v for v, text in zip(values, asked, strict=True) if text not in labels]
                if missing or isinstance(condition, dict):
                    raise InvalidRequest(f"column {name!r} has no category {missing}")
                cells: tuple[int, ...] | range = tuple(labels[text] for text in asked)
            elif column.kind == "binary":
                if isinstance(condition, dict) or any(v not in (0, 1, True, False) for v in values):
                    raise InvalidRequest(f"column {name!r} is binary: use 0, 1, false or true")
                cells = tuple(1 if v in (1, True) else 0 for v in values)
            else:
                if not (isinstance(condition, dict) and set(condition) == {"between"}):
                    raise InvalidRequest(
                        f'column {name!r} is continuous: use {{"between": [low, high]}}'
                    )
                bounds = condition["between"]  # floats already (the Condition schema)
                if len(bounds) != 2 or not all(math.isfinite(v) for v in bounds):
                    raise InvalidRequest(
                        f'column {name!r}: "between" takes two finite numbers [low, high]'
                    )
                low, high = bounds
                # the midpoints (original units) ascend: those in [low, high] are a run
                midpoints = columns.midpoints[j]
                first = bisect.bisect_left(midpoints, low)
                end = bisect.bisect_right(midpoints, high)
                if first >= end:
                    raise InvalidRequest(f"no cell of column {name!r} lies in [{low}, {high}]")
                cells = range(first, end)
                if answered is not None:  # the run's outer edges
                    edges = columns.edges[j]
                    answered[name] = [edges[first], edges[end]]
            terms[j] = cells
        return terms

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        parsed = registry.validate_queries(_QUERIES, queries)
        release: rr.RRRelease = loaded["release"]
        domain = release.domain
        assert domain is not None
        counts = release.cell_counts
        values = 0 if counts.values is None else int(counts.values.size)
        registry.check_batch_work(
            len(parsed),
            counts.size + PUBLIC_VALUE_WORK * values,
            MAX_ANSWER_WORK,
            reads=f"the counts of its {counts.size} distinct released cells"
            + (f" over {values} public values" if values else ""),
        )
        columns = _Columns.of(self._perturbed(info), loaded["bits"])
        out = []
        for position, query in enumerate(parsed):
            answered: dict[str, Any] = {}
            try:
                row_query: Any
                if isinstance(query, ConjunctionQuery):
                    terms = self._terms(query.where, columns, answered)
                    if all(len(set(terms[a])) == domain.cardinalities[a] for a in terms):
                        # every value allowed: every row satisfies it (Definition 3 needs a
                        # row function that is not constant), exactly, with no noise
                        out.append(_every_row(query.estimator, answered))
                        continue
                    row_query = rr.Conjunction(domain, terms)
                elif isinstance(query, TableQuery):
                    if domain.size > MAX_TABLE_DOMAIN:
                        raise InvalidRequest(
                            f"table queries need a domain of at most {MAX_TABLE_DOMAIN} cells "
                            f"(this one has {domain.size}); use a conjunction"
                        )
                    if len(query.values) != domain.size:
                        raise InvalidRequest(
                            f"a table query needs {domain.size} values (one per cell)"
                        )
                    row_query = rr.Table(np.asarray(query.values, dtype=np.float64))
                else:
                    public_values = loaded["public_values"]
                    if public_values is None:
                        raise InvalidRequest("this release has no public column")
                    codes = {value: k for k, value in enumerate(public_values)}
                    unknown = sorted(set(query.by_public) - set(codes))
                    if unknown:
                        raise InvalidRequest(
                            f"values not in the released public column: {unknown[:10]}"
                        )
                    # one conjunction per distinct set of cells, shared by every public
                    # value whose condition selects it (the mechanism reads each once)
                    built: dict[Hashable, rr.Conjunction] = {}
                    functions: dict[int, rr.Conjunction] = {}
                    for key, where in query.by_public.items():
                        terms = self._terms(where, columns, answered.setdefault(key, {}))
                        same = tuple(terms.items())
                        if (conjunction := built.get(same)) is None:
                            conjunction = built[same] = rr.Conjunction(domain, terms)
                        functions[codes[key]] = conjunction
                    row_query = rr.Heterogeneous(functions)
                value, stderr, bound, interval = release.answer(
                    row_query, proper=query.estimator == "proper", level=LEVEL
                )
            except MechanismError as exc:
                raise InvalidRequest(f"queries.{position}: {exc}") from None
            except InvalidRequest as exc:
                raise InvalidRequest(f"queries.{position}: {exc.message}") from None
            item: dict[str, Any] = {
                "value": value,
                "stderr": stderr,
                "interval": list(interval),
                "error_bound": bound,
                "estimator": query.estimator,
                "note": "stderr: exact worst case over databases of this size; interval: "
                "95 %, value +- 1.96 stderr (normal approximation) clipped to the range of "
                "the row function (every exact answer lies there); error_bound: paper 004 "
                "bound (20)/(22)",
            }
            answered = {k: v for k, v in answered.items() if v}
            if answered:
                item["answered_ranges"] = answered
                item["note"] += (
                    "; a continuous 'between' is answered on the released cells whose "
                    "midpoints lie in the range: value, stderr, interval and bound are for "
                    "the fraction of rows in answered_ranges (cell edges, original units), "
                    "not in the range asked, which can differ by the mass of the edge cells"
                )
            out.append(item)
        return out


registry.register(RandomizedResponse())
