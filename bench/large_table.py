"""How the service scales with the table size: uploads, releases, answers and downloads of
synthetic tables of n = 10^5, 10^6 and 10^7 rows, end to end through the real server.

Protocol
--------
- Data: ``d = 10`` columns drawn with a fixed seed (:data:`SEED`), in chunks, so the
  client never holds a whole table: 8 continuous columns from different laws (normal,
  log-normal, uniform, beta, exponential, a two-component mixture, gamma, Student t),
  clipped to their declared bounds (no cell is clipped by the service); one categorical
  column with 10 categories of unequal frequency; one binary column (p = 0.3). Values are
  written with 4 decimals, as CSV (pyarrow's writer) and as Parquet (pyarrow's writer,
  zstd, row groups of 2^20 rows, pyarrow's default).
- Server: ``curator serve --port 0 --port-file`` in a subprocess (SQLite, SQLite queue,
  the embedded worker, default settings: the 10^7-row CSV, ~610 MiB, is within the
  default upload limit of 1 GiB), on a fresh ``CURATOR_DATA_DIR`` for each n, restarted
  on it for each upload and each release. Unlike ``bench.service_latency`` (in-process)
  the server runs in its own process, so that its memory is measured apart from the
  client's, and a fresh one for each step, so that a step's peak is not hidden by memory
  an earlier step left in the allocator (a process keeps what it freed for reuse).
- Memory: the server process's peak resident set (``VmHWM`` in ``/proc/<pid>/status``),
  reset before each step by writing 5 to ``/proc/<pid>/clear_refs``; the resident set
  before the step is in the JSON as ``rss_before_mib`` (about 260 MiB for a server that
  has just started; the answers and the download run after their release in its process,
  which holds its decoded release in the answers' cache).
- Upload: ``POST /v1/datasets`` with the file streamed from disk (multipart), until the
  201; the same table as CSV and as Parquet.
- Releases (on the dataset uploaded as Parquet; the stored table is the same), epsilon 1:
  ``smooth_synthetic`` with the default method at delta = 0 (marginals) and at delta =
  1e-9 (tree), ``smooth_synopsis`` (defaults), ``randomized_response`` on the categorical,
  the binary and one continuous column. Time from ``POST /releases`` until the status
  reads ``succeeded`` (polled every 100 ms), split into *measure* (``measured_at -
  created_at``, so with the queue wait, under 1 s) and *synthesise* (``finished_at -
  measured_at``), from the release's JSON.
- Answers: one request of 100 queries: for the smooth releases, Gaussian kernels on the
  8 continuous columns in original units (centres drawn in the bounds, width a quarter of
  each range); for randomized response, which answers statistical queries and not kernels,
  100 conjunctions on the categorical and binary columns (one request where the service's
  per-request work limit allows, otherwise as few as it allows, all timed together).
- Download: the synthetic CSV (``GET /synthetic?format=csv``: the smooth_synthetic sample
  has min(n, 10^6) rows, randomized response's n); for the synopsis, its JSON.

    python -m bench.large_table [--sizes 100000,1000000,10000000] [--out DIR]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from app.storage.artifacts import write_csv_and_parquet
from bench._common import RESULTS, Run

SEED = 20260506
CHUNK_ROWS = 1 << 20
EPSILON = 1.0
DELTA = 1e-9
QUERIES = 100
POLL_SECONDS = 0.1

CATEGORIES = [f"c{k}" for k in range(10)]
CATEGORY_P = np.array([0.3, 0.2, 0.12, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02])
#: name -> (lower, upper) declared bounds of the continuous columns
BOUNDS: dict[str, tuple[float, float]] = {
    "normal": (-5.0, 5.0),
    "lognormal": (0.0, 50.0),
    "uniform": (0.0, 1.0),
    "beta": (0.0, 1.0),
    "exponential": (0.0, 20.0),
    "mixture": (-10.0, 10.0),
    "gamma": (0.0, 30.0),
    "student_t": (-10.0, 10.0),
}
CATEGORICAL, BINARY = "category", "flag"

RELEASES: dict[str, dict[str, Any]] = {
    "smooth_synthetic, delta 0 (marginals)": {
        "mechanism": "smooth_synthetic",
        "epsilon": EPSILON,
    },
    "smooth_synthetic, delta 1e-9 (tree)": {
        "mechanism": "smooth_synthetic",
        "epsilon": EPSILON,
        "delta": DELTA,
    },
    "smooth_synopsis": {"mechanism": "smooth_synopsis", "epsilon": EPSILON},
    "randomized_response": {
        "mechanism": "randomized_response",
        "epsilon": EPSILON,
        "columns": [CATEGORICAL, BINARY, "normal"],
    },
}
#: the resolved parameters kept in the results (they set the work: R moments, cells)
RESOLVED_KEYS = ("method", "bins", "pair_bins", "basis_size", "domain_size", "bits")


def schema() -> dict[str, Any]:
    columns: list[dict[str, Any]] = [
        {"name": name, "kind": "continuous", "lower": lo, "upper": hi}
        for name, (lo, hi) in BOUNDS.items()
    ]
    columns.append({"name": CATEGORICAL, "kind": "categorical", "categories": CATEGORIES})
    columns.append({"name": BINARY, "kind": "binary"})
    return {
        "name": "large-table",
        "columns": columns,
        "budget": {"epsilon": 100.0, "delta": 1e-7},
    }


def chunks(n: int, seed: int = SEED) -> Iterator[pa.Table]:
    """The table of ``n`` rows in chunks of at most :data:`CHUNK_ROWS` (seeded per chunk)."""
    for index, start in enumerate(range(0, n, CHUNK_ROWS)):
        m = min(CHUNK_ROWS, n - start)
        rng = np.random.default_rng([seed, index])
        raw = {
            "normal": rng.normal(0.0, 1.0, m),
            "lognormal": rng.lognormal(1.0, 0.75, m),
            "uniform": rng.uniform(0.0, 1.0, m),
            "beta": rng.beta(2.0, 5.0, m),
            "exponential": rng.exponential(2.0, m),
            "mixture": np.where(
                rng.uniform(size=m) < 0.4, rng.normal(-4.0, 1.0, m), rng.normal(3.0, 1.5, m)
            ),
            "gamma": rng.gamma(3.0, 2.0, m),
            "student_t": rng.standard_t(4.0, m),
        }
        columns: dict[str, Any] = {
            name: np.round(np.clip(values, *BOUNDS[name]), 4) for name, values in raw.items()
        }
        codes = rng.choice(len(CATEGORIES), size=m, p=CATEGORY_P)
        columns[CATEGORICAL] = pa.DictionaryArray.from_arrays(
            pa.array(codes, pa.int32()), pa.array(CATEGORIES)
        ).cast(pa.string())
        columns[BINARY] = (rng.uniform(size=m) < 0.3).astype(np.int8)
        yield pa.table(columns)


def write_files(n: int, directory: Path) -> dict[str, Path]:
    """The table as ``table.csv`` and ``table.parquet`` in ``directory``."""
    csv_path, parquet_path = directory / "table.csv", directory / "table.parquet"
    write_csv_and_parquet(csv_path, parquet_path, chunks(n), compression="zstd")
    return {"csv": csv_path, "parquet": parquet_path}


# The server ------------------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in kB."""
    out = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    log_path: Path
    key: str = ""
    #: whether the peak can be reset per step (``clear_refs``); if not, peaks are since start
    resettable: bool = True

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_mib(self) -> float:
        return _status(self.pid)["VmRSS"] / 1024

    def reset_peak(self) -> None:
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            self.resettable = False

    def peak_mib(self) -> float:
        return _status(self.pid)["VmHWM"] / 1024

    # HTTP (http.client: the upload streams from disk, downloads stream to nowhere)

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)

    def request(
        self, method: str, path: str, body: Any = None, *, sink: bool = False
    ) -> tuple[Any, int]:
        """JSON in, JSON out (``sink``: the body is read in chunks and only counted); returns
        the decoded answer (or None) and the number of bytes of the response body."""
        connection = self._connection()
        try:
            headers = {"Authorization": f"Bearer {self.key}"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            if sink and response.status == 200:
                size = 0
                while chunk := response.read(1 << 20):
                    size += len(chunk)
                return None, size
            content = response.read()
            if response.status >= 300:
                raise RuntimeError(f"{method} {path} -> {response.status}: {content[:500]!r}")
            return json.loads(content), len(content)
        finally:
            connection.close()

    def upload(self, path: Path, schema_json: bytes) -> dict[str, Any]:
        boundary = secrets.token_hex(16)
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="schema"; '
            f'filename="schema.json"\r\nContent-Type: application/json\r\n\r\n'.encode()
            + schema_json
            + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
        )
        tail = f"\r\n--{boundary}--\r\n".encode()
        connection = self._connection()
        try:
            connection.putrequest("POST", "/v1/datasets")
            connection.putheader("Authorization", f"Bearer {self.key}")
            connection.putheader("Content-Type", f"multipart/form-data; boundary={boundary}")
            connection.putheader("Content-Length", str(len(head) + path.stat().st_size + len(tail)))
            connection.endheaders()
            connection.send(head)
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    connection.send(chunk)
            connection.send(tail)
            response = connection.getresponse()
            content = response.read()
            if response.status != 201:
                raise RuntimeError(f"upload -> {response.status}: {content[:500]!r}")
            answer: dict[str, Any] = json.loads(content)
            return answer
        finally:
            connection.close()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from app.cli import main; main()", *args]


@contextmanager
def serve(data_dir: Path, key: str | None = None) -> Iterator[Server]:
    """``curator serve`` on a port the system picks, with ``key`` or a new curator's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env |= {
        "CURATOR_DATA_DIR": str(data_dir),
        "CURATOR_LOG_LEVEL": "WARNING",
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    port_file = data_dir / "port"
    port_file.unlink(missing_ok=True)  # --port-file wants a path that does not exist
    log_path = data_dir / "server.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            _cli("serve", "--port", "0", "--port-file", str(port_file)),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = Server(process, 0, env, log_path)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        server.port = int(port_file.read_text())
        if key is None:
            created = subprocess.run(
                _cli("create-user", "--name", "bench", "--role", "curator", "--json"),
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            key = json.loads(created.stdout)["api_key"]
        server.key = key
        yield server
    except BaseException:
        sys.stderr.write(log_path.read_text()[-4000:])
        raise
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Step:
    """Wall time and the server's peak resident set of one step."""

    server: Server
    seconds: float = 0.0
    rss_before_mib: float = 0.0
    peak_mib: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __enter__(self) -> Step:
        self.rss_before_mib = self.server.rss_mib()
        self.server.reset_peak()
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._started
        self.peak_mib = self.server.peak_mib()

    def record(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "rss_before_mib": round(self.rss_before_mib, 1),
            "peak_rss_mib": round(self.peak_mib, 1),
        } | self.extra


# Queries ---------------------------------------------------------------------------------


def kernel_queries(count: int, seed: int = SEED) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, 1])
    out = []
    for _ in range(count):
        factors = {}
        for name, (lo, hi) in BOUNDS.items():
            factors[name] = {
                "type": "gaussian",
                "center": round(float(lo + (hi - lo) * rng.uniform()), 6),
                "sigma": (hi - lo) / 4,
            }
        out.append({"type": "product", "space": "original", "factors": factors})
    return out


def conjunction_queries(count: int, seed: int = SEED) -> list[dict[str, Any]]:
    rng = np.random.default_rng([seed, 2])
    return [
        {
            "type": "conjunction",
            "where": {
                CATEGORICAL: [CATEGORIES[k] for k in sorted(rng.choice(10, 3, replace=False))],
                BINARY: int(rng.integers(2)),
            },
        }
        for _ in range(count)
    ]


def _timestamp(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value).timestamp()


def run_release(server: Server, dataset: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    with Step(server) as step:
        release, _ = server.request("POST", f"/v1/datasets/{dataset['id']}/releases", body)
        while True:
            status, _ = server.request("GET", f"/v1/releases/{release['id']}")
            if status["status"] == "succeeded":
                break
            if status["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"{body['mechanism']} {status['status']}: {status['message']}")
            time.sleep(POLL_SECONDS)
    created = _timestamp(status["created_at"])
    measured = _timestamp(status["measured_at"])
    finished = _timestamp(status["finished_at"])
    out = step.record() | {
        "measure_s": round(measured - created, 3),
        "synthesize_s": round(finished - measured, 3),
        "resolved": {k: v for k, v in status["resolved"].items() if k in RESOLVED_KEYS},
    }
    # answers: one request of 100 queries (randomized response's request bound counts its
    # distinct released cells, at most 1280 here: 100 queries fit in one request)
    if body["mechanism"] == "randomized_response":
        queries = conjunction_queries(QUERIES)
    else:
        queries = kernel_queries(QUERIES)
    with Step(server) as answers:
        result, _ = server.request(
            "POST", f"/v1/releases/{release['id']}/answers", {"queries": queries}
        )
    assert len(result["answers"]) == QUERIES
    answers.extra["requests"] = 1
    out["answers"] = answers.record()
    target = "synopsis" if body["mechanism"] == "smooth_synopsis" else "synthetic?format=csv"
    with Step(server) as download:
        _, size = server.request("GET", f"/v1/releases/{release['id']}/{target}", sink=True)
    download.extra["mib"] = round(size / 2**20, 1)
    download.extra["what"] = "synopsis JSON" if "synopsis" in target else "synthetic CSV"
    out["download"] = download.record()
    return out


def measure_size(n: int, workdir: Path, releases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    files_dir = workdir / "files"
    files_dir.mkdir(parents=True)
    started = time.perf_counter()
    files = write_files(n, files_dir)
    result: dict[str, Any] = {
        "n": n,
        "generate_s": round(time.perf_counter() - started, 1),
        "uploads": {},
        "releases": {},
    }
    print(f"n = {n}: files written in {result['generate_s']} s", flush=True)
    schema_json = json.dumps(schema()).encode()
    data_dir, key = workdir / "data", None
    resettable = True
    try:
        # a fresh server process for each upload and each release (on the same data
        # directory), so that each peak is the step's own and not what an earlier step
        # left in the allocator
        datasets = {}
        for fmt, path in files.items():
            with serve(data_dir, key) as server:
                key = server.key
                result.setdefault("server_idle_rss_mib", round(server.rss_mib(), 1))
                with Step(server) as step:
                    datasets[fmt] = server.upload(path, schema_json)
                resettable = resettable and server.resettable
            assert datasets[fmt]["n_rows"] == n
            step.extra["file_mib"] = round(path.stat().st_size / 2**20, 1)
            result["uploads"][fmt] = step.record()
            print(f"  upload {fmt}: {result['uploads'][fmt]}", flush=True)
            path.unlink()  # keep the disk free
        for label, body in releases.items():
            with serve(data_dir, key) as server:
                result["releases"][label] = run_release(server, datasets["parquet"], body)
                resettable = resettable and server.resettable
            print(f"  {label}: {result['releases'][label]}", flush=True)
        result["peak_reset_per_step"] = resettable
    finally:
        shutil.rmtree(files_dir, ignore_errors=True)
    return result


# Report ----------------------------------------------------------------------------------


def _n(n: int) -> str:
    exponent = math.log10(n)
    return f"10^{int(exponent)}" if exponent.is_integer() else f"{n}"


def _s(seconds: float) -> str:
    return f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def _peak(step: dict[str, Any]) -> str:
    """Peak RSS with its rise over the RSS before the step."""
    return f"{step['peak_rss_mib']:.0f} (+{step['peak_rss_mib'] - step['rss_before_mib']:.0f})"


def _resolved(resolved: dict[str, Any]) -> str:
    names = {"basis_size": "R", "domain_size": "cells", "pair_bins": "b"}
    return ", ".join(f"{names.get(k, k)} {v}" for k, v in resolved.items() if k != "method")


def _steps(results: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every timed step of a run, by a label (for the comparison)."""
    for result in results:
        n = _n(result["n"])
        for fmt, up in result["uploads"].items():
            yield f"{n} | upload {fmt}", up
        for label, rel in result["releases"].items():
            yield f"{n} | {label}", rel
            yield f"{n} | {label}: answers", rel["answers"]
            yield f"{n} | {label}: download", rel["download"]


def markdown(
    results: list[dict[str, Any]], before: dict[str, Any] | None = None, note: str = ""
) -> str:
    lines = [
        "# Large tables: how the service scales with n",
        "",
        *([note, ""] if note else []),
        "Synthetic tables of d = 10 columns (8 continuous with declared bounds, 1 categorical",
        "with 10 categories, 1 binary; fixed seed), through `curator serve` in its own process",
        "(SQLite, embedded worker, a fresh data directory per n and a freshly started server",
        "for each upload and each release). Peak RSS: the server process's `VmHWM` in MiB,",
        "reset before each step, with in brackets its rise over the RSS the process had",
        "before the step (a started server: about 260 MiB). Protocol in",
        "`bench/large_table.py`.",
        "",
        "## Uploads",
        "",
        "`POST /v1/datasets` until the 201: streamed into the encrypted spool, validated cell",
        "by cell, normalised and stored as encrypted Parquet.",
        "",
        "| n | format | file MiB | upload s | rows/s | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        for fmt, up in result["uploads"].items():
            lines.append(
                f"| {_n(result['n'])} | {fmt} | {up['file_mib']} | {_s(up['seconds'])} | "
                f"{result['n'] / up['seconds']:,.0f} | {_peak(up)} |"
            )
    lines += [
        "",
        "## Releases, answers and downloads",
        "",
        f"Epsilon {EPSILON} each, on the dataset uploaded as Parquet. *total*: `POST",
        "/releases` to `succeeded` as the client saw it; *measure* / *synthesise*: from the",
        "release's timestamps (measure includes the wait in the queue); *resolved*: the",
        "parameters the service chose from n (R moments, histogram bins, RR cells), which set",
        f"the work. *answers*: one request of {QUERIES} queries (Gaussian kernels on the 8",
        "continuous columns; randomized response: conjunctions). *download*: the synthetic",
        "CSV (the synopsis: its JSON).",
        "",
        "| n | release | resolved | total s | measure s | synthesise s | peak RSS MiB "
        "| answers s | answers peak MiB | download s (MiB) | download peak MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        for label, rel in result["releases"].items():
            answers, download = rel["answers"], rel["download"]
            lines.append(
                f"| {_n(result['n'])} | {label} | {_resolved(rel.get('resolved', {}))} | "
                f"{_s(rel['seconds'])} | {_s(rel['measure_s'])} | {_s(rel['synthesize_s'])} | "
                f"{_peak(rel)} | {_s(answers['seconds'])} | {_peak(answers)} | "
                f"{_s(download['seconds'])} ({download['mib']}) | {_peak(download)} |"
            )
    idle = ", ".join(f"{_n(r['n'])}: {r['server_idle_rss_mib']:.0f}" for r in results)
    lines += ["", f"Server RSS at idle after start (MiB): {idle}."]
    if before is not None:
        earlier = dict(_steps(before["results"]))
        lines += [
            "",
            f"## Against `{before['benchmark']}` ({before['machine']['date_utc']} UTC)",
            "",
            "The same steps in that run and in this one: seconds and the rise of the peak RSS",
            "over the RSS before the step (MiB).",
            "",
            "| n | step | seconds then | seconds now | peak rise then | peak rise now |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for label, now in _steps(results):
            if label not in earlier:
                continue
            then = earlier[label]
            rise_then = then["peak_rss_mib"] - then["rss_before_mib"]
            rise_now = now["peak_rss_mib"] - now["rss_before_mib"]
            lines.append(
                f"| {label} | {_s(then['seconds'])} | {_s(now['seconds'])} | "
                f"{rise_then:.0f} | {rise_now:.0f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--sizes",
        default="100000,1000000,10000000",
        help="comma-separated row counts (default 10^5, 10^6, 10^7)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory of the results")
    parser.add_argument("--name", default="large_table", help="stem of the result files")
    parser.add_argument("--tmp", type=Path, default=None, help="scratch directory")
    parser.add_argument(
        "--compare", type=Path, default=None, help="the JSON of an earlier run to compare with"
    )
    parser.add_argument("--note", default="", help="a line under the title (what was run)")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    command = shlex.join(["python", "-m", "bench.large_table", *(argv or [])])
    run = Run(args.name, command)
    results = []
    with tempfile.TemporaryDirectory(prefix="curator-large-", dir=args.tmp) as tmp:
        for n in sizes:
            results.append(measure_size(n, Path(tmp) / f"n{n}", RELEASES))
    payload = {
        "settings": {
            "sizes": sizes,
            "seed": SEED,
            "epsilon": EPSILON,
            "delta_tree": DELTA,
            "queries": QUERIES,
            "releases": RELEASES,
            "schema": schema(),
        },
        "note": args.note,
        "results": results,
    }
    before = json.loads(args.compare.read_text()) if args.compare else None
    text = markdown(results, before, args.note)
    machine = run.machine()
    payload = {"benchmark": args.name, "command": command, "machine": machine} | payload
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(text + "\n\n" + run.machine_md(machine) + "\n")
    print(text)
    print(run.machine_md(machine))
    return payload


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl+C, so the server and the scratch files go too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main(sys.argv[1:])
