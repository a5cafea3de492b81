"""Release type ``compressed``: paper 002's random projection ``Phi X``.

NOT differential privacy. With a declared ``reference`` covariance the guarantee is paper
002's distributional privacy, with the bound ``alpha`` of Theorem 4.6 (infinite where the
theorem's conditions fail); every response names it. The release needs the curator's
opt-in on the dataset, takes no epsilon, and is recorded in the ledger as ``non_dp``.
Without a declared ``reference`` the truncation region depends on the data (see
:mod:`app.mechanisms.compressed`), which the theorem does not cover, so the release claims
no guarantee (:data:`app.mechanisms.compressed.DATA_REFERENCE_GUARANTEE`, in every
response from the request on); and ``alpha`` would be computed from two eigenvalues of the
data's own covariance, an exact statistic: it is then neither computed, stored nor reported
(``alpha: null`` with :data:`DATA_REFERENCE_NOTE`). Migration 0011 removed it from the
records and responses of releases measured before this rule; a ``release.json`` they wrote
keeps it (and the old label) until they are re-synthesised.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from app.core.errors import InvalidRequest
from app.core.types import Integer, integral_number
from app.mechanisms import compressed as cp
from app.mechanisms.errors import MechanismError
from app.releases import registry
from app.releases.payloads import pack, unpack
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage import sizes
from app.storage.source import EncryptedTableSource
from app.storage.tables import arrow_path


class CompressedParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    delta_max: float = Field(
        gt=0,
        lt=1,
        description="Delta_max of paper 002 (eq. 5-6), declared by the curator; in (0, 1) "
        "(Theorem 3.2)",
    )
    m: Annotated[int, Field(ge=1), BeforeValidator(integral_number)] | None = Field(
        default=None, description="rows of Phi X; default: the smallest m paper 002 allows"
    )
    reference: list[list[float]] | None = Field(
        default=None,
        description="declared reference normalised covariance Sigma_1 (p x p); without it the "
        "data's own is used, the release claims no proven guarantee (Theorem 4.6 needs a "
        "declared reference) and no alpha is reported (it would be a statistic of the data)",
    )


class PCAQuery(BaseModel):
    """Top-k principal directions of the compressed covariance (of the normalised
    columns); ``k`` at most the number of released columns. Accepted by ``compressed``
    releases."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra={"examples": [{"type": "pca", "k": 2}]}
    )

    type: Literal["pca"]
    k: Integer = Field(ge=1)


_QUERIES: TypeAdapter[list[Annotated[PCAQuery, Field(discriminator="type")]]] = TypeAdapter(
    list[Annotated[PCAQuery, Field(discriminator="type")]]
)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


#: The measure stage's progress share of the first read (the covariance); the draw of
#: ``Phi`` with the second read takes the rest, reported block by block
#: (:meth:`Compressed.measure_read_share`).
MEASURE_READ_SHARE = 0.1

#: Why a release with the data as its own reference reports no alpha.
DATA_REFERENCE_NOTE = (
    "not reported: without a declared reference the bound would be computed from the "
    "eigenvalues of the data's own covariance, an exact statistic of the data, and the "
    "truncation region moves with the data, which Theorem 4.6's proof does not cover; "
    "declare params.reference to get alpha"
)


def _alpha(release: cp.CompressedRelease) -> dict[str, Any]:
    """The published alpha fields: Theorem 4.6's bound for a declared reference (public
    quantities only), nothing for the data's own (:data:`DATA_REFERENCE_NOTE`)."""
    if release.alpha is None or release.alpha_pairwise is None:  # the data as reference
        return {"alpha": None, "alpha_pairwise": None, "alpha_note": DATA_REFERENCE_NOTE}
    return {
        "alpha": _finite(release.alpha),
        "alpha_pairwise": _finite(release.alpha_pairwise),
        "alpha_note": None
        if math.isfinite(release.alpha)
        else "infinite: Theorem 4.6's conditions do not hold for these parameters",
    }


class Compressed(registry.Mechanism):
    name: ClassVar[str] = "compressed"
    description: ClassVar[str] = "random projection Phi X of paper 002, for PCA"
    guarantee: ClassVar[str] = cp.GUARANTEE
    privacy_kind: ClassVar[str] = "non_dp"
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = CompressedParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = (PCAQuery,)
    #: Paper 002's guarantee is for one ``Phi X``: independent repeats average towards the
    #: data's normalised covariance (an audit: 50 releases took the Frobenius error from
    #: 0.22 to 0.02-0.035), and a declared reference's refusal (data outside ``S_n``),
    #: retried with moving references, bisected an entry of it to 2e-8 in 24 requests.
    single_release: ClassVar[bool] = True

    def guarantee_for(self, params: Mapping[str, Any]) -> str:
        """Paper 002's distributional privacy with a declared reference; no proven guarantee
        with the data's own (:func:`app.mechanisms.compressed.guarantee_of`)."""
        return cp.guarantee_of("data" if params.get("reference") is None else "declared")

    def _m(self, info: DatasetInfo, params: BaseModel) -> int:
        assert isinstance(params, CompressedParams)
        return params.m if params.m is not None else cp.min_rows(info.n_rows, info.d)

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        assert isinstance(params, CompressedParams)
        m, floor = self._m(info, params), cp.min_rows(info.n_rows, info.d)
        if m < floor:
            raise InvalidRequest(f"m ({m}) must be at least 2 (C1 + C2) ln(2 n p) = {floor}")
        if m >= info.n_rows:
            raise InvalidRequest(
                f"m ({m}) must be below n ({info.n_rows}): compression needs m < n "
                f"(the smallest allowed m here is {floor})"
            )
        cp.check_projection_size(info.n_rows, info.d, m)
        if params.reference is not None and (
            len(params.reference) != info.d or any(len(r) != info.d for r in params.reference)
        ):
            raise InvalidRequest(f"reference must be a {info.d} x {info.d} matrix")
        if params.reference is not None:
            # Finite, symmetric, positive definite, each diagonal entry within delta_max
            # of 1 or 0: a MechanismError here is the request's 422, before anything is
            # reserved (the release checks again, before reading the data, for a request
            # recorded before a check was added).
            cp.check_reference(params.reference, info.d, params.delta_max)

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        assert isinstance(params, CompressedParams)
        m = self._m(info, params)
        return {
            "resolved": {
                "m": m,
                "min_m": cp.min_rows(info.n_rows, info.d),
                "truncation_radius": cp.truncation_radius(info.n_rows, info.d, m, params.delta_max),
                "guarantee": self.guarantee_for(params.model_dump()),
            },
            "accuracy": {
                "note": "alpha (Theorem 4.6) and the PCA projector bound are computed at release "
                "time; alpha is reported only with a declared reference (without one it "
                "would be a statistic of the data)",
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
        """``compressed.parquet`` (``m`` rows of ``d`` floats, one row group) and
        ``release.json`` (which lists the column names), bounded by
        :mod:`app.storage.sizes`."""
        m, names = self._m(info, params), info.names
        return sizes.files(
            sizes.parquet_bytes(m, [sizes.PARQUET_FLOAT_CELL] * len(names), names),
            sizes.JSON_ALLOWANCE + sum(sizes.json_text(name) + 16 for name in names),
        )

    def measure_read_share(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> float:
        """The first read only sums the rows' covariance; the draw of ``Phi`` (``m n``
        normals from OpenDP's CSPRNG, 36-65 ns each) with the second is most of the work."""
        return MEASURE_READ_SHARE

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        assert isinstance(params, CompressedParams)
        release = cp.release(
            source,
            self._m(info, params),
            params.delta_max,
            reference=None if params.reference is None else np.asarray(params.reference),
            progress=progress,
        )
        return Measured(
            payload=pack(release.to_dict()),
            privacy_cost=release.privacy_cost,
            resolved={
                "m": release.m,
                **_alpha(release),
                "reference": release.reference_kind,
                "guarantee": release.guarantee,
            },
        )

    def load(
        self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path
    ) -> cp.CompressedRelease:
        return cp.CompressedRelease.from_dict(unpack(payload))

    def synthesize(
        self,
        payload: Mapping[str, Any],
        info: DatasetInfo,
        params: BaseModel,
        rng: np.random.Generator,
        workdir: Path,
        progress: ProgressFn,
    ) -> Synthesized:
        release = self.load(payload, info, workdir)
        table = pa.table({name: release.matrix[:, j] for j, name in enumerate(info.names)})
        pq.write_table(table, arrow_path(workdir / "compressed.parquet"))
        (workdir / "release.json").write_text(
            json.dumps(
                {
                    "mechanism": "compressed (paper 002)",
                    "guarantee": release.guarantee,
                    "m": release.m,
                    "n": release.n,
                    "delta_max": release.delta_max,
                    **_alpha(release),
                    "columns": info.names,
                    "note": "columns of X were normalised as paper 002 eq. (4) before "
                    "compression; the normalising scales are not released",
                },
                indent=1,
            )
        )
        return Synthesized(
            artifacts={
                "compressed.parquet": ArtifactInfo(
                    "compressed.parquet",
                    "application/vnd.apache.parquet",
                    f"Phi X ({release.m} x {release.p}); {release.guarantee}",
                ),
                "release.json": ArtifactInfo(
                    "release.json", "application/json", "the guarantee and its alpha bound"
                ),
            },
            summary={"m": release.m},
        )

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        parsed = registry.validate_queries(_QUERIES, queries)
        release: cp.CompressedRelease = loaded
        out = []
        for position, query in enumerate(parsed):
            try:
                result = release.pca(query.k)
            except MechanismError as exc:
                raise InvalidRequest(f"queries.{position}: {exc}") from None
            out.append(
                {
                    "value": {
                        "columns": info.names,
                        "components": result.components.tolist(),
                        "explained_variance": result.explained_variance.tolist(),
                        "explained_variance_ratio": result.explained_variance_ratio.tolist(),
                    },
                    "stderr": None,
                    "interval": None,
                    "error_bound": result.projector_error_bound,
                    "guarantee": release.guarantee,
                    "note": "PCA of the compressed covariance of the normalised columns; "
                    "error_bound: Proposition 3.4 bound on the projector error (None where "
                    "it does not apply)",
                }
            )
        return out


registry.register(Compressed())
