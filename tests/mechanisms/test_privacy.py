import math

import pytest

from app.mechanisms.errors import MechanismError
from app.mechanisms.privacy import CostPart, PrivacyCost, check_budget


def test_compose_adds_epsilon_and_delta() -> None:
    cost = PrivacyCost.compose(
        [CostPart("pca", 0.3, 1e-10), CostPart("centre", 0.1), CostPart("moments", 0.6, 4e-10)]
    )
    assert math.isclose(cost.epsilon, 1.0)
    assert math.isclose(cost.delta, 5e-10)
    assert [p.step for p in cost.parts] == ["pca", "centre", "moments"]
    assert cost.within(1.0, 5e-10)
    assert not cost.within(0.99, 5e-10)


def test_within_tolerates_float_rounding_and_no_more_than_the_ledgers_resolution() -> None:
    """within() allows a sum of shares a few ulps over its request (0.1 + 0.2 is
    0.30000000000000004), and nothing past 1e-12 relative, the ledger's resolution at
    epsilon 1: a cost 2e-12 or 1e-10 over its reservation is not within it, in epsilon
    or in delta."""
    rounded = PrivacyCost.compose([CostPart("a", 0.1, 1e-10), CostPart("b", 0.2, 2e-10)])
    assert rounded.epsilon > 0.3
    assert rounded.within(0.3, 3e-10)
    for over in (2e-12, 1e-10):
        assert not PrivacyCost.compose([CostPart("a", 0.2 * (1 + over))]).within(0.2, 0.0)
        assert not PrivacyCost.compose([CostPart("a", 0.2, 1e-9 * (1 + over))]).within(0.2, 1e-9)
    assert PrivacyCost.compose([CostPart("a", 0.2 * (1 + 2e-13), 1e-9)]).within(0.2, 1e-9)


def test_round_trip_through_dict() -> None:
    cost = PrivacyCost.compose([CostPart("moments", 0.7, 1e-9)])
    assert PrivacyCost.from_dict(cost.as_dict()) == cost


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.0, 0.0), (-1.0, 0.0), (math.inf, 0.0), (1.0, 1.0), (1.0, -0.1)]
)
def test_check_budget_rejects(epsilon: float, delta: float) -> None:
    with pytest.raises(MechanismError):
        check_budget(epsilon, delta)


def test_negative_part_rejected() -> None:
    with pytest.raises(MechanismError, match="epsilon of step 'x'"):
        CostPart("x", -0.1)


@pytest.mark.parametrize("delta", [-1e-12, 1.0, 2.0, math.nan])
def test_a_part_with_a_delta_outside_zero_one_is_rejected(delta: float) -> None:
    with pytest.raises(MechanismError, match="delta of step 'x'"):
        CostPart("x", 0.1, delta)


def test_within_is_inclusive_at_zero_and_at_the_tolerance() -> None:
    """A cost equal to its request is within it, also at epsilon = delta = 0 (a release
    that is not differential privacy reserves nothing and reports a zero cost), and so is
    a cost exactly at the relative tolerance."""
    assert PrivacyCost(0.0, 0.0, kind="non_dp").within(0.0, 0.0)
    assert PrivacyCost(0.5, 1e-9).within(0.5, 1e-9)
    edge = 0.5 * (1 + 1e-12)
    assert PrivacyCost(edge).within(0.5, 0.0)
    assert not PrivacyCost(math.nextafter(edge, math.inf)).within(0.5, 0.0)


def test_a_non_dp_cost_keeps_its_kind_through_dict() -> None:
    """The kind is stored: a guarantee that is not DP must not load back as ``"dp"``."""
    cost = PrivacyCost(0.0, 0.0, kind="non_dp")
    again = PrivacyCost.from_dict(cost.as_dict())
    assert again == cost
    assert again.kind == "non_dp"


@pytest.mark.parametrize("epsilon", [math.inf, math.nan, -1e-300])
def test_a_cost_with_an_epsilon_not_finite_and_nonnegative_is_rejected(epsilon: float) -> None:
    with pytest.raises(MechanismError, match="must be >= 0"):
        PrivacyCost(epsilon)
    with pytest.raises(MechanismError, match="must be >= 0"):
        CostPart("x", epsilon)
