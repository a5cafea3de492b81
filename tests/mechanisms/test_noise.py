"""Noise calibration, sensitivity and distribution of the OpenDP samplers.

Statistical tests draw fresh OpenDP noise (it cannot be seeded), so each states its
false-failure rate: a Kolmogorov-Smirnov test at p < 1e-6 fails a correct sampler with
probability 1e-6 per run.
"""

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats

from app.mechanisms import noise
from app.mechanisms.basis import moments, total_degree
from app.mechanisms.errors import MechanismError

ALPHA = 1e-6  # false-failure rate of each statistical assertion


# --- sensitivity -------------------------------------------------------------------------


def test_moment_sensitivity_formulas() -> None:
    """Exact 2/n, 2R/n, 2 sqrt(R)/n plus the rounding of a mean of n = 500 terms summed
    at depth h = 2 bit_length(500) = 18: gamma_19 per coordinate."""
    s = noise.moment_sensitivity(n=500, R=36)
    e = 19 * 2.0**-53 / (1 - 19 * 2.0**-53)
    assert noise.mean_rounding(500) == e
    assert s == {
        "linf": (2 / 500 + 2 * e) * (1 + 2.0**-48),
        "l1": (72 / 500 + 2 * 36 * e) * (1 + 2.0**-48),
        "l2": (12 / 500 + 2 * 6 * e) * (1 + 2.0**-48),
    }
    exact = {"linf": 2 / 500, "l1": 72 / 500, "l2": 12 / 500}
    for key, value in s.items():  # relative allowance n gamma_19 + 2^-48 ~ 1.1e-12
        assert exact[key] < value < exact[key] * (1 + 1.2e-12)


def test_float_sensitivity_and_gamma() -> None:
    u = noise.UNIT_ROUNDOFF
    assert u == 2.0**-53
    assert noise.gamma(0) == 0.0
    assert noise.gamma(10) == 10 * u / (1 - 10 * u)
    assert noise.gamma(3) + noise.gamma(4) + noise.gamma(3) * noise.gamma(4) <= noise.gamma(7)
    assert noise.float_sensitivity(0.25, 0.0) == 0.25 * (1 + 2.0**-48)
    assert noise.float_sensitivity(0.25, 1e-15) == (0.25 + 2e-15) * (1 + 2.0**-48)
    assert noise.float_sensitivity(0.25, 1e-15) > 0.25 + 2e-15
    assert noise.float_sensitivity(0.0, 1e-15) == 2e-15 * (1 + 2.0**-48)  # constant statistic
    for exact, rounding in [(0.0, 0.0), (-1.0, 0.0), (math.inf, 0.0), (1.0, -1e-16)]:
        with pytest.raises(MechanismError):
            noise.float_sensitivity(exact, rounding)
    with pytest.raises(MechanismError):
        noise.gamma(2**52)


@pytest.mark.parametrize(("d", "R"), [(2, 9), (3, 19), (4, 4)])
def test_moment_sensitivity_bounds_hold_on_random_neighbours(d: int, R: int) -> None:
    """Brute force: replace one row, at random and at the cube's corners."""
    rng = np.random.default_rng(10)
    index_set = total_degree(d, R)
    n = 7
    bound = noise.moment_sensitivity(n, R)
    worst = {"linf": 0.0, "l1": 0.0, "l2": 0.0}
    corners = np.array(list(np.ndindex(*(2,) * d)), dtype=float) * 2 - 1
    for trial in range(400):
        D = rng.uniform(-1, 1, size=(n, d))
        if trial % 2:
            D = corners[rng.integers(0, len(corners), size=n)]
        D2 = D.copy()
        D2[rng.integers(n)] = (
            corners[rng.integers(len(corners))] if trial % 3 else rng.uniform(-1, 1, size=d)
        )
        diff = moments(D, index_set) - moments(D2, index_set)
        worst["linf"] = max(worst["linf"], float(np.max(np.abs(diff))))
        worst["l1"] = max(worst["l1"], float(np.sum(np.abs(diff))))
        worst["l2"] = max(worst["l2"], float(np.linalg.norm(diff)))
    for key in worst:
        assert worst[key] <= bound[key] * (1 + 1e-12), key
    assert worst["linf"] == pytest.approx(bound["linf"])  # a corner flip attains 2/n


def test_first_degree_moments_attain_the_sensitivity() -> None:
    d, n = 5, 11
    index_set = total_degree(d, d)
    D = np.zeros((n, d))
    D[0] = 1.0
    D2 = D.copy()
    D2[0] = -1.0
    diff = moments(D, index_set) - moments(D2, index_set)
    bound = noise.moment_sensitivity(n, d)
    assert np.sum(np.abs(diff)) == pytest.approx(bound["l1"])
    assert np.linalg.norm(diff) == pytest.approx(bound["l2"])


# --- calibration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sensitivity", "epsilon", "k"), [(2 * 30 / 569, 1.0, 1), (0.013, 0.3, 1), (0.2, 0.7, 4)]
)
def test_laplace_scale_is_sensitivity_over_epsilon(
    sensitivity: float, epsilon: float, k: int
) -> None:
    cal = noise.calibrate(
        "laplace", sensitivity=sensitivity, epsilon=epsilon, dimension=30, compositions=k
    )
    assert cal.scale == pytest.approx(k * sensitivity / epsilon, rel=1e-12)
    assert cal.epsilon <= epsilon
    assert cal.epsilon == pytest.approx(epsilon, rel=1e-12)
    assert (cal.delta, cal.distribution, cal.metric) == (0.0, "laplace", "l1")


def opendp_gaussian_epsilon(scale: float, sensitivity: float, delta: float) -> float:
    """``epsilon`` at ``delta`` of a Gaussian at ``scale`` moved by ``sensitivity``, built
    here from OpenDP's constructors and not through :func:`noise.cost_of_scale` (the code
    that chose the scale): a vector Gaussian under L2 at ``Delta_2`` is ``Delta_2^2 / (2 s^2)``
    -zCDP, exactly as a scalar one moved by ``|d| = Delta_2``."""
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale
    )
    return float(dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(unit), delta).map(sensitivity)[0])


def assert_gaussian_scale_is_independently_right(
    scale: float, sensitivity: float, epsilon: float, delta: float
) -> None:
    """The calibrated scale checked against two computations that do not call
    :func:`noise.cost_of_scale`: (a) ``s = Delta_2 / sqrt(2 rho)`` with ``rho =``
    :func:`noise.rho_budget` (exact in real arithmetic; the two root searches agree to
    ``5e-13`` relative at ``delta`` from ``1e-10`` to ``1 - 1e-9``, so ``rel=1e-9`` cannot
    flake), and (b) a scalar OpenDP Gaussian built here charges ``<= epsilon`` at ``s``
    and ``> epsilon`` at ``0.999 s`` (``+0.1%`` to ``+1.3%`` over ``epsilon`` there).
    Deterministic: no noise is drawn."""
    rho = noise.rho_budget(epsilon, delta)
    assert scale == pytest.approx(sensitivity / math.sqrt(2 * rho), rel=1e-9)
    assert opendp_gaussian_epsilon(scale, sensitivity, delta) <= epsilon
    assert opendp_gaussian_epsilon(0.999 * scale, sensitivity, delta) > epsilon


def test_gaussian_scale_is_minimal_and_linear_in_sensitivity() -> None:
    delta = 1e-10
    a = noise.calibrate("gaussian", sensitivity=0.02, epsilon=1.0, delta=delta, dimension=30)
    b = noise.calibrate("gaussian", sensitivity=0.05, epsilon=1.0, delta=delta, dimension=30)
    assert a.epsilon <= 1.0
    assert a.delta == delta
    # adequate and minimal by a map other than the one that chose the scale
    assert_gaussian_scale_is_independently_right(a.scale, 0.02, 1.0, delta)
    assert_gaussian_scale_is_independently_right(b.scale, 0.05, 1.0, delta)
    # scale = sensitivity * c(epsilon, delta): the ratio does not depend on the sensitivity
    assert a.scale / 0.02 == pytest.approx(b.scale / 0.05, rel=1e-9)
    # minimal: a slightly smaller scale overspends
    eps_smaller, _ = noise.cost_of_scale("gaussian", a.scale * (1 - 1e-6), 0.02, 30, delta)
    assert eps_smaller > 1.0
    # the charged epsilon is no worse than the textbook zCDP conversion of rho = D^2 / (2 s^2)
    rho = 0.02**2 / (2 * a.scale**2)
    assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) >= 1.0


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace_approx"])
@pytest.mark.parametrize("delta", [0.49, 0.9, 0.999999999])
def test_a_large_delta_is_calibrated_minimally(mechanism: str, delta: float) -> None:
    """Near delta = 1/2 and above, OpenDP's conversion reaches epsilon = 0 at a finite
    scale; the search still finds the smallest scale within the budget."""
    cal = noise.calibrate(mechanism, sensitivity=1.0, epsilon=1.0, delta=delta, dimension=3)
    assert cal.epsilon <= 1.0
    eps_smaller, _ = noise.cost_of_scale(mechanism, cal.scale * (1 - 1e-6), 1.0, 3, delta)
    assert eps_smaller > 1.0
    if mechanism == "gaussian":
        assert_gaussian_scale_is_independently_right(cal.scale, 1.0, 1.0, delta)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace_approx"])
def test_a_tiny_epsilon_at_a_large_delta_is_calibrated_minimally(mechanism: str) -> None:
    """At a large delta the map reaches epsilon = 0 at a finite scale, and at epsilon = 1e-12
    the classical starting guess lies about twelve decades above it: the search used to
    give up there ("privacy map is not decreasing"; an audit saw a smooth_synthetic
    release accepted, charged and failed in the worker). The scale exists and is found."""
    sensitivity, delta = noise.moment_sensitivity(569, 30)[noise.METRIC[mechanism]], 0.5
    cal = noise.calibrate(
        mechanism, sensitivity=sensitivity, epsilon=1e-12, delta=delta, dimension=30
    )
    assert cal.epsilon <= 1e-12
    assert cal.delta <= delta
    eps_smaller, _ = noise.cost_of_scale(mechanism, cal.scale * (1 - 1e-6), sensitivity, 30, delta)
    assert eps_smaller > 1e-12


def test_a_budget_no_scale_fits_is_refused_with_what_was_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A map that overspends at every scale is a clear MechanismError naming the budget,
    not an endless doubling of the scale."""

    def overspends(mechanism: str, scale: float, *args: object) -> tuple[float, float]:
        assert math.isfinite(scale), "the search went past the largest float"
        return math.inf, 1e-9

    monkeypatch.setattr(noise, "cost_of_scale", overspends)
    with pytest.raises(MechanismError) as refused:
        noise.calibrate("gaussian", sensitivity=0.5, epsilon=1.0, delta=1e-9, dimension=3)
    assert str(refused.value) == (
        "no noise scale fits the budget: epsilon = 1 at delta = 1e-09 for 3 value(s) of "
        "sensitivity 0.5 (gaussian noise); OpenDP's privacy map charges more than epsilon "
        "at every scale up to the largest float (epsilon is too small for this delta and "
        "dimension): raise epsilon"
    )


@pytest.mark.parametrize(("epsilon", "delta"), [(1e-12, 1e-18), (1.0, 1e-9), (1e6, 1e-18)])
def test_rho_budget_at_the_corners_of_the_accepted_range(epsilon: float, delta: float) -> None:
    """Tiny epsilon puts rho far below the old fixed bracket (1e-12; brentq raised), huge
    epsilon overflows OpenDP's conversion (now read as over budget: a smaller rho)."""
    rho = noise.rho_budget(epsilon, delta)
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
    )
    eps = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(unit), delta).map(math.sqrt(2 * rho))[0]
    assert eps <= epsilon
    if epsilon <= 1.0:  # minimal: a little more rho overspends
        assert (
            dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(unit), delta).map(
                math.sqrt(2 * rho * (1 + 1e-9))
            )[0]
            > epsilon
        )


def test_rho_budget_is_searched_once_per_budget() -> None:
    """The search (about a second at large delta) runs once for a budget: a tree's plan and
    its preview ask again. An invalid budget is refused every time, not remembered."""
    noise.rho_budget.cache_clear()
    rho = noise.rho_budget(0.3, 1e-8)
    assert noise.rho_budget(0.3, 1e-8) == rho
    assert noise.rho_budget.cache_info().hits == 1
    for _ in range(2):
        with pytest.raises(MechanismError):
            noise.rho_budget(0.0, 1e-8)
    assert noise.rho_budget.cache_info().currsize == 1


def test_gaussian_compositions_add_in_zcdp() -> None:
    one = noise.calibrate("gaussian", sensitivity=0.1, epsilon=0.5, delta=1e-9, dimension=8)
    ten = noise.calibrate(
        "gaussian", sensitivity=0.1, epsilon=0.5, delta=1e-9, dimension=8, compositions=10
    )
    assert ten.scale == pytest.approx(math.sqrt(10) * one.scale, rel=1e-9)


def test_laplace_approx_uses_zcdp_for_many_moments() -> None:
    n, delta = 569, 1e-10
    s1 = noise.moment_sensitivity(n, 1000)
    s4 = noise.moment_sensitivity(n, 4000)
    big = noise.calibrate(
        "laplace_approx", sensitivity=s1["linf"], epsilon=1.0, delta=delta, dimension=1000
    )
    bigger = noise.calibrate(
        "laplace_approx", sensitivity=s4["linf"], epsilon=1.0, delta=delta, dimension=4000
    )
    assert big.accounting == "zcdp"
    assert big.delta == delta
    assert big.epsilon <= 1.0
    # advanced composition: the scale grows like sqrt(R), not R
    assert bigger.scale / big.scale == pytest.approx(2.0, rel=1e-6)
    assert big.scale < s1["l1"] / 5  # five times less noise than pure Laplace at R = 1000
    # each coordinate is (linf / b)-DP -> rho = R (linf / b)^2 / 2; textbook conversion bound
    rho = 1000 * (s1["linf"] / big.scale) ** 2 / 2
    assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) >= 1.0


def test_laplace_approx_falls_back_to_pure_for_few_moments() -> None:
    s = noise.moment_sensitivity(569, 10)
    cal = noise.calibrate(
        "laplace_approx", sensitivity=s["linf"], epsilon=1.0, delta=1e-10, dimension=10
    )
    assert cal.accounting == "pure"
    assert cal.delta == 0.0
    assert cal.scale == pytest.approx(s["l1"], rel=1e-9)


def test_paper_literal_laplace_scale_overspends() -> None:
    """Paper 000 §3.2's Lap(sqrt(t^d log(1/delta)) / (n eps)) is not (eps, delta)-DP."""
    n, delta = 569, 1e-10
    for R, expected in [(30, 2.2829), (1000, 2.6750)]:
        scale = noise.paper_laplace_scale(n, R, 1.0, delta)
        eps, _ = noise.cost_of_scale("laplace_approx", scale, 2 / n, R, delta)
        assert eps == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mechanism": "laplace", "epsilon": 0.0}, "epsilon"),
        ({"mechanism": "laplace", "epsilon": -1.0}, "epsilon"),
        ({"mechanism": "laplace", "sensitivity": 0.0}, "sensitivity"),
        ({"mechanism": "gaussian", "delta": 0.0}, "needs delta > 0"),
        ({"mechanism": "laplace_approx", "delta": 0.0}, "needs delta > 0"),
        ({"mechanism": "gaussian", "delta": 1.0}, r"\[0, 1\)"),
        ({"mechanism": "cauchy"}, "must be one of"),
        ({"mechanism": "laplace", "dimension": 0}, "dimension"),
    ],
)
def test_bad_calibration_requests(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"sensitivity": 0.1, "epsilon": 1.0, "delta": 1e-9, "dimension": 3}
    args.update(kwargs)
    mechanism = args.pop("mechanism")
    with pytest.raises(MechanismError, match=message):
        noise.calibrate(mechanism, **args)  # type: ignore[arg-type]


# --- sampling ----------------------------------------------------------------------------


@pytest.mark.slow
def test_laplace_noise_has_the_calibrated_law() -> None:
    cal = noise.calibrate("laplace", sensitivity=0.5, epsilon=1.0, dimension=4000)
    draws = noise.sample(cal, np.zeros(4000))
    assert stats.kstest(draws, stats.laplace(scale=cal.scale).cdf).pvalue > ALPHA
    # the test has power: a 1.5x wrong scale is rejected (KS distance 0.074 at n = 4000)
    assert stats.kstest(draws, stats.laplace(scale=1.5 * cal.scale).cdf).pvalue < ALPHA


@pytest.mark.slow
def test_gaussian_noise_has_the_calibrated_law() -> None:
    """The draws are tested against the scale ``0.5 / sqrt(2 rho_budget(1, 1e-9))`` that
    the budget calls for, computed without :func:`noise.cost_of_scale`, not only against
    ``cal.scale``: a calibration that halved the scale would still match its own record."""
    cal = noise.calibrate("gaussian", sensitivity=0.5, epsilon=1.0, delta=1e-9, dimension=4000)
    assert_gaussian_scale_is_independently_right(cal.scale, 0.5, 1.0, 1e-9)
    required = 0.5 / math.sqrt(2 * noise.rho_budget(1.0, 1e-9))
    draws = noise.sample(cal, np.zeros(4000))
    assert stats.kstest(draws, stats.norm(scale=required).cdf).pvalue > ALPHA
    assert stats.kstest(draws, stats.norm(scale=1.5 * required).cdf).pvalue < ALPHA


def test_noisy_moments_are_centred_on_the_exact_moments() -> None:
    """6-sigma band on the mean noise over R = 500 coordinates: false failure 2e-9 (the
    mean of 500 Laplace draws is normal to within Monte Carlo error out to 4 sigma, 6.2e-5
    in 5e5 means against 6.3e-5). It was 4 sigma, 6e-5 per run; 6 sigma still rejects a
    bias of 0.27 standard deviations per coordinate."""
    X = np.random.default_rng(11).uniform(-1, 1, size=(200, 3))
    index_set = total_degree(3, 500)
    exact = moments(X, index_set)
    s = noise.moment_sensitivity(200, 500)
    calibration = noise.calibrate("laplace", sensitivity=s["l1"], epsilon=50.0, dimension=500)
    released = noise.release(calibration, exact, step="moments")
    errors = released.values - exact
    stddev = released.calibration.stddev
    assert abs(errors.mean()) < 6 * stddev / math.sqrt(500)
    assert np.all(errors != 0.0)
    assert released.privacy_cost.epsilon <= 50.0
    assert [p.step for p in released.privacy_cost.parts] == ["moments"]


def test_noisy_vector_round_trips_through_json() -> None:
    calibration = noise.calibrate(
        "gaussian", sensitivity=0.01, epsilon=1.0, delta=1e-9, dimension=3
    )
    released = noise.release(calibration, np.array([0.1, -0.2, 0.3]), step="moments")
    back = noise.NoisyVector.from_dict(json.loads(json.dumps(released.to_dict())))
    np.testing.assert_array_equal(back.values, released.values)
    assert back.calibration == released.calibration
    assert back.to_dict() == released.to_dict()


def test_sample_checks_length() -> None:
    cal = noise.calibrate("laplace", sensitivity=0.5, epsilon=1.0, dimension=3)
    with pytest.raises(MechanismError, match="length 2"):
        noise.sample(cal, np.zeros(2))


#: The one function that may draw from numpy's noise samplers: the parametric bootstrap's
#: simulation of a public noise law (its draws are never released) ...
SIMULATION = "simulated_noise"
#: ... and the post-processing that may call it (each reads released values only).
SIMULATION_CALLERS = {
    "marginals.py": {"noise_replicates"},
    "marginal_tree.py": {"simulated_measurements"},
    "smooth_synthetic.py": {"noise_replicates"},
}


def test_privacy_noise_only_from_opendp_with_safe_features() -> None:
    """No numpy sampler draws privacy noise; no unsafe OpenDP feature is switched on.
    numpy's ``laplace`` / ``normal`` appear only in the bootstrap's simulation, and that
    is called only from the post-processing named in :data:`SIMULATION_CALLERS` (a new
    caller has to be added here, on purpose)."""
    root = Path(__file__).resolve().parents[2] / "app" / "mechanisms"
    for path in root.glob("*.py"):
        text = path.read_text()
        tree = ast.parse(text)
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            calls = {
                node.func.attr if isinstance(node.func, ast.Attribute) else None
                for node in ast.walk(function)
                if isinstance(node, ast.Call)
            }
            if calls & {"laplace", "normal"}:
                assert (path.name, function.name) == ("bootstrap.py", SIMULATION), (
                    path,
                    function.name,
                )
            if SIMULATION in calls and path.name != "bootstrap.py":
                assert function.name in SIMULATION_CALLERS.get(path.name, set()), (
                    path,
                    function.name,
                )
        for call in re.findall(r"enable_features\(([^)]*)\)", text):
            assert call.strip() == '"contrib"', path


class _OverBudget:
    """A stand-in for an OpenDP measurement whose map charges ``over`` for its first
    ``steps`` evaluations, then 0 (``steps=None``: always ``over``)."""

    def __init__(self, over: float, steps: int | None) -> None:
        self.calls = 0
        self.over, self.steps = over, steps

    def charge(self, *_args: object) -> float:
        self.calls += 1
        return self.over if self.steps is None or self.calls <= self.steps else 0.0


@pytest.mark.parametrize("steps", [3, None])
def test_the_nudges_after_a_calibration_are_bounded(
    monkeypatch: pytest.MonkeyPatch, steps: int | None
) -> None:
    """Each calibration steps its scale (or ``rho``) up until OpenDP's map is within
    budget: a few steps for a map that rounds outward, and a clear error, not an endless
    loop, for one that never comes within budget (a broken map)."""
    for name, calibrate in (
        (
            "_pure_laplace_epsilon",
            lambda: noise.calibrate("laplace", sensitivity=0.1, epsilon=1.0, dimension=3),
        ),
        ("_vector_gaussian", lambda: noise.gaussian_scale_for_rho(0.1, 0.5)),
        ("_noisy_max", lambda: noise.noisy_max_scale(0.1, 0.5)),
    ):
        fake = _OverBudget(10.0, steps)
        if name == "_pure_laplace_epsilon":
            monkeypatch.setattr(noise, name, fake.charge)
        else:
            measurement = type("Measurement", (), {"map": staticmethod(fake.charge)})
            monkeypatch.setattr(noise, name, lambda _scale, m=measurement: m)
        if steps is None:
            with pytest.raises(MechanismError, match=f"after {noise.MAX_NUDGES} steps"):
                calibrate()
            assert fake.calls == noise.MAX_NUDGES
        else:
            calibrate()
            assert fake.calls >= steps + 1
        monkeypatch.undo()


def test_a_scale_the_map_already_admits_is_not_nudged() -> None:
    """The nudges step only while OpenDP's map is over budget: a scale whose map is the
    budget exactly is kept (sensitivity 1 at rho = 1/2: scale 1, a map of exactly 1/2)."""
    assert noise._vector_gaussian(1.0).map(1.0) == 0.5
    assert noise.gaussian_scale_for_rho(1.0, 0.5) == 1.0
    assert noise._noisy_max(1.0).map(1.0) == 0.5
    assert noise.noisy_max_scale(1.0, 0.5) == 1.0


class _BreaksAfter:
    """A privacy map that is ``honest`` for its first ``limit`` evaluations and then
    charges ``over`` (``limit=None``: never breaks; ``calls`` counts the evaluations)."""

    def __init__(self, honest: Any, over: Any, limit: int | None = None) -> None:
        self.honest, self.over, self.limit, self.calls = honest, over, limit, 0

    def __call__(self, value: float) -> Any:
        self.calls += 1
        return (
            self.over if self.limit is not None and self.calls > self.limit else self.honest(value)
        )


def test_the_root_searches_end_with_bounded_nudges(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root searches of approximate-DP scales and of the zCDP budget end with the same
    bounded nudges: a map that is honest until the search is done (as many evaluations as
    an honest run makes before its last check) and then stays over budget fails clearly."""
    honest = _BreaksAfter(lambda s: 1.0 / s, math.inf)
    assert noise._smallest_scale(honest, 0.5, 1.0, "a test budget") == pytest.approx(2.0)
    broken = _BreaksAfter(lambda s: 1.0 / s, math.inf, limit=honest.calls - 1)
    with pytest.raises(MechanismError, match=f"a test budget.*after {noise.MAX_NUDGES} steps"):
        noise._smallest_scale(broken, 0.5, 1.0, "a test budget")

    fix_delta = noise._fix_delta
    maps: list[_BreaksAfter] = []

    def converted(limit: int | None) -> Any:
        def fake(measurement: object, delta: float) -> object:
            real = fix_delta(measurement, delta)
            maps.append(_BreaksAfter(real.map, (math.inf, delta), limit))
            return type("Converted", (), {"map": staticmethod(maps[-1])})

        return fake

    noise.rho_budget.cache_clear()
    monkeypatch.setattr(noise, "_fix_delta", converted(None))
    expected = noise.rho_budget(0.75, 1e-7)
    monkeypatch.setattr(noise, "_fix_delta", converted(maps[-1].calls - 1))
    noise.rho_budget.cache_clear()
    with pytest.raises(MechanismError, match=f"rho for epsilon = 0.75.*{noise.MAX_NUDGES} steps"):
        noise.rho_budget(0.75, 1e-7)
    monkeypatch.undo()
    noise.rho_budget.cache_clear()
    assert noise.rho_budget(0.75, 1e-7) == expected


def test_laplace_approx_compositions_count_in_the_zcdp_route() -> None:
    """k releases of R coordinates compose in zCDP exactly like one release of k R
    coordinates: the zCDP route charges k R (linf / b)^2 / 2, so the calibrated scale for
    k = 4 is twice that for k = 1 (sqrt(k)); the pure route's k R linf / b is larger here."""
    n, R, delta = 569, 1000, 1e-10
    linf = noise.moment_sensitivity(n, R)["linf"]
    one = noise.calibrate("laplace_approx", sensitivity=linf, epsilon=1.0, delta=delta, dimension=R)
    four = noise.calibrate(
        "laplace_approx", sensitivity=linf, epsilon=1.0, delta=delta, dimension=R, compositions=4
    )
    assert (one.accounting, four.accounting) == ("zcdp", "zcdp")
    assert four.scale / one.scale == pytest.approx(2.0, rel=1e-6)
    assert noise.cost_of_scale("laplace_approx", one.scale, linf, R, delta, 4) == (
        noise.cost_of_scale("laplace_approx", one.scale, linf, 4 * R, delta, 1)
    )


def test_a_calibration_charging_more_delta_than_requested_is_refused() -> None:
    fields = {
        "mechanism": "gaussian",
        "sensitivity": 0.1,
        "dimension": 3,
        "scale": 1.0,
        "epsilon": 0.5,
        "target_epsilon": 0.5,
        "target_delta": 1e-9,
    }
    noise.NoiseCalibration(**fields, delta=1e-9)  # type: ignore[arg-type]
    with pytest.raises(MechanismError, match="exceeds the requested budget"):
        noise.NoiseCalibration(**fields, delta=1.0000001e-9)  # type: ignore[arg-type]


def test_gaussian_at_scale_records_what_opendp_charges_at_that_scale() -> None:
    """The record of a zCDP step is the (epsilon, delta) of its own scale and sensitivity:
    at the scale that calibrate() finds for a budget it is that budget's charge, exactly."""
    cal = noise.calibrate("gaussian", sensitivity=0.3, epsilon=0.5, delta=1e-8, dimension=6)
    step = noise.gaussian_at_scale(0.3, 6, cal.scale, 0.5, 1e-8)
    assert (step.epsilon, step.delta) == (cal.epsilon, cal.delta)
    assert step.epsilon == pytest.approx(0.5, rel=1e-9)
    assert (step.sensitivity, step.scale, step.accounting) == (0.3, cal.scale, "zcdp")


@pytest.mark.slow
def test_laplace_approx_noise_is_laplace() -> None:
    """laplace_approx draws Laplace noise at its scale (its accounting is zCDP, its law is
    not Gaussian): KS at n = 20000 against Laplace(b) passes and against N(0, b^2) or
    N(0, 2 b^2) (Laplace's variance) is rejected (KS distances ~0.045 and ~0.06 against a
    critical 0.019 at p = 1e-6)."""
    linf = noise.moment_sensitivity(569, 20000)["linf"]
    cal = noise.calibrate(
        "laplace_approx", sensitivity=linf, epsilon=1.0, delta=1e-10, dimension=20000
    )
    assert cal.distribution == "laplace"
    draws = noise.sample(cal, np.zeros(20000))
    assert stats.kstest(draws, stats.laplace(scale=cal.scale).cdf).pvalue > ALPHA
    for sd in (cal.scale, math.sqrt(2) * cal.scale):
        assert stats.kstest(draws, stats.norm(scale=sd).cdf).pvalue < ALPHA


def _opendp_fixed_delta(delta: float) -> Any:
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
    )
    return dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(unit), delta=delta)


@pytest.mark.parametrize("delta", [1e-6, 0.5, 0.999])
def test_the_fixed_delta_shortcut_answers_as_opendp(delta: float) -> None:
    """``noise._fix_delta`` answers ``(0.0, delta)`` from the privacy profile's
    ``delta(0)`` where that is within ``delta``, without OpenDP's ``fix_delta`` search: on
    a grid of ``rho`` across the edge of that plateau (and far from it) every answer is
    OpenDP's own, to the bit, so every scale searched through it is unchanged (never
    smaller for the same budget)."""
    unit = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0
    )
    profile = dp.c.make_zCDP_to_approxDP(unit)
    # the plateau's edge: the rho whose profile has delta(0) = delta (bisection on log rho)
    lo, hi = 1e-12, 1e3
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if profile.map(math.sqrt(2 * mid)).delta(0.0) <= delta else (lo, mid)
    ours, theirs = noise._fix_delta(unit, delta), _opendp_fixed_delta(delta)
    plateau = 0
    for rho in (1e-9, lo * 0.5, lo, lo * (1 + 1e-12), hi, hi * (1 + 1e-9), hi * 2, 20.0):
        d_in = math.sqrt(2 * rho)
        assert tuple(ours.map(d_in)) == tuple(theirs.map(d_in)), rho
        plateau += ours.map(d_in)[0] == 0.0
    assert plateau >= 2  # the grid reaches into the plateau


def test_a_corner_budget_makes_no_fix_delta_search_on_the_plateau(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At ``epsilon = 1e-12, delta = 0.999`` most conversions a root search makes fall on
    the plateau where the answer is ``epsilon = 0``; OpenDP's ``fix_delta`` took 70-340 ms
    for each of them there (a tree request 2-8 s). The shortcut answers those from the
    profile: ``fix_delta`` is asked only off the plateau, and the budget is unchanged."""
    noise.rho_budget.cache_clear()
    expected = noise.rho_budget(1e-12, 0.999)
    answers: list[float] = []
    real = dp.c.make_fix_delta

    def counted(measurement: Any, delta: float) -> Any:
        fixed = real(measurement, delta=delta)
        return type(
            "Counted",
            (),
            {
                "map": staticmethod(
                    lambda d_in: answers.append(fixed.map(d_in)[0]) or fixed.map(d_in)
                )
            },
        )

    monkeypatch.setattr(dp.c, "make_fix_delta", counted)
    noise.rho_budget.cache_clear()
    assert noise.rho_budget(1e-12, 0.999) == expected
    assert answers
    assert 0.0 not in answers
    noise.rho_budget.cache_clear()
