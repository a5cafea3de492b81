"""Time of randomized-response answers with ``by_public`` (a row function per public value).

Run: ``python -m bench.rr_by_public [--rows 1000000] [--public 100000] [--name rr_by_public]``
(about a minute on 2 cores at the defaults).

Setup: a synthetic release made in process, no server and no stored dataset: ``--rows``
rows of a categorical column (10 categories, the skewed frequencies of
``bench.large_table``), a binary column and a continuous column (a standard normal with
declared bounds [-5, 5], ``default_bits(n)`` bits), and a public column of ``--public``
values drawn uniformly (every value held by some row). The release is randomized
response (mechanism E of paper 004) at epsilon = 1 over the three perturbed columns. The
answers are post-processing of that release: they read ``RRRelease.cell_counts`` (the
released rows counted by (public value, code)), never the rows it was made from.

Timed (median of ``REPEATS`` runs, after one warm-up for the counts):

- *counts*: ``RRRelease.cell_counts``, built once per loaded release;
- *conjunction*: one adapter answer of a conjunction (reads every entry of the counts);
- *by_public, mechanism*: ``RRRelease.answer`` of a :class:`Heterogeneous` query whose row
  function is a :class:`Conjunction` per public value (the objects built beforehand);
- *by_public, adapter*: ``RandomizedResponse.answer`` of one ``heterogeneous`` query as
  the service receives it (parsed JSON: validation, conditions to cells, the answer).

The adapter's request bound charges a query ``entries + PUBLIC_VALUE_WORK x public
values`` units of about 100 ns (``MAX_ANSWER_WORK``); the table derives the per-entry
time from the conjunction and the per-public-value time from the by_public answer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from app.mechanisms import randomized_response as rr
from app.releases.adapters import randomized_response as adapter
from app.releases.registry import ColumnInfo, DatasetInfo
from bench._common import Run

SEED = 20260506
EPSILON = 1.0
REPEATS = 3
CATEGORIES = [f"c{k}" for k in range(10)]
CATEGORY_P = np.array([0.3, 0.2, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02])
INFO_COLUMNS = (
    ColumnInfo("category", "categorical", categories=tuple(CATEGORIES)),
    ColumnInfo("flag", "binary"),
    ColumnInfo("normal", "continuous", lower=-5.0, upper=5.0),
    ColumnInfo("viewer", "public"),
)


def synthetic_release(rows: int, public: int, seed: int = SEED) -> dict[str, Any]:
    """The adapter's loaded release (``RandomizedResponse.load``) of synthetic rows."""
    rng = np.random.default_rng(seed)
    bits = rr.default_bits(rows)
    category = rng.choice(10, size=rows, p=CATEGORY_P)
    flag = rng.integers(0, 2, size=rows)
    normal = rr.discretize(np.clip(rng.standard_normal(rows), -5.0, 5.0) / 5.0, bits)
    domain = rr.Domain((10, 2, 1 << bits))
    codes = domain.encode(np.column_stack([category, flag, normal]))
    viewer = np.concatenate([np.arange(public), rng.integers(0, public, size=rows - public)])
    release = rr.release(codes, domain, EPSILON, public=rng.permutation(viewer))
    return {
        "release": release,
        "bits": bits,
        "public_values": [f"v{k:06d}" for k in range(public)],
    }


def by_public_query(public: int, seed: int = SEED) -> dict[str, Any]:
    """One heterogeneous query: per public value a conjunction on one to three columns
    (a category set, a flag, a range of the continuous column), drawn at random."""
    rng = np.random.default_rng([seed, 1])
    by_public: dict[str, dict[str, Any]] = {}
    for k in range(public):
        where: dict[str, Any] = {}
        kind = int(rng.integers(3))
        if kind == 0:
            where["category"] = [CATEGORIES[c] for c in sorted(rng.choice(10, 3, replace=False))]
        if kind <= 1:
            where["flag"] = int(rng.integers(2))
        if kind >= 1:
            low = float(rng.uniform(-3.0, 1.0))
            where["normal"] = {"between": [low, low + 2.0]}
        by_public[f"v{k:06d}"] = where
    return {"type": "heterogeneous", "by_public": by_public}


def median_seconds(action: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(rows: int, public: int) -> dict[str, Any]:
    loaded = synthetic_release(rows, public)
    release: rr.RRRelease = loaded["release"]
    info = DatasetInfo(n_rows=rows, columns=INFO_COLUMNS)
    mechanism = adapter.RandomizedResponse()
    start = time.perf_counter()
    counts = release.cell_counts
    counts_s = time.perf_counter() - start

    conjunction = [{"type": "conjunction", "where": {"category": ["c0", "c3"], "flag": 1}}]
    conjunction_s = median_seconds(lambda: mechanism.answer(loaded, info, conjunction))

    query = by_public_query(public)
    domain = release.domain
    assert domain is not None
    codes = {value: k for k, value in enumerate(loaded["public_values"])}
    heterogeneous = rr.Heterogeneous(
        {
            codes[key]: rr.Conjunction(domain, mechanism._terms(where, info, loaded["bits"]))
            for key, where in query["by_public"].items()
        }
    )
    mechanism_s = median_seconds(lambda: release.answer(heterogeneous, proper=False))
    adapter_s = median_seconds(lambda: mechanism.answer(loaded, info, [query]))
    (answer,) = mechanism.answer(loaded, info, [query])

    entries = counts.size
    per_entry_ns = conjunction_s / entries * 1e9
    per_value_ns = max(adapter_s - conjunction_s, 0.0) / public * 1e9
    work = entries + adapter.PUBLIC_VALUE_WORK * public
    return {
        "rows": rows,
        "public_values": public,
        "domain_size": release.domain_size,
        "entries": entries,
        "counts_s": round(counts_s, 3),
        "conjunction_s": round(conjunction_s, 4),
        "by_public_mechanism_s": round(mechanism_s, 4),
        "by_public_adapter_s": round(adapter_s, 4),
        "per_entry_ns": round(per_entry_ns, 1),
        "per_public_value_ns": round(per_value_ns, 1),
        "per_public_value_entries": round(per_value_ns / per_entry_ns, 1),
        "public_value_work": adapter.PUBLIC_VALUE_WORK,
        "charged_work": work,
        "queries_per_request": adapter.MAX_ANSWER_WORK // work,
        "request_s_at_bound": round(adapter.MAX_ANSWER_WORK // work * adapter_s, 1),
        "answer": {k: answer[k] for k in ("value", "stderr", "error_bound")},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rr_by_public")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--public", type=int, default=100_000)
    parser.add_argument("--name", default="rr_by_public")
    args = parser.parse_args(argv)
    command = (
        f"python -m bench.rr_by_public --rows {args.rows} --public {args.public} --name {args.name}"
    )
    run = Run(args.name, command)
    result = measure(args.rows, args.public)
    r = result
    lines = [
        "# Randomized response: answers with by_public (a row function per public value)",
        "",
        f"Synthetic release of {r['rows']} rows (categorical x binary x continuous, "
        f"|D| = {r['domain_size']}) with a public column of {r['public_values']} values; "
        f"epsilon = {EPSILON}. Counts by (public value, code): {r['entries']} entries. "
        f"Median of {REPEATS} runs.",
        "",
        "| step | seconds |",
        "|---|---:|",
        f"| cell counts (once per loaded release) | {r['counts_s']} |",
        f"| conjunction, one adapter answer | {r['conjunction_s']} |",
        f"| by_public, mechanism (RRRelease.answer) | {r['by_public_mechanism_s']} |",
        f"| by_public, adapter (one parsed query) | {r['by_public_adapter_s']} |",
        "",
        f"Per entry of the counts: {r['per_entry_ns']} ns (the conjunction). Per public "
        f"value: {r['per_public_value_ns']} ns (the by_public adapter answer less the "
        f"conjunction), i.e. {r['per_public_value_entries']} entries; the request bound "
        f"charges PUBLIC_VALUE_WORK = {r['public_value_work']}. Charged work of one such "
        f"query: {r['charged_work']}; MAX_ANSWER_WORK admits {r['queries_per_request']} of "
        f"them per request, about {r['request_s_at_bound']} s.",
    ]
    run.write("\n".join(lines), {"epsilon": EPSILON, "repeats": REPEATS, "result": result})


if __name__ == "__main__":
    main()
