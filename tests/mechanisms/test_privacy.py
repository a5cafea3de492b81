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
