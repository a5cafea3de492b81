"""Request and response bodies of the release endpoints."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, WrapValidator

from app.core.types import UnsignedZeroFloat, validated_as_declared
from app.datasets.schemas import MAX_COLUMNS, ColumnName
from app.releases import adapters, registry

#: ``params`` as the body carries it: any JSON object, validated by the release type
#: named in ``mechanism`` against its own model (``Mechanism.parse_params``: an unknown or
#: ill-typed parameter is that type's 422 ``invalid_request``, naming the mechanism). The
#: OpenAPI schema shows every release type's model (``Mechanism.Params``), so that a
#: generated client can build and check them; a schema only.
Params = Annotated[
    dict[str, Any],
    WrapValidator(
        validated_as_declared,
        json_schema_input_type=Union[  # noqa: UP007
            tuple(registry.REGISTRY[name].Params for name in adapters.__all__)
        ],
    ),
]

ReleaseStatus = Literal["queued", "measuring", "synthesizing", "succeeded", "failed", "cancelled"]


class ReleaseCreate(BaseModel):
    """A release request. ``columns`` defaults to every column the mechanism can release.
    ``epsilon`` is required for differentially private mechanisms and must be omitted for
    the non-DP ones (``compressed``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"mechanism": "smooth_synopsis", "epsilon": 1.0, "params": {"smoothness": 16}},
                {"mechanism": "smooth_synthetic", "epsilon": 1.0},
                {"mechanism": "smooth_synthetic", "epsilon": 1.0, "delta": 1e-7},
                {"mechanism": "randomized_response", "epsilon": 1.0, "columns": ["diagnosis"]},
                {"mechanism": "graph_cuts", "epsilon": 1.0},
                {"mechanism": "compressed", "params": {"delta_max": 0.5}},
            ]
        },
    )

    mechanism: str = Field(
        description="smooth_synthetic, smooth_synopsis or randomized_response (a table), "
        "graph_cuts (a graph), compressed (a table; not differentially private)",
        # the release types (``app.releases.adapters``), an enum a generated client can
        # offer; the body is validated against the registry (an unknown name is a 422)
        json_schema_extra={"enum": list(adapters.__all__)},
    )
    # strict: a privacy parameter is a JSON number, never true or "1" (lax mode read both)
    epsilon: float | None = Field(default=None, strict=True)
    delta: UnsignedZeroFloat = Field(default=0.0, strict=True)
    # no dataset declares more names, nor longer ones (distinct names of at most 200
    # characters): a longer list, or 2000 names of 30 000 characters, was read whole and
    # quoted back whole in the 422 (tens of MB)
    columns: list[ColumnName] | None = Field(default=None, min_length=1, max_length=MAX_COLUMNS)
    params: Params = Field(
        default_factory=dict,
        description="the mechanism's own parameters (README, Releases), one of the "
        "models shown, the one of the mechanism named; an unknown one is a 422",
    )


class ResynthesizeRequest(BaseModel):
    """New post-processing parameters; the stored measurements are reused, no budget spent."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"params": {"grid_size": 2000}}]}
    )

    params: Params = Field(
        default_factory=dict,
        description="post-processing parameters of the release's mechanism (README, "
        "Re-synthesis); a parameter of the measurement, or an unknown one, is a 422",
    )


class ArtifactOut(BaseModel):
    name: str
    media_type: str
    description: str
    url: str


class ReleaseOut(BaseModel):
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: uuid.UUID
    dataset_id: uuid.UUID
    mechanism: str
    guarantee: str
    status: ReleaseStatus
    progress: float = Field(description="fraction of the current stage done, 0 to 1")
    message: str | None
    cancel_requested: bool
    epsilon: float
    delta: float
    columns: list[str]
    params: dict[str, Any]
    synthesis_params: dict[str, Any]
    synthesis_version: int
    published_version: int | None = Field(
        description="the synthesis version whose artifacts and answers are served (null "
        "until one succeeded); a re-synthesis that runs, fails or is cancelled leaves it "
        "served"
    )
    resolved: dict[str, Any]
    accuracy: dict[str, Any] | None = Field(
        description="the accuracy predicted at the request from public values only (the "
        "preview's); null for releases recorded before the service kept it"
    )
    privacy_cost: dict[str, Any] | None
    artifacts: list[ArtifactOut]
    created_at: datetime
    updated_at: datetime
    measured_at: datetime | None
    finished_at: datetime | None
    files_deleted_at: datetime | None = Field(
        description="when its curator deleted its published files (DELETE "
        "/v1/releases/{id}/artifacts): downloads and answers are 410 until a re-synthesis "
        "publishes it again; null otherwise"
    )
    warnings: list[str] = Field(
        default_factory=list,
        description="advice on the release, e.g. a delta not below 1/n (the preview's)",
    )


class PreviewOut(BaseModel):
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    mechanism: str
    guarantee: str
    epsilon: float | None
    delta: float
    columns: list[str]
    params: dict[str, Any]
    resolved: dict[str, Any]
    accuracy: dict[str, Any]
    fits_budget: bool
    artifact_bytes: int = Field(
        description="an upper bound on the bytes of the release's files (every format), "
        "predicted from public values; at most CURATOR_MAX_RELEASE_BYTES"
    )
    remaining: dict[str, float]
    warnings: list[str] = Field(
        default_factory=list, description="advice on the request, e.g. a delta not below 1/n"
    )
