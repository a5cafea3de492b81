"""Bodies of ``POST /v1/releases/{id}/answers``."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, WrapValidator

from app.core.types import validated_as_declared
from app.releases import adapters, registry

MAX_QUERIES = 100_000


def _published_forms() -> tuple[type[BaseModel], ...]:
    """Every query form of the service's release types (``Mechanism.query_forms``), once
    each (``smooth_synthetic`` and ``smooth_synopsis`` share theirs). Two release types
    with different models under one ``type`` name could not be told apart by a client
    reading the discriminator: refused here (give one of them another name)."""
    forms: dict[str, type[BaseModel]] = {}
    for name in adapters.__all__:
        for form in registry.REGISTRY[name].query_forms:
            (tag,) = get_args(form.model_fields["type"].annotation)
            if forms.setdefault(tag, form) is not form:
                raise TypeError(f"two query forms are named {tag!r}: {forms[tag]} and {form}")
    return tuple(forms.values())


#: The published union of every release type's query forms, by ``type``. A schema only:
#: each release type validates a batch against its own forms (``Mechanism.answer``), so
#: a form of another release type stays that type's 422 ``invalid_request``.
QueryForm = Annotated[Union[_published_forms()], Field(discriminator="type")]  # type: ignore[valid-type]  # noqa: UP007


#: A query as the body carries it: any JSON object (checked as before, by the release
#: type); the OpenAPI schema shows :data:`QueryForm`.
Query = Annotated[
    dict[str, Any], WrapValidator(validated_as_declared, json_schema_input_type=QueryForm)
]


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

    queries: list[Query] = Field(
        min_length=1,
        max_length=MAX_QUERIES,
        description="each an object whose 'type' is one of its release's forms (README, "
        "Answers): smooth_synthetic and smooth_synopsis: gaussian_mixture, polynomial, "
        "product; randomized_response: conjunction, table, heterogeneous; graph_cuts: cut; "
        "compressed: pca",
    )


class Answer(BaseModel):
    """One query's answer. Every release type sends these four fields and adds its own,
    kept as sent: ``error_bound`` (``randomized_response``, ``graph_cuts``: a bound on the
    error; ``compressed``: Proposition 3.4's bound on the PCA projector error, null where it
    does not apply), ``guarantee`` (``compressed``), ``estimator`` and ``answered_ranges``
    (``randomized_response``), and ``smooth_synopsis``'s ``level``, ``noise_halfwidth``,
    ``truncation_estimate``, ``truncation_bound``, ``worst_case_interval``,
    ``independence_extrapolation``, ``dependence_log_factor``, ``method``, ``rigorous`` and
    ``within_smoothness``. ``note`` says what the numbers mean for the release type."""

    model_config = ConfigDict(extra="allow")

    value: float | dict[str, Any] = Field(
        description="the answer: a number, or for compressed's pca an object (columns, "
        "components, explained_variance, explained_variance_ratio)"
    )
    stderr: float | None = Field(description="its standard error; null where not known")
    interval: list[float] | None = Field(
        description="[low, high]: a 95 % interval where the release type gives one, else null"
    )
    note: str = Field(description="what value, stderr and interval mean for this release type")


class AnswersOut(BaseModel):
    release_id: uuid.UUID
    mechanism: str
    guarantee: str
    answers: list[Answer] = Field(description="one per query, in the order asked")
