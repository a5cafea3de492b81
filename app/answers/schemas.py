"""Bodies of ``POST /v1/releases/{id}/answers``."""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_QUERIES = 100_000


class AnswerRequest(BaseModel):
    """A batch of queries in the release type's JSON forms (a closed set; nothing is
    evaluated as code)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "queries": [
                        {
                            "type": "product",
                            "space": "original",
                            "factors": {
                                "mean_radius": {"type": "gaussian", "center": 14, "sigma": 3}
                            },
                        }
                    ]
                },
                {
                    "queries": [
                        {"type": "conjunction", "where": {"diagnosis": "M"}},
                        {"type": "table", "values": [0.0, 1.0]},
                    ]
                },
                {"queries": [{"type": "cut", "S": [0, 1], "T": [2, 3]}]},
                {"queries": [{"type": "pca", "k": 2}]},
            ]
        },
    )

    queries: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=MAX_QUERIES,
        description="each an object whose 'type' is one of its release's forms (README, "
        "Answers): smooth_synthetic and smooth_synopsis: gaussian_mixture, polynomial, "
        "product; randomized_response: conjunction, table, heterogeneous; graph_cuts: cut; "
        "compressed: pca",
    )


class AnswersOut(BaseModel):
    release_id: uuid.UUID
    mechanism: str
    guarantee: str
    answers: list[dict[str, Any]] = Field(
        description="per query: value, stderr, interval (95 %) where the mechanism allows, "
        "and a note on what they mean"
    )
