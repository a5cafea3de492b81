"""Answers of randomized response from the cell counts, every group at once (numpy segment
reductions, ``_group_sums``), against the per-group loop they replaced and the row-by-row
formulas (eq. 17-18, the exact variance, bounds (20) and (22)).

The references are kept here, slow on purpose: ``loop_sums`` is the former
``RRRelease._sums`` (one Python iteration and one ``evaluate`` per public value),
``row_sums`` evaluates each row's function on its released code. Sums of integers
(``sum_i phi_i(y_i)`` for 0/1 row functions) must agree exactly, every other sum and every
answer field to 1e-12 relative (rounding: numpy's reductions add in another order).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from app.mechanisms import randomized_response as rr
from app.mechanisms.errors import MechanismError
from app.mechanisms.randomized_response import Conjunction, Domain, Heterogeneous, Table

RTOL = 1e-12
KINDS: tuple[rr.StderrKind, ...] = ("worst_case", "plug_in", "bound", "bound_proper")


def _add_group(sums: rr._Sums, function: rr.RowFunction, cells: np.ndarray, counts: np.ndarray):
    """One iteration of the former ``RRRelease._sums`` loop (verbatim formulas)."""
    count = int(counts.sum())
    weights = counts.astype(np.float64)
    phi_y = function.evaluate(cells)
    mu = function.mean
    sums.phi_y += float(np.dot(weights, phi_y))
    sums.mu += count * mu
    sums.dev2_y += float(np.dot(weights, (phi_y - mu) ** 2))
    sums.spread += count * function.spread
    sums.worst_dev2 += count * max((function.low - mu) ** 2, (function.high - mu) ** 2)
    sums.low = min(sums.low, function.low)
    sums.high = max(sums.high, function.high)
    sums.pairs.add((function.low, function.high))
    sums.two_valued = sums.two_valued and function.two_valued


def loop_sums(released: rr.RRRelease, query: rr.Query) -> rr._Sums:
    """The former per-group loop over ``cell_counts``: one group per public value."""
    sums = rr._Sums()
    table = released.cell_counts
    if isinstance(query, Heterogeneous):
        assert table.values is not None
        for g, value in enumerate(table.values):
            entries = slice(table.starts[g], table.starts[g + 1])
            function = query.functions[int(value)]
            _add_group(sums, function, table.cells[entries], table.counts[entries])
    else:
        _add_group(sums, rr._as_row_function(query), table.cells, table.counts)
    return sums


def row_sums(released: rr.RRRelease, query: rr.Query) -> rr._Sums:
    """Every row's function at its released code, summed row by row (no counts at all)."""
    if isinstance(query, Heterogeneous):
        assert released.public is not None
        functions = [query.functions[int(p)] for p in released.public]
    else:
        functions = [rr._as_row_function(query)] * released.n
    sums = rr._Sums()
    for function, code in zip(functions, released.codes, strict=True):
        _add_group(sums, function, np.array([code]), np.array([1]))
    return sums


def assert_sums_match(got: rr._Sums, want: rr._Sums, *, exact_phi: bool) -> None:
    if exact_phi:
        assert got.phi_y == want.phi_y
    else:
        np.testing.assert_allclose(got.phi_y, want.phi_y, rtol=RTOL, atol=1e-12)
    for name in ("mu", "spread", "worst_dev2"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=RTOL)
    np.testing.assert_allclose(got.dev2_y, want.dev2_y, rtol=RTOL, atol=1e-12)
    assert (got.low, got.high, got.pairs, got.two_valued) == (
        want.low,
        want.high,
        want.pairs,
        want.two_valued,
    )


def assert_answers_match(released: rr.RRRelease, query: rr.Query, want: rr._Sums) -> None:
    """Every answer field from the vectorised path equals the reference sums' answer."""
    # the estimate subtracts rho * sum_i mu_i: near 0 its relative rounding is that of
    # sum_i mu_i over n (1 - rho), hence the absolute tolerance
    atol = 1e-15 / released.keep_margin
    value, stderr, bound, _ = released.answer(query, proper=False)
    np.testing.assert_allclose(value, released._estimate(want), rtol=RTOL, atol=atol)
    np.testing.assert_allclose(stderr, released._stderr(want, "worst_case"), rtol=RTOL)
    assert bound == released._stderr(want, "bound")
    for kind in KINDS:
        np.testing.assert_allclose(
            released.stderr(query, kind), released._stderr(want, kind), rtol=RTOL
        )
    if len(want.pairs) == 1 and want.two_valued:
        proper, _, bound_proper, _ = released.answer(query, proper=True)
        assert proper == released._estimate_proper(want)
        assert bound_proper == released._stderr(want, "bound_proper")
    else:
        with pytest.raises(MechanismError, match="same two"):
            released.answer(query, proper=True)


def random_conjunction(rng: np.random.Generator, domain: Domain) -> Conjunction:
    """1 to 3 attributes, each allowing a random nonempty subset (never all of them)."""
    cards = domain.cardinalities
    while True:
        attributes = rng.choice(len(cards), size=int(rng.integers(1, min(3, len(cards)) + 1)))
        terms: dict[int, list[int]] = {}
        for a in attributes.tolist():
            k = cards[a]
            size = int(rng.integers(1, min(k, 6) + 1))
            terms[a] = sorted({int(v) for v in rng.integers(0, k, size=size)})
        if any(len(terms[a]) < cards[a] for a in terms):
            return Conjunction(domain, terms)


#: (domain, epsilon): categorical (3, 5), binary (2) and discretised continuous (2^3, 2^4)
#: attributes; a one-attribute domain; an attribute of 2^40 values (keys by rank)
CASES = [
    (Domain((3, 2, 8)), 1.0),
    (Domain((5, 16)), 0.5),
    (Domain((7,)), 2.0),
    (Domain((2, 2, 2, 2, 2, 2)), 1.0),
    (Domain((1 << 40, 3)), 30.0),
]


def make_release(
    domain: Domain, epsilon: float, seed: int, n: int, public_values: np.ndarray
) -> rr.RRRelease:
    rng = np.random.default_rng(seed)
    x = domain.encode(np.column_stack([rng.integers(0, k, size=n) for k in domain.cardinalities]))
    public = public_values[rng.integers(0, public_values.size, size=n)]
    return rr.release(x, domain, epsilon, public=public)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_heterogeneous_conjunctions_match_the_loop_and_the_rows(case: int, seed: int) -> None:
    """by_public conjunctions (the service's heterogeneous queries) on many public values
    with few rows each, so most (value, code) pairs have no rows; sparse public codes."""
    domain, epsilon = CASES[case]
    rng = np.random.default_rng([case, seed])
    values = np.sort(rng.choice(10_000, size=int(rng.integers(1, 60)), replace=False))
    released = make_release(domain, epsilon, seed, int(rng.integers(1, 400)), values)
    table = released.cell_counts
    assert table.values is not None
    by_public = {int(v): random_conjunction(rng, domain) for v in table.values}
    by_public[10_001] = random_conjunction(rng, domain)  # a value with no rows: ignored
    shared = random_conjunction(rng, domain)
    queries: list[rr.Query] = [
        Heterogeneous(by_public),
        Heterogeneous(dict.fromkeys(by_public, shared)),  # one object for every group
        shared,
    ]
    for query in queries:
        want = loop_sums(released, query)
        assert_sums_match(released._sums(query), want, exact_phi=True)
        assert_sums_match(row_sums(released, query), want, exact_phi=True)
        assert_answers_match(released, query, want)
    # the same conjunction for every public value is the plain linear query (to rounding:
    # sum_g n_g mu against n mu)
    assert_sums_match(released._sums(queries[1]), released._sums(shared), exact_phi=True)


def test_a_single_public_value() -> None:
    domain = Domain((4, 2, 8))
    released = make_release(domain, 1.0, 7, 300, np.array([42]))
    rng = np.random.default_rng(7)
    for query in (
        Heterogeneous({42: random_conjunction(rng, domain)}),
        Heterogeneous({42: rng.uniform(-1, 1, size=domain.size)}),
    ):
        want = loop_sums(released, query)
        assert_sums_match(released._sums(query), want, exact_phi=False)
        assert_answers_match(released, query, want)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_mixed_row_functions_match_the_loop(seed: int) -> None:
    """Conjunctions, tables (one object shared by several values, others distinct),
    indicator tables and a table of other values (pairs differ: no proper estimate)."""
    domain = Domain((3, 2, 4))
    rng = np.random.default_rng(seed)
    values = np.arange(0, 90, 3)
    released = make_release(domain, 0.8, seed, 500, values)
    table = released.cell_counts
    assert table.values is not None
    indicator = Table(np.isin(np.arange(domain.size), [1, 5, 7, 20]).astype(float))
    shared = Table(rng.uniform(-2, 3, size=domain.size))
    choices: list[Callable[[], rr.RowFunction]] = [
        lambda: random_conjunction(rng, domain),
        lambda: shared,
        lambda: Table(rng.normal(size=domain.size)),
        lambda: indicator,
    ]
    two_valued = {int(v): choices[(0, 3)[int(rng.integers(2))]]() for v in table.values}
    mixed = {int(v): choices[int(rng.integers(0, 4))]() for v in table.values}
    scaled = dict(two_valued) | {int(table.values[0]): Table(2 * indicator.values)}
    for functions in (two_valued, mixed, scaled):
        query = Heterogeneous(functions)
        want = loop_sums(released, query)
        assert_sums_match(released._sums(query), want, exact_phi=False)
        assert_sums_match(row_sums(released, query), want, exact_phi=False)
        assert_answers_match(released, query, want)


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_queries_without_and_with_a_public_column(seed: int) -> None:
    """One row function for every row: one group of every entry, public column or not."""
    domain = Domain((3, 2, 8))
    rng = np.random.default_rng(seed)
    for public in (None, np.arange(20)):
        x = domain.encode(rng.integers(0, [3, 2, 8], size=(400, 3)))
        p = None if public is None else rng.choice(public, size=400)
        released = rr.release(x, domain, 1.0, public=p)
        for query in (
            random_conjunction(rng, domain),
            rng.uniform(-1, 1, size=domain.size),
            Table(np.isin(np.arange(domain.size), [0, 9]).astype(float)),
        ):
            want = loop_sums(released, query)
            assert_sums_match(released._sums(query), want, exact_phi=False)
            assert_answers_match(released, query, want)


def test_group_sums_with_empty_groups() -> None:
    """Groups with no entries (``starts`` repeating) count no rows but their row
    function still takes part in ``a``, ``b`` and the pairs, as in the loop."""
    domain = Domain((3, 4))
    rng = np.random.default_rng(9)
    starts = np.array([0, 0, 3, 3, 3, 7, 7], dtype=np.int64)
    cells = np.concatenate([np.sort(rng.choice(12, size=k, replace=False)) for k in (3, 4)])
    counts = rng.integers(1, 9, size=cells.size)
    functions: list[rr.RowFunction] = [
        Table(np.linspace(-5, 7, 12)),  # empty: its a = -5, b = 7 still count
        random_conjunction(rng, domain),
        random_conjunction(rng, domain),  # empty
        Table(np.linspace(-5, 7, 12)),  # empty
        random_conjunction(rng, domain),
        Conjunction(domain, {0: 1}),  # empty
    ]
    want = rr._Sums()
    for g, function in enumerate(functions):
        entries = slice(starts[g], starts[g + 1])
        _add_group(want, function, cells[entries], counts[entries])
    got = rr._group_sums(cells, counts, starts, functions, domain)
    assert_sums_match(got, want, exact_phi=False)
    assert (got.low, got.high) == (-5.0, 7.0)


def test_groups_that_share_a_conjunction_read_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups whose row function is the same :class:`Conjunction` object (a ``by_public``
    query whose values select the same cells) are evaluated through one entry of
    ``_conjunctions_at`` each, and every group still gets its own rows' values: the sums
    equal the per-group loop's, ``phi`` exactly, with the groups interleaved and a table
    among them."""
    domain = Domain((3, 4, 5))
    rng = np.random.default_rng(31)
    a, b, c = (random_conjunction(rng, domain) for _ in range(3))
    assert len({tuple(f.term_sets.items()) for f in (a, b, c)}) == 3
    functions: list[rr.RowFunction] = [a, b, a, Table(np.linspace(0, 1, 60)), c, b, a, c]
    sizes = rng.integers(1, 12, size=len(functions))
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    cells = np.concatenate([np.sort(rng.choice(60, size=k, replace=False)) for k in sizes])
    counts = rng.integers(1, 9, size=cells.size)
    passed: list[int] = []
    conjunctions_at = rr._conjunctions_at

    def spy(conjunctions, *args):  # type: ignore[no-untyped-def]
        passed.append(len(conjunctions))
        return conjunctions_at(conjunctions, *args)

    monkeypatch.setattr(rr, "_conjunctions_at", spy)
    want = rr._Sums()
    for g, function in enumerate(functions):
        entries = slice(starts[g], starts[g + 1])
        _add_group(want, function, cells[entries], counts[entries])
    got = rr._group_sums(cells, counts, starts, functions, domain)
    assert passed == [3]
    assert_sums_match(got, want, exact_phi=True)


@pytest.mark.parametrize(
    "cardinalities",
    [(3, 2, 8, 5), (3, 7, 11, 13, 6)],  # the second: products that round by their order
)
def test_conjunction_values_are_the_brute_force_table(cardinalities: tuple[int, ...]) -> None:
    """``_conjunctions_at`` on every cell of the domain for many conjunctions at once
    equals each conjunction's own ``evaluate`` and ``mean``, bit for bit."""
    domain = Domain(cardinalities)
    rng = np.random.default_rng(12)
    conjunctions = [random_conjunction(rng, domain) for _ in range(40)]
    owner = np.repeat(np.arange(40), domain.size)
    cells = np.tile(np.arange(domain.size), 40)
    mu, phi = rr._conjunctions_at(conjunctions, domain, owner, cells)
    want = np.concatenate([c.evaluate(np.arange(domain.size)) for c in conjunctions])
    assert np.array_equal(phi, want)
    assert mu.tolist() == [c.mean for c in conjunctions]


def test_heterogeneous_refusals_are_unchanged() -> None:
    domain = Domain((2, 3))
    released = rr.release(np.array([0, 1, 2, 5]), domain, 1.0, public=np.array([5, 5, 6, 9]))
    with pytest.raises(MechanismError, match="no row function for 2 of the public column's 3"):
        released.estimate(Heterogeneous({5: Conjunction(domain, {0: 1})}))
    with pytest.raises(MechanismError, match="release's domain"):
        released.estimate(
            Heterogeneous(dict.fromkeys((5, 6, 9), Conjunction(Domain((6,)), {0: 1})))
        )
    with pytest.raises(MechanismError, match="defined on 4 cells"):
        released.estimate(Heterogeneous({5: np.arange(6.0), 6: np.arange(4.0), 9: np.arange(6.0)}))
    plain = rr.release(np.array([0, 1, 2, 5]), 6, 1.0, public=np.array([5, 5, 6, 9]))
    with pytest.raises(MechanismError, match="release's domain"):
        plain.estimate(Heterogeneous(dict.fromkeys((5, 6, 9), Conjunction(domain, {0: 1}))))
    assert math.isfinite(released.estimate(Heterogeneous(dict.fromkeys((5, 6, 9), [0, 1] * 3))))
