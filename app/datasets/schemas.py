"""The curator's declared schema, and the datasets endpoints' bodies.

The declaration is public by definition (bounds and categories are what the curator
says, never what the data says, DESIGN §2 rule 1), so error messages about it may quote
it; error messages about the *file* never quote a cell.
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
import uuid
from collections import Counter
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from app.core.types import PLAIN_NUMBER, Name, control_character_error, integral_number

#: Column names and categories have no character rule of their own: these types also read
#: the declarations stored before there was one (``DatasetOut``, the columns a release
#: reads). A new declaration's are checked by :func:`declared_text_error`.
ColumnName = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Category = Annotated[str, StringConstraints(min_length=1, max_length=200)] | int

MAX_COLUMNS = 2_000
#: The longest cell of an upload, in bytes (enforced by :mod:`app.datasets.validation`,
#: which says why), and so the most a public column's ``max_bytes`` may declare.
MAX_CELL_BYTES = 1024
MAX_CATEGORIES = 10_000
#: The widest declared range ``upper - lower``: half the largest double. Normalisation
#: computes ``2 (x - lower)`` and releases map back with ``(x' + 1) (upper - lower)``,
#: both of which overflow to infinity past it.
MAX_BOUND_WIDTH = sys.float_info.max / 2
#: A budget total's epsilon range, at upload and on PATCH: the ledger's resolution is
#: 1e-12 (app.ledger.units), its largest total 1e6.
MIN_EPSILON_TOTAL = 1e-12
MAX_EPSILON_TOTAL = 1e6


#: The first characters on which a spreadsheet reads a cell as a formula (OWASP, "CSV
#: injection"; its tab and carriage return are control characters, refused anyway).
FORMULA_TRIGGERS = ("=", "+", "-", "@")
#: What a formula needs to do more than arithmetic on cells: call a function
#: (``HYPERLINK(...)``, ``WEBSERVICE(...)``) or another program (DDE: ``cmd|' /C calc'!A0``).
FORMULA_CALLS = ("(", "|", "!")
#: A plain decimal number (:data:`app.core.types.PLAIN_NUMBER`): a spreadsheet reads one
#: that starts with a sign as a number, not as a formula.
_PLAIN_NUMBER = re.compile(PLAIN_NUMBER)


def declared_text_error(text: str) -> str | None:
    """Why ``text`` cannot be a new declaration's column name or category, or None. Both
    are written as they are into the synthetic CSV (its header, a categorical column's
    cells), which analysts open in spreadsheets: no control characters (the text is then
    never quoted back); no ``=`` first, and no ``+``, ``-`` or ``@`` first in a text that
    also holds ``(``, ``|`` or ``!`` (a formula that calls a function or a program), unless
    the text is a plain number. A sign alone or before other text (``+``, ``-10 to -5``,
    ``-1,000``) is data that tables hold (a rhesus factor, a binned range): a spreadsheet
    may show it as an error or a sum, but runs nothing."""
    problem = control_character_error(text)
    if problem is not None:
        return problem
    if not text.startswith(FORMULA_TRIGGERS) or _PLAIN_NUMBER.fullmatch(text) is not None:
        return None
    if text.startswith("="):
        return (
            f"{text!r} starts with '=': a spreadsheet opening the synthetic CSV would run it "
            "as a formula; a column name or category may not start with '='"
        )
    calls = [c for c in FORMULA_CALLS if c in text]
    if calls:
        return (
            f"{text!r} starts with {text[0]!r} and holds {calls[0]!r}: a spreadsheet opening "
            "the synthetic CSV would run it as a formula; a column name or category that "
            f"starts with {', '.join(FORMULA_TRIGGERS[1:-1])} or {FORMULA_TRIGGERS[-1]} may "
            f"not hold {', '.join(FORMULA_CALLS[:-1])} or {FORMULA_CALLS[-1]} (a function "
            "call or another program)"
        )
    return None


def _epsilon_total_error(epsilon: float) -> str | None:
    """Why ``epsilon`` cannot be a budget total, or None if it can."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        return "must be a positive finite number"
    if not MIN_EPSILON_TOTAL <= epsilon <= MAX_EPSILON_TOTAL:
        return f"must lie in [{MIN_EPSILON_TOTAL:g}, {MAX_EPSILON_TOTAL:g}] (the ledger's range)"
    return None


class ContinuousColumn(BaseModel):
    """A real-valued column with public bounds; stored normalised to ``[-1, 1]``:
    ``x' = 2 (x - lower) / (upper - lower) - 1``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ColumnName
    kind: Literal["continuous"]
    lower: float
    upper: float

    @model_validator(mode="after")
    def _bounds(self) -> ContinuousColumn:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
            raise ValueError(f"column {self.name!r}: lower and upper must be finite numbers")
        if not math.isfinite(self.upper - self.lower):
            # 2 (x - lower) / (upper - lower) would be inf / inf = NaN for large x: the
            # stored column would mark which rows lie above a threshold (a data-dependent
            # failure at measure time), so such bounds are refused up front.
            raise ValueError(
                f"column {self.name!r}: upper - lower must be a finite number "
                "(the bounds are too far apart for double precision)"
            )
        if not self.lower < self.upper:
            raise ValueError(
                f"column {self.name!r}: lower ({self.lower}) must be < upper ({self.upper})"
            )
        return self


class CategoricalColumn(BaseModel):
    """A column taking one of the declared categories; stored as the category's index.
    Cells match categories by their text (``"3"`` matches category ``3``), trimmed of
    surrounding whitespace (a declaration refuses categories that have some)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ColumnName
    kind: Literal["categorical"]
    categories: Annotated[list[Category], Field(min_length=1, max_length=MAX_CATEGORIES)]

    @model_validator(mode="after")
    def _distinct(self) -> CategoricalColumn:
        labels = [str(c) for c in self.categories]
        if len(set(labels)) != len(labels):
            raise ValueError(f"column {self.name!r}: categories must be distinct")
        return self

    @property
    def labels(self) -> list[str]:
        return [str(c) for c in self.categories]


class BinaryColumn(BaseModel):
    """A 0/1 column (cells ``0``, ``1``, ``true``, ``false``); stored as 0/1."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ColumnName
    kind: Literal["binary"]


class PublicColumn(BaseModel):
    """A column the curator declares public (an identifier such as a movie id): stored as
    text and released unperturbed by mechanisms that use it (``randomized_response``'s
    heterogeneous queries). Declaring a column public is the curator's decision, and it
    narrows the guarantee: the column is released row by row, so differential privacy then
    holds between datasets that agree on it (the release's ``guarantee`` says so)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: ColumnName
    kind: Literal["public"]
    #: The longest value, in UTF-8 bytes (of the cell as stored: its surrounding spaces
    #: trimmed), declared by the curator: an upload with a longer cell is refused, and a
    #: release predicts its files' size from it (``CURATOR_MAX_RELEASE_BYTES``). A column
    #: declared without it, or stored before it existed, reads as the cell limit, 1024.
    max_bytes: Annotated[int, Field(ge=1, le=MAX_CELL_BYTES), BeforeValidator(integral_number)] = (
        MAX_CELL_BYTES
    )


Column = Annotated[
    ContinuousColumn | CategoricalColumn | BinaryColumn | PublicColumn,
    Field(discriminator="kind"),
]


class PublicColumnOut(PublicColumn):
    """A public column as a response shows it: ``max_bytes`` always sent (1024 for a
    column declared, or stored, without it), so required in the response's schema."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


#: A stored column as a response shows it (:class:`DatasetOut`).
ColumnOut = Annotated[
    ContinuousColumn | CategoricalColumn | BinaryColumn | PublicColumnOut,
    Field(discriminator="kind"),
]


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # strict: a budget is a JSON number, never true or "1" (lax mode read both)
    epsilon: float = Field(strict=True)
    delta: float = Field(default=0.0, strict=True)

    @model_validator(mode="after")
    def _valid(self) -> BudgetIn:
        problem = _epsilon_total_error(self.epsilon)
        if problem is not None:
            raise ValueError(f"budget.epsilon ({self.epsilon}) {problem}")
        if not (0.0 <= self.delta < 1.0):
            raise ValueError(f"budget.delta ({self.delta}) must lie in [0, 1)")
        return self


class DatasetDeclaration(BaseModel):
    """The ``schema`` form field of ``POST /v1/datasets`` for a table."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name  # DatasetOut reads stored names as plain text (named before the rule)
    kind: Literal["table"] = "table"
    columns: Annotated[list[Column], Field(min_length=1, max_length=MAX_COLUMNS)]
    budget: BudgetIn
    out_of_bounds: Literal["clip", "reject"] = "clip"
    allow_non_dp_releases: bool = False

    @model_validator(mode="after")
    def _unique_names(self) -> DatasetDeclaration:
        counts = Counter(c.name for c in self.columns)
        duplicates = sorted(name for name, count in counts.items() if count > 1)
        if duplicates:
            raise ValueError(f"duplicate column names in the schema: {duplicates}")
        # Checked on the declaration only, not on the column models: a stored dataset's
        # columns are validated again each time they are shown, and may predate these.
        for column in self.columns:
            # Wider bounds normalised values above lower + MAX_BOUND_WIDTH to 1 and released
            # infinity for synthetic values near the upper bound (sample.csv held "inf").
            if (
                isinstance(column, ContinuousColumn)
                and column.upper - column.lower > MAX_BOUND_WIDTH
            ):
                raise ValueError(
                    f"column {column.name!r}: upper - lower ({column.upper - column.lower:g}) "
                    f"must be at most {MAX_BOUND_WIDTH:g}, half the largest double (the "
                    "normalisation computes 2 (x - lower), which would overflow)"
                )
            # Cells are matched with their surrounding whitespace trimmed: such a category
            # could never match one.
            if isinstance(column, CategoricalColumn):
                # and in Unicode normal form C, as cells are (validation): "é" typed as one
                # code point or as "e" and a combining accent is one category
                column.categories = [
                    unicodedata.normalize("NFC", c) if isinstance(c, str) else c
                    for c in column.categories
                ]
                labels = column.labels
                if len(set(labels)) != len(labels):
                    raise ValueError(
                        f"column {column.name!r}: categories must be distinct; two of them are "
                        "the same text in different Unicode forms (NFC and NFD)"
                    )
                for label in column.labels:
                    if label != label.strip():
                        raise ValueError(
                            f"column {column.name!r}: category {label!r} has leading or "
                            "trailing whitespace; cells are compared without it, so no cell "
                            "could match it"
                        )
        return self

    @model_validator(mode="after")
    def _spreadsheet_safe_text(self) -> DatasetDeclaration:
        # On the declaration only, as above: datasets declared before keep their names and
        # categories (README). After _unique_names: categories are checked in NFC, as stored.
        for i, column in enumerate(self.columns):
            problem = declared_text_error(column.name)
            if problem is not None:
                raise ValueError(f"columns.{i}.name: {problem}")
            if isinstance(column, CategoricalColumn):
                for k, category in enumerate(column.categories):
                    problem = None if isinstance(category, int) else declared_text_error(category)
                    if problem is not None:
                        raise ValueError(
                            f"columns.{i}.categories.{k} (column {column.name!r}): {problem}"
                        )
        return self


MAX_VERTICES = 20_000


class GraphDeclaration(BaseModel):
    """The ``schema`` form field for a graph: an undirected edge list over the vertex ids
    ``0..vertices-1``. The vertex count is public; the edges (and their number) are not."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: Name
    kind: Literal["graph"]
    vertices: Annotated[int, Field(ge=2, le=MAX_VERTICES), BeforeValidator(integral_number)]
    budget: BudgetIn


#: The declarations the ``schema`` part of an upload may hold (JSON): a table's
#: (``"kind": "table"``, the default) or a graph's (``"kind": "graph"``). Published in the
#: OpenAPI schema as that part's shape (``app.main.publish_schemas``).
UPLOAD_DECLARATIONS: tuple[type[BaseModel], ...] = (DatasetDeclaration, GraphDeclaration)


class BudgetSummary(BaseModel):
    epsilon_total: float
    delta_total: float
    epsilon_spent: float
    delta_spent: float
    epsilon_reserved: float
    delta_reserved: float
    epsilon_remaining: float
    delta_remaining: float


class ValidationReport(BaseModel):
    """What validation found, shown to the dataset's curator only. ``clipped`` (values
    clipped per column) is an exact statistic of the data: it is in the upload's own
    response, a report on the file the curator just sent, and is never stored or shown
    again (``None`` afterwards; privacy rule 5)."""

    # every field is sent, also those with a default: the schema marks them required
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    format: Literal["csv", "parquet", "edge_list"]
    n_rows: int | None
    clipped: dict[str, int] | None = Field(
        default=None, description="values clipped per column; in the upload response only"
    )


class DatasetOut(BaseModel):
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: uuid.UUID
    name: str
    kind: Literal["table", "graph"]
    owner_id: uuid.UUID
    columns: list[ColumnOut]
    n_rows: int | None = Field(description="rows of a table (public); None for a graph")
    n_vertices: int | None = Field(description="vertex count of a graph (public)")
    out_of_bounds: Literal["clip", "reject"]
    allow_non_dp_releases: bool
    budget: BudgetSummary
    created_at: datetime
    data_deleted_at: datetime | None = Field(
        description="when the curator deleted the stored rows (DELETE .../data); the "
        "dataset then takes no new release, and its releases stay"
    )
    validation: ValidationReport | None = Field(
        default=None, description="present for the dataset's curator only"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="advice on the declaration, e.g. a delta total not below 1/n_rows",
    )


class DatasetUpdate(BaseModel):
    """The curator's opt-in for releases that are not differentially private
    (``compressed``); ``false`` withdraws it."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"allow_non_dp_releases": True}]},
    )

    allow_non_dp_releases: bool


class LedgerEntryOut(BaseModel):
    id: int
    kind: Literal["reserve", "commit", "refund", "non_dp"]
    release_id: uuid.UUID
    epsilon: float
    delta: float
    actor: str
    created_at: datetime


class BudgetOut(BudgetSummary):
    entries: list[LedgerEntryOut]


class BudgetUpdate(BaseModel):
    """New totals. A total may go up, or down to no less than spent + reserved."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"epsilon": 10.0}, {"epsilon": 10.0, "delta": 1e-6}]},
    )

    epsilon: float | None = None
    delta: float | None = None

    @model_validator(mode="after")
    def _valid(self) -> BudgetUpdate:
        if self.epsilon is None and self.delta is None:
            raise ValueError("give epsilon, delta or both")
        problem = None if self.epsilon is None else _epsilon_total_error(self.epsilon)
        if problem is not None:
            raise ValueError(f"epsilon ({self.epsilon}) {problem}")
        if self.delta is not None and not (0.0 <= self.delta < 1.0):
            raise ValueError(f"delta ({self.delta}) must lie in [0, 1)")
        return self


class GrantCreate(BaseModel):
    """The analyst to grant read access to the dataset (a user id)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"user_id": "0b7c2f4e-8f1a-4c55-9d3e-2a6b1c9e7f10"}]},
    )

    user_id: uuid.UUID


class GrantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    dataset_id: uuid.UUID
    user_id: uuid.UUID
    granted_by: uuid.UUID
    created_at: datetime
