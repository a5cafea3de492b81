"""Smoke test of bench.answer_concurrency with two tiny requests (the real run is not a
test)."""

from bench import answer_concurrency as bench


def test_bench_measures_a_tiny_storm_and_tabulates_it() -> None:
    result = bench.measure(clients=2, queries=3)
    assert result["answers_s"]["n"] == 2
    assert result["healthz_s"]["n"] >= 1
    assert result["release_s"]["n"] == result["healthz_s"]["n"]
    assert result["alone_s"] > 0
    assert result["wall_s"] > 0
    lines = bench.table([{"label": "tiny", **result}]).splitlines()
    assert len(lines) == 3
    assert lines[2].startswith("| tiny | 2 x 3 |")
