"""What concurrent answer requests do to the rest of the API.

``POST /releases/{id}/answers`` computes for up to seconds per request. Runs the real API
with its embedded worker (SQLite) in-process, as :mod:`bench.service_latency` does, makes
one ``smooth_synopsis`` release of WDBC, then sends ``--clients`` answer requests at once
(each ``--queries`` paper-000 Gaussian-mixture queries) while a prober reads
``GET /healthz`` and ``GET /v1/releases/{id}`` every 50 ms. Reported: one answer request
alone; the storm's wall time and its requests' latencies; the probes' latencies during the
storm (what every other user of the API waits meanwhile).

    python -m bench.answer_concurrency [--label after] [--clients 40] [--queries 400]

Each run writes ``answer_concurrency_<label>.json``; the markdown table shows every label
found (run it with ``--label before`` on the code before a change to compare).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from app.demo.runner import Client
from bench._common import RESULTS, Run
from bench.service_latency import _queries, _release, wdbc_served

PROBE_SECONDS = 0.05


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
        "max": round(ordered[-1], 3),
    }


def _storm(curator: Client, release_id: str, body: bytes, clients: int) -> dict[str, Any]:
    """``clients`` answer requests at once, and the probes while they run."""
    done = threading.Event()
    probes: dict[str, list[float]] = {"healthz": [], "release": []}

    def probe() -> None:
        paths = {"healthz": "/healthz", "release": f"/v1/releases/{release_id}"}
        while not done.is_set():
            for name, path in paths.items():
                started = time.perf_counter()
                curator.request("GET", path)
                probes[name].append(time.perf_counter() - started)
            time.sleep(PROBE_SECONDS)

    latencies: list[float] = []
    barrier = threading.Barrier(clients)

    def ask() -> None:
        barrier.wait()
        started = time.perf_counter()
        curator.request(
            "POST",
            f"/v1/releases/{release_id}/answers",
            raw=body,
            headers={"Content-Type": "application/json"},
        )
        latencies.append(time.perf_counter() - started)

    prober = threading.Thread(target=probe)
    askers = [threading.Thread(target=ask) for _ in range(clients)]
    started = time.perf_counter()
    prober.start()
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join()
    wall = time.perf_counter() - started
    done.set()
    prober.join()
    return {
        "wall_s": round(wall, 2),
        "answers_s": _quantiles(latencies),
        "healthz_s": _quantiles(probes["healthz"]),
        "release_s": _quantiles(probes["release"]),
    }


def measure(clients: int, queries: int) -> dict[str, Any]:
    """One release, three answer requests alone (the fastest kept), then the storm."""
    with wdbc_served({"epsilon": 10.0, "delta": 1e-6}) as (curator, dataset, schema):
        release = {"mechanism": "smooth_synopsis", "epsilon": 1.0}
        release_id = str(_release(curator, dataset["id"], release)["release_id"])
        body = json.dumps({"queries": _queries("gaussian_mixture", queries, schema)}).encode()
        url = f"/v1/releases/{release_id}/answers"
        alone = []
        for _ in range(3):
            started = time.perf_counter()
            curator.request("POST", url, raw=body, headers={"Content-Type": "application/json"})
            alone.append(time.perf_counter() - started)
        storm = _storm(curator, release_id, body, clients)
    return {"clients": clients, "queries": queries, "alone_s": round(min(alone), 3), **storm}


def table(runs: list[dict[str, Any]]) -> str:
    rows = [
        "| run | clients x queries | one request alone | storm wall | answers p50 / max | "
        "`/healthz` p50 / p95 / max | `GET /releases/{id}` p50 / p95 / max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for item in runs:
        h, r, a = item["healthz_s"], item["release_s"], item["answers_s"]
        rows.append(
            f"| {item['label']} | {item['clients']} x {item['queries']} | {item['alone_s']} s "
            f"| {item['wall_s']} s | {a['p50']} / {a['max']} s "
            f"| {h['p50']} / {h['p95']} / {h['max']} s | {r['p50']} / {r['p95']} / {r['max']} s |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="after")
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()
    command = (
        f"python -m bench.answer_concurrency --label {args.label} --clients {args.clients} "
        f"--queries {args.queries}"
    )
    run = Run(f"answer_concurrency_{args.label}", command)
    payload = {"label": args.label, **measure(args.clients, args.queries)}
    runs = [
        json.loads(path.read_text())
        for path in sorted(RESULTS.glob("answer_concurrency_*.json"))
        if path.name != f"answer_concurrency_{args.label}.json"
    ] + [payload]
    markdown = "\n".join(
        [
            "# Concurrent answer requests and the rest of the API",
            "",
            "One `smooth_synopsis` release of WDBC (epsilon 1, default parameters), the API "
            "with its embedded worker on SQLite, in-process (`bench/answer_concurrency.py`). "
            "`clients` answer requests of `queries` paper-000 Gaussian-mixture queries each "
            "are sent at once; meanwhile a prober reads `/healthz` and a release every 50 ms. "
            "Each run is one label's (`before`: the code before a change).",
            "",
            table(sorted(runs, key=lambda item: str(item["label"]))),
        ]
    )
    run.write(markdown, payload)
    (RESULTS / "answer_concurrency.md").write_text(
        (RESULTS / f"answer_concurrency_{args.label}.md").read_text()
    )
    (RESULTS / f"answer_concurrency_{args.label}.md").unlink()


if __name__ == "__main__":
    main()
