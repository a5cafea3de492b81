"""``curator demo``: the whole flow on WDBC, in one process, through the real HTTP API.

A throwaway data directory (SQLite, SQLite queue), the API with its embedded worker in a
background thread, and then, as a curator and an analyst would: users, upload, grant,
two releases (``smooth_synopsis`` and ``smooth_synthetic``) with progress, downloads, and
answers with intervals compared with the truth. The truth is computed from the demo's own
copy of the file, which the service never returns.
"""

from __future__ import annotations

import csv
import json
import math
import secrets
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from app.config import Settings
from app.core import migrations
from app.core.services import Services
from app.models import Role
from app.users import service as users

DATA = resources.files("app.demo")


class DemoError(RuntimeError):
    pass


class Client:
    def __init__(self, base: str, key: str | None = None) -> None:
        self.base = base
        self.key = key

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        all_headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        if body is not None:
            all_headers["Content-Type"] = "application/json"
        all_headers.update(headers or {})
        request = urllib.request.Request(  # noqa: S310 - the demo's own http://127.0.0.1 server
            self.base + path, data=data, method=method, headers=all_headers
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310
                content = response.read()
                kind = response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            raise DemoError(f"{method} {path} -> {exc.code}: {exc.read().decode()[:300]}") from None
        return json.loads(content) if kind.startswith("application/json") else content

    def upload(self, path: str, fields: dict[str, bytes]) -> Any:
        boundary = secrets.token_hex(16)
        parts = []
        for name, content in fields.items():
            parts.append(
                f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; '
                f'filename="{name}"\r\n\r\n'.encode()
                + content
                + b"\r\n"
            )
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return self.request(
            "POST",
            path,
            raw=body,
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )


def _wait(client: Client, release_id: str, label: str, out: TextIO) -> dict[str, Any]:
    """Poll a release until it ends, showing its stage and progress (redrawn in place on a
    terminal, one line per stage otherwise)."""
    started = time.monotonic()
    interactive = out.isatty()
    shown = ""
    while True:
        release: dict[str, Any] = client.request("GET", f"/v1/releases/{release_id}")
        status = release["status"]
        if status in ("succeeded", "failed", "cancelled"):
            line = f"  {label}: {status} in {time.monotonic() - started:.1f} s"
            out.write(f"\r{line}{' ' * 20}\n" if interactive else f"{line}\n")
            out.flush()
            if status != "succeeded":
                raise DemoError(f"{label} {status}: {release.get('message')}")
            return release
        if interactive:
            out.write(f"\r  {label}: {status} {100 * release['progress']:3.0f}%   ")
            out.flush()
        elif status != shown:
            out.write(f"  {label}: {status}\n")
            shown = status
        time.sleep(0.2)


def _truth(rows: np.ndarray, center: np.ndarray, sigma: float) -> float:
    return float(np.mean(np.exp(-np.sum((rows - center) ** 2, axis=1) / (2 * sigma**2))))


def run(data_dir: Path | None = None, out: TextIO = sys.stdout) -> dict[str, Any]:
    """Run the demo; return a summary (the CLI prints the report as it goes)."""
    temporary = None
    if data_dir is None:
        temporary = tempfile.TemporaryDirectory(prefix="curator-demo-")
        data_dir = Path(temporary.name)
    settings = Settings(data_dir=data_dir, database_url=None, redis_url=None, lease_seconds=10)
    # no key here: the server's services get it, and refuse to generate one for a database
    # holding stored datasets (a --data-dir reused without its data.key)
    settings.prepare_directories()
    migrations.upgrade(settings.resolved_database_url)
    try:
        return _run(settings, out)
    finally:
        if temporary is not None:
            temporary.cleanup()


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The API with its embedded worker on a free local port, in a thread; yields its URL.
    The port is bound here and the socket handed to uvicorn (a port found free and let go
    could be taken by another process before uvicorn bound it)."""
    import uvicorn

    from app.main import create_app

    app = create_app(settings, embedded_worker=True)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="curator-server", daemon=True
    )
    try:
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise DemoError("the server did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        if not server.started:  # no lifespan ran, and none will close the app's services
            app.state.services.close()


def _run(settings: Settings, out: TextIO) -> dict[str, Any]:
    with serving(settings) as base:
        return _flow(settings, base, out)


def _flow(settings: Settings, base: str, out: TextIO) -> dict[str, Any]:
    say: Callable[[str], None] = lambda line: print(line, file=out, flush=True)  # noqa: E731
    services = Services.build(settings)
    try:
        with services.db.transaction() as session:
            _, _, admin_key = users.create_user(session, "demo-admin", Role.admin, None)
    finally:
        services.close()
    admin = Client(base, admin_key)
    curator = Client(
        base, admin.request("POST", "/v1/users", {"name": "carol", "role": "curator"})["api_key"]
    )
    analyst_user = admin.request("POST", "/v1/users", {"name": "alan", "role": "analyst"})
    analyst = Client(base, analyst_user["api_key"])

    csv_bytes = (DATA / "wdbc.csv").read_bytes()
    schema = json.loads((DATA / "wdbc.schema.json").read_text())
    dataset = curator.upload(
        "/v1/datasets", {"file": csv_bytes, "schema": json.dumps(schema).encode()}
    )
    continuous = [c for c in schema["columns"] if c["kind"] == "continuous"]
    say(
        f"privacy curator demo: WDBC, {dataset['n_rows']} rows, {len(continuous)} continuous "
        f"columns (data in {settings.data_dir})"
    )
    curator.request("POST", f"/v1/datasets/{dataset['id']}/grants", {"user_id": analyst_user["id"]})
    before = curator.request("GET", f"/v1/datasets/{dataset['id']}/budget")
    say(f"budget before: epsilon {before['epsilon_total']}, delta {before['delta_total']}")

    requests = {
        "smooth_synopsis": {
            "mechanism": "smooth_synopsis",
            "epsilon": 1.0,
            "params": {"smoothness": 16},
        },
        "smooth_synthetic": {
            "mechanism": "smooth_synthetic",
            "epsilon": 1.0,
            "params": {"sample_size": 1000},
        },
    }
    releases: dict[str, dict[str, Any]] = {}
    for name, body in requests.items():
        created = curator.request("POST", f"/v1/datasets/{dataset['id']}/releases", body)
        releases[name] = _wait(
            curator, created["id"], f"release {name} (epsilon {body['epsilon']})", out
        )
    after = curator.request("GET", f"/v1/datasets/{dataset['id']}/budget")
    say(
        f"budget after: spent epsilon {after['epsilon_spent']}, remaining "
        f"{after['epsilon_remaining']} ({len(after['entries'])} ledger entries)"
    )
    sample = analyst.request(
        "GET", f"/v1/releases/{releases['smooth_synthetic']['id']}/synthetic?format=csv"
    )
    sampled_rows = len(sample.splitlines()) - 1
    say(f"synthetic database: {sampled_rows} rows downloaded by the analyst")

    # queries: Gaussian kernels of width 4 on the normalised scale, centred at 5 points
    names = [c["name"] for c in continuous]
    lower = np.array([c["lower"] for c in continuous], dtype=float)
    upper = np.array([c["upper"] for c in continuous], dtype=float)
    reader = csv.DictReader(csv_bytes.decode().splitlines())
    raw = np.array([[float(r[n]) for n in names] for r in reader])
    rows = np.clip(2 * (raw - lower) / (upper - lower) - 1, -1, 1)
    rng = np.random.default_rng(0)
    sigma = 4.0
    centers = rng.uniform(-1, 1, size=(5, len(names)))
    queries = [
        {"type": "gaussian_mixture", "centers": [c.tolist()], "weights": [1.0], "sigma": sigma}
        for c in centers
    ]
    synopsis = analyst.request(
        "POST", f"/v1/releases/{releases['smooth_synopsis']['id']}/answers", {"queries": queries}
    )["answers"]
    synthetic = analyst.request(
        "POST", f"/v1/releases/{releases['smooth_synthetic']['id']}/answers", {"queries": queries}
    )["answers"]
    say(f"answers: Gaussian kernels, sigma = {sigma} on the normalised scale, random centres")
    say(
        f"  {'query':>5}  {'truth':>7}  {'synopsis [95 % interval]':>30}  "
        f"{'synthetic +- noise stderr':>25}"
    )
    covered = 0
    for i, center in enumerate(centers):
        truth = _truth(rows, center, sigma)
        low, high = synopsis[i]["interval"]
        covered += int(low <= truth <= high)
        say(
            f"  {i + 1:>5}  {truth:7.4f}  {synopsis[i]['value']:7.4f} [{low:7.4f}, {high:7.4f}]"
            f"{'':>5}  {synthetic[i]['value']:16.4f} +- {synthetic[i]['stderr']:.4f}"
        )
    say(f"  {covered} of {len(centers)} synopsis intervals contain the truth (computed locally)")
    say("  (the synthetic stderr is the DP noise's alone, not the error of its model)")
    return {
        "dataset": dataset["id"],
        "releases": {k: v["id"] for k, v in releases.items()},
        "epsilon_spent": after["epsilon_spent"],
        "covered": covered,
        "max_abs_error_synthetic": max(
            abs(synthetic[i]["value"] - _truth(rows, c, sigma)) for i, c in enumerate(centers)
        ),
        "finite": all(math.isfinite(a["value"]) for a in synopsis + synthetic),
    }
