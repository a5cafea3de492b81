"""Time of randomized-response answers with ``by_public`` (a row function per public value).

Run: ``python -m bench.rr_by_public [--sizes ROWS:PUBLIC ...] [--name rr_by_public]``
(about a minute on 2 cores at the defaults: 10^6 rows over 10^5 and 10^4 public values,
2 10^5 rows over 10^5).

Setup: a synthetic release made in process, no server and no stored dataset: ``ROWS``
rows of a categorical column (10 categories, the skewed frequencies of
``bench.large_table``), a binary column and a continuous column (a standard normal with
declared bounds [-5, 5], ``default_bits(n)`` bits), and a public column of ``PUBLIC``
values drawn uniformly (every value held by some row). The release is randomized
response (mechanism E of paper 004) at epsilon = 1 over the three perturbed columns. The
answers are post-processing of that release: they read ``RRRelease.cell_counts`` (the
released rows counted by (public value, code)), never the rows it was made from.

Timed (median of ``REPEATS`` runs; the counts once, as a loaded release does):

- *counts*: ``RRRelease.cell_counts``, built once per loaded release;
- *conjunction*: one adapter answer of a conjunction (reads every entry of the counts);
- *by_public, mechanism*: ``RRRelease.answer`` of a :class:`Heterogeneous` query whose row
  function is a :class:`Conjunction` per public value (the objects built beforehand);
- *by_public, adapter*: ``RandomizedResponse.answer`` of one ``heterogeneous`` query as
  the service receives it (parsed JSON: validation, conditions to cells, the answer);
  values whose conditions select the same cells share one conjunction;
- *distinct, adapter*: the same for :func:`distinct_query`, whose values nearly all
  select cells of their own: the costlier case, which sets the request bound.

The adapter's request bound charges a query ``entries + PUBLIC_VALUE_WORK x public
values`` units of about 100 ns (``MAX_ANSWER_WORK``); the table gives, per release, the
public-value term that would charge the slower of the two answers exactly ("implied W"),
and what the bound admits per request.
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
#: The request bound's unit of work (MAX_ANSWER_WORK): about 100 ns, an entry of the counts.
UNIT_S = 100e-9
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


def distinct_query(public: int, seed: int = SEED) -> dict[str, Any]:
    """The costly heterogeneous query: per public value a conjunction on all three columns
    (one to nine categories, a flag, a range of the continuous column of random width),
    so that nearly every value has cells of its own and the adapter shares few
    conjunctions between values (:func:`by_public_query` asks far fewer distinct ones)."""
    rng = np.random.default_rng([seed, 2])
    by_public: dict[str, dict[str, Any]] = {}
    for k in range(public):
        chosen = sorted(rng.choice(10, int(rng.integers(1, 10)), replace=False))
        low = float(rng.uniform(-4.5, 3.0))
        by_public[f"v{k:06d}"] = {
            "category": [CATEGORIES[c] for c in chosen],
            "flag": int(rng.integers(2)),
            "normal": {"between": [low, low + float(rng.uniform(0.7, 1.5))]},
        }
    return {"type": "heterogeneous", "by_public": by_public}


def distinct_conjunctions(
    mechanism: adapter.RandomizedResponse, columns: Any, query: dict[str, Any]
) -> int:
    """How many distinct conjunctions (sets of cells) the query's conditions select."""
    selected = set()
    for where in query["by_public"].values():
        terms = mechanism._terms(where, columns)
        selected.add(tuple((j, tuple(cells)) for j, cells in terms.items()))
    return len(selected)


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
    columns = adapter._Columns.of(mechanism._perturbed(info), loaded["bits"])
    heterogeneous = rr.Heterogeneous(
        {
            codes[key]: rr.Conjunction(domain, mechanism._terms(where, columns))
            for key, where in query["by_public"].items()
        }
    )
    mechanism_s = median_seconds(lambda: release.answer(heterogeneous, proper=False))
    adapter_s = median_seconds(lambda: mechanism.answer(loaded, info, [query]))
    (answer,) = mechanism.answer(loaded, info, [query])
    costly = distinct_query(public)
    costly_s = median_seconds(lambda: mechanism.answer(loaded, info, [costly]))
    slowest_s = max(adapter_s, costly_s)

    entries = counts.size
    per_entry_ns = conjunction_s / entries * 1e9
    per_value_ns = max(slowest_s - conjunction_s, 0.0) / public * 1e9
    work = entries + adapter.PUBLIC_VALUE_WORK * public
    fitting = max(adapter.MAX_ANSWER_WORK // work, 1)
    return {
        "rows": rows,
        "public_values": public,
        "domain_size": release.domain_size,
        "entries": entries,
        "counts_s": round(counts_s, 3),
        "conjunction_s": round(conjunction_s, 4),
        "by_public_mechanism_s": round(mechanism_s, 4),
        "by_public_adapter_s": round(adapter_s, 4),
        "by_public_conjunctions": distinct_conjunctions(mechanism, columns, query),
        "distinct_adapter_s": round(costly_s, 4),
        "distinct_conjunctions": distinct_conjunctions(mechanism, columns, costly),
        "per_entry_ns": round(per_entry_ns, 1),
        "per_public_value_ns": round(per_value_ns, 1),
        # the public-value term that would charge the slower answer's time at 100 ns a unit
        "implied_public_value_work": round((slowest_s / UNIT_S - entries) / public, 1),
        "public_value_work": adapter.PUBLIC_VALUE_WORK,
        "charged_work": work,
        "charged_s": round(work * UNIT_S, 3),
        "queries_per_request": fitting,
        "request_s_at_bound": round(fitting * slowest_s, 1),
        "answer": {k: answer[k] for k in ("value", "stderr", "error_bound")},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rr_by_public")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["1000000:100000", "1000000:10000", "200000:100000"],
        help="rows:public values of each synthetic release",
    )
    parser.add_argument("--name", default="rr_by_public")
    args = parser.parse_args(argv)
    command = f"python -m bench.rr_by_public --sizes {' '.join(args.sizes)} --name {args.name}"
    run = Run(args.name, command)
    results = []
    for size in args.sizes:
        rows, public = (int(part) for part in size.split(":"))
        results.append(measure(rows, public))
    lines = [
        "# Randomized response: answers with by_public (a row function per public value)",
        "",
        "Synthetic releases (categorical x binary x continuous, a public column), epsilon = "
        f"{EPSILON}; median of {REPEATS} runs. *entries*: the release's counts by (public "
        "value, code). *conjunction*: one adapter answer of a plain conjunction. *by_public "
        "mechanism*: RRRelease.answer of a Heterogeneous query of a Conjunction per public "
        "value (built beforehand). *by_public adapter*: the adapter's answer of one parsed "
        "heterogeneous query (validation, conditions to cells, conjunctions, the answer), "
        "one to three conditions per value, and how many distinct conjunctions its values "
        "select (the adapter builds each once; the mechanism reads each once). *distinct "
        "adapter*: the same for a query of three conditions per value, most of them with "
        "cells of their own (`distinct_query`). *implied W*: the public-value term that "
        "charges the slower adapter time at 100 ns a unit, (seconds / 100 ns - entries) / "
        "public values; *charged*: the request bound's work of the query (entries + "
        f"{adapter.PUBLIC_VALUE_WORK} x public values) at 100 ns a unit; *at the bound*: "
        "MAX_ANSWER_WORK's queries per request times the slower measured answer.",
        "",
        "| rows | public values | entries | counts s | conjunction s | by_public mechanism s "
        "| by_public adapter s (conjunctions) | distinct adapter s (conjunctions) "
        "| implied W | charged s | queries at the bound | at the bound s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']} | {r['public_values']} | {r['entries']} | {r['counts_s']} | "
            f"{r['conjunction_s']} | {r['by_public_mechanism_s']} | "
            f"{r['by_public_adapter_s']} ({r['by_public_conjunctions']}) | "
            f"{r['distinct_adapter_s']} ({r['distinct_conjunctions']}) | "
            f"{r['implied_public_value_work']} | "
            f"{r['charged_s']} | {r['queries_per_request']} | {r['request_s_at_bound']} |"
        )
    run.write(
        "\n".join(lines),
        {"epsilon": EPSILON, "repeats": REPEATS, "unit_s": UNIT_S, "results": results},
    )


if __name__ == "__main__":
    main()
