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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from app.core.errors import InvalidRequest
from app.core.types import Integer
from app.mechanisms import smooth_synopsis as sy
from app.mechanisms.basis import IndexSet
from app.mechanisms.errors import MechanismError
from app.releases import registry
from app.releases.adapters import smooth_queries
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage.source import EncryptedTableSource


class SynopsisParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    smoothness: Integer = Field(default=4, ge=1, le=100, description="K of paper 001")
    basis: Literal["auto", "nominal", "paper", "total_degree", "full_tensor"] = "auto"
    basis_size: Integer | None = Field(default=None, ge=1)
    max_basis_size: Integer = Field(default=sy.DEFAULT_MAX_BASIS_SIZE, ge=1, le=200_000)
    noise_mechanism: Literal["laplace", "gaussian"] | None = None
    co_spread: bool = Field(
        default=True,
        description="spend 5 % of epsilon on the co-spread that corrects Gaussian-kernel "
        "answers for the dependence between columns (when the basis admits it)",
    )


def _plan(
    info: DatasetInfo, epsilon: float, delta: float, params: SynopsisParams
) -> tuple[IndexSet, sy.BasisChoice, float]:
    return sy.plan(
        info.n_rows,
        info.d,
        epsilon=epsilon,
        delta=delta,
        smoothness=params.smoothness,
        basis="total_degree" if params.basis_size is not None else params.basis,
        basis_size=params.basis_size,
        max_basis_size=params.max_basis_size,
        mechanism=params.noise_mechanism,
        co_spread=params.co_spread,
    )


class SmoothSynopsis(registry.Mechanism):
    name: ClassVar[str] = "smooth_synopsis"
    description: ClassVar[str] = (
        "noisy Chebyshev moments (paper 001) answering smooth queries with standard errors"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = SynopsisParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = smooth_queries.FORMS

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        assert isinstance(params, SynopsisParams)
        if params.noise_mechanism == "gaussian" and delta <= 0:
            raise InvalidRequest("noise_mechanism 'gaussian' needs delta > 0")
        _plan(info, epsilon, delta, params)  # refuses impossible index sets early

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        assert isinstance(params, SynopsisParams)
        index_set, choice, share = _plan(info, epsilon, delta, params)
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
                "kernel of width sqrt(K) with a uniform random centre (normalised scale)",
            },
        }

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
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
        parsed = smooth_queries.parse(queries, info)
        try:
            answers = loaded.answer_many(parsed)
        except MechanismError as exc:
            raise smooth_queries.refusal(exc, parsed, loaded.answer_many) from None
        out = []
        for i in range(len(answers)):
            item = answers[i].as_dict()
            item["note"] = (
                "value: the synopsis answer plus independence_extrapolation (the truncated "
                "interaction terms predicted from the released one-column moments), times "
                "exp(dependence_log_factor) for Gaussian kernels (the dependence between "
                "columns measured by the released co-spread); stderr from the known noise "
                "(delta method); interval: noise quantile combined with the estimated "
                "truncation error (estimated from the released moments, not a bound), or "
                "the worst case when a Gaussian factor is narrower than the declared "
                "smoothness (within_smoothness false); "
                "worst_case_interval is centred on the plain answer (value minus "
                "independence_extrapolation), adds the truncation bound and holds for every "
                "dataset"
            )
            out.append(item)
        return out


registry.register(SmoothSynopsis())
