"""Helpers shared by the mechanism tests."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from app.mechanisms import noise
from app.mechanisms import smooth_synopsis as ss
from app.mechanisms.basis import IndexSet, moments
from app.mechanisms.dependence import CoSpread


def exact_synopsis(
    X: np.ndarray,
    index_set: IndexSet,
    delta: float = 0.0,
    *,
    epsilon: float = 1.0,
    co_spread: CoSpread | None = None,
    smoothness: int = 4,
) -> ss.Synopsis:
    """Test-only: a synopsis holding the exact (noise-free) moments of X, with the noise
    law of ``(epsilon, delta)`` for its standard errors, an optional co-spread and the
    declared ``smoothness`` (queries with a Gaussian width ``s < sqrt(smoothness)`` get the
    worst-case interval)."""
    n = X.shape[0]
    mech = "laplace" if delta == 0 else "gaussian"
    metric = "l1" if delta == 0 else "l2"
    cal = noise.calibrate(
        mech,
        sensitivity=noise.moment_sensitivity(n, index_set.size)[metric],
        epsilon=epsilon,
        delta=delta,
        dimension=index_set.size,
    )
    _, choice = ss.choose_basis(n, index_set.dim, epsilon=1.0, delta=delta, basis=index_set)
    return ss.Synopsis(
        index_set, moments(X, index_set), cal, n, smoothness, choice, co_spread=co_spread
    )


def log_calls(
    monkeypatch: pytest.MonkeyPatch,
    owner: object,
    name: str,
    events: list[object],
    label: Callable[..., object],
) -> None:
    """Replace ``owner.name`` by a wrapper that appends ``label(*args, **kwargs)`` to
    ``events`` and calls the original: tests of the order of calibrations and reads."""
    original = getattr(owner, name)

    def logged(*args: Any, **kwargs: Any) -> Any:
        events.append(label(*args, **kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, logged)
