"""A test-only release type: noisy column means (OpenDP Laplace), with an optional gate
and marker files so that tests can act (cancel, signal or kill a worker) while a stage
stands at a known point.

Importing this module registers ``test_means``. It is never imported by the service.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import opendp.prelude as dp
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from app.mechanisms.data import iter_checked
from app.mechanisms.privacy import CostPart, PrivacyCost
from app.releases import registry
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage import sizes

dp.enable_features("contrib")


#: The points of the stages where a gate can stand: in measure, before the first row is
#: read, after the first batch, or after the last (the mechanism returns next); or at the
#: start of synthesize.
GatePoint = Literal["before_reading", "after_first_batch", "after_reading", "before_synthesizing"]
#: How long a stage stands at a gate the test never opens before it fails.
GATE_SECONDS = 120.0


class MeansParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(default=20, ge=1, le=10_000)
    #: where the first attempt of a stage stops (see :func:`_stand_at_gate`)
    gate: GatePoint | None = None
    #: how many times the data are read
    passes: int = Field(default=1, ge=1, le=5)
    marker_dir: str | None = None
    fail_in: str | None = None


class TestMeans(registry.Mechanism):
    name: ClassVar[str] = "test_means"
    description: ClassVar[str] = "noisy column means (tests only)"
    column_kinds: ClassVar[frozenset[str]] = frozenset({"continuous"})
    Params: ClassVar[type[BaseModel]] = MeansParams
    post_processing: ClassVar[frozenset[str]] = frozenset({"rows"})

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        scale = 2 * info.d / (info.n_rows * epsilon)
        return {"resolved": {"d": info.d}, "accuracy": {"noise_scale": scale}}

    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        assert isinstance(params, MeansParams)
        return sizes.files(
            sizes.csv_bytes(params.rows, [sizes.CSV_FLOAT_CELL] * info.d, info.names),
            sizes.parquet_bytes(params.rows, [sizes.PARQUET_FLOAT_CELL] * info.d, info.names),
            sizes.JSON_ALLOWANCE + 32 * info.d,
        )

    def measure(
        self,
        source: Any,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        assert isinstance(params, MeansParams)
        gate = params.gate if _mark(params, "measure") else None
        if gate == "before_reading":
            _stand_at_gate(params)
        if params.fail_in == "measure_before_reading":
            raise RuntimeError("failed before reading a row")
        total, batches = np.zeros(info.d), 0
        for _ in range(params.passes):
            total = np.zeros(info.d)
            for batch in iter_checked(source):
                total += batch.sum(axis=0)
                batches += 1
                if batches == 1 and gate == "after_first_batch":
                    _stand_at_gate(params)
        if gate == "after_reading":
            _stand_at_gate(params)
        if params.fail_in == "measure":
            raise RuntimeError("value 37.123456 must never reach a client")
        means = total / info.n_rows
        scale = 2 * info.d / (info.n_rows * epsilon)  # L1 sensitivity 2d/n
        noise = dp.m.make_laplace(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)),
            dp.l1_distance(T=float),
            scale=scale,
        )
        noisy = np.asarray(noise(means.tolist()))
        cost = float(noise.map(2 * info.d / info.n_rows))
        payload: dict[str, Any] = {"means": noisy.tolist(), "scale": scale}
        if params.fail_in == "persist":
            payload["unstorable"] = {1, 2}  # a set: storing the measurement fails
        return Measured(
            payload=payload,
            privacy_cost=PrivacyCost.compose([CostPart("means", cost)]),
            resolved={"scale": scale},
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
        assert isinstance(params, MeansParams)
        if _mark(params, "synthesize") and params.gate == "before_synthesizing":
            _stand_at_gate(params)
        progress(0.5)
        if params.fail_in == "synthesize":
            raise RuntimeError("synthesis failed")
        means = np.clip(np.asarray(payload["means"]), -1, 1)
        rows = np.clip(means + rng.uniform(-0.01, 0.01, size=(params.rows, info.d)), -1, 1)
        table = pa.table({name: info.to_original(rows)[:, j] for j, name in enumerate(info.names)})
        pacsv.write_csv(table, workdir / "sample.csv")
        pq.write_table(table, workdir / "sample.parquet")
        (workdir / "means.json").write_text(json.dumps(payload))
        return Synthesized(
            artifacts={
                "sample.csv": ArtifactInfo("sample.csv", "text/csv", "rows"),
                "sample.parquet": ArtifactInfo(
                    "sample.parquet", "application/vnd.apache.parquet", "rows"
                ),
                "means.json": ArtifactInfo("means.json", "application/json", "noisy means"),
            },
            # a set cannot be stored: the finished synthesis fails to commit
            summary={"rows": params.rows, **({"x": {1}} if params.fail_in == "store" else {})},
        )


def _stand_at_gate(params: MeansParams) -> None:
    """Write ``gate.reached`` in ``marker_dir`` and wait there until the test writes
    ``gate.open`` (files, so that a worker in another process can be held too): the test
    acts while the stage stands at a known point, however slow the machine is."""
    assert params.marker_dir is not None, "a gate needs a marker_dir"
    folder = Path(params.marker_dir)
    (folder / "gate.reached").touch()
    deadline = time.monotonic() + GATE_SECONDS
    while not (folder / "gate.open").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gate {params.gate} was not opened in {GATE_SECONDS} s")
        time.sleep(0.01)


def _mark(params: MeansParams, stage: str) -> bool:
    """Leave a marker; True on the stage's first attempt (only the first attempt stands at
    its gate)."""
    if not params.marker_dir:
        return True
    marker = Path(params.marker_dir, f"{stage}.started")
    first = not marker.exists()
    marker.touch()
    return first


registry.register(TestMeans())


class TestNonDP(TestMeans):
    """Same computation, declared as a release whose guarantee is not DP (tests only)."""

    name: ClassVar[str] = "test_non_dp"
    guarantee: ClassVar[str] = "none (tests only)"
    privacy_kind: ClassVar[str] = "non_dp"

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        return {"resolved": {"d": info.d}, "accuracy": {"noise_scale": 0.0}}

    def measure(
        self,
        source: Any,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        progress: ProgressFn | None = None,
    ) -> Measured:
        total = sum(batch.sum(axis=0) for batch in iter_checked(source))
        return Measured(
            payload={"means": (np.asarray(total) / info.n_rows).tolist()},
            privacy_cost=PrivacyCost(epsilon=0.0, kind="non_dp"),
        )


registry.register(TestNonDP())
