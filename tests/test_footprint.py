"""app.core.footprint: the answer cache's estimate of a decoded release's memory."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from app.core.footprint import footprint


def test_a_buffer_is_counted_once_through_its_views() -> None:
    array = np.zeros(100_000)
    alone = footprint(array)
    assert array.nbytes <= alone < array.nbytes + 1000
    views = (array, array[:10], array[5:].reshape(-1, 1), {"again": array})
    assert alone <= footprint(views) < array.nbytes + 2000
    borrowed = np.frombuffer(bytes(80_000), dtype=np.float64)  # owned by a bytes object
    assert 80_000 <= footprint(borrowed) < 81_000


@dataclass(frozen=True, eq=False)
class _Release:
    edges: np.ndarray
    names: list[str] = field(default_factory=list)

    @functools.cached_property
    def table(self) -> np.ndarray:
        return np.ones((self.edges.shape[0], 4))


def test_lazily_built_tables_count_once_built() -> None:
    release = _Release(np.zeros((1000, 2), dtype=np.int64), ["a", "b"])
    before = footprint(release)
    assert release.edges.nbytes <= before < release.edges.nbytes + 2000
    built = release.table
    assert footprint(release) - before >= built.nbytes


def test_sparse_matrices_and_cycles() -> None:
    matrix = sparse.random(500, 500, density=0.02, format="csr", random_state=0)
    held = matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes
    assert held <= footprint(matrix) < held + 5000
    loop: list[object] = [np.zeros(1000)]
    loop.append(loop)
    assert 8000 <= footprint(loop) < 8000 + 1000
    assert footprint(None) == sys.getsizeof(None)


def test_the_answer_cache_keeps_the_larger_size_of_one_object() -> None:
    """Answers measure a cached release after each answer, outside the cache's lock: one
    that measured before a concurrent answer built more tables must not put the smaller
    size back over the larger. A new object under the key takes its own size."""
    from app.answers.service import _LoadedReleases

    cache = _LoadedReleases(4)
    held, fresh = object(), object()
    cache.put(("r", 0), held, 100, 1000)
    cache.put(("r", 0), held, 60, 1000)
    assert cache.nbytes == 100
    cache.put(("r", 0), fresh, 60, 1000)
    assert cache.nbytes == 60
    assert cache.get(("r", 0)) is fresh
