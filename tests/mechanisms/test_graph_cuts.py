"""Cut-function release of paper 004 §VI-B.

False-failure rates: z-tests at 5 sigma (~6e-7), unbiasedness at 4 standard errors (~6e-5).
"""

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from app.mechanisms import graph_cuts as gc
from app.mechanisms import secure_random
from app.mechanisms.errors import MechanismError

FACEBOOK = Path("/work/shared/datasets/facebook_combined.txt")


def random_graph(n_vertices: int, n_edges: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    iu = np.triu_indices(n_vertices, k=1)
    chosen = rng.choice(iu[0].size, size=n_edges, replace=False)
    return np.stack([iu[0][chosen], iu[1][chosen]], axis=1)


def dense(edges: np.ndarray, n_vertices: int) -> np.ndarray:
    adjacency = np.zeros((n_vertices, n_vertices), dtype=bool)
    adjacency[edges[:, 0], edges[:, 1]] = True
    adjacency[edges[:, 1], edges[:, 0]] = True
    return adjacency


def true_cut(edges: np.ndarray, S: np.ndarray, T: np.ndarray, n_vertices: int) -> int:
    return int(dense(edges, n_vertices)[np.ix_(S, T)].sum())


def test_flip_rates_and_privacy_ratio() -> None:
    """Each pair bit flips w.p. p; neighbouring graphs (one pair differs) give outputs
    whose probabilities differ by e^eps exactly: P[1 | edge] / P[1 | no edge] = (1-p)/p.
    Tolerance: 5 standard errors of the log ratio (delta method)."""
    n_vertices, epsilon = 1500, 1.0
    edges = random_graph(n_vertices, 100_000, seed=1)
    released = gc.release(edges, n_vertices, epsilon)
    truth = dense(edges, n_vertices)[np.triu_indices(n_vertices, k=1)]
    noisy = dense(released.edges, n_vertices)[np.triu_indices(n_vertices, k=1)]
    p = released.flip_probability
    kept = noisy[truth].mean()  # P[1 | edge]
    spurious = noisy[~truth].mean()  # P[1 | no edge]
    for rate, expected, count in ((kept, 1 - p, truth.sum()), (spurious, p, (~truth).sum())):
        assert abs(rate - expected) < 5 * math.sqrt(expected * (1 - expected) / count)
    log_ratio = math.log(kept / spurious)
    tolerance = 5 * math.sqrt(
        (1 - kept) / (kept * truth.sum()) + (1 - spurious) / (spurious * (~truth).sum())
    )
    assert abs(log_ratio - epsilon) < tolerance
    assert p == pytest.approx(1 / (1 + math.e))


@pytest.mark.parametrize("epsilon", [1.0, 0.01, 5.0, 1e-12])
def test_rounded_threshold_keeps_epsilon(epsilon: float) -> None:
    threshold = gc.flip_threshold(epsilon)
    p = 1 / (1 + Decimal(epsilon).exp())
    assert Decimal(threshold) / secure_random.TWO_64 >= p
    assert threshold <= 1 << 63
    assert gc.effective_epsilon(threshold) <= epsilon
    assert gc.effective_epsilon(threshold) == pytest.approx(epsilon, rel=1e-6, abs=1e-12)


def test_estimator_is_unbiased_and_its_stderr_exact() -> None:
    n_vertices, draws = 30, 2000
    edges = random_graph(n_vertices, 150, seed=2)
    S, T = np.arange(0, 12), np.arange(12, 30)
    truth = true_cut(edges, S, T, n_vertices)
    releases = [gc.release(edges, n_vertices, 1.0) for _ in range(draws)]
    estimates = np.array([r.cut(S, T) for r in releases])
    stderr = releases[0].stderr(S, T)
    # 6 standard errors of the mean: false failure 2e-9 (4, as before, failed 6e-5 per run)
    assert abs(estimates.mean() - truth) < 6 * stderr / math.sqrt(draws)
    assert estimates.std(ddof=1) == pytest.approx(stderr, rel=0.1)  # ~6.5 sigma for 2000 draws


def test_bound_35_holds_empirically() -> None:
    n_vertices, draws = 200, 300
    edges = random_graph(n_vertices, 4000, seed=3)
    rng = np.random.default_rng(4)
    S = np.sort(rng.permutation(n_vertices)[: n_vertices // 2])
    T = np.setdiff1d(np.arange(n_vertices), S)
    truth = true_cut(edges, S, T, n_vertices)
    releases = [gc.release(edges, n_vertices, 1.0) for _ in range(draws)]
    errors = np.abs(np.array([r.cut(S, T) for r in releases]) - truth)
    bound = releases[0].bound(S, T)
    e = math.exp(-1.0)
    assert bound == pytest.approx((1 + e) / (1 - e) * math.sqrt(S.size * T.size), rel=1e-12)
    assert errors.mean() + 4 * errors.std(ddof=1) / math.sqrt(draws) <= bound
    assert releases[0].stderr(S, T) <= bound / 2  # (35) is loose by 2 cosh(eps/2)


def test_cut_matches_brute_force() -> None:
    n_vertices = 50
    edges = random_graph(n_vertices, 300, seed=5)
    released = gc.release(edges, n_vertices, 0.5)
    noisy = dense(released.edges, n_vertices)
    S, T = np.array([0, 3, 7, 9, 20]), np.arange(30, 50)
    q_y = int(noisy[np.ix_(S, T)].sum())
    assert released.noisy_cut(S, T) == q_y
    p = released.flip_probability
    assert released.cut(S, T) == pytest.approx((q_y - p * S.size * T.size) / (1 - 2 * p))
    s_mask = np.zeros(n_vertices, bool)
    s_mask[S] = True
    assert released.cut(s_mask, T) == pytest.approx(released.cut(S, T))
    batch = released.cuts([S, T, np.array([1])], [T, S, np.array([2, 4])])
    assert batch[0] == pytest.approx(released.cut(S, T))
    assert batch[1] == pytest.approx(released.cut(T, S))
    assert batch[2] == pytest.approx(released.cut(np.array([1]), np.array([2, 4])))


def test_released_edges_are_canonical() -> None:
    edges = np.array([[3, 1], [0, 2], [4, 0]])
    released = gc.release(edges, 5, 1.0)
    u, v = released.edges[:, 0], released.edges[:, 1]
    assert np.all(u < v)
    assert released.edges.dtype == np.int32
    index = u.astype(np.int64) * 5 + v
    assert np.all(np.diff(index) > 0)
    empty = gc.release(np.empty((0, 2), np.int64), 3, 2.0)
    assert empty.edges.shape[1] == 2


def test_round_trip_through_dict() -> None:
    released = gc.release(random_graph(40, 100, seed=6), 40, 1.0)
    back = gc.GraphRelease.from_dict(released.to_dict())
    assert np.array_equal(back.edges, released.edges)
    assert back.flip_threshold == released.flip_threshold
    assert back.privacy_cost == released.privacy_cost
    assert released.privacy_cost.epsilon == 1.0
    shuffled = released.to_dict() | {"edges": released.edges[::-1]}
    with pytest.raises(MechanismError, match="sorted"):
        gc.GraphRelease.from_dict(shuffled)


@pytest.mark.slow
@pytest.mark.skipif(not FACEBOOK.exists(), reason="shared dataset not present")
def test_facebook_graph_release_is_fast_and_sized_right() -> None:
    edges = np.loadtxt(FACEBOOK, dtype=np.int64)
    released = gc.release(edges, 4039, 1.0)
    pairs = 4039 * 4038 // 2
    p = released.flip_probability
    expected = p * pairs + (1 - 2 * p) * edges.shape[0]
    spread = math.sqrt(pairs * p * (1 - p))
    assert abs(released.edges.shape[0] - expected) < 5 * spread


SECRET = 31_337


@pytest.mark.parametrize(
    ("edges", "n_vertices", "match"),
    [
        (np.array([[0, 1], [2, SECRET]]), 10, "^edges has vertex ids outside"),
        (np.array([[0, 1], [-1, 2]]), 10, "outside"),
        (np.array([[0, 1], [4, 4]]), 10, "^edges has self-loops"),
        (np.array([[0, 1], [1, 0], [2, 3]]), 10, "^edges has duplicate"),
        (np.array([[0, 1], [0, 1]]), 10, "^edges has duplicate"),
        (np.array([0, 1, 2]), 10, "shape"),
        (np.array([[0.0, 1.0]]), 10, "integer"),
        (np.array([[0, 1]]), 1, "n_vertices"),
        (np.array([[0, 1]]), gc.MAX_VERTICES + 1, "n_vertices"),
        (np.array([[0, 1]]), True, "integer"),
    ],
)
def test_release_rejects(edges: np.ndarray, n_vertices: int, match: str) -> None:
    with pytest.raises(MechanismError, match=match) as info:
        gc.release(edges, n_vertices, 1.0)
    assert str(SECRET) not in str(info.value)


def test_release_rejects_bad_epsilon() -> None:
    for epsilon in (0.0, -1.0, math.inf):
        with pytest.raises(MechanismError, match="epsilon"):
            gc.release(np.array([[0, 1]]), 3, epsilon)


@pytest.mark.parametrize("form", ["edges", "packed"])
def test_cut_rejects(form: str) -> None:
    """The edge list and the packed bit matrix (:func:`_packed`) refuse alike."""
    released: gc.GraphRelease | gc.PackedGraphRelease = gc.release(np.array([[0, 1]]), 5, 1.0)
    if form == "packed":
        released = _packed(released)
    with pytest.raises(MechanismError, match="disjoint"):
        released.cut([0, 1], [1, 2])
    with pytest.raises(MechanismError, match="outside"):
        released.cut([0, 7], [1])
    for beyond_int64 in (10**23, -(10**23)):  # an object array in numpy
        with pytest.raises(MechanismError, match=r"T has vertex ids outside \[0, 5\)"):
            released.cut([0], [1, beyond_int64])
    with pytest.raises(MechanismError, match="more than once"):
        released.cut([0, 0], [1])
    with pytest.raises(MechanismError, match="mask"):
        released.cut(np.ones(3, bool), [4])
    with pytest.raises(MechanismError, match="same number"):
        released.cuts([[0]], [[1], [2]])


def _noisy_cut_pmf(edges: int, pairs: int, p: float) -> np.ndarray:
    """Brute force: the law of Bin(edges, 1 - p) + Bin(pairs - edges, p) by convolution."""
    return np.convolve(
        stats.binom.pmf(np.arange(edges + 1), edges, 1 - p),
        stats.binom.pmf(np.arange(pairs - edges + 1), pairs - edges, p),
    )


@pytest.mark.parametrize("p", [0.018, 0.27, 0.45])
def test_noisy_cut_cdf_matches_the_convolution(p: float) -> None:
    for pairs in range(12):
        for edges in range(pairs + 1):
            cdf = np.cumsum(_noisy_cut_pmf(edges, pairs, p))
            for x in range(-2, pairs + 3):
                expected = 0.0 if x < 0 else 1.0 if x >= pairs else cdf[x]
                assert gc.noisy_cut_cdf(x, edges, pairs, p) == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0, 8.0])
@pytest.mark.parametrize("pairs", [1, 2, 6, 25, 60])
def test_exact_interval_covers_whatever_the_graph(epsilon: float, pairs: int) -> None:
    """Coverage computed exactly (no simulation): for every number of edges e of the cut,
    the probability under the noisy cut's law that the interval holds e is >= 0.95. The
    normal interval fell to 0.90 (6 pairs, epsilon 4)."""
    p = 1 / (1 + math.exp(epsilon))
    intervals = [gc.cut_interval(n, pairs, p) for n in range(pairs + 1)]
    assert all(0 <= lo <= hi <= pairs for lo, hi in intervals)
    for edges in range(pairs + 1):
        pmf = _noisy_cut_pmf(edges, pairs, p)
        covered = sum(pmf[n] for n, (lo, hi) in enumerate(intervals) if lo <= edges <= hi)
        assert covered >= 0.95 - 1e-9, (edges, covered)
    if (epsilon, pairs) == (4.0, 6):
        sd = math.sqrt(pairs * p * (1 - p))
        normal = sum(
            _noisy_cut_pmf(0, pairs, p)[n]
            for n in range(pairs + 1)
            if abs(n - pairs * p) <= 1.96 * sd
        )
        assert normal < 0.93  # what the exact interval replaces


def test_release_interval_is_exact_for_small_cuts_and_normal_beyond() -> None:
    n_vertices = 120
    edges = random_graph(n_vertices, 800, seed=9)
    released = gc.release(edges, n_vertices, 2.0)
    p = released.flip_probability
    small_S, small_T = np.arange(0, 3), np.arange(3, 8)
    noisy = released.noisy_cut(small_S, small_T)
    assert released.interval(small_S, small_T) == gc.cut_interval(noisy, 15, p)
    S, T = np.arange(0, 60), np.arange(60, 120)  # 3600 pairs: variance 846 at epsilon 0.5
    wide = gc.release(edges, n_vertices, 0.5)
    value, stderr = wide.cut(S, T), wide.stderr(S, T)
    assert 3600 * wide.flip_probability * (1 - wide.flip_probability) >= gc.EXACT_INTERVAL_VARIANCE
    lo, hi = wide.interval(S, T)
    assert lo == pytest.approx(max(value - 1.959963984540054 * stderr, 0.0))
    assert hi == pytest.approx(min(value + 1.959963984540054 * stderr, 3600.0))
    with pytest.raises(MechanismError, match="level"):
        released.interval(small_S, small_T, level=1.0)


def _packed(released: gc.GraphRelease) -> "gc.PackedGraphRelease":
    return gc.PackedGraphRelease.from_pair_bits(
        _bits(released), released.n_vertices, released.epsilon, released.flip_threshold
    )


@pytest.mark.parametrize("n_vertices", [2, 3, 7, 8, 9, 16, 17, 61])
def test_packed_release_answers_as_the_edge_list(n_vertices: int) -> None:
    """The dense bit matrix (what a loaded graph_cuts release answers from) gives every
    answer of the edge-list release bit for bit, and noisy cuts equal to direct counting
    in the noisy adjacency: random graphs, sizes at and around byte boundaries, id arrays
    and masks, |S| larger and smaller than |T|, batches."""
    rng = np.random.default_rng(n_vertices)
    pairs = n_vertices * (n_vertices - 1) // 2
    for epsilon in (0.05, 1.0, 6.0):
        edges = random_graph(n_vertices, int(rng.integers(0, pairs + 1)), seed=n_vertices)
        released = gc.release(edges, n_vertices, epsilon)
        packed = _packed(released)
        noisy = dense(released.edges, n_vertices)
        assert np.array_equal(np.unpackbits(packed.rows, axis=1, count=n_vertices), noisy)
        assert packed.released_edges() == released.edges.shape[0]
        streamed = list(gc.pair_bits_to_edges(_bits(released), n_vertices))
        assert np.array_equal(np.concatenate(streamed), released.edges)
        S_list, T_list = [], []
        for _ in range(30):
            perm = rng.permutation(n_vertices)
            a = int(rng.integers(1, n_vertices))
            b = int(rng.integers(a + 1, n_vertices + 1))
            S, T = perm[:a], perm[a:b]
            S_list.append(S)
            T_list.append(T)
            assert packed.noisy_cut(S, T) == int(noisy[np.ix_(S, T)].sum())
            assert packed.noisy_cut(S, T) == released.noisy_cut(S, T)
            for name in ("cut", "stderr", "bound", "interval"):
                assert getattr(packed, name)(S, T) == getattr(released, name)(S, T), name
            s_mask = np.zeros(n_vertices, bool)
            s_mask[S] = True
            assert packed.cut(s_mask, T.tolist()) == released.cut(S, T)
        assert np.array_equal(packed.cuts(S_list, T_list), released.cuts(S_list, T_list))
        assert np.array_equal(packed.cuts(T_list, S_list), packed.cuts(S_list, T_list))
        assert packed.cuts([], []).size == 0


def _bits(released: gc.GraphRelease) -> np.ndarray:
    return gc.pair_bits_of([released.edges], released.n_vertices)


def test_packed_release_rejects_a_matrix_of_the_wrong_shape() -> None:
    with pytest.raises(MechanismError, match="rows must be"):
        gc.PackedGraphRelease(
            rows=np.zeros((5, 2), np.uint8), n_vertices=5, epsilon=1.0, flip_threshold=1
        )
    with pytest.raises(MechanismError, match="pair bits must be 2 bytes"):
        gc.pair_bits_to_rows(np.zeros(3, np.uint8), 5)


def test_loaded_release_holds_the_bit_matrix_not_an_edge_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resource audit: a graph_cuts release of 20,000 vertices at epsilon 0.1 (9.5e7 noisy
    edges) loaded as an int64/int32 edge list held GBs, more than the answer cache, so it
    was decoded again (13-17 s) per request. The loaded release (what the cache sizes with
    footprint) and the memory of loading and answering are now the |V| ceil(|V|/8) bytes of
    the bit matrix plus fixed blocks, whatever the number of noisy edges."""
    import tracemalloc

    from app.core.footprint import footprint
    from app.releases.adapters.graph_cuts import GraphCuts
    from app.releases.payloads import pack

    monkeypatch.setattr(gc, "_BLOCK_BITS", 1 << 18, raising=False)
    n = 2000
    released = gc.release(np.empty((0, 2), np.int64), n, 0.01)  # about half the pairs
    assert released.edges.shape[0] > 900_000
    payload = pack(
        {
            "n_vertices": n,
            "epsilon": released.epsilon,
            "flip_threshold": released.flip_threshold,
            "pairs": _bits(released),
        }
    )
    matrix = n * ((n + 7) // 8)  # 0.5 MB; the edge list is 7 MB as int32 pairs
    adapter = GraphCuts()
    rng = np.random.default_rng(0)
    queries = []
    for size in (1, 10, 100, 1000, 1000):
        perm = rng.permutation(n).tolist()
        queries.append({"type": "cut", "S": perm[:size], "T": perm[size:]})
        queries.append({"type": "cut", "S": perm[size:], "T": perm[:size]})
    tracemalloc.start()
    try:
        loaded = adapter.load(payload, None, Path("."))  # type: ignore[arg-type]
        answers = adapter.answer(loaded, None, queries)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(answers) == 10
    assert footprint(loaded) <= matrix + 64 * 1024
    assert peak <= matrix + 3 * 1024 * 1024
    reference = gc.GraphRelease(
        edges=released.edges,
        n_vertices=n,
        epsilon=released.epsilon,
        flip_threshold=released.flip_threshold,
    )
    for query, answer in zip(queries, answers, strict=True):
        assert answer["value"] == reference.cut(query["S"], query["T"])
        assert answer["interval"] == list(reference.interval(query["S"], query["T"]))


def test_synthesize_writes_every_noisy_edge_in_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """edges.parquet (written in row blocks since the resource audit) holds the released
    edges, u < v in pair order, as int32 columns; the summary counts them."""
    import pyarrow.parquet as pq

    from app.releases.adapters.graph_cuts import GraphCuts
    from app.releases.payloads import pack

    monkeypatch.setattr(gc, "_BLOCK_BITS", 1 << 10, raising=False)  # several blocks
    n = 203
    released = gc.release(random_graph(n, 500, seed=1), n, 0.3)
    payload = pack(
        {
            "n_vertices": n,
            "epsilon": released.epsilon,
            "flip_threshold": released.flip_threshold,
            "pairs": _bits(released),
        }
    )
    done = GraphCuts().synthesize(
        payload,
        None,
        None,
        np.random.default_rng(0),
        tmp_path,
        lambda _: None,  # type: ignore[arg-type]
    )
    table = pq.read_table(tmp_path / "edges.parquet")
    assert table.schema.field("u").type == "int32"
    assert table.schema.field("v").type == "int32"
    written = np.column_stack([table["u"].to_numpy(), table["v"].to_numpy()])
    assert np.array_equal(written, released.edges)
    assert done.summary == {"noisy_edges": released.edges.shape[0]}
    # release.json: the public parameters as the release states them
    described = json.loads((tmp_path / "release.json").read_text())
    assert described["n_vertices"] == n
    assert described["epsilon"] == released.epsilon
    assert described["flip_probability"] == released.flip_probability
    assert described["epsilon_effective"] == released.epsilon_effective
    # at epsilon 40 the flip coin's rounding shows: T = 79, epsilon_effective 39.99...
    tiny = gc.release(np.array([[0, 1]]), 5, 40.0)
    GraphCuts().synthesize(
        pack(
            {
                "n_vertices": 5,
                "epsilon": 40.0,
                "flip_threshold": tiny.flip_threshold,
                "pairs": _bits(tiny),
            }
        ),
        None,
        None,
        np.random.default_rng(0),
        tmp_path,
        lambda _: None,  # type: ignore[arg-type]
    )
    described = json.loads((tmp_path / "release.json").read_text())
    assert described["flip_probability"] == tiny.flip_threshold / 2**64
    assert described["epsilon_effective"] == tiny.epsilon_effective < 40.0


def test_pair_bits_of_streams_blocks_and_refuses_an_edge_listed_twice_across_them() -> None:
    """The pair bits from edges in blocks (either orientation) are those of the whole
    edge list, bit for bit; an edge listed twice is refused whether the two copies share a
    block or not (the message gives no count: on the measure path it reaches the release's
    status), and the block checks of an edge list hold."""
    n = 61
    edges = random_graph(n, 400, seed=9)
    flipped = edges[:, ::-1].copy()
    whole = gc.pair_bits_of([edges], n)
    blocks = gc.pair_bits_of([edges[:150], flipped[150:300], edges[300:]], n)
    np.testing.assert_array_equal(blocks, whole)
    assert gc.pair_count(whole) == 400
    adjacency = dense(edges, n)
    rows, cols = np.triu_indices(n, k=1)
    np.testing.assert_array_equal(np.unpackbits(whole)[: rows.size], adjacency[rows, cols])
    assert not np.unpackbits(whole)[rows.size :].any()  # the padding
    with pytest.raises(MechanismError, match=r"^edges has duplicate edges"):
        gc.pair_bits_of([edges[:200], flipped[100:102], edges[200:]], n)
    with pytest.raises(MechanismError, match=r"^edges has duplicate edges"):
        gc.pair_bits_of([np.vstack([edges[:5], flipped[:1]])], n)
    with pytest.raises(MechanismError, match=r"^edges has duplicate edges"):  # across blocks
        gc.pair_bits_of([edges[:200], flipped[7:8], edges[200:]], n)
    with pytest.raises(MechanismError, match="self-loops"):
        gc.pair_bits_of([edges[:5], np.array([[3, 3]])], n)


def test_released_pair_bits_flip_each_pair_and_keep_the_padding() -> None:
    """The stored form: at a huge epsilon (flip probability 2^-63) the noisy pair bits are
    the true ones; at a small one about half of the pairs are flipped, the padding bits
    after the last pair stay 0 (a bit there would be read as no pair, but the stored bytes
    must not depend on where a block ended), and the cost is the requested epsilon."""
    n = 5  # 10 pairs: 2 bytes, the last 6 bits padding
    edges = np.array([[0, 1], [2, 4], [3, 4]])
    exact = gc.release_pair_bits([edges], n, 60.0)
    assert exact.flip_threshold == 2  # ceil(p 2^64) + 1
    np.testing.assert_array_equal(exact.bits, gc.pair_bits_of([edges], n))
    assert exact.privacy_cost.epsilon == 60.0
    flips = 0
    for _ in range(200):
        noisy = gc.release_pair_bits([edges], n, 0.01)
        assert noisy.bits[-1] & 0x3F == 0
        flips += int(np.bitwise_count(noisy.bits ^ exact.bits).sum())
    # 2000 pair draws at p = 0.4975: mean 995, sd 22; the bound is 9 sd
    assert abs(flips - 995) < 200


def test_measure_streams_the_stored_edges_into_pair_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resource audit: the measure concatenated every stored edge as int64, checked and
    sorted it, and perturbed it into an int64 list of every released edge (about 56 bytes
    each: GBs at 20,000 vertices and a small epsilon) before packing it into pair bits. It
    now reads the stored edges a batch at a time into the pair bits and flips them there:
    its memory is the two pair bit arrays, a block of random words and one batch, whatever
    the number of true or released edges."""
    import tracemalloc

    import pyarrow as pa

    from app.releases.adapters.graph_cuts import GraphCuts
    from app.releases.payloads import unpack

    monkeypatch.setattr(gc, "_BLOCK_PAIRS", 1 << 16)
    n = 2000
    iu = np.triu_indices(n, k=1)
    keep = np.random.default_rng(3).random(iu[0].size) < 0.5  # half of the 2e6 pairs
    u, v = iu[0][keep].astype(np.int32), iu[1][keep].astype(np.int32)
    batches = [
        pa.RecordBatch.from_arrays(
            [pa.array(u[i : i + 50_000]), pa.array(v[i : i + 50_000])], ["u", "v"]
        )
        for i in range(0, u.size, 50_000)
    ]

    class Source:
        def codes(self) -> list[pa.RecordBatch]:
            return batches

    class Info:
        n_vertices = n

    adapter = GraphCuts()
    params = adapter.parse_params({})
    tracemalloc.start()
    try:
        measured = adapter.measure(Source(), Info(), 60.0, 0.0, params)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pairs = unpack(measured.payload)["pairs"]
    expected = gc.pair_bits_of([np.column_stack([u, v])], n)
    np.testing.assert_array_equal(pairs, expected)  # epsilon 60: flip probability 2^-63
    assert measured.privacy_cost.epsilon == 60.0
    bits = gc.pair_bytes(n)  # 250 KB; the 1e6 true edges are 16 MB as int64 pairs
    assert peak <= 4 * bits + 4 * 1024 * 1024, peak


@pytest.mark.parametrize("n", [5, 9, 4039])
def test_certain_flips_flip_every_pair_once_and_never_the_padding(n: int) -> None:
    """``_perturb`` at ``T = 2^64`` (every coin 1) is the complement of every pair bit,
    each pair flipped exactly once, also where a block of :data:`_BLOCK_PAIRS` ends
    (4039 vertices: 8.2e6 pairs, two blocks at the real block size), and the padding
    bits after the last pair stay 0; at ``T = 0`` the bits are unchanged."""
    pairs = n * (n - 1) // 2
    assert gc._BLOCK_PAIRS % 8 == 0  # blocks are whole bytes
    edges = random_graph(n, min(pairs // 3, 5000), seed=4)
    true_bits = gc.pair_bits_of([edges], n)
    flipped = gc._perturb(true_bits, n, secure_random.TWO_64)
    assert flipped.shape == true_bits.shape
    unpacked = np.unpackbits(flipped)
    np.testing.assert_array_equal(unpacked[:pairs], 1 - np.unpackbits(true_bits)[:pairs])
    assert not unpacked[pairs:].any()
    assert gc.pair_count(flipped) == pairs - edges.shape[0]
    np.testing.assert_array_equal(gc._perturb(true_bits, n, 0), true_bits)


def test_stored_flip_threshold_must_lie_in_zero_to_half() -> None:
    """A release's ``flip_threshold`` ``T`` (flip probability ``T / 2^64``) lies in
    ``(0, 2^63]``: ``2^63`` (probability 1/2) is accepted, 0 and ``2^63 + 1`` refused."""
    bits = np.zeros(gc.pair_bytes(5), np.uint8)
    half = gc.PairBitsRelease(bits=bits, n_vertices=5, epsilon=1.0, flip_threshold=1 << 63)
    assert half.flip_probability == 0.5
    for threshold in (0, (1 << 63) + 1):
        with pytest.raises(MechanismError, match=r"flip_threshold must lie in \(0, 2\^63\]"):
            gc.PairBitsRelease(bits=bits, n_vertices=5, epsilon=1.0, flip_threshold=threshold)


@pytest.mark.parametrize("block_bytes", [1, 24, 100])
def test_packed_cuts_read_every_row_in_any_block_size(
    monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    """A packed cut reads its rows _CUT_BLOCK_BYTES at a time: with blocks of 1, 3 and 12
    rows (61 vertices: 8-byte rows) every row of the smaller side is counted once, the
    noisy cut equal to direct counting in the noisy adjacency."""
    monkeypatch.setattr(gc, "_CUT_BLOCK_BYTES", block_bytes)
    n = 61
    released = gc.release(random_graph(n, 600, seed=5), n, 1.0)
    packed = _packed(released)
    noisy = dense(released.edges, n)
    rng = np.random.default_rng(6)
    for a in (1, 2, 3, 4, 12, 13, 25, 30):
        perm = rng.permutation(n)
        S, T = perm[:a], perm[a:]
        assert packed.noisy_cut(S, T) == int(noisy[np.ix_(S, T)].sum()), a
        assert packed.noisy_cut(T, S) == int(noisy[np.ix_(S, T)].sum()), a


def test_pair_bits_must_be_the_graphs_bytes_as_uint8() -> None:
    """Stored pair bits are exactly pair_bytes(|V|) bytes of uint8: the right length in
    another dtype (whose items are not 8 pair bits each) is refused."""
    for bits in (np.zeros(2, np.int64), np.zeros(2, np.bool_), np.zeros(3, np.uint8)):
        with pytest.raises(MechanismError, match="pair bits must be 2 bytes for 5 vertices"):
            gc.PairBitsRelease(bits=bits, n_vertices=5, epsilon=1.0, flip_threshold=2)
        with pytest.raises(MechanismError, match="pair bits must be 2 bytes"):
            list(gc.pair_bits_to_edges(bits, 5))


def test_a_bad_epsilon_is_refused_before_any_edge_is_read() -> None:
    """release_pair_bits checks its public parameters before it reads the edge blocks (a
    stored graph may be GBs): a refused epsilon consumes none of them."""

    def blocks() -> Any:
        raise AssertionError("an edge block was read")
        yield np.array([[0, 1]])  # pragma: no cover

    for epsilon in (0.0, -1.0, float("nan")):
        with pytest.raises(MechanismError, match="epsilon"):
            gc.release_pair_bits(blocks(), 5, epsilon)
    with pytest.raises(MechanismError, match="n_vertices"):
        gc.release_pair_bits(blocks(), 1, 1.0)


def test_flips_report_their_progress_by_vertices_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``release_pair_bits``' progress is the share of the ``|V| (|V| - 1) / 2`` pairs
    flipped, after each block of :data:`_BLOCK_PAIRS`: the same values for any graph on the
    same vertices (the edge count is private), and the same bits with and without it (a
    seeded stand-in for OpenDP's CSPRNG)."""
    monkeypatch.setattr(gc, "_BLOCK_PAIRS", 16)
    n = 9  # 36 pairs: blocks end at 16, 32, 36
    drawn: dict[str, list[float]] = {}
    for name, edges in (("one edge", np.array([[0, 1]])), ("many", random_graph(n, 20, seed=2))):
        seen: list[float] = []
        gc.release_pair_bits([edges], n, 1.0, progress=seen.append)
        drawn[name] = seen
    assert drawn["one edge"] == pytest.approx([16 / 36, 32 / 36, 1.0])
    assert drawn["many"] == drawn["one edge"]

    def seeded() -> None:
        rng = np.random.default_rng(5)
        monkeypatch.setattr(
            secure_random, "bernoulli", lambda size, threshold: rng.random(size) < 0.3
        )

    edges = random_graph(n, 12, seed=3)
    seeded()
    with_progress = gc.release_pair_bits([edges], n, 1.0, progress=lambda done: None)
    seeded()
    without = gc.release_pair_bits([edges], n, 1.0)
    np.testing.assert_array_equal(with_progress.bits, without.bits)


@pytest.mark.parametrize("n", [2, 3, 8, 9, 40])
def test_pair_block_count_is_the_number_of_edge_blocks(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:func:`pair_block_count` (the synthesis stage's progress denominator) is how many
    blocks :func:`pair_bits_to_edges` yields, one per ``_BLOCK_BITS`` pairs."""
    monkeypatch.setattr(gc, "_BLOCK_BITS", 8)
    bits = gc.pair_bits_of([random_graph(n, 1, seed=1)], n)
    assert gc.pair_block_count(n) == len(list(gc.pair_bits_to_edges(bits, n)))
    assert gc.pair_block_count(n) == math.ceil(n * (n - 1) / 2 / 8)
