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
