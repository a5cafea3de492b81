"""The curator command: migrate, create-user, and serve as a real process."""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from app import __version__
from app.cli import main


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CURATOR_")}
    env["CURATOR_DATA_DIR"] = str(tmp_path / "data")
    return env


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from app.cli import main; main()", *args],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_create_user_prints_json_after_migrate(tmp_path: Path) -> None:
    unmigrated = _run(tmp_path, "create-user", "--name", "root", "--role", "admin", "--json")
    assert unmigrated.returncode == 2
    assert "run: curator migrate" in unmigrated.stderr
    assert "alembic" not in unmigrated.stderr  # Alembic's context preamble is not logged
    migrated = _run(tmp_path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "Running upgrade  -> 0001" in migrated.stderr  # an upgrade's own lines are
    assert "Context impl" not in migrated.stderr
    created = _run(tmp_path, "create-user", "--name", "root", "--role", "admin", "--json")
    assert created.returncode == 0, created.stderr
    assert created.stderr == ""
    out = json.loads(created.stdout)
    assert set(out) >= {"id", "api_key"}
    assert out["api_key"].startswith("cur_")


def test_configuration_errors_exit_2_with_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CURATOR_DATA_KEY", "nope")
    with pytest.raises(SystemExit) as info:
        main(["migrate"])
    assert info.value.code == 2
    assert "configuration error: CURATOR_DATA_KEY is not a Fernet key" in capsys.readouterr().err


def test_files_in_an_existing_data_dir_are_closed_to_others_and_an_open_one_is_warned_of(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DATA_DIR that exists already keeps its mode (0755 here): the files a command
    writes in it are still closed to other users (its umask adds 007 to the operator's),
    and it warns, naming the directory. A group-shared directory (API and workers as two
    users of one group, umask 007) keeps its group access and is not warned of."""

    def migrate_in(data: Path) -> list[str]:
        monkeypatch.setenv("CURATOR_DATA_DIR", str(data))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="curator"):
            assert _exit(["migrate"], capsys)[0] == 0
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o755)
    os.umask(0o022)  # a common default: files 0644 without the command's own umask
    warnings = migrate_in(data)
    assert stat.S_IMODE((data / "curator.db").stat().st_mode) == 0o640
    assert any(str(data) in m and "0o755" in m for m in warnings), warnings
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o2770)
    os.umask(0o007)
    assert migrate_in(group) == []
    shared = stat.S_IMODE((group / "curator.db").stat().st_mode)
    assert shared & 0o040  # the group reads it (SQLite creates its files 0644 before the umask)
    assert not shared & 0o007
    os.umask(0o077)
    private = tmp_path / "private"  # created by the command: 0700, nothing to warn of
    assert migrate_in(private) == []
    assert stat.S_IMODE((private / "curator.db").stat().st_mode) == 0o600


def serve_on_a_free_port(port_file: Path) -> list[str]:
    """The command line of ``curator serve`` on a port the system picks, which it writes
    to ``port_file`` once it listens (no free port chosen here, which another process
    could take before the server binds it)."""
    command = [sys.executable, "-c", "from app.cli import main; main()", "serve", "--port", "0"]
    return [*command, "--port-file", str(port_file)]


def wait_for_port(process: subprocess.Popen[Any], port_file: Path, timeout: float = 60) -> int:
    """The port the server started with :func:`serve_on_a_free_port` listens on, once it does."""
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        assert process.poll() is None, "the server exited"
        assert time.monotonic() < deadline, f"the server did not listen in {timeout} s"
        time.sleep(0.1)
    return int(port_file.read_text())


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_serve_migrates_answers_and_stops_cleanly(tmp_path: Path, stop: signal.Signals) -> None:
    """On a port the system picks (--port 0), reported in --port-file and the log; SIGTERM
    (docker stop) and SIGINT (Ctrl+C) shut it down cleanly."""
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        serve_on_a_free_port(port_file),
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = wait_for_port(process, port_file)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as response:
            assert json.load(response) == {
                "status": "ready",
                "database": "ok",
                "queue": "ok",
                "storage": "ok",
            }
        process.send_signal(stop)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    # uvicorn finishes its shutdown, then re-raises SIGTERM so that supervisors see it
    assert process.returncode == (-signal.SIGTERM if stop == signal.SIGTERM else 0), output
    assert "Traceback" not in output
    assert f"privacy curator {__version__} on http://127.0.0.1:{port} (data in" in output
    assert "Application shutdown complete" in output
    assert "embedded worker started" in output
    assert "embedded worker stopped" in output
    # one BLAS thread per product (CURATOR_BLAS_THREADS), in numpy's and scipy's OpenBLAS
    # (two libraries here, numpy's and scipy's own; one where they share a BLAS)
    assert re.search(r"BLAS: at most 1 thread\(s\) per matrix product in each of [12] libr", output)
    assert not (tmp_path / "port.partial").exists()


def test_serve_logs_only_json_lines_with_curator_log_format_json(tmp_path: Path) -> None:
    """CURATOR_LOG_FORMAT=json: uvicorn's own lines (startup, access, shutdown) are JSON
    objects too, and the access line of a request carries its id."""
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        serve_on_a_free_port(port_file),
        env={**_env(tmp_path), "CURATOR_LOG_FORMAT": "json"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = wait_for_port(process, port_file)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/readyz", headers={"X-Request-ID": "probe-1"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["X-Request-ID"] == "probe-1"
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    lines = [json.loads(line) for line in output.splitlines()]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    assert [line["request_id"] for line in access] == ["probe-1"], access
    assert '"GET /readyz HTTP/1.1" 200' in access[0]["message"]
    messages = [line["message"] for line in lines]
    assert any(m.startswith(f"privacy curator {__version__} on") for m in messages)
    assert "Application shutdown complete." in messages
    assert all(set(line) >= {"time", "level", "logger", "message"} for line in lines)


def test_serve_no_migrate_refuses_an_old_database(tmp_path: Path) -> None:
    result = _run(tmp_path, "serve", "--no-migrate", "--port", "0")
    assert result.returncode == 2
    assert "run: curator migrate" in result.stderr


def _sentinel_password() -> str:
    return "s3cr3t-pw-7f1c"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (
            f"postgresql+psycopg://postgres:{_sentinel_password()}@127.0.0.1:1/x",
            "Connection refused",
        ),
        ("sqlite:////nonexistent-curator-dir/curator.db", "unable to open database file"),
    ],
)
@pytest.mark.parametrize(
    "command", [["migrate"], ["create-user", "--name", "a", "--role", "admin"]]
)
def test_an_unusable_database_exits_1_with_one_line(
    url: str,
    reason: str,
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CURATOR_DATABASE_URL", url)
    code, err = _exit(command, capsys)
    assert code == 1
    assert err.startswith("curator: the database cannot be used (")
    assert reason in err
    assert "Traceback" not in err
    assert _sentinel_password() not in err


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:",
        "postgresql+psycopg://u@127.0.0.1:notaport/x",
        "postgresql+psycopg2://u@127.0.0.1/x",
        "mysql://u@127.0.0.1/x",
    ],
)
def test_a_malformed_database_url_is_a_configuration_error(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CURATOR_DATABASE_URL", url)
    code, err = _exit(["migrate"], capsys)
    assert code == 2
    assert "configuration error" in err
    assert "CURATOR_DATABASE_URL" in err
    assert "postgresql+psycopg://<user>@<host>/<db>" in err


def test_an_unescaped_at_in_the_password_is_refused_without_echoing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL parser ends the password at its first @, so the rest reads as the host; the
    driver's error would print that tail of the password."""
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(
        "CURATOR_DATABASE_URL", f"postgresql+psycopg://curator:se@{_sentinel_password()}@db/x"
    )
    code, err = _exit(["migrate"], capsys)
    assert code == 2
    assert "has an unescaped @ in its user or password: write it as %40" in err
    assert _sentinel_password() not in err


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[object, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, capsys.readouterr().err


@pytest.fixture
def never_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command gets as far as starting a consumer or the server."""

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a consumer or the server was started")

    monkeypatch.setattr("app.worker.queue.Queue.consumer", started)
    monkeypatch.setattr("uvicorn.Server.run", started)


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize("command", [["worker"], ["serve", "--port", "1"]])
def test_an_unreachable_queue_refuses_to_start(
    command: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    assert _exit(["migrate"], capsys)[0] == 0
    monkeypatch.setenv("CURATOR_REDIS_URL", f"redis://:{_sentinel_password()}@127.0.0.1:1/0")
    code, err = _exit(command, capsys)
    assert code == 1
    assert "curator: the queue cannot be used (redis://:***@127.0.0.1:1/0): " in err
    assert "Connection refused" in err
    assert _sentinel_password() not in err


@pytest.mark.usefixtures("never_started")
def test_serve_on_a_taken_port_refuses_before_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port another process listens on: a one-line refusal (exit 1) before the app or
    its embedded worker starts (uvicorn started the worker, then failed to bind)."""
    import socket

    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _exit(["serve", "--port", str(port)], capsys)
    assert code == 1
    assert err.startswith(f"curator: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in err


@pytest.mark.usefixtures("never_started")
def test_serve_refuses_a_port_file_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --port-file that cannot be written: a one-line refusal (exit 1) before the app
    starts, not a server a script waits for in vain."""
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    port_file = tmp_path / "missing" / "port"
    code, err = _exit(["serve", "--port", "0", "--port-file", str(port_file)], capsys)
    assert code == 1
    assert err == f"curator: cannot write --port-file {port_file}: No such file or directory\n"


def test_serve_listens_before_it_reports_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The port in --port-file is listened on when the file appears, before uvicorn
    serves: a client that connects as soon as it reads the port is queued, not refused
    (a socket bound but not listening refused it); and uvicorn is handed that very socket."""
    import socket

    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    port_file = tmp_path / "port"
    connected: list[int] = []

    def run(_server: object, sockets: list[socket.socket] | None = None) -> None:
        port = int(port_file.read_text())
        assert sockets is not None
        assert [s.getsockname()[1] for s in sockets] == [port]
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            connected.append(port)

    monkeypatch.setattr("uvicorn.Server.run", run)
    code, err = _exit(["serve", "--port", "0", "--port-file", str(port_file)], capsys)
    assert (code, err) == (0, "")
    assert len(connected) == 1


def test_the_servers_socket_binds_a_port_left_in_time_wait(tmp_path: Path) -> None:
    """A server restarted on its port while connections it closed are in TIME_WAIT binds
    it (SO_REUSEADDR, as uvicorn sets it): without, 'address already in use' for a minute."""
    import socket

    from app.cli import _listen

    with _listen("127.0.0.1", 0) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server closes first: its side goes to TIME_WAIT
            assert client.recv(1) == b""
    with _listen("127.0.0.1", port) as again:
        assert again.getsockname()[1] == port


def test_the_port_file_never_holds_part_of_the_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script polling for --port-file sees no file or the whole number: the port is
    written elsewhere and renamed into place, never written where it is read."""
    from app.cli import _write_port

    port_file = tmp_path / "port"
    seen: list[str | None] = []
    write_text = Path.write_text

    def slow_write(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        write_text(self, data[:1], *args, **kwargs)  # as a write cut short would leave it
        seen.append(port_file.read_text() if port_file.exists() else None)
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", slow_write)
    _write_port(port_file, 54321)
    assert seen == [None]
    assert port_file.read_text() == "54321\n"
    assert not (tmp_path / "port.partial").exists()


def test_the_logged_url_brackets_an_ipv6_host() -> None:
    from app.cli import _url

    assert _url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert _url("0.0.0.0", 80) == "http://0.0.0.0:80"
    assert _url("::1", 8000) == "http://[::1]:8000"
    assert _url("::", 8080) == "http://[::]:8080"


@pytest.mark.usefixtures("never_started")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--port", "99999"], "argument --port: 99999 is not in 0-65535"),
        (["serve", "--port", "-1"], "argument --port: -1 is not in 0-65535"),
        (["worker", "--threads", "0"], "argument --threads: 0 is not in 1-64"),
        (["worker", "--threads", "-1"], "argument --threads: -1 is not in 1-64"),
        (["worker", "--threads", "x"], "argument --threads: 'x' is not an integer"),
    ],
)
def test_out_of_range_flags_are_usage_errors(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    code, err = _exit(argv, capsys)
    assert code == 2
    assert message in err


def test_migrate_refuses_unknown_and_older_revisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    code, err = _exit(["migrate", "--revision", "nonexistent"], capsys)
    assert code == 2
    assert err.startswith("curator: --revision 'nonexistent': ")
    assert "Traceback" not in err
    assert _exit(["migrate"], capsys)[0] == 0
    code, err = _exit(["migrate", "--revision", "0001"], capsys)  # was a silent no-op, exit 0
    assert code == 2
    assert "past 0001; curator migrate only upgrades" in err
    monkeypatch.setenv("CURATOR_ALEMBIC_INI", str(tmp_path / "missing.ini"))
    code, err = _exit(["migrate"], capsys)
    assert code == 2
    assert "configuration error: alembic.ini not found at" in err


def test_migrate_takes_relative_revisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``+N`` counts from the database's revision and ``ID+N`` from ID (Alembic's relative
    identifiers; they were refused as unknown revisions); past head, or backwards, is
    refused with the reason and changes nothing."""
    from alembic.script import ScriptDirectory
    from sqlalchemy import text

    from app.config import load_settings
    from app.core import migrations
    from app.core.db import make_engine

    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    url = load_settings().resolved_database_url
    script = ScriptDirectory.from_config(migrations.alembic_config(url))
    order = [r.revision for r in reversed(list(script.walk_revisions()))]
    assert _exit(["migrate", "--revision", "+1"], capsys) == (0, "")
    assert migrations.current_revision(url) == order[0]
    assert _exit(["migrate", "--revision", "+2"], capsys)[0] == 0
    assert migrations.current_revision(url) == order[2]
    assert _exit(["migrate", "--revision", f"{order[2]}+1"], capsys)[0] == 0
    assert migrations.current_revision(url) == order[3]
    code, err = _exit(["migrate", "--revision", f"+{len(order)}"], capsys)
    assert code == 2
    assert f"past the head revision {order[-1]}" in err
    for backwards in ("-1", "+0"):
        code, err = _exit(["migrate", "--revision", backwards], capsys)
        assert code == 2, backwards
        assert err.startswith(f"curator: --revision {backwards!r}: "), err
    assert migrations.current_revision(url) == order[3]
    assert _exit(["migrate"], capsys)[0] == 0
    assert migrations.current_revision(url) == order[-1]
    engine = make_engine(url)  # a database stamped by newer code: +N has no reference point
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = 'newer'"))
    finally:
        engine.dispose()
    code, err = _exit(["migrate", "--revision", "+1"], capsys)
    assert code == 2
    assert "the database is at revision newer, unknown to this code" in err


def test_create_key_and_create_user_refuse_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CURATOR_DATA_DIR", str(tmp_path))
    nobody = "00000000-0000-0000-0000-000000000000"
    code, err = _exit(["create-key", "--user-id", nobody], capsys)  # unmigrated: a traceback
    assert code == 2
    assert "run: curator migrate" in err
    assert _exit(["migrate"], capsys)[0] == 0
    code, err = _exit(["create-key", "--user-id", nobody], capsys)  # was NotFound's traceback
    assert code == 1
    assert err == f"curator: no user with id {nobody}\n"
    for name in ("", "  ", "bad\x00name"):
        code, err = _exit(["create-user", "--name", name, "--role", "admin"], capsys)
        assert code == 2
        assert "--name must be 1 to 200 characters" in err


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://curator:p@ss/w0rd@db:5432/c",
            "postgresql+psycopg://curator:***@db:5432/c",
        ),
        ("postgresql+psycopg://curator:a:b@db/c", "postgresql+psycopg://curator:***@db/c"),
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("postgresql+psycopg://curator@db/c", "postgresql+psycopg://curator@db/c"),
        ("sqlite:////data/a@b.db", "sqlite:////data/a@b.db"),
        # redis-py and libpq also take the password from the query string
        ("redis://127.0.0.1:6379/0?password=pw", "redis://127.0.0.1:6379/0?password=***"),
        (
            "redis://u@h:6379/0?db=1&password=p@w&socket_timeout=3",
            "redis://u@h:6379/0?db=1&password=***&socket_timeout=3",
        ),
        ("postgresql+psycopg://c@db/c?password=pw", "postgresql+psycopg://c@db/c?password=***"),
    ],
)
def test_messages_hide_the_whole_password(url: str, shown: str) -> None:
    from app.cli import _without_password

    assert _without_password(url) == shown


def test_serve_help_states_the_defaults_the_readme_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The README runs the service "at http://127.0.0.1:8000"; --help says so too."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "address to listen on (default: 127.0.0.1)" in usage
    assert (
        "port to listen on, 0-65535; 0 takes a free one the system picks (default: 8000)" in usage
    )
    assert "--port-file PORT_FILE once the server listens, write its port to this file" in usage


def test_log_lines_carry_utc_times_whatever_the_hosts_zone(tmp_path: Path) -> None:
    """Log times were the host's local time without an offset (``2026-11-29 18:44:04,512``
    in Asia/Kolkata for an API timestamp of 13:14:04Z)."""
    code = (
        "import logging; from app.cli import configure_logging; configure_logging('INFO'); "
        "logging.getLogger('curator').info('hello')"
    )
    env = {**os.environ, "TZ": "Asia/Kolkata"}
    before = time.time()
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    match = re.fullmatch(
        r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.\d{3}Z INFO curator: hello\n", done.stderr
    )
    assert match is not None, done.stderr
    logged = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    assert before - 2 <= logged <= time.time() + 1
