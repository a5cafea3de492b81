"""Exact budget arithmetic: epsilon and delta as integers of fixed resolution.

Floats cannot say "ten spends of 0.1 exhaust a budget of 1.0" (``sum([0.1] * 10) < 1``);
integers can. One epsilon is ``EPSILON_SCALE`` units (resolution 1e-12); one delta is
``DELTA_SCALE`` units (resolution 1e-18). Values are converted through their shortest
decimal representation (``Decimal(repr(x))``), so ``0.1`` is exactly 10^11 units.
Charges round *up* and budget totals round *down*: rounding never favours spending.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

EPSILON_SCALE = 10**12
DELTA_SCALE = 10**18
MAX_EPSILON = Decimal(10**6)


def _decimal(value: float | int | str | Decimal) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        return Decimal(repr(value))
    return Decimal(value)


def _to_units(value: float | int | str | Decimal, scale: int, *, charge: bool) -> int:
    exact = _decimal(value) * scale
    return int(exact.to_integral_value(rounding=ROUND_CEILING if charge else ROUND_FLOOR))


def epsilon_units(value: float | int | str | Decimal, *, charge: bool) -> int:
    """Epsilon in ledger units; ``charge=True`` rounds up (a cost), else down (a total)."""
    return _to_units(value, EPSILON_SCALE, charge=charge)


def delta_units(value: float | int | str | Decimal, *, charge: bool) -> int:
    """Delta in ledger units; ``charge=True`` rounds up (a cost), else down (a total)."""
    return _to_units(value, DELTA_SCALE, charge=charge)


def epsilon_value(units: int) -> float:
    """Ledger units back to epsilon, for display (exact to the 1e-12 resolution)."""
    return float(Decimal(units) / EPSILON_SCALE)


def delta_value(units: int) -> float:
    return float(Decimal(units) / DELTA_SCALE)
