"""Forensic canary audit: do raw values reach any place at rest, before and after the
data are deleted (DESIGN rule 5: raw files encrypted at rest, raw values in no endpoint,
log line or error)?

A canary table (CSV and a Parquet copy) holds values that cannot occur by chance: 10
significant digits in three continuous columns. The service runs for real (``curator
serve`` with its embedded worker on SQLite, or ``serve --no-worker`` and a separate
``curator worker`` on PostgreSQL and Redis), with ``TMPDIR`` and ``CURATOR_DATA_DIR`` in a
directory of the audit's own and the log at DEBUG. The audit uploads both files (the CSV
with an ``Idempotency-Key``, retried), an upload refused by validation (an undeclared
category, a non-numeric cell and a value outside ``reject`` bounds, each a canary of its
own), an upload whose client disconnects mid-body (canaries of their own too), and a
graph; it runs every release type (``smooth_synthetic``'s three methods,
``smooth_synopsis``, ``randomized_response``, ``compressed``, ``graph_cuts``), one that
fails (``compressed`` with a reference the data are outside of), one cancelled while it
measures, and a re-synthesis; it answers queries, downloads every artifact and runs
``curator backup`` (SQLite).

Then it searches every file under ``DATA_DIR`` (spools, work directories, journal,
``queue.db``), ``TMPDIR``, files under ``/tmp`` changed since the audit started, the
SQLite database with its WAL, a ``pg_dump`` and every key of the Redis database, the
server's (and worker's) output, the backup, the downloads and the answers, for:

- each raw continuous value as the CSV's text, float64 and (for 20 rows) float32 bytes,
  little-endian, and normalised to ``[-1, 1]`` by the declared bounds (float64): the
  stored representation;
- the refused and the disconnected uploads' canaries (text, UTF-8 and UTF-16-LE);
- the declared categories (UTF-8, UTF-16-LE), which are public and expected in the
  declaration and the outputs, reported only elsewhere.

Then it deletes both datasets' data through the API and searches again, also for the
upload's keyed fingerprint and the sealed file keys the dataset rows held, and tries
every key left (the data key ring with every file key the database still holds) on every
encrypted Parquet file left.

Usage::

    python -m bench.canary_audit                    # SQLite, embedded worker
    python -m bench.canary_audit --postgres URL --redis URL \\
        [--pg-data-dir /var/lib/postgresql/15/main]   # + a separate worker

A hit is a finding unless it is a declared category in the declaration or an output.
Results go to ``bench/results/canary_audit_<backend>.{md,json}`` (``--no-write``: print).
"""

from __future__ import annotations

import argparse
import base64
import codecs
import contextlib
import hashlib
import hmac
import http.client
import io
import json
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._common import Run

N_ROWS = 3000
SEED = 59
BOUNDS = {"c_alpha": (0.0, 1000.0), "c_beta": (-10.0, 10.0), "c_gamma": (0.0, 1.0)}
CATEGORIES = ["CANARYxq7Z", "CANARYp3Wm", "CANARYk9Rt"]
#: rows whose values are also searched as float32 (4 bytes: more would match by chance)
FLOAT32_ROWS = 20
#: canaries of the refused upload (each must appear nowhere)
REFUSED = {
    "undeclared category": "CANARYundeclaredQ4v",
    "non-numeric cell": "CANARYnotanumber8h",
    "out of bounds": "1234.567891234",
}
#: the disconnected (and too large) upload's continuous values are drawn with this seed
DISCONNECT_SEED = 5959
DISCONNECT_ROWS = 60_000
#: CURATOR_MAX_UPLOAD_BYTES of the audited service: the disconnected upload's file
#: (about 2.6 MB) is past it, its first half is not
MAX_UPLOAD_BYTES = 2_000_000
POLL = 0.25
#: directories of /tmp not searched: virtual environments, job outputs, caches, other
#: audits (the audited processes write under their own TMPDIR; this looks for what
#: bypasses it)
SKIP_TMP_DIRS = ("venv", "bash_jobs", "pip-", "pytest-of-", "canary-audit-", ".cache", "uv-")


# The canary table ---------------------------------------------------------------------


def _digits(rng: np.random.Generator, lower: float, upper: float, n: int) -> list[str]:
    """``n`` values in ``(lower, upper)`` written with 10 significant digits, all distinct,
    none with fewer digits (a trailing zero would shorten the text)."""
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        x = rng.uniform(lower, upper)
        text = f"{x:.10g}"
        if len(text.replace("-", "").replace(".", "").lstrip("0")) < 10 or text in seen:
            continue
        if "e" in text:
            continue
        seen.add(text)
        out.append(text)
    return out


def table(seed: int, n: int) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    cols = {name: _digits(rng, lo, hi, n) for name, (lo, hi) in BOUNDS.items()}
    cols["c_cat"] = [CATEGORIES[i] for i in rng.integers(0, len(CATEGORIES), n)]
    cols["c_bin"] = [str(b) for b in rng.integers(0, 2, n)]
    return cols


def schema(name: str, out_of_bounds: str = "clip") -> dict[str, Any]:
    columns: list[dict[str, Any]] = [
        {"name": c, "kind": "continuous", "lower": lo, "upper": hi}
        for c, (lo, hi) in BOUNDS.items()
    ]
    columns += [
        {"name": "c_cat", "kind": "categorical", "categories": CATEGORIES},
        {"name": "c_bin", "kind": "binary"},
    ]
    return {
        "name": name,
        "columns": columns,
        "budget": {"epsilon": 100.0, "delta": 1e-4},
        "out_of_bounds": out_of_bounds,
        "allow_non_dp_releases": True,
    }


def csv_bytes(cols: dict[str, list[str]]) -> bytes:
    names = list(cols)
    lines = [",".join(names)] + [",".join(r) for r in zip(*(cols[c] for c in names), strict=True)]
    return ("\n".join(lines) + "\n").encode()


def parquet_bytes(cols: dict[str, list[str]]) -> bytes:
    arrays = {
        c: pa.array([float(v) for v in vals], pa.float64()) if c in BOUNDS else pa.array(vals)
        for c, vals in cols.items()
    }
    arrays["c_bin"] = pa.array([int(v) for v in cols["c_bin"]], pa.int64())
    sink = io.BytesIO()
    pq.write_table(pa.table(arrays), sink)
    return sink.getvalue()


# Patterns and the scanner --------------------------------------------------------------


@dataclass
class Patterns:
    #: pattern bytes -> label ("kind:detail")
    long: dict[bytes, str] = field(default_factory=dict)
    short: dict[bytes, str] = field(default_factory=dict)  # 4-byte (float32)

    def add(self, pattern: bytes, label: str) -> None:
        (self.short if len(pattern) < 8 else self.long).setdefault(pattern, label)


def raw_patterns(cols: dict[str, list[str]], tag: str, float32_rows: int) -> Patterns:
    p = Patterns()
    for c, (lo, hi) in BOUNDS.items():
        texts = cols[c]
        values = np.array([float(t) for t in texts])
        normalised = np.clip(2.0 * (values - lo) / (hi - lo) - 1.0, -1.0, 1.0)
        for i, text in enumerate(texts):
            p.add(text.encode(), f"{tag}:ascii")
            p.add(text.encode("utf-16-le"), f"{tag}:utf16")
            p.add(np.float64(values[i]).tobytes(), f"{tag}:float64")
            p.add(np.float64(normalised[i]).tobytes(), f"{tag}:normalised_float64")
            if i < float32_rows:
                p.add(np.float32(values[i]).tobytes(), f"{tag}:float32")
                p.add(np.float32(normalised[i]).tobytes(), f"{tag}:normalised_float32")
    return p


def text_patterns(texts: dict[str, str], tag: str) -> Patterns:
    p = Patterns()
    for what, text in texts.items():
        p.add(text.encode(), f"{tag}:{what}:utf8")
        p.add(text.encode("utf-16-le"), f"{tag}:{what}:utf16")
        p.add(text.encode("utf-16-be"), f"{tag}:{what}:utf16be")
    return p


def merge(*parts: Patterns) -> Patterns:
    out = Patterns()
    for part in parts:
        for k, v in part.long.items():
            out.add(k, v)
        for k, v in part.short.items():
            out.add(k, v)
    return out


class Scanner:
    """Multi-pattern search: every 8-byte (4-byte) window at each of 8 (4) alignments is
    looked up among the patterns' sorted first 8 (4) bytes (:func:`numpy.searchsorted`), and a
    candidate is checked in full."""

    def __init__(self, patterns: Patterns) -> None:
        self.patterns = patterns
        self.prefix8: dict[int, list[bytes]] = defaultdict(list)
        for pat in patterns.long:
            self.prefix8[int.from_bytes(pat[:8], "little")].append(pat)
        self.keys8 = np.array(sorted(self.prefix8), dtype=np.uint64)
        self.keys4 = np.array(
            sorted(int.from_bytes(p, "little") for p in patterns.short), dtype=np.uint32
        )

    def scan(self, data: bytes) -> Counter[str]:
        hits: Counter[str] = Counter()
        for width, keys, dtype in ((8, self.keys8, "<u8"), (4, self.keys4, "<u4")):
            if not len(keys):
                continue
            for offset in range(width):
                usable = (len(data) - offset) // width * width
                if usable <= 0:
                    continue
                words = np.frombuffer(data, dtype=dtype, count=usable // width, offset=offset)
                at = np.minimum(np.searchsorted(keys, words), len(keys) - 1)
                for index in np.flatnonzero(keys[at] == words):
                    start = offset + int(index) * width
                    word = int(words[index])
                    if width == 4:
                        label = self.patterns.short[word.to_bytes(4, "little")]
                        hits[label + (HIGH_HALF if _high_half(data, start) else "")] += 1
                        continue
                    for pat in self.prefix8[word]:
                        if data[start : start + len(pat)] == pat and _bounded(data, start, pat):
                            hits[self.patterns.long[pat]] += 1
        return hits


HIGH_HALF = "~high_half"


def _high_half(data: bytes, start: int) -> bool:
    """Whether the 4 bytes at ``start`` read as the high half of an unrelated float64
    rather than as a float32 among float32s. Float32 patterns of values in [0.5, 2)
    share their sign, exponent and 20 leading mantissa bits with the high word of
    float64s in bands such as [2^-11, 2^-10) or [0.25, 0.5), so arrays of such float64s
    (normalised supports, weights) hold them by chance far more often than random bytes
    do. The 4 bytes before a float64's high word are mantissa bits, which read as a
    float32 of any exponent; in a float32 array they are a float32 of ordinary size
    (zero or within [1e-6, 1e7]), and so are the 4 bytes after: a match whose neighbours
    both look so is kept as a possible float32 (about 3 % of chance matches too)."""
    if start < 4:
        return False
    x = abs(float(np.frombuffer(data, "<f8", count=1, offset=start - 4)[0]))
    y = abs(float(np.frombuffer(data, "<f4", count=1, offset=start)[0]))
    if not (1e-300 <= x <= 1e300) or np.isclose(x, y, rtol=1e-6):
        return False

    def ordinary(offset: int) -> bool:
        if offset < 0 or offset + 4 > len(data):
            return True
        z = abs(float(np.frombuffer(data, "<f4", count=1, offset=offset)[0]))
        return z == 0.0 or 1e-6 <= z <= 1e7

    return not (ordinary(start - 4) and ordinary(start + 4))


_NUMBER_BYTES = frozenset(b"0123456789.")


def _bounded(data: bytes, start: int, pat: bytes) -> bool:
    """Whether a number's text at ``start`` stands alone: not part of a longer number
    (``12.34567891`` inside ``112.345678912``), which a synthetic value printed with 17
    digits contains by chance. Other patterns always count."""
    if not pat[:1].isdigit() and pat[:1] != b"-":
        return True
    if any(b not in _NUMBER_BYTES for b in pat.lstrip(b"-")):
        return True
    before = data[start - 1] if start else None
    end = start + len(pat)
    after = data[end] if end < len(data) else None
    return before not in _NUMBER_BYTES and after not in _NUMBER_BYTES


# The server ----------------------------------------------------------------------------


class Api:
    def __init__(self, port: int) -> None:
        self.port = port

    def call(
        self,
        method: str,
        path: str,
        key: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            hdrs = {"Authorization": f"Bearer {key}"} | (headers or {})
            data = raw
            if body is not None:
                data = json.dumps(body).encode()
                hdrs["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=hdrs)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def json(self, method: str, path: str, key: str, body: Any = None, **kw: Any) -> Any:
        status, content = self.call(method, path, key, body, **kw)
        if status >= 300:
            raise RuntimeError(f"{method} {path} -> {status}: {content[:400]!r}")
        return json.loads(content)


def multipart(schema_doc: dict[str, Any], filename: str, data: bytes) -> tuple[bytes, str]:
    boundary = secrets.token_hex(16)
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="schema"\r\n\r\n'.encode()
        + json.dumps(schema_doc).encode()
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return body, f"multipart/form-data; boundary={boundary}"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from app.cli import main; main()", *args]


@dataclass
class Deployment:
    root: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    port: int = 0

    def start(self, separate_worker: bool) -> None:
        port_file = self.root / "port"
        log = self.root / "logs" / "serve.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        args = ["serve", "--port", "0", "--port-file", str(port_file)]
        if separate_worker:
            args.append("--no-worker")
        with log.open("ab") as out:
            self.processes.append(
                subprocess.Popen(_cli(*args), env=self.env, stdout=out, stderr=subprocess.STDOUT)
            )
        self.logs.append(log)
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if self.processes[0].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        self.port = int(port_file.read_text())
        if separate_worker:
            wlog = self.root / "logs" / "worker.log"
            with wlog.open("ab") as out:
                self.processes.append(
                    subprocess.Popen(
                        _cli("worker"), env=self.env, stdout=out, stderr=subprocess.STDOUT
                    )
                )
            self.logs.append(wlog)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_release(api: Api, key: str, release_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        release: dict[str, Any] = api.json("GET", f"/v1/releases/{release_id}", key)
        if release["status"] in ("succeeded", "failed", "cancelled"):
            return release
        if time.monotonic() > deadline:
            raise RuntimeError(f"release {release_id} still {release['status']}")
        time.sleep(POLL)


def disconnect_upload(port: int, key: str, body: bytes, content_type: str) -> None:
    """Send the headers and half the body, then close the connection."""
    sock = socket.create_connection(("127.0.0.1", port))
    try:
        head = (
            f"POST /v1/datasets HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body[: len(body) // 2])
        time.sleep(1.0)
    finally:
        sock.close()


# The scenario --------------------------------------------------------------------------

SMOOTH_COLUMNS = list(BOUNDS)


def release_bodies() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, dataset, body): dataset ``csv`` or ``parquet`` or ``graph``."""
    return [
        (
            "marginals",
            "csv",
            {"mechanism": "smooth_synthetic", "epsilon": 1.0, "params": {"method": "marginals"}},
        ),
        (
            "tree",
            "csv",
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1.0,
                "delta": 1e-6,
                "params": {"method": "tree"},
            },
        ),
        (
            "moments",
            "parquet",
            {
                "mechanism": "smooth_synthetic",
                "epsilon": 1.0,
                "params": {"method": "moments", "grid_size": 200},
            },
        ),
        ("synopsis", "csv", {"mechanism": "smooth_synopsis", "epsilon": 1.0}),
        (
            "randomized_response",
            "csv",
            {
                "mechanism": "randomized_response",
                "epsilon": 1.0,
                "columns": ["c_cat", "c_bin", "c_alpha"],
            },
        ),
        (
            "compressed",
            "parquet",
            {"mechanism": "compressed", "columns": SMOOTH_COLUMNS, "params": {"delta_max": 0.5}},
        ),
        (
            "compressed_fails",
            "csv",
            {
                "mechanism": "compressed",
                "columns": ["c_alpha", "c_beta"],
                "params": {"delta_max": 0.05, "reference": [[1.0, 0.9], [0.9, 1.0]]},
            },
        ),
        ("graph_cuts", "graph", {"mechanism": "graph_cuts", "epsilon": 1.0}),
    ]


QUERIES = {
    "smooth": [
        {
            "type": "product",
            "space": "original",
            "factors": {"c_alpha": {"type": "gaussian", "center": 500.0, "sigma": 300.0}},
        }
    ],
    "randomized_response": [{"type": "conjunction", "where": {"c_cat": CATEGORIES[0]}}],
    "graph_cuts": [{"type": "cut", "S": [0, 1, 2], "T": [3, 4, 5]}],
    "compressed": [{"type": "pca", "k": 2}],
}


def scenario(api: Api, dep: Deployment, work: Path) -> dict[str, Any]:
    env = dep.env
    created = subprocess.run(
        _cli("create-user", "--name", "admin", "--role", "admin", "--json"),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    admin = json.loads(created.stdout)["api_key"]
    curator = api.json("POST", "/v1/users", admin, {"name": "carol", "role": "curator"})["api_key"]
    analyst = api.json("POST", "/v1/users", admin, {"name": "alan", "role": "analyst"})
    log: dict[str, Any] = {"uploads": {}, "releases": {}}
    inputs = work / "inputs"

    def upload(
        name: str, data: bytes, filename: str, doc: dict[str, Any], idem: str | None = None
    ) -> tuple[int, Any]:
        body, ctype = multipart(doc, filename, data)
        headers = {"Content-Type": ctype}
        if idem:
            headers["Idempotency-Key"] = idem
        status, content = api.call("POST", "/v1/datasets", curator, raw=body, headers=headers)
        (work / "responses" / f"upload-{name}.json").write_bytes(content)
        log["uploads"][name] = status
        return status, json.loads(content)

    csv_data = (inputs / "canary.csv").read_bytes()
    status, ds_csv = upload("csv", csv_data, "canary.csv", schema("canary csv"), "canary-idem")
    assert status == 201, ds_csv
    status, again = upload("csv_retry", csv_data, "canary.csv", schema("canary csv"), "canary-idem")
    assert status == 200, again
    assert again["id"] == ds_csv["id"], again
    status, ds_pq = upload(
        "parquet",
        (inputs / "canary.parquet").read_bytes(),
        "canary.parquet",
        schema("canary parquet"),
    )
    assert status == 201, ds_pq
    status, refused = upload(
        "refused",
        (inputs / "refused.csv").read_bytes(),
        "refused.csv",
        schema("refused", out_of_bounds="reject"),
    )
    assert status == 422, refused
    # other refusals, each of a file made of the refused table's canaries
    for name in (
        "headerless.csv",
        "ragged.csv",
        "unterminated.csv",
        "strings.parquet",
        "not_utf8.parquet",
    ):
        status, _ = upload(f"refused_{name}", (inputs / name).read_bytes(), name, schema("refused"))
        assert status == 422, (name, status)
    # the upload's key again, with other bytes: 409, and its spool removed
    status, _ = upload(
        "idempotency_conflict",
        (inputs / "headerless.csv").read_bytes(),
        "canary.csv",
        schema("canary csv"),
        "canary-idem",
    )
    assert status == 409, status
    # past CURATOR_MAX_UPLOAD_BYTES while it streams: 413
    status, _ = upload(
        "too_large", (inputs / "disconnect.csv").read_bytes(), "big.csv", schema("big")
    )
    assert status == 413, status
    body, ctype = multipart(
        schema("disconnect"), "gone.csv", (inputs / "disconnect.csv").read_bytes()
    )
    disconnect_upload(api.port, curator, body, ctype)
    log["uploads"]["disconnect"] = "closed mid-body"
    graph_doc = {
        "name": "canary graph",
        "kind": "graph",
        "vertices": 40,
        "budget": {"epsilon": 10.0, "delta": 0.0},
    }
    edges = "\n".join(f"{i},{j}" for i in range(40) for j in range(i + 1, 40) if (i * j) % 7 == 1)
    status, ds_graph = upload("graph", edges.encode(), "edges.csv", graph_doc)
    assert status == 201, ds_graph
    datasets = {"csv": ds_csv["id"], "parquet": ds_pq["id"], "graph": ds_graph["id"]}
    for ds in datasets.values():
        api.json("POST", f"/v1/datasets/{ds}/grants", curator, {"user_id": analyst["id"]})

    downloads = work / "downloads"
    for label, which, body in release_bodies():
        rel = api.json(
            "POST",
            f"/v1/datasets/{datasets[which]}/releases",
            curator,
            body,
            headers={"Idempotency-Key": f"canary-{label}"},
        )
        done = wait_release(api, curator, rel["id"])
        log["releases"][label] = {"status": done["status"], "message": done.get("message")}
        (work / "responses" / f"release-{label}.json").write_text(json.dumps(done))
        if done["status"] != "succeeded":
            continue
        family = "smooth" if body["mechanism"].startswith("smooth") else body["mechanism"]
        status, content = api.call(
            "POST",
            f"/v1/releases/{rel['id']}/answers",
            analyst["api_key"],
            {"queries": QUERIES[family]},
        )
        (work / "responses" / f"answers-{label}.json").write_bytes(content)
        log["releases"][label]["answers"] = status
        for artifact in done["artifacts"]:
            status, content = api.call(
                "GET", f"/v1/releases/{rel['id']}/artifacts/{artifact['name']}", analyst["api_key"]
            )
            (downloads / f"{label}-{artifact['name']}").write_bytes(content)
        if body["mechanism"] == "smooth_synthetic":
            for fmt in ("csv", "parquet"):
                for kind in ("sample", "support"):
                    status, content = api.call(
                        "GET",
                        f"/v1/releases/{rel['id']}/synthetic?format={fmt}&kind={kind}",
                        analyst["api_key"],
                    )
                    (downloads / f"{label}-synthetic-{kind}.{fmt}").write_bytes(content)
        if label == "marginals":
            api.json(
                "POST",
                f"/v1/releases/{rel['id']}/resynthesize",
                curator,
                {"params": {"grid_size": 300}},
            )
            log["releases"]["marginals_resynthesis"] = wait_release(api, curator, rel["id"])[
                "status"
            ]

    # cancelled mid-run: a synopsis with a large basis measures for seconds
    rel = api.json(
        "POST",
        f"/v1/datasets/{datasets['csv']}/releases",
        curator,
        {
            "mechanism": "smooth_synopsis",
            "epsilon": 1.0,
            "params": {"basis_size": 100000, "co_spread": False},
        },
    )
    deadline = time.monotonic() + 120
    while api.json("GET", f"/v1/releases/{rel['id']}", curator)["status"] == "queued":
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    seen = api.json("GET", f"/v1/releases/{rel['id']}", curator)["status"]
    api.call("DELETE", f"/v1/releases/{rel['id']}", curator)
    done = wait_release(api, curator, rel["id"])
    log["releases"]["cancelled_mid_run"] = {
        "status_when_cancelled": seen,
        "status": done["status"],
        "message": done["message"],
    }
    log["datasets"] = datasets
    log["curator_key"] = curator
    return log


class Watcher(threading.Thread):
    """Files that come and go while the scenario runs (spools, work directories, staging
    copies, anything written to TMPDIR and removed): every ``period`` seconds, each file
    under ``roots`` not seen with its size and mtime is read and searched at once; the
    hits are kept by file. A file that lives less than a period can be missed."""

    def __init__(self, roots: list[Path], scanner: Scanner, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.roots, self.scanner, self.period = roots, scanner, period
        self.seen: dict[Path, tuple[int, float]] = {}
        self.hits: dict[str, Counter[str]] = defaultdict(Counter)
        self.files: set[str] = set()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            for root in self.roots:
                for path in list(root.rglob("*")):
                    try:
                        st = path.stat()
                        if not path.is_file() or st.st_size > 16 << 20:
                            continue
                        if self.seen.get(path) == (st.st_size, st.st_mtime):
                            continue
                        self.seen[path] = (st.st_size, st.st_mtime)
                        data = path.read_bytes()
                    except OSError:
                        continue
                    self.files.add(str(path))
                    for label, count in self.scanner.scan(data).items():
                        hits = self.hits[str(path)]
                        hits[label] = max(hits[label], count)
            self.halt.wait(self.period)


# Collecting what is at rest ------------------------------------------------------------


def snapshot(
    dep: Deployment,
    work: Path,
    started: float,
    pg_url: str | None,
    redis_url: str | None,
    label: str,
) -> dict[str, bytes]:
    """Every place to search, as name -> bytes."""
    blobs: dict[str, bytes] = {}
    skip = {work / "inputs"}
    for base in (work,):
        for path in sorted(base.rglob("*")):
            if any(parent in skip for parent in path.parents) or not path.is_file():
                continue
            if path.is_symlink():
                continue
            with contextlib.suppress(OSError):
                blobs[str(path.relative_to(work))] = path.read_bytes()
    # /tmp outside the audit's directory: the files at its top level changed since the
    # audit started, and the directories created there since (the audited processes write
    # under their own TMPDIR; this looks for what bypasses it, without reading the trees
    # other engineers keep in /tmp on a shared machine)
    tmp = Path("/tmp")
    for entry in sorted(tmp.iterdir()):
        try:
            st = entry.lstat()
        except OSError:
            continue
        if entry == work or entry.is_symlink() or entry.name.startswith(SKIP_TMP_DIRS):
            continue
        if st.st_mtime < started:
            continue
        paths = (
            [entry]
            if entry.is_file()
            else (
                sorted(entry.rglob("*"))
                if entry.is_dir() and entry.name not in TMP_AT_START
                else []
            )
        )
        for path in paths:
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_size <= 64 << 20:
                    blobs[f"/tmp:{path}"] = path.read_bytes()
            except OSError:
                pass
    if pg_url:
        dump = subprocess.run(
            ["pg_dump", "--data-only", pg_url.replace("postgresql+psycopg", "postgresql")],
            capture_output=True,
            check=True,
        ).stdout
        blobs[f"pg_dump({label})"] = dump
    if redis_url:
        blobs[f"redis({label})"] = redis_contents(redis_url)
    if pg_url and PG_DATA_DIR[0]:
        blobs.update(postgres_files(Path(PG_DATA_DIR[0]), pg_url))
    return blobs


#: the names at the top of /tmp when the audit started (their trees are not searched)
TMP_AT_START: set[str] = set()
#: set from ``--pg-data-dir``
PG_DATA_DIR: list[str | None] = [None]


def postgres_files(data_dir: Path, pg_url: str) -> dict[str, bytes]:
    """The database's heap files (after a CHECKPOINT) and the server's WAL segments."""
    url = pg_url.replace("postgresql+psycopg", "postgresql")
    subprocess.run(["psql", url, "-c", "CHECKPOINT"], capture_output=True, check=False)
    oid = subprocess.run(
        [
            "psql",
            "-At",
            url,
            "-c",
            "select oid from pg_database where datname = current_database()",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    out = {}
    for base in (data_dir / "base" / oid, data_dir / "pg_wal"):
        for path in sorted(base.glob("*")):
            if path.is_file():
                out[f"postgres {base.name}/{path.name}"] = path.read_bytes()
    return out


def redis_contents(url: str) -> bytes:
    import redis

    client = redis.Redis.from_url(url)
    out = bytearray()
    for key in client.scan_iter(count=1000):
        out += b"KEY " + key + b"\n"
        dumped = client.dump(key)
        if dumped:
            out += dumped + b"\n"
        kind = client.type(key)
        if kind == b"string":
            out += client.get(key) or b""
        elif kind == b"list":
            out += b"".join(client.lrange(key, 0, -1))
        elif kind == b"hash":
            for k, v in client.hgetall(key).items():
                out += k + v
        elif kind == b"set":
            out += b"".join(client.smembers(key))
        elif kind == b"zset":
            out += b"".join(m for m, _ in client.zrange(key, 0, -1, withscores=True))
        out += b"\n"
    return bytes(out)


def classify(name: str, label: str) -> str:
    """``expected`` for a declared category where declarations and outputs live, else
    ``finding``."""
    declared = label.startswith("declared_category")
    if label.startswith("deleted_key") and name.startswith("backup/"):
        return "documented (a backup taken before the deletion)"
    if label.startswith("deleted_key") and name.startswith("postgres pg_wal/"):
        return "documented (PostgreSQL's WAL keeps the row's old version)"
    if declared and (
        "curator.db" in name
        or name.startswith(("pg_dump", "postgres ", "downloads/", "responses/", "backup/"))
        or "/releases/" in name
    ):
        return "expected"
    if declared and name.startswith("logs/"):
        return "finding"
    if label.endswith(HIGH_HALF):
        return "chance (the high half of an unrelated float64)"
    if label.endswith("float32"):
        # 4 bytes: chance matches are expected (see the expected count in the report);
        # each is looked at by hand (the report says what the ones seen were)
        return "weak (4-byte match)"
    return "finding"


def chance_4byte(scanner: Scanner, blobs: dict[str, bytes]) -> float:
    """Matches of the 4-byte patterns expected by chance in uniformly random bytes (data
    with structure, such as float64 arrays, makes some words likelier)."""
    return sum(len(b) for b in blobs.values()) * len(scanner.keys4) / 2**32


def search(scanner: Scanner, blobs: dict[str, bytes]) -> list[dict[str, Any]]:
    found = []
    for name, data in blobs.items():
        for label, count in scanner.scan(data).items():
            found.append(
                {"where": name, "what": label, "count": count, "verdict": classify(name, label)}
            )
    return found


def remaining_keys(dep: Deployment, work: Path, pg_url: str | None) -> list[bytes]:
    """The data key ring and every file key the database still holds."""
    from app.storage import tables

    key = (
        (work / "data" / "data.key").read_bytes().strip()
        if not dep.env.get("CURATOR_DATA_KEY")
        else dep.env["CURATOR_DATA_KEY"].encode()
    )
    sealed = [s for _, s in dataset_rows(work, pg_url) if s]
    keys = [key]
    for s in sealed:
        keys += tables.unseal_file_keys(key, s)
    return keys


def dataset_rows(work: Path, pg_url: str | None) -> list[tuple[str, str | None]]:
    query = "select id, file_keys from datasets"
    if pg_url:
        out = subprocess.run(
            [
                "psql",
                "-At",
                "-F",
                "\t",
                pg_url.replace("postgresql+psycopg", "postgresql"),
                "-c",
                query,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return [
            (line.split("\t")[0], line.split("\t")[1] or None) for line in out.splitlines() if line
        ]
    with sqlite3.connect(work / "data" / "curator.db") as conn:
        return [(str(a), b) for a, b in conn.execute(query)]


def fingerprints(work: Path, dep: Deployment, files: list[bytes]) -> list[str]:
    from app.datasets.upload import fingerprint_keys

    key = (
        dep.env.get("CURATOR_DATA_KEY", "").encode()
        or (work / "data" / "data.key").read_bytes().strip()
    )
    return [
        hmac.new(k, data, hashlib.sha256).hexdigest()
        for k in fingerprint_keys(key)
        for data in files
    ]


def openable(work: Path, keys: list[bytes], deleted_rows: int) -> list[dict[str, Any]]:
    """Every encrypted Parquet file under ``work``, whether a key of ``keys`` opens it and
    then whether it holds the canary table's row count (one of the deleted datasets)."""
    from app.storage import tables

    out = []
    for path in work.rglob("*"):
        if (
            not path.is_file()
            or work / "inputs" in path.parents
            or work / "downloads" in path.parents
        ):
            continue
        with path.open("rb") as handle:
            head = handle.read(4)
        if head != b"PARE":  # Parquet with an encrypted footer: what the service encrypts
            continue
        for key in keys:
            try:
                opened = tables.open_table(path, key)
            except Exception:
                continue
            rows = opened.metadata.num_rows
            opened.close()
            out.append(
                {
                    "file": str(path.relative_to(work)),
                    "opens": True,
                    "rows": rows,
                    "canary_rows": rows == deleted_rows,
                }
            )
            break
        else:
            out.append({"file": str(path.relative_to(work)), "opens": False})
    return out


# Main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="CURATOR_DATABASE_URL of an empty database")
    parser.add_argument("--redis", help="CURATOR_REDIS_URL (a database the audit may flush)")
    parser.add_argument(
        "--pg-data-dir",
        help="PostgreSQL's data directory, if readable: the database's heap files and the "
        "WAL are searched too (the WAL is the server's, shared with other databases)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    PG_DATA_DIR[0] = args.pg_data_dir
    TMP_AT_START.update(os.listdir("/tmp"))
    backend = "postgres_redis" if args.postgres else "sqlite"
    run = Run(
        f"canary_audit_{backend}",
        "python -m bench.canary_audit " + ("--postgres URL --redis URL" if args.postgres else ""),
    )
    started = time.time() - 1
    work = Path(tempfile.mkdtemp(prefix="canary-audit-"))
    for sub in ("inputs", "tmp", "downloads", "responses", "logs"):
        (work / sub).mkdir()
    cols = table(SEED, N_ROWS)
    (work / "inputs" / "canary.csv").write_bytes(csv_bytes(cols))
    (work / "inputs" / "canary.parquet").write_bytes(parquet_bytes(cols))
    refused = table(SEED + 1, 50)
    refused["c_cat"][7] = REFUSED["undeclared category"]
    refused["c_alpha"][11] = REFUSED["non-numeric cell"]
    refused["c_beta"][13] = REFUSED["out of bounds"]
    (work / "inputs" / "refused.csv").write_bytes(csv_bytes(refused))
    clean = table(SEED + 1, 50)
    lines = csv_bytes(clean).decode().splitlines()
    (work / "inputs" / "headerless.csv").write_text("\n".join(lines[1:]) + "\n")
    ragged = list(lines)
    ragged[5] += "," + clean["c_alpha"][40]
    (work / "inputs" / "ragged.csv").write_text("\n".join(ragged) + "\n")
    unterminated = list(lines)
    unterminated[9] = '"' + unterminated[9]
    (work / "inputs" / "unterminated.csv").write_text("\n".join(unterminated) + "\n")
    strings = {c: pa.array(v) for c, v in clean.items()}  # numbers as text: refused by type
    strings["c_alpha"] = pa.array([REFUSED["non-numeric cell"]] * 50)
    sink = io.BytesIO()
    pq.write_table(pa.table(strings), sink)
    (work / "inputs" / "strings.parquet").write_bytes(sink.getvalue())
    binary = dict(strings)
    # a string column whose bytes are not UTF-8 (a view: pyarrow does not check them)
    binary["c_cat"] = pa.array(
        [b"\xff" + REFUSED["undeclared category"].encode()] * 50, pa.binary()
    ).view(pa.string())
    binary["c_alpha"] = pa.array([float(v) for v in clean["c_alpha"]])
    sink = io.BytesIO()
    pq.write_table(pa.table(binary), sink)
    (work / "inputs" / "not_utf8.parquet").write_bytes(sink.getvalue())
    gone = table(DISCONNECT_SEED, DISCONNECT_ROWS)
    (work / "inputs" / "disconnect.csv").write_bytes(csv_bytes(gone))

    patterns = merge(
        raw_patterns(cols, "raw", FLOAT32_ROWS),
        raw_patterns(gone, "disconnected", 0),
        raw_patterns(clean, "refused_raw", 0),
        text_patterns(REFUSED, "refused"),
        text_patterns({c: c for c in CATEGORIES}, "declared_category"),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env |= {
        "CURATOR_DATA_DIR": str(work / "data"),
        "TMPDIR": str(work / "tmp"),
        "CURATOR_LOG_LEVEL": "DEBUG",
        "CURATOR_LEASE_SECONDS": "10",
        "CURATOR_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
    }
    if args.postgres:
        env |= {
            "CURATOR_DATABASE_URL": args.postgres,
            "CURATOR_REDIS_URL": args.redis,
            "CURATOR_DATA_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        import redis

        redis.Redis.from_url(args.redis).flushdb()
        subprocess.run(_cli("migrate"), env=env, check=True, capture_output=True)
    dep = Deployment(work, env)
    monitor = None
    if args.redis:
        # every command Redis receives while the scenario runs (the queue's payloads)
        monitor = subprocess.Popen(
            ["redis-cli", "-u", args.redis, "monitor"],
            stdout=(work / "logs" / "redis-monitor.raw").open("wb"),
        )
    result: dict[str, Any] = {
        "backend": backend,
        "rows": N_ROWS,
        "patterns": len(patterns.long) + len(patterns.short),
    }
    try:
        dep.start(separate_worker=bool(args.postgres))
        api = Api(dep.port)
        scanner = Scanner(patterns)
        watcher = Watcher([work / "data", work / "tmp"], scanner)
        watcher.start()
        try:
            log = scenario(api, dep, work)
        finally:
            watcher.halt.set()
            watcher.join()
        root = str(work) + "/"
        result["transient"] = [
            {
                "where": "while running: " + name.removeprefix(root),
                "what": label,
                "count": count,
                "verdict": classify(name.removeprefix(root), label),
            }
            for name, hits in sorted(watcher.hits.items())
            for label, count in hits.items()
        ]
        result["transient_files_seen"] = len(watcher.files)
        result["scenario"] = {k: v for k, v in log.items() if k != "curator_key"}
        if monitor is not None:
            monitor.terminate()
            monitor.wait()
            raw = (work / "logs" / "redis-monitor.raw").read_bytes()
            # redis-cli quotes arguments with C escapes: the bytes Redis received
            (work / "logs" / "redis-monitor.decoded").write_bytes(
                b"\n".join(codecs.escape_decode(line)[0] for line in raw.splitlines())
            )
            result["redis_monitor_lines"] = raw.count(b"\n")
        time.sleep(2)
        if not args.postgres:
            subprocess.run(
                _cli("backup", str(work / "backup")), env=env, check=True, capture_output=True
            )
        rows_before = dataset_rows(work, args.postgres)
        blobs = snapshot(dep, work, started, args.postgres, args.redis, "before")
        result["before_delete"] = search(scanner, blobs)
        result["searched"] = {
            "places": len(blobs),
            "bytes": sum(map(len, blobs.values())),
            "float32_chance_hits": round(chance_4byte(scanner, blobs), 3),
            "names": sorted(blobs),
        }
        del blobs
        # delete the data of both canary datasets
        deleted_ids = {log["datasets"]["csv"], log["datasets"]["parquet"]}
        sealed = [s for i, s in rows_before if s and i in deleted_ids]
        fps = fingerprints(
            work,
            dep,
            [
                (work / "inputs" / "canary.csv").read_bytes(),
                (work / "inputs" / "canary.parquet").read_bytes(),
            ],
        )
        for which in ("csv", "parquet"):
            status, _ = api.call(
                "DELETE", f"/v1/datasets/{log['datasets'][which]}/data", log["curator_key"]
            )
            result.setdefault("delete", {})[which] = status
        time.sleep(3)  # the background checkpoint
        after_patterns = merge(
            patterns,
            text_patterns(
                {f"fingerprint_{i}": fp for i, fp in enumerate(fps)}
                | {f"sealed_file_keys_{i}": s for i, s in enumerate(sealed)},
                "deleted_key",
            ),
        )
        after_scanner = Scanner(after_patterns)
        result["after_delete"] = search(
            after_scanner, snapshot(dep, work, started, args.postgres, args.redis, "after")
        )
        rows_after = dataset_rows(work, args.postgres)
        result["file_keys_left"] = sum(1 for _, s in rows_after if s)
        keys = remaining_keys(dep, work, args.postgres)
        result["openable_after_delete"] = openable(work, keys, N_ROWS)
        if (work / "backup" / "curator.db").exists():
            # the backup's own database still holds the deleted datasets' sealed keys
            with sqlite3.connect(work / "backup" / "curator.db") as conn:
                backup_sealed = [s for (s,) in conn.execute("select file_keys from datasets") if s]
            from app.storage import tables

            backup_keys = [k for s in backup_sealed for k in tables.unseal_file_keys(keys[0], s)]
            result["backup_openable_after_delete"] = [
                f for f in openable(work / "backup", backup_keys, N_ROWS) if f.get("canary_rows")
            ]
    finally:
        dep.stop()
        result["logs_bytes"] = sum(p.stat().st_size for p in dep.logs if p.exists())
        if args.keep:
            result["work"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    md = markdown(result)
    if args.no_write:
        print(md)
        print(json.dumps(result, indent=2, default=str))
    else:
        run.write(md, result)
    return result


NOTES = """## Reading the results

- Verdicts: `finding` is a raw value (or an undeclared canary, or a deleted dataset's key
  or fingerprint) where none may be; `expected` is a declared (public) category in the
  declaration or a release's output; `documented` is what the README says stays (a
  backup taken before a deletion, PostgreSQL's WAL); 4-byte (float32) matches are
  `weak`, or `chance` when the 4 bytes are the high half of an unrelated float64.
- Before `Database.checkpoint` vacuumed the datasets table on PostgreSQL (commit
  "datasets: on PostgreSQL, vacuum the datasets table once a data deletion commits"),
  this audit found both deleted datasets' sealed file keys and fingerprints in the
  table's heap file and the fingerprint's index after the deletion (a CHECKPOINT later);
  now only the WAL holds them.
- Float32 matches seen in earlier runs were all in `support_normalized.npy` or
  `support.parquet`: the high word of a float64 support point or weight (e.g. the
  float32 of the normalised canary 0.74966 is 0x3F3FE9D5, the high word of the weight
  0.000487), not the value; the exact float64 and text of every canary were never found.
- The backup, taken before the deletion, opens the deleted datasets with the data key
  (`backup_openable_after_delete`): as documented, a backup holds the sealed keys of
  what it copied; let backups expire.
- Not covered: a graph's edges (small integers, not distinctive), files that live less
  than the watcher's 0.1 s period, swap and core dumps (none were written), disk blocks
  of removed files, and a process killed mid-upload (its spool is sealed under a key
  that lived in its memory only).
"""


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "none\n"
    out = "| where | what | count | verdict |\n| --- | --- | --- | --- |\n"
    for r in sorted(rows, key=lambda r: (r["verdict"], r["where"], r["what"])):
        out += f"| `{r['where']}` | {r['what']} | {r['count']} | {r['verdict']} |\n"
    return out


def markdown(result: dict[str, Any]) -> str:
    findings = [
        r
        for key in ("transient", "before_delete", "after_delete")
        for r in result.get(key, [])
        if r["verdict"] == "finding"
    ]
    searched = result.get("searched", {})
    lines = [
        f"# Canary audit ({result['backend']})",
        "",
        f"{result['rows']} canary rows, {result['patterns']} byte patterns. "
        f"Findings: **{len(findings)}**. Searched {searched.get('places')} places, "
        f"{searched.get('bytes', 0) / 2**20:.1f} MiB (4-byte matches expected by chance "
        f"in random bytes: {searched.get('float32_chance_hits')}).",
        "",
        "Scenario: " + json.dumps(result.get("scenario", {}), default=str),
        "",
        f"## Hits in files seen while the scenario ran ({result.get('transient_files_seen')} "
        "files under DATA_DIR and TMPDIR, polled every 0.1 s)",
        "",
        _table(result.get("transient", [])),
        "## Hits before the data are deleted",
        "",
        _table(result.get("before_delete", [])),
        "## Hits after the data are deleted",
        "",
        _table(result.get("after_delete", [])),
        f"File keys still held by dataset rows after the deletion: {result.get('file_keys_left')}"
        " (the graph's, whose data were not deleted).",
        "",
        "Encrypted Parquet files left after the deletion, and whether a key the service "
        "still holds opens them: " + json.dumps(result.get("openable_after_delete")),
        "",
        "Deleted datasets' files in the backup (taken before the deletion) that the backup's "
        "database and the data key open: " + json.dumps(result.get("backup_openable_after_delete")),
        "",
        NOTES,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
