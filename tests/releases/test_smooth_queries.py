"""smooth_queries: polynomial queries expand as a dense expansion does, and a batch
proven over the pair budget is refused before any polynomial is expanded."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from numpy.polynomial import polynomial

from app.core.errors import InvalidRequest
from app.releases.adapters import smooth_queries
from app.releases.adapters.smooth_queries import PolynomialForm, parse
from app.releases.registry import ColumnInfo, DatasetInfo


def _info(bounds: list[tuple[float, float]]) -> DatasetInfo:
    return DatasetInfo(
        n_rows=10,
        columns=tuple(
            ColumnInfo(f"c{i}", "continuous", lower, upper)
            for i, (lower, upper) in enumerate(bounds)
        ),
    )


def _dense(form: PolynomialForm, info: DatasetInfo) -> tuple[np.ndarray, np.ndarray]:
    """The reference: each monomial keyed by its dense d-tuple of exponents (the expansion
    the parser used before it keyed monomials sparsely)."""
    d = info.d
    lower, upper = info.bounds()

    def affine(i: int) -> tuple[float, float]:
        if form.space == "normalized":
            return 0.0, 1.0
        half = (upper[i] - lower[i]) / 2.0
        return float(lower[i] + half), float(half)

    total: dict[tuple[int, ...], float] = {}
    for term in form.terms:
        expansions = {
            info.names.index(name): polynomial.polypow(affine(info.names.index(name)), power)
            for name, power in term.powers.items()
        }
        monomials: dict[tuple[int, ...], float] = {(0,) * d: term.coefficient}
        for i, coefficients in expansions.items():
            grown: dict[tuple[int, ...], float] = {}
            for exponent, value in monomials.items():
                for k, c in enumerate(coefficients):
                    if c == 0.0:
                        continue
                    key = (*exponent[:i], exponent[i] + k, *exponent[i + 1 :])
                    grown[key] = grown.get(key, 0.0) + value * float(c)
            monomials = grown
        for exponent, value in monomials.items():
            total[exponent] = total.get(exponent, 0.0) + value
    if not total:
        total = {(0,) * d: 0.0}
    return np.array(list(total), dtype=np.int64).reshape(-1, d), np.array(list(total.values()))


def _random_form(rng: random.Random, d: int, space: str) -> dict[str, Any]:
    terms: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 8)):
        if terms and rng.random() < 0.25:  # a duplicate term
            terms.append(dict(rng.choice(terms)))
            continue
        columns = rng.sample(range(d), rng.randint(0, min(d, 4)))
        coefficient = rng.choice([0.0, -0.0, 1.0, rng.uniform(-3, 3), rng.randint(-5, 5)])
        terms.append(
            {
                "coefficient": float(coefficient),
                "powers": {f"c{i}": rng.choice([0, 1, 2, 3, rng.randint(0, 7)]) for i in columns},
            }
        )
    return {"type": "polynomial", "space": space, "terms": terms}


@pytest.mark.parametrize("space", ["normalized", "original"])
def test_polynomials_expand_as_the_dense_expansion_does(space: str) -> None:
    rng = random.Random(7 if space == "normalized" else 8)
    for case in range(300):
        d = rng.randint(1, 6)
        # bounds symmetric about 0 give zero coefficients in (a + b x')^p (a = 0)
        bounds = [
            rng.choice([(0.0, 1.0), (-2.0, 2.0), (-1.0, 3.0), (5.0, 7.5), (-1e3, 1e-3)])
            for _ in range(d)
        ]
        info = _info(bounds)
        query = _random_form(rng, d, space)
        (parsed,) = parse([query], info)
        exponents, coefficients = _dense(PolynomialForm.model_validate(query), info)
        assert parsed.exponents.tolist() == exponents.tolist(), (case, query)
        # bit for bit, signed zeros included
        assert parsed.coefficients.tobytes() == coefficients.tobytes(), (case, query)
        bound = smooth_queries._monomials_at_least(
            PolynomialForm.model_validate(query), smooth_queries._Columns(info)
        )
        assert 1 <= bound <= exponents.shape[0], (case, query)
        if space == "normalized":
            assert bound == exponents.shape[0], (case, query)


def test_columns_repeated_across_terms_merge() -> None:
    info = _info([(0.0, 2.0), (1.0, 3.0), (-1.0, 1.0)])
    query = {
        "type": "polynomial",
        "space": "original",
        "terms": [
            {"coefficient": 1.0, "powers": {"c0": 2, "c1": 1}},
            {"coefficient": -2.0, "powers": {"c1": 1, "c0": 1}},
            {"coefficient": 0.5, "powers": {"c2": 3, "c0": 1}},
            {"coefficient": 0.0, "powers": {"c1": 2}},
            {"coefficient": 3.0},
        ],
    }
    (parsed,) = parse([query], info)
    exponents, coefficients = _dense(PolynomialForm.model_validate(query), info)
    assert parsed.exponents.tolist() == exponents.tolist()
    assert parsed.coefficients.tobytes() == coefficients.tobytes()


def test_a_batch_proven_over_the_pair_budget_is_refused_before_expanding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def expanded(*args: Any) -> Any:
        raise AssertionError("expanded")

    monkeypatch.setattr(smooth_queries, "_polynomial", expanded)
    info = _info([(0.0, 1.0)] * 20)
    # 4096 monomials from one term in original units: 4096^2 pairs
    wide = {f"c{i}": 1 for i in range(12)}
    query = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": wide}],
    }
    with pytest.raises(InvalidRequest) as refused:
        parse([query], info)
    assert "at least 16777216 pairs of kernels" in refused.value.message
    # normalised units: 1000 distinct monomials per query, 11 queries
    terms = [{"coefficient": 1, "powers": {f"c{i % 20}": 1 + i // 20}} for i in range(600)]
    terms += [
        {"coefficient": 1, "powers": {f"c{i % 20}": 1, "c0": 1 + i // 20}} for i in range(400)
    ]
    query = {"type": "polynomial", "terms": terms}
    with pytest.raises(InvalidRequest) as refused:
        parse([query] * 11, info)
    bound = smooth_queries._monomials_at_least(
        PolynomialForm.model_validate(query), smooth_queries._Columns(info)
    )
    assert f"at least {11 * bound**2} pairs" in refused.value.message
    assert 11 * bound**2 > smooth_queries.MAX_CENTER_PAIRS


def test_a_query_refused_on_its_own_keeps_its_refusal() -> None:
    """The bound leaves out a query that names an unknown column or expands to too many
    monomials: that query's own 422 is given, not the pair budget's."""
    info = _info([(0.0, 1.0)] * 20)
    huge = {"coefficient": 1, "powers": {f"c{i}": 1 for i in range(17)}}
    query = {"type": "polynomial", "space": "original", "terms": [huge]}
    with pytest.raises(InvalidRequest) as refused:
        parse([query], info)
    assert refused.value.message.startswith("queries.0: this polynomial expands to 131072")
    unknown = {"type": "polynomial", "terms": [{"coefficient": 1, "powers": {"nope": 1}}]}
    with pytest.raises(InvalidRequest) as refused:
        parse([{"type": "polynomial", "terms": [{"coefficient": 1}]}, unknown], info)
    assert refused.value.message.startswith("queries.1: column 'nope' is not in this release")


def test_a_batch_over_the_exponent_budget_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each polynomial becomes a dense (monomials x d) exponent table: a batch whose
    tables would pass MAX_EXPONENT_ENTRIES is refused, before anything is expanded when
    the lower bound proves it (normalised units: exact), else once the expansion does."""
    info = _info([(0.0, 1.0)] * 20)
    monkeypatch.setattr(smooth_queries, "MAX_EXPONENT_ENTRIES", 50 * 20)
    ten = {
        "type": "polynomial",
        "terms": [{"coefficient": 1, "powers": {f"c{i}": 1}} for i in range(10)],
    }
    assert len(parse([ten] * 5, info)) == 5  # 50 monomials x 20 columns: at the bound
    expand = smooth_queries._polynomial

    def expanded(*args: Any) -> Any:
        raise AssertionError("expanded")

    monkeypatch.setattr(smooth_queries, "_polynomial", expanded)
    with pytest.raises(InvalidRequest) as refused:
        parse([ten] * 6, info)
    assert refused.value.message.startswith(
        "these polynomials have at least 60 monomials in normalised units over 20 columns, "
        "1200 exponents; at most 1000 per request"
    )
    monkeypatch.setattr(smooth_queries, "_polynomial", expand)
    # original units: (c0 + c1 + ...) expands to more monomials than the bound sees
    wide = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": {"c0": 1, "c1": 1}}],
    }  # (0.5 + 0.5 x0)(0.5 + 0.5 x1): 4 monomials, at least 4 seen (one term)
    assert len(parse([ten] * 4 + [wide] * 2, info)) == 6  # 48 x 20
    sums = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": {f"c{i}": 1}} for i in range(10)],
    }  # 11 monomials (10 linear ones and the constant), at least 10 seen
    assert (
        smooth_queries._monomials_at_least(
            PolynomialForm.model_validate(sums), smooth_queries._Columns(info)
        )
        == 10
    )
    with pytest.raises(InvalidRequest) as refused:  # 40 + 11 = 51 monomials, 1020 entries
        parse([ten] * 4 + [sums], info)
    assert refused.value.message.startswith(
        "these polynomials have at least 51 monomials in normalised units over 20 columns, "
        "1020 exponents; at most 1000 per request"
    )


def test_an_expansion_stops_as_soon_as_it_passes_the_budgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A polynomial whose lower bound fits but whose expansion does not is refused while
    it expands, before its dense exponent table is built (review: one query of 97 terms
    on 10 columns each passed its bound of 1024 monomials and built a 99,232 x 1000
    table, 1.5 GB, before the pair budget refused it)."""
    info = _info([(0.0, 1.0)] * 20)
    monkeypatch.setattr(smooth_queries, "MAX_EXPONENT_ENTRIES", 30 * 20)
    pairs = [(2 * i, 2 * i + 1) for i in range(10)] + [(0, 2), (1, 3)]
    query = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": {f"c{a}": 1, f"c{b}": 1}} for a, b in pairs],
    }  # 1 + 20 + 12 = 33 monomials; the bound sees the 12 distinct leading ones
    form = PolynomialForm.model_validate(query)
    assert smooth_queries._monomials_at_least(form, smooth_queries._Columns(info)) == 12
    built: list[int] = []
    polynomial = smooth_queries.Polynomial

    def building(**arrays: Any) -> Any:
        built.append(len(arrays["coefficients"]))
        return polynomial(**arrays)

    monkeypatch.setattr(smooth_queries, "Polynomial", building)
    with pytest.raises(InvalidRequest) as refused:
        parse([query], info)
    message = refused.value.message
    assert message.startswith("these polynomials have at least ")
    assert 30 < int(message.split()[5]) <= 33
    assert built == []
    # the same query within the budget: expanded in full, its 33 monomials exact
    monkeypatch.setattr(smooth_queries, "MAX_EXPONENT_ENTRIES", 33 * 20)
    (parsed,) = parse([query], info)
    assert built == [33]
    exponents, _ = _dense(form, info)
    assert parsed.exponents.tolist() == exponents.tolist()
    # and the pair budget stops it the same way
    monkeypatch.setattr(smooth_queries, "MAX_CENTER_PAIRS", 30 * 30)
    with pytest.raises(InvalidRequest, match=r"^these queries have at least"):
        parse([query], info)
    assert built == [33]


def test_an_expansion_is_refused_at_the_first_term_past_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The budget is checked after each term: a polynomial past it stops there, with the
    monomials of the terms expanded so far (terms of two new columns each in original
    units: 1 + 3 k monomials after k terms), not once every term is expanded."""
    info = _info([(0.0, 1.0)] * 24)
    terms = [{"coefficient": 1, "powers": {f"c{2 * i}": 1, f"c{2 * i + 1}": 1}} for i in range(12)]
    form = PolynomialForm.model_validate(
        {"type": "polynomial", "space": "original", "terms": terms}
    )
    columns = smooth_queries._Columns(info)
    factors = columns.factors
    expanded: list[int] = []

    def counted(*args: Any) -> Any:
        expanded.append(1)
        return factors(*args)

    monkeypatch.setattr(columns, "factors", counted)
    with pytest.raises(smooth_queries._OverBudget) as over:
        smooth_queries._polynomial(form, info, columns, budget=10)
    assert over.value.count == 13  # 1 + 3 * 4: the fourth term passed 10
    assert len(expanded) == 4
    expanded.clear()
    full = smooth_queries._polynomial(form, info, columns, budget=37)  # 1 + 3 * 12, at it
    assert full.exponents.shape[0] == 37
    assert len(expanded) == 12


def test_an_expanded_polynomial_counts_exactly_against_the_next_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a polynomial is expanded its exact count replaces its lower bound in both
    budgets: three polynomials of 11 monomials (each seen as at least 10) fit budgets of
    33 monomials and 3 x 11^2 pairs, and not one less of either; a batch whose bounds are
    exact and sum to the pair budget is admitted."""
    info = _info([(0.0, 1.0)] * 20)
    sums = {
        "type": "polynomial",
        "space": "original",
        "terms": [{"coefficient": 1, "powers": {f"c{i}": 1}} for i in range(10)],
    }  # 11 monomials (10 linear ones and the constant), at least 10 seen
    monkeypatch.setattr(smooth_queries, "MAX_EXPONENT_ENTRIES", 33 * 20)
    assert [q.exponents.shape[0] for q in parse([sums] * 3, info)] == [11, 11, 11]
    monkeypatch.setattr(smooth_queries, "MAX_EXPONENT_ENTRIES", 32 * 20)
    with pytest.raises(InvalidRequest) as refused:
        parse([sums] * 3, info)
    assert refused.value.message.startswith(
        "these polynomials have at least 33 monomials in normalised units over 20 columns"
    )
    monkeypatch.undo()
    monkeypatch.setattr(smooth_queries, "MAX_CENTER_PAIRS", 3 * 11**2)
    assert len(parse([sums] * 3, info)) == 3
    monkeypatch.setattr(smooth_queries, "MAX_CENTER_PAIRS", 3 * 11**2 - 1)
    with pytest.raises(InvalidRequest) as refused:
        parse([sums] * 3, info)
    assert refused.value.message.startswith("these queries have at least 363 pairs of kernels")
    ten = {
        "type": "polynomial",
        "terms": [{"coefficient": 1, "powers": {f"c{i}": 1}} for i in range(10)],
    }  # normalised units: 10 monomials, and a bound of 10
    monkeypatch.setattr(smooth_queries, "MAX_CENTER_PAIRS", 3 * 10**2)
    assert len(parse([ten] * 3, info)) == 3
