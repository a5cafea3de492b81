"""Release type ``smooth_synthetic``: paper 000's synthetic database for smooth queries.

Measure: :func:`app.mechanisms.smooth_synthetic.measure` on the release's continuous
columns (normalised to ``[-1, 1]`` with the declared bounds). Synthesise (free, re-runnable
with other post-processing parameters): candidates, the LP fit and ``m`` sampled rows.
Artifacts, in original units: ``sample.csv``/``.parquet`` (the synthetic rows) and
``support.csv``/``.parquet`` (the weighted support points, with a ``weight`` column).

Answers come from the weighted support: ``q_f = sum_k w_k f(s_k)``, exact for the released
synthetic distribution. Its distance to the true answer comes from the DP noise through
the LP fit, for which no per-query bound is computed (the service says so); a
``smooth_synopsis`` release gives answers with calibrated standard errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from app.core.errors import InvalidRequest
from app.mechanisms import noise
from app.mechanisms import smooth_synthetic as ss
from app.mechanisms.errors import MechanismError
from app.mechanisms.queries import answer as weighted_answer
from app.releases import registry
from app.releases.adapters import smooth_queries
from app.releases.payloads import pack, unpack
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage.source import EncryptedTableSource

NOTE = (
    "exact for the released synthetic distribution (weighted support); the error against "
    "the data comes from the DP noise through the fit and has no per-query bound; use a "
    "smooth_synopsis release for answers with standard errors"
)


class SyntheticParams(BaseModel):
    """Measure-time parameters (fixed once measured) and post-processing parameters
    (``grid_size``, ``solver``, ``sample_size``, ``ellipsoid_radius``: re-synthesis may
    change them at no privacy cost). Defaults: :mod:`app.mechanisms.smooth_synthetic`."""

    model_config = ConfigDict(extra="forbid")

    smoothness: int = Field(default=4, ge=1, le=100, description="K of paper 000")
    grid: Literal["hypercube", "pca_ellipsoid", "full"] = "hypercube"
    basis_size: int | None = Field(default=None, ge=1, le=ss.MAX_BASIS_SIZE)
    basis_rule: Literal["paper_min_d", "paper"] = "paper_min_d"
    noise_mechanism: Literal["laplace", "gaussian", "laplace_approx"] | None = None
    pca_share: float = Field(default=0.2, gt=0, lt=1)
    pca_rank: int | None = Field(default=None, ge=1)
    pca_iterations: int | None = Field(default=None, ge=1, le=100)
    pca_noise: Literal["laplace", "gaussian"] | None = None
    centre_share: float = Field(default=0.05, gt=0, lt=1)
    # post-processing
    grid_size: int | None = Field(default=None, ge=1, le=1_000_000)
    solver: Literal["simplex", "ipm"] = "simplex"
    sample_size: int | None = Field(default=None, ge=1, le=ss.MAX_DEFAULT_SAMPLE_SIZE)
    ellipsoid_radius: Literal["paper", "matched"] = "paper"


POST_PROCESSING = frozenset({"grid_size", "solver", "sample_size", "ellipsoid_radius"})


class SmoothSynthetic(registry.Mechanism):
    name: ClassVar[str] = "smooth_synthetic"
    description: ClassVar[str] = (
        "synthetic database for smooth queries (paper 000): noisy Chebyshev moments, an LP "
        "fit over candidate points, sampled rows"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = SyntheticParams
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

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        assert isinstance(params, SyntheticParams)
        if params.noise_mechanism in ("gaussian", "laplace_approx") and delta <= 0:
            raise InvalidRequest(f"noise_mechanism {params.noise_mechanism!r} needs delta > 0")
        if params.pca_noise == "gaussian" and delta <= 0:
            raise InvalidRequest("pca_noise 'gaussian' needs delta > 0")
        if params.pca_rank is not None and params.pca_rank > info.d:
            raise InvalidRequest(f"pca_rank ({params.pca_rank}) must be at most d ({info.d})")

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        assert isinstance(params, SyntheticParams)
        R = params.basis_size or ss.default_basis_size(
            info.n_rows, info.d, params.smoothness, delta, params.basis_rule
        )
        theorem = ss.theorem_parameters(info.n_rows, info.d, params.smoothness, delta)
        mechanism = params.noise_mechanism or ("gaussian" if delta > 0 else "laplace")
        moments_share = 1.0 - (params.pca_share if params.grid == "pca_ellipsoid" else 0.0)
        accuracy: dict[str, Any] = {}
        if mechanism != "laplace_approx":  # its per-coordinate zCDP accounting differs
            sensitivity = ss_sensitivity(info.n_rows, R, mechanism)
            calibration = noise.calibrate(
                mechanism,
                sensitivity=sensitivity,
                epsilon=epsilon * moments_share,
                delta=delta * moments_share,
                dimension=R,
            )
            accuracy = {
                "noise": calibration.distribution,
                "noise_scale": calibration.scale,
                "moment_stddev": calibration.stddev,
                "note": "standard deviation of each noisy moment; answers of K-smooth "
                "queries inherit it through the fit (paper 000 Theorem 3.1)",
            }
        return {
            "resolved": {
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

    def measure(
        self,
        source: EncryptedTableSource,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
    ) -> Measured:
        assert isinstance(params, SyntheticParams)
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
            resolved=dict(measurements.parameters),
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
        assert isinstance(params, SyntheticParams)
        measurements = ss.Measurements.from_dict(unpack(payload))
        release = ss.synthesize_from(
            measurements,
            rng,
            grid_size=params.grid_size,
            solver=params.solver,
            sample_size=params.sample_size,
            ellipsoid_radius=params.ellipsoid_radius,
        )
        progress(0.8)
        names = info.names
        rows = info.to_original(release.rows)
        support = info.to_original(release.points)
        sample = pa.table({name: rows[:, j] for j, name in enumerate(names)})
        weighted = pa.table(
            {**{name: support[:, j] for j, name in enumerate(names)}, "weight": release.weights}
        )
        for table, stem in ((sample, "sample"), (weighted, "support")):
            pacsv.write_csv(table, workdir / f"{stem}.csv")
            pq.write_table(table, workdir / f"{stem}.parquet")
        np.save(workdir / "support_normalized.npy", release.points)
        np.save(workdir / "weights.npy", release.weights)
        summary = {
            "parameters": dict(release.parameters),
            "solver": dict(release.solver),
            "seconds": dict(release.seconds),
            "support_points": int(release.points.shape[0]),
            "rows": int(release.rows.shape[0]),
        }
        (workdir / "release.json").write_text(json.dumps(_json_safe(summary), indent=1))
        parquet = "application/vnd.apache.parquet"
        return Synthesized(
            artifacts={
                "sample.csv": ArtifactInfo(
                    "sample.csv", "text/csv", "synthetic rows, original units"
                ),
                "sample.parquet": ArtifactInfo(
                    "sample.parquet", parquet, "synthetic rows, original units"
                ),
                "support.csv": ArtifactInfo(
                    "support.csv", "text/csv", "weighted support points, original units"
                ),
                "support.parquet": ArtifactInfo(
                    "support.parquet", parquet, "weighted support points, original units"
                ),
                "release.json": ArtifactInfo(
                    "release.json", "application/json", "resolved parameters and solver report"
                ),
            },
            summary=_json_safe(summary),
        )

    def load(self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path) -> Any:
        try:
            points = np.load(artifacts / "support_normalized.npy")
            weights = np.load(artifacts / "weights.npy")
        except FileNotFoundError:
            raise InvalidRequest("this release's support is missing; re-synthesise it") from None
        return points, weights

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        points, weights = loaded
        out = []
        for position, query in enumerate(smooth_queries.parse(queries, info)):
            try:
                value = weighted_answer(query, points, weights)
            except MechanismError as exc:
                raise InvalidRequest(f"queries.{position}: {exc}") from None
            out.append({"value": value, "stderr": None, "interval": None, "note": NOTE})
        return out


def ss_sensitivity(n: int, R: int, mechanism: str) -> float:
    """The moment vector's sensitivity in the noise's metric (:data:`noise.METRIC`)."""
    return noise.moment_sensitivity(n, R)[noise.METRIC[mechanism]]


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(pack(value), default=str))


registry.register(SmoothSynthetic())
