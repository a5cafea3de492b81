import numpy as np
import pytest

from app.mechanisms.errors import MechanismError
from app.mechanisms.grids import ellipsoid, full_grid, grid_axis, hypercube, snap_to_grid


def test_grid_axis_is_cell_centres() -> None:
    np.testing.assert_allclose(grid_axis(4), [-0.75, -0.25, 0.25, 0.75])
    np.testing.assert_allclose(grid_axis(1), [0.0])


def test_full_grid_enumerates_every_point() -> None:
    points = full_grid(3, 4)
    assert points.shape == (64, 3)
    assert len({tuple(p) for p in points}) == 64
    np.testing.assert_allclose(points[1], [-0.75, -0.75, -0.25])  # last coordinate fastest
    with pytest.raises(MechanismError, match="N\\^d"):
        full_grid(30, 2)


def test_snap_to_grid_picks_the_nearest_centre() -> None:
    x = np.random.default_rng(30).uniform(-1, 1, size=(500, 3))
    x[0] = [-1.0, 1.0, 0.0]
    axis = grid_axis(5)
    snapped = snap_to_grid(x, 5)
    nearest = axis[np.argmin(np.abs(x[..., None] - axis), axis=-1)]
    np.testing.assert_allclose(snapped, nearest)


def test_hypercube_is_reproducible_and_in_range() -> None:
    a = hypercube(1000, 4, np.random.default_rng(31))
    b = hypercube(1000, 4, np.random.default_rng(31))
    np.testing.assert_array_equal(a, b)
    assert a.min() >= -1
    assert a.max() <= 1
    on_grid = hypercube(200, 3, np.random.default_rng(32), resolution=3)
    assert set(np.unique(on_grid)) <= set(grid_axis(3))


def test_ellipsoid_points_fill_the_ellipsoid_uniformly() -> None:
    rng = np.random.default_rng(33)
    axes, _ = np.linalg.qr(rng.standard_normal((5, 3)))
    radii = np.array([0.4, 0.2, 0.1])
    centre = np.array([0.1, -0.2, 0.0, 0.3, 0.0])
    points = ellipsoid(20_000, centre, axes, radii, rng)
    coords = (points - centre) @ axes / radii  # back to the unit ball
    norms = np.linalg.norm(coords, axis=1)
    assert norms.max() <= 1 + 1e-12
    np.testing.assert_allclose(points - centre, (coords * radii) @ axes.T, atol=1e-12)
    # uniform in a 3-ball: P(|v| <= 1/2) = 1/8; 4-sigma band of a binomial with n = 20000
    frac = np.mean(norms <= 0.5)
    assert abs(frac - 1 / 8) < 4 * np.sqrt(1 / 8 * 7 / 8 / 20_000)


def test_ellipsoid_is_clipped_to_the_cube() -> None:
    points = ellipsoid(
        500, np.array([0.9, 0.0]), np.eye(2), np.array([1.0, 1.0]), np.random.default_rng(34)
    )
    assert points.max() <= 1.0
    assert np.any(points[:, 0] == 1.0)


def test_bad_grid_arguments() -> None:
    rng = np.random.default_rng(35)
    with pytest.raises(MechanismError, match="grid_size"):
        hypercube(0, 2, rng)
    with pytest.raises(MechanismError, match="shapes disagree"):
        ellipsoid(10, np.zeros(3), np.eye(2), np.ones(2), rng)
    with pytest.raises(MechanismError, match="non-negative"):
        ellipsoid(10, np.zeros(2), np.eye(2), -np.ones(2), rng)
