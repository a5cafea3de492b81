"""curator demo runs the whole flow on WDBC and reports."""

from __future__ import annotations

import io
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.core import migrations
from app.demo.runner import run, serving
from tests.conftest import Caller


@pytest.mark.slow
def test_demo_runs_the_whole_flow(tmp_path: Path) -> None:
    out = io.StringIO()
    summary = run(tmp_path / "demo", out)
    report = out.getvalue()
    assert summary["epsilon_spent"] == 2.0
    assert summary["finite"]
    assert set(summary["releases"]) == {"smooth_synopsis", "smooth_synthetic"}
    for line in (
        "privacy curator demo: WDBC, 569 rows, 30 continuous columns",
        "budget before: epsilon 5.0",
        "release smooth_synopsis (epsilon 1.0): succeeded",
        "release smooth_synthetic (epsilon 1.0): succeeded",
        "budget after: spent epsilon 2.0, remaining 3.0 (4 ledger entries)",
        "synthetic database: 1000 rows downloaded by the analyst",
        "synopsis intervals contain the truth",
        "synthetic +- noise stderr",
        "the synthetic stderr is the DP noise's alone",
    ):
        assert line in report, line
    assert "\r" not in report  # not a terminal: one line per stage
    # the demo's noise is unseeded: all 5 intervals cover in about 79 % of runs, none in
    # practically none; the synthetic answers sit well inside 0.1 of the truth
    assert 1 <= summary["covered"] <= 5
    assert summary["max_abs_error_synthetic"] < 0.1


def test_the_demo_server_keeps_the_port_it_picked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's server listens on a port the system picked, on the very socket that got
    it: a port found free and let go (the demo did so) can be taken by another process
    before uvicorn binds it. Here each listening socket this process lets go of has its
    port taken at once, as another process could; the demo's server failed to start."""
    close = socket.socket.close
    takers: list[socket.socket] = []

    def close_and_take(self: socket.socket) -> None:
        address = None
        if self.family == socket.AF_INET and self.fileno() != -1:
            try:
                self.getpeername()  # a connection's socket: its port is not offered
            except OSError:
                address = self.getsockname()
        close(self)
        if address is not None and address[1] != 0:
            taker = socket.socket()
            try:
                taker.bind(address)
                taker.listen()
            except OSError:
                close(taker)
            else:
                takers.append(taker)

    settings = Settings(data_dir=tmp_path, database_url=None, redis_url=None)
    settings.prepare()
    migrations.upgrade(settings.resolved_database_url)
    monkeypatch.setattr(socket.socket, "close", close_and_take)
    try:
        with serving(settings) as base, urllib.request.urlopen(f"{base}/healthz") as response:
            assert response.status == 200
    finally:
        for taker in takers:
            close(taker)


def _settings(tmp_path: Path) -> Settings:
    settings = Settings(data_dir=tmp_path, database_url=None, redis_url=None)
    settings.prepare()
    migrations.upgrade(settings.resolved_database_url)
    return settings


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "curator-server"]


def test_the_demo_server_stops_and_lets_its_port_go_when_done(tmp_path: Path) -> None:
    """Leaving serving() stops the server at once (it was told to exit, not waited for
    until the join's 60 s timeout) and the port is free again."""
    assert _server_threads() == []
    with serving(_settings(tmp_path)) as base:
        port = int(base.rsplit(":", 1)[1])
        assert len(_server_threads()) == 1
    assert _server_threads() == []
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_a_demo_server_that_does_not_start_is_reported_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server thread that ends without starting is a DemoError as soon as it ends, not
    after the 30 s start deadline, and the app's services (its database engine) are
    closed: no lifespan ran to close them."""
    import uvicorn

    from app.core.services import Services
    from app.demo.runner import DemoError

    settings = _settings(tmp_path)
    monkeypatch.setattr(uvicorn.Server, "run", lambda *_args, **_kwargs: None)
    closed: list[Services] = []
    close = Services.close
    monkeypatch.setattr(Services, "close", lambda self: (closed.append(self), close(self)))
    began = time.monotonic()
    with pytest.raises(DemoError, match="the server did not start"), serving(settings):
        pass
    assert time.monotonic() - began < 10
    assert _server_threads() == []
    assert len(closed) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_demo_generates_no_key_for_a_data_dir_holding_stored_datasets(
    client: TestClient,
    curator: Caller,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """curator demo --data-dir on a directory whose data.key is gone (and no
    CURATOR_DATA_KEY) generated a new key before anything else (Settings.prepare), past
    the services' refusal to do so while the database holds stored datasets."""
    import sqlite3

    from app.config import KEY_FILE_NAME, ConfigError
    from app.demo import runner
    from tests.releases.helpers import dataset

    dataset(client, curator)
    data_dir = tmp_path / "demo"
    data_dir.mkdir(mode=0o700)
    source = sqlite3.connect(settings.resolved_database_url.removeprefix("sqlite:///"))
    with sqlite3.connect(data_dir / "curator.db") as copy:
        source.backup(copy)  # the demo's database: DATA_DIR/curator.db
    source.close()
    copy.close()
    monkeypatch.delenv("CURATOR_DATA_KEY", raising=False)
    monkeypatch.setattr(runner, "_flow", lambda *_: {})
    with pytest.raises(ConfigError, match="no data key"):
        run(data_dir, io.StringIO())
    assert not (data_dir / KEY_FILE_NAME).exists()
