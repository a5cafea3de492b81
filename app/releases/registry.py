"""Release types: how each mechanism plugs into the release lifecycle.

A :class:`Mechanism` adapts one library mechanism of :mod:`app.mechanisms` to the
service. It validates the request's parameters without touching data (``parse_params``,
``check``), predicts cost and accuracy (``preview``), measures from a
:class:`~app.mechanisms.data.RowSource` (the only call that sees raw rows), turns the
stored measurements into artifacts (``synthesize``: post-processing only) and answers
queries from them (``answer``). Adapters are stateless singletons in :data:`REGISTRY`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, TypeAdapter, ValidationError

from app.core.errors import InvalidRequest, describe_errors
from app.datasets.schemas import MAX_CELL_BYTES
from app.mechanisms.privacy import PrivacyCost
from app.storage.source import EncryptedTableSource

ProgressFn = Callable[[float], None]


def _within_bounds(
    original: NDArray[np.float64],
    lower: float | NDArray[np.float64],
    upper: float | NDArray[np.float64],
) -> NDArray[np.float64]:
    """``original`` clipped to ``[lower, upper]``. The map back from ``[-1, 1]`` rounds:
    ``lower + 2 (upper - lower) / 2`` is one or a few units in the last place past
    ``upper`` for many bounds (``-5 + 5.2 = 0.20000000000000018`` for ``[-5, 0.2]``), and
    a released point at exactly 1 (a histogram's atom at the bound, the moment LP's grid)
    was a value outside the declared domain. Clipping moves nothing else: every released
    normalised value lies in ``[-1, 1]``."""
    clipped: NDArray[np.float64] = np.clip(original, lower, upper)
    return clipped


@dataclass(frozen=True)
class ColumnInfo:
    """A released column as declared by the curator (public)."""

    name: str
    kind: str
    lower: float | None = None
    upper: float | None = None
    categories: tuple[str, ...] | None = None
    #: A public column's longest value in UTF-8 bytes, as declared (a declaration stored
    #: before ``max_bytes`` existed: the cell limit, 1024); None for other kinds.
    max_bytes: int | None = None

    def to_original(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Undo the normalisation of a continuous column: ``lower + (x' + 1)(upper - lower)/2``
        for ``x'`` in ``[-1, 1]``, held inside ``[lower, upper]`` (:func:`_within_bounds`)."""
        if self.lower is None or self.upper is None:
            raise ValueError(f"column {self.name!r} has no declared bounds")
        original = (
            self.lower + (np.asarray(x, dtype=np.float64) + 1.0) * (self.upper - self.lower) / 2.0
        )
        return _within_bounds(original, self.lower, self.upper)

    @classmethod
    def from_declared(cls, spec: Mapping[str, Any]) -> ColumnInfo:
        categories = spec.get("categories")
        return cls(
            name=str(spec["name"]),
            kind=str(spec["kind"]),
            lower=float(spec["lower"]) if "lower" in spec else None,
            upper=float(spec["upper"]) if "upper" in spec else None,
            categories=tuple(str(c) for c in categories) if categories is not None else None,
            max_bytes=(
                int(spec.get("max_bytes", MAX_CELL_BYTES)) if spec["kind"] == "public" else None
            ),
        )


@dataclass(frozen=True)
class DatasetInfo:
    """What a mechanism may know about the dataset: public by design (n and the schema of
    a table; the vertex count of a graph, whose edge count is private)."""

    #: Rows of a table (public). 0 for a graph: its edge count is private.
    n_rows: int
    columns: tuple[ColumnInfo, ...]
    n_vertices: int | None = None

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def d(self) -> int:
        return len(self.columns)

    def bounds(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        lower = np.array([c.lower for c in self.columns], dtype=np.float64)
        upper = np.array([c.upper for c in self.columns], dtype=np.float64)
        return lower, upper

    def to_original(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Undo the normalisation: ``x = lower + (x' + 1) (upper - lower) / 2`` for ``x'`` in
        ``[-1, 1]``, held inside the declared bounds (:func:`_within_bounds`)."""
        lower, upper = self.bounds()
        original = lower + (np.asarray(X, dtype=np.float64) + 1.0) * (upper - lower) / 2.0
        return _within_bounds(original, lower, upper)

    def to_normalised(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        lower, upper = self.bounds()
        return 2.0 * (np.asarray(X, dtype=np.float64) - lower) / (upper - lower) - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_vertices": self.n_vertices,
            "n_rows": self.n_rows,
            "columns": [{k: v for k, v in vars(c).items() if v is not None} for c in self.columns],
        }


@dataclass(frozen=True)
class Measured:
    """What the measure stage persists: JSON-safe noisy measurements and what they cost."""

    payload: dict[str, Any]
    privacy_cost: PrivacyCost
    resolved: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArtifactInfo:
    file: str
    media_type: str
    description: str


@dataclass(frozen=True)
class Synthesized:
    """Files written by the synthesise stage (name -> info) and a summary of how."""

    artifacts: dict[str, ArtifactInfo]
    summary: dict[str, Any] = field(default_factory=dict)


class Mechanism(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    guarantee: ClassVar[str] = "differential privacy"
    #: ``"dp"``: the request's (epsilon, delta) is reserved and spent. ``"non_dp"``: the
    #: guarantee is something else (stated in ``guarantee``); the request carries no
    #: epsilon, the dataset must allow non-DP releases, and the ledger records a
    #: ``non_dp`` entry that never enters the epsilon sums.
    privacy_kind: ClassVar[str] = "dp"
    dataset_kinds: ClassVar[frozenset[str]] = frozenset({"table"})
    #: Column kinds the mechanism releases; the default column set is every such column.
    column_kinds: ClassVar[frozenset[str]]
    Params: ClassVar[type[BaseModel]]
    #: The JSON query forms :meth:`answer` accepts (models with a ``type`` literal), as the
    #: OpenAPI schema publishes them (``app.answers.schemas``): the adapter validates a
    #: batch against these same models. Empty for a release type that answers no queries.
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = ()
    #: Params fields that a re-synthesis may change (post-processing only).
    post_processing: ClassVar[frozenset[str]] = frozenset()
    #: Whether the request's delta must be > 0.
    requires_delta: ClassVar[bool] = False
    #: At most one release of this mechanism per dataset (any that read the data, or is
    #: still running, counts): for a release whose guarantee covers one output only, so
    #: that repeats cannot be averaged, nor its data-dependent refusals bisected.
    single_release: ClassVar[bool] = False

    def parse_params(self, raw: Mapping[str, Any]) -> BaseModel:
        try:
            return self.Params.model_validate(dict(raw))
        except ValidationError as exc:
            problems = describe_errors(exc.errors(include_input=False), "params")
            raise InvalidRequest(f"invalid parameters for {self.name}: {problems}") from None

    def resolve_params(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> BaseModel:
        """Fill defaults that depend on the request (public values only) before
        :meth:`check`; the result is what the release stores. By default: unchanged."""
        return params

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        """Refuse (InvalidRequest) what cannot work, before any budget is reserved."""
        if self.requires_delta and delta <= 0:
            raise InvalidRequest(f"{self.name} with these parameters needs delta > 0")

    def guarantee_for(self, params: Mapping[str, Any]) -> str:
        """The guarantee a release with these params (as stored, or as the request's JSON)
        carries, as every response names it. By default :attr:`guarantee`; a mechanism
        whose guarantee depends on a parameter says which applies."""
        return self.guarantee

    def post_processing_for(self, stored: Mapping[str, Any]) -> frozenset[str]:
        """The :attr:`post_processing` fields a re-synthesis of a release with these
        stored params may change (the list a refusal names). By default all of them."""
        return self.post_processing

    def shown_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The part of a release's stored ``params`` that its output shows (of its
        ``synthesis_params``: those in :meth:`post_processing_for`). The stored dict keeps
        every field of :attr:`Params` (the request's hash and a re-synthesis read it); a
        mechanism whose fields depend on a choice among them shows the ones that apply.
        By default: all."""
        return dict(params)

    def check_post_processing(self, stored: Mapping[str, Any], changes: Mapping[str, Any]) -> None:
        """Refuse (InvalidRequest), with the reason, re-synthesis ``changes`` that the stored
        release cannot use (``stored``: its params as requested), before the generic
        refusal of fields outside :meth:`post_processing_for`. By default: none."""
        return None

    def check_synthesis(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> None:
        """Refuse (InvalidRequest or MechanismError) a synthesis whose ``params`` cannot run
        (the post-processing part of :meth:`check`, e.g. an LP or a sample too big for
        memory). A new request's :meth:`check` runs it before any budget is reserved; a
        re-synthesis runs it on the merged ``params`` before the release leaves its current
        state. By default nothing to check."""
        return None

    @abstractmethod
    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        """Resolved parameters and predicted accuracy, from public information only."""

    def checked_preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        """:meth:`check`, then :meth:`preview`: what a request (or its preview) runs. A
        mechanism whose check and preview make the same plan (the smooth ones) overrides
        it to make the plan once and pass it along."""
        self.check(info, epsilon, delta, params)
        return self.preview(info, epsilon, delta, params)

    @abstractmethod
    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        """An upper bound on the bytes of the files :meth:`synthesize` writes for these
        ``params`` (a request's resolved ones, or a re-synthesis's merged ones), from
        public values only: the rows and columns of each file times its format's largest
        cell (:mod:`app.storage.sizes`). ``resolved`` is what the mechanism resolved
        without data: a request's :meth:`preview` ``resolved``, or a re-synthesis's stored
        ``Release.resolved`` (the measure stage's). A request, or a re-synthesis, whose
        bound exceeds ``CURATOR_MAX_RELEASE_BYTES`` is refused before anything is
        reserved or changed (:func:`app.releases.service.check_release_bytes`)."""

    def measure_read_share(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> float:
        """The share of the measure stage's progress that reading the rows fills (rows
        read over stored rows, up to this share); the rest is the mechanism's work after
        its first read, which :meth:`measure` reports through its ``progress``. By default
        1.0: the read is the work, and ``progress`` is never called."""
        return 1.0

    @abstractmethod
    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        """Read the data once and return noisy measurements costing at most (epsilon, delta).

        ``source`` streams the release's columns: ``source.batches()`` as float64 (values
        normalised to ``[-1, 1]``, category codes, 0/1) or ``source.codes()`` as Arrow
        batches (with the text of public columns).

        ``progress``, if given, is called with the fraction (0 to 1, never decreasing) of
        the mechanism's work after its first read of the rows (a second pass, a selection,
        a draw of noise): the stage publishes it above :meth:`measure_read_share`, and a
        cancel raises from it, so a long step that calls it is cancellable. Its fractions
        must follow from public values only (the steps done of a number fixed by ``n``,
        ``d`` and the parameters), never from the data."""

    @abstractmethod
    def synthesize(
        self,
        payload: Mapping[str, Any],
        info: DatasetInfo,
        params: BaseModel,
        rng: np.random.Generator,
        workdir: Path,
        progress: ProgressFn,
    ) -> Synthesized:
        """Post-process stored measurements into artifacts written under ``workdir``."""

    def load(self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path) -> Any:
        """The object that answers queries, rebuilt from the stored measurements and, where
        the answers come from synthesised output, the current artifacts (the service caches
        it per release and synthesis version)."""
        raise InvalidRequest(f"{self.name} releases do not answer queries")

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """Answer a batch of queries given in this release type's JSON forms (no budget)."""
        raise InvalidRequest(f"{self.name} releases do not answer queries")


QueryT = TypeVar("QueryT")


def validate_queries(forms: TypeAdapter[list[QueryT]], queries: Sequence[Any]) -> list[QueryT]:
    """Parse a batch of JSON queries into a release type's closed set of forms, or 422
    naming each problem (without the submitted values)."""
    try:
        return forms.validate_python(list(queries))
    except ValidationError as exc:
        raise InvalidRequest(
            "invalid queries: " + describe_errors(exc.errors(include_input=False), "queries")
        ) from None


def check_batch_work(
    queries: int, per_query: int, limit: int, *, what: str = "queries", reads: str
) -> None:
    """422 for a batch whose ``queries`` answers, each ``per_query`` units of work (rows or
    edges it reads; public sizes), exceed ``limit``, saying how many fit in one request."""
    if queries * per_query > limit:
        raise InvalidRequest(
            f"{queries} {what} are more than one request may ask of this release (each "
            f"reads {reads}): at most {max(1, limit // per_query)} per request; split the "
            "batch"
        )


def check_total_work(
    queries: int,
    work: int,
    limit: int,
    *,
    what: str = "queries",
    costs: str,
    smaller: str,
    at_least: bool = False,
) -> None:
    """422 for a batch whose answers take ``work`` units in all (computed from public sizes
    before anything is answered) over ``limit``: it says about how many queries like these
    fit in one request, or, when not even one does, how to make them smaller
    (``smaller``). ``costs`` says what a unit of the work counts. ``at_least``: ``work``
    is a lower bound (counted before the queries are parsed), and so the queries that fit
    an upper bound."""
    if work <= limit:
        return
    fit = queries * limit // work
    asked = f"{queries} {what} are" if queries != 1 else "this query is"
    head = (
        f"{asked} more than one request may ask of this release: "
        f"{'at least ' if at_least else ''}{work:.3g} units of work "
        f"({costs}), at most {limit:.3g} a request"
    )
    if fit >= 1:
        about = "at most about" if at_least else "about"
        raise InvalidRequest(
            f"{head}; {about} {fit} like these fit in one request: split the batch"
        )
    alone = "not even one of them fits" if queries != 1 else "it does not fit on its own"
    raise InvalidRequest(f"{head}; {alone}: {smaller}")


REGISTRY: dict[str, Mechanism] = {}


def register(mechanism: Mechanism) -> Mechanism:
    REGISTRY[mechanism.name] = mechanism
    return mechanism


def get(name: str) -> Mechanism:
    try:
        return REGISTRY[name]
    except KeyError:
        available = ", ".join(sorted(REGISTRY)) or "none"
        raise InvalidRequest(f"unknown mechanism {name!r}; available: {available}") from None
