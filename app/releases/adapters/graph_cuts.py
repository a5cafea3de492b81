"""Release type ``graph_cuts``: paper 004 §VI-B on a graph dataset.

Every unordered vertex pair's bit is flipped with probability ``1/(1 + e^eps)`` (one edge
is one pair, so the guarantee is epsilon-DP per edge); the noisy graph is released as an
edge list, and cut queries ``|E(S, T)|`` are answered with estimator (34), with its exact
standard error and bound (35).

The measurements are stored as the packed upper triangle of the noisy adjacency matrix
(``|V| (|V| - 1) / 2`` bits: 1 MB for 4039 vertices, 25 MB for 20,000). Answers read them
as a dense symmetric bit matrix (``|V| ceil(|V|/8)`` bytes, :class:`gc.PackedGraphRelease`),
never as an edge list: at 20,000 vertices and epsilon 0.1 the noisy graph has about 9.5e7
edges, GBs as an array. ``synthesize`` writes the edges out in row blocks.
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
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from scipy.special import expit

from app.core.errors import InvalidRequest
from app.core.types import Integer
from app.mechanisms import graph_cuts as gc
from app.mechanisms import secure_random
from app.mechanisms.errors import MechanismError
from app.releases import registry
from app.releases.payloads import pack, unpack
from app.releases.registry import ArtifactInfo, DatasetInfo, Measured, ProgressFn, Synthesized
from app.storage import sizes
from app.storage.source import EncryptedTableSource
from app.storage.tables import arrow_path

#: Work one answers request may ask for, in bytes of the noisy adjacency's bit matrix read
#: (a cut reads ``min(|S|, |T|)`` rows of ``ceil(|V|/8)`` bytes, twice: value and interval)
#: plus the vertices (masks) plus :data:`QUERY_OVERHEAD` per query. Measured (2 cores,
#: shared, under nice) at 20,000 vertices, epsilon 0.1: about 1.3e9 units a second for
#: large cuts (|S| = |T| = 10,000: 36 ms a cut), so this bounds one request to ~6 s. (The
#: bound used to count the released edges, when a cut was a product with the edge list.)
MAX_CUT_WORK = 8 * 10**9

#: Fixed work of one cut in the units of :data:`MAX_CUT_WORK`: parsing, masks and the exact
#: interval took 0.2-1.5 ms a query whatever |V| (300 to 20,000 vertices), about 2e6 units.
QUERY_OVERHEAD = 2 * 10**6


#: The measure stage's progress share of the read of the true edges
#: (:meth:`GraphCuts.measure_read_share`).
MEASURE_READ_SHARE = 0.2

#: The synthesis stage's progress once the noisy edges are written (block by block up to
#: it); ``release.json`` is the rest.
WRITTEN_PROGRESS = 0.95


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

    def artifact_bytes(
        self,
        info: DatasetInfo,
        epsilon: float,
        delta: float,
        params: BaseModel,
        resolved: Mapping[str, Any],
    ) -> int:
        """``edges.parquet`` and ``release.json``. The noisy graph's edge count is a DP
        output, not known before it is measured, so the bound is every one of the
        ``|V| (|V| - 1) / 2`` vertex pairs an edge, two int32 values each (written a block
        of pairs at a time: a row group a block; :mod:`app.storage.sizes`). At
        ``MAX_VERTICES`` (20,000) it is about 3 GiB, the largest of any release type
        and what ``CURATOR_MAX_RELEASE_BYTES``'s default (4 GiB) is set above."""
        assert info.n_vertices is not None
        n = info.n_vertices
        pairs = n * (n - 1) // 2
        groups = gc.pair_block_count(n)
        return sizes.files(
            sizes.parquet_bytes(pairs, [sizes.PARQUET_INT32_CELL] * 2, ["u", "v"])
            + groups * 2 * sizes.PARQUET_CHUNK_OVERHEAD,
            sizes.JSON_ALLOWANCE,
        )

    def measure_read_share(
        self, info: DatasetInfo, epsilon: float, delta: float, params: BaseModel
    ) -> float:
        """The read of the true edges reports no fraction (their number is private); the
        flips of the ``|V| (|V| - 1) / 2`` pairs after it (16 ns a pair from OpenDP's
        CSPRNG: 1.8 s at 20,000 vertices) are most of the work of a sparse graph, and are
        reported block by block."""
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
        assert info.n_vertices is not None
        # the stored edges a batch at a time, straight into pair bits: neither the true nor
        # the released edges are held as a list (9.5e7 released edges at 20,000 vertices
        # and epsilon 0.1 took GBs as int64 arrays)
        edge_blocks = (
            np.column_stack([batch.column("u").to_numpy(), batch.column("v").to_numpy()])
            for batch in source.codes()
        )
        release = gc.release_pair_bits(edge_blocks, info.n_vertices, epsilon, progress)
        payload = {
            "n_vertices": release.n_vertices,
            "epsilon": release.epsilon,
            "flip_threshold": release.flip_threshold,
            "pairs": release.bits,
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
    ) -> gc.PackedGraphRelease:
        """The noisy graph as a dense bit matrix (|V| ceil(|V|/8) bytes, 50 MB at 20,000
        vertices), built from the stored pair bits without an edge list: decoded as an
        int64/int32 edge list (9.5e7 edges at 20,000 vertices and epsilon 0.1), a release
        held GBs, was larger than the answer cache and so was decoded again per request."""
        data = unpack(payload)
        return gc.PackedGraphRelease.from_pair_bits(
            data["pairs"],
            int(data["n_vertices"]),
            float(data["epsilon"]),
            int(data["flip_threshold"]),
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
        data = unpack(payload)
        n = int(data["n_vertices"])
        threshold = int(data["flip_threshold"])
        schema = pa.schema([("u", pa.int32()), ("v", pa.int32())])
        noisy_edges = 0
        blocks = gc.pair_block_count(n)
        with pq.ParquetWriter(arrow_path(workdir / "edges.parquet"), schema) as writer:
            for done, block in enumerate(gc.pair_bits_to_edges(data["pairs"], n), 1):
                noisy_edges += block.shape[0]
                writer.write_table(pa.table({"u": block[:, 0], "v": block[:, 1]}, schema=schema))
                progress(WRITTEN_PROGRESS * done / blocks)
        (workdir / "release.json").write_text(
            json.dumps(
                {
                    "mechanism": "graph_cuts (paper 004, section VI-B)",
                    "n_vertices": n,
                    "flip_probability": threshold / secure_random.TWO_64,
                    "epsilon": float(data["epsilon"]),
                    "epsilon_effective": gc.effective_epsilon(threshold),
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
            summary={"noisy_edges": noisy_edges},
        )

    def answer(
        self, loaded: Any, info: DatasetInfo, queries: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        parsed = registry.validate_queries(_QUERIES, queries)
        release: gc.PackedGraphRelease = loaded
        n = release.n_vertices
        row_bytes = (n + 7) // 8
        # a cut reads min(|S|, |T|) rows of the bit matrix (twice: value and interval) and
        # builds masks of the |V| vertices; the list lengths bound |S|, |T| (public sizes)
        rows = max(min(len(query.S), len(query.T)) for query in parsed) if parsed else 0
        registry.check_batch_work(
            len(parsed),
            2 * rows * row_bytes + n + QUERY_OVERHEAD,
            MAX_CUT_WORK,
            what="cut queries",
            reads=f"up to {2 * rows} rows of {row_bytes} bytes of the noisy adjacency",
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
