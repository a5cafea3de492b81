"""Privacy cost of a release: what the ledger charges.

A mechanism that reads data returns a :class:`PrivacyCost` that says what it spent,
broken down by the data-dependent steps that spent it (``parts``), so that the share
of every step (moments, private PCA, a noisy centre...) is visible to the curator.
Totals compose by basic (sequential) composition: epsilons add and deltas add.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from app.mechanisms.errors import MechanismError

#: The keys of a :class:`PrivacyCost` read as a mapping, in :meth:`PrivacyCost.as_dict`'s order.
_KEYS = ("kind", "epsilon", "delta", "parts")


def check_budget(epsilon: float, delta: float) -> None:
    """Validate a requested (epsilon, delta) pair; raise :class:`MechanismError` if invalid."""
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise MechanismError(f"epsilon ({epsilon!r}) must be a positive finite number")
    if not (isinstance(delta, int | float) and 0.0 <= delta < 1.0):
        raise MechanismError(f"delta ({delta!r}) must lie in [0, 1)")


@dataclass(frozen=True)
class CostPart:
    """One data-dependent step and the (epsilon, delta) it spent."""

    step: str
    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise MechanismError(f"epsilon of step {self.step!r} ({self.epsilon}) must be >= 0")
        if not (0.0 <= self.delta < 1.0):
            raise MechanismError(f"delta of step {self.step!r} ({self.delta}) must lie in [0, 1)")


@dataclass(frozen=True)
class PrivacyCost(Mapping[str, object]):
    """Total (epsilon, delta) of a release and the steps that make it up.

    ``kind`` is ``"dp"`` for differential privacy. A guarantee that is not
    differential privacy (paper 002's distributional privacy) uses its own kind and
    is never added to epsilon sums.

    Also a read-only mapping (DESIGN.md §6 reads ``privacy_cost`` as the dict
    ``{"epsilon": ..., "delta": ...}``): ``cost["epsilon"]``, ``dict(cost)`` and
    ``cost.keys()`` give :meth:`as_dict`'s ``kind``, ``epsilon``, ``delta`` and ``parts``.
    Equality and hashing stay the dataclass's (field by field).
    """

    epsilon: float
    delta: float = 0.0
    parts: tuple[CostPart, ...] = field(default=())
    kind: str = "dp"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise MechanismError(f"epsilon ({self.epsilon}) must be >= 0")
        if not (0.0 <= self.delta < 1.0):
            raise MechanismError(f"delta ({self.delta}) must lie in [0, 1)")

    @classmethod
    def compose(cls, parts: Iterable[CostPart]) -> PrivacyCost:
        """Basic composition of the parts: ``epsilon = sum eps_i``, ``delta = sum delta_i``."""
        parts = tuple(parts)
        return cls(
            epsilon=math.fsum(p.epsilon for p in parts),
            delta=math.fsum(p.delta for p in parts),
            parts=parts,
        )

    def within(self, epsilon: float, delta: float, rtol: float = 1e-12) -> bool:
        """True when this cost does not exceed the requested (epsilon, delta) by more than
        ``rtol`` (relative): floating-point rounding of a sum of shares, a few ulps, and no
        more than the ledger's resolution (1e-12 epsilon units) at epsilon 1. A sweep of
        every measuring mechanism over 12 epsilons and 3 deltas found no cost above its
        request at all."""
        return self.epsilon <= epsilon * (1 + rtol) and self.delta <= delta * (1 + rtol)

    def __getitem__(self, key: str) -> object:
        """``cost["epsilon"]``, ``cost["delta"]`` (also ``"kind"``, ``"parts"``): the
        library API of DESIGN.md §6 reads a release's ``privacy_cost`` as the dict
        ``{"epsilon": ..., "delta": ...}``; the fields are the same values."""
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "parts": [{"step": p.step, "epsilon": p.epsilon, "delta": p.delta} for p in self.parts],
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> PrivacyCost:
        raw_parts = data.get("parts", [])
        assert isinstance(raw_parts, list)
        return cls(
            epsilon=float(data["epsilon"]),  # type: ignore[arg-type]
            delta=float(data.get("delta", 0.0)),  # type: ignore[arg-type]
            parts=tuple(
                CostPart(step=str(p["step"]), epsilon=float(p["epsilon"]), delta=float(p["delta"]))
                for p in raw_parts
            ),
            kind=str(data.get("kind", "dp")),
        )
