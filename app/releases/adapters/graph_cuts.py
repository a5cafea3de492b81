"""Release type ``graph_cuts``: paper 004 §VI-B on a graph dataset.

Every unordered vertex pair's bit is flipped with probability ``1/(1 + e^eps)`` (one edge
is one pair, so the guarantee is epsilon-DP per edge); the noisy graph is released as an
edge list, and cut queries ``|E(S, T)|`` are answered with estimator (34), with its exact
standard error and bound (35).

The measurements are stored as the packed upper triangle of the noisy adjacency matrix
(``|V| (|V| - 1) / 2`` bits: 1 MB for 4039 vertices).
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
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from scipy.special import expit

from app.core.errors import InvalidRequest
from app.core.types import Integer
from app.mechanisms import graph_cuts as gc
from app.mechanisms.errors import MechanismError
from app.releases import registry
from app.releases.payloads import pack, unpack
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage.source import EncryptedTableSource

#: Work one answers request may ask for: its queries times (twice the released edges, plus
#: the vertices). A cut is a product with the noisy adjacency, whatever the sizes of S and
#: T, so a batch of one-vertex cuts on a large release cost minutes to hours (1000 cuts on
#: 4000 vertices at a small epsilon, about 4 million released edges, took 28 s). This
#: bounds one request to seconds; the released edge count it is computed from is public.
MAX_CUT_WORK = 4 * 10**9


class GraphParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CutQuery(BaseModel):
    """The number of edges between the disjoint vertex sets ``S`` and ``T`` (vertex ids
    ``0..vertices-1``). Accepted by ``graph_cuts`` releases."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"type": "cut", "S": [0, 1], "T": [2, 3]}]},
    )

    type: Literal["cut"]
    S: list[Integer] = Field(min_length=1)
    T: list[Integer] = Field(min_length=1)


_QUERIES: TypeAdapter[list[Annotated[CutQuery, Field(discriminator="type")]]] = TypeAdapter(
    list[Annotated[CutQuery, Field(discriminator="type")]]
)


def _row_starts(n: int) -> NDArray[np.int64]:
    """Index of pair ``(u, u+1)`` in the row-major upper triangle, for every ``u``."""
    u = np.arange(n, dtype=np.int64)
    return u * (2 * n - u - 1) // 2


def pairs_to_bits(edges: NDArray[np.int32], n: int) -> NDArray[np.uint8]:
    starts = _row_starts(n)
    u, v = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
    bitmap = np.zeros(n * (n - 1) // 2, dtype=bool)
    bitmap[starts[u] + (v - u - 1)] = True
    return np.packbits(bitmap)


def bits_to_pairs(bits: NDArray[np.uint8], n: int) -> NDArray[np.int32]:
    total = n * (n - 1) // 2
    index = np.flatnonzero(np.unpackbits(bits, count=total))
    starts = _row_starts(n)
    u = np.searchsorted(starts, index, side="right") - 1
    v = index - starts[u] + u + 1
    return np.column_stack([u, v]).astype(np.int32)


class GraphCuts(registry.Mechanism):
    name: ClassVar[str] = "graph_cuts"
    description: ClassVar[str] = (
        "noisy graph (each vertex pair flipped with probability 1/(1+e^eps)) answering "
        "cut queries with estimator (34) of paper 004"
    )
    column_kinds: ClassVar[frozenset[str]] = frozenset()
    dataset_kinds: ClassVar[frozenset[str]] = frozenset({"graph"})
    Params: ClassVar[type[BaseModel]] = GraphParams
    query_forms: ClassVar[tuple[type[BaseModel], ...]] = (CutQuery,)

    def check(self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel) -> None:
        if delta:
            raise InvalidRequest("graph_cuts is epsilon-DP: use delta = 0")

    def preview(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> dict[str, Any]:
        assert info.n_vertices is not None
        n = info.n_vertices
        p = float(expit(-epsilon))  # 1 / (1 + e^epsilon), without overflow past epsilon 709
        half = n // 2
        stderr_half = math.sqrt(half * (n - half) * p * (1 - p)) / (1 - 2 * p)
        return {
            "resolved": {"n_vertices": n, "vertex_pairs": n * (n - 1) // 2, "flip_probability": p},
            "accuracy": {
                "stderr_of_a_cut": "sqrt(|S| |T| p (1-p)) / (1 - 2p), whatever the graph",
                "stderr_half_split": stderr_half,
                "expected_noisy_edges_from_flips": p * n * (n - 1) / 2,
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
        assert info.n_vertices is not None
        parts = [
            np.column_stack([batch.column("u").to_numpy(), batch.column("v").to_numpy()]).astype(
                np.int64
            )
            for batch in source.codes()
        ]
        edges = np.concatenate(parts) if parts else np.empty((0, 2), dtype=np.int64)
        release = gc.release(edges, info.n_vertices, epsilon)
        payload = {
            "n_vertices": release.n_vertices,
            "epsilon": release.epsilon,
            "flip_threshold": release.flip_threshold,
            "pairs": pairs_to_bits(release.edges, release.n_vertices),
        }
        return Measured(
            payload=pack(payload),
            privacy_cost=release.privacy_cost,
            resolved={
                "n_vertices": release.n_vertices,
                "flip_probability": release.flip_probability,
                "epsilon_effective": release.epsilon_effective,
            },
        )

    def load(
        self, payload: Mapping[str, Any], info: DatasetInfo, artifacts: Path
    ) -> gc.GraphRelease:
        data = unpack(payload)
        n = int(data["n_vertices"])
        return gc.GraphRelease(
            edges=bits_to_pairs(data["pairs"], n),
            n_vertices=n,
            epsilon=float(data["epsilon"]),
            flip_threshold=int(data["flip_threshold"]),
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
        release = self.load(payload, info, workdir)
        progress(0.5)
        table = pa.table({"u": release.edges[:, 0], "v": release.edges[:, 1]})
        pq.write_table(table, workdir / "edges.parquet")
        (workdir / "release.json").write_text(
            json.dumps(
                {
                    "mechanism": "graph_cuts (paper 004, section VI-B)",
                    "n_vertices": release.n_vertices,
                    "flip_probability": release.flip_probability,
                    "epsilon": release.epsilon,
                    "epsilon_effective": release.epsilon_effective,
                    "estimator": "cut(S, T) = (noisy_cut - p |S| |T|) / (1 - 2p)   (eq. 34)",
                },
                indent=1,
            )
        )
        return Synthesized(
            artifacts={
                "edges.parquet": ArtifactInfo(
                    "edges.parquet",
                    "application/vnd.apache.parquet",
                    "the noisy graph: one row per edge (u < v)",
                ),
                "release.json": ArtifactInfo(
                    "release.json", "application/json", "flip probability and the estimator"
                ),
            },
            summary={"noisy_edges": int(release.edges.shape[0])},
        )

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        parsed = registry.validate_queries(_QUERIES, queries)
        release: gc.GraphRelease = loaded
        released = int(release.edges.shape[0])
        registry.check_batch_work(
            len(parsed),
            2 * released + release.n_vertices,
            MAX_CUT_WORK,
            what="cut queries",
            reads=f"its {released} released edges",
        )
        out = []
        for position, query in enumerate(parsed):
            try:
                value = release.cut(query.S, query.T)
                stderr = release.stderr(query.S, query.T)
                bound = release.bound(query.S, query.T)
                interval = release.interval(query.S, query.T)
            except MechanismError as exc:
                raise InvalidRequest(f"queries.{position}: {exc}") from None
            out.append(
                {
                    "value": value,
                    "stderr": stderr,
                    "interval": list(interval),
                    "error_bound": bound,
                    "note": "estimator (34); stderr exact (it does not depend on the graph); "
                    "interval: 95 %, exact (coverage at least 0.95 whatever the graph) when "
                    "|S||T| p (1 - p) < 400, else the normal approximation, within "
                    "[0, |S||T|]; error_bound: bound (35) on E|error|",
                }
            )
        return out


registry.register(GraphCuts())
