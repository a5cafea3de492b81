"""The service on machines unlike CI's: the C locale without UTF-8 mode, a DATA_DIR
whose name is not ASCII. Each case that needs its own interpreter settings runs in a
subprocess (the locale and UTF-8 mode are fixed when an interpreter starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.config import ConfigError, Settings

ROOT = Path(__file__).resolve().parent.parent


def c_locale_env(**extra: str) -> dict[str, str]:
    """The environment of an operator's machine whose locale is C and whose Python is not
    told to use UTF-8: the file system's encoding (paths), argv and stdout are ASCII."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONIOENCODING"))}
    env.update(LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0", **extra)
    return env


def run_python(
    code: str, env: dict[str, str], *args: str | bytes
) -> subprocess.CompletedProcess[str]:
    """``code`` (ASCII: the C locale decodes the command line as ASCII) in a new
    interpreter, with ``args`` (bytes are passed as they are)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="backslashreplace",
        timeout=120,
        check=False,
    )


UPLOAD = """
    import io, json, os, sys
    from pathlib import Path
    from fastapi.testclient import TestClient
    from app.config import Settings
    from app.core import migrations
    from app.main import create_app
    from app.models import Role
    from app.storage import artifacts
    from app.users import service as users
    import pyarrow as pa

    assert sys.getfilesystemencoding() == "ascii", sys.getfilesystemencoding()
    data_dir = Path(sys.argv[1])  # its non-ASCII bytes decoded to surrogates
    settings = Settings(data_dir=data_dir, redis_url=None, min_free_bytes=0)
    settings.prepare()
    migrations.upgrade(settings.resolved_database_url)
    app = create_app(settings, embedded_worker=False)
    with TestClient(app) as client:
        with app.state.services.db.transaction() as session:
            _, _, key = users.create_user(session, "curator", Role.curator, None)
        schema = {
            "name": "donn\\u00e9es",
            "columns": [
                {"name": "\\u00e2ge", "kind": "continuous", "lower": 0, "upper": 100},
                {"name": "groupe", "kind": "categorical", "categories": ["\\u00d8", "\\u65e5\\u672c"]},
            ],
            "budget": {"epsilon": 1.0, "delta": 1e-6},
        }
        body = "\\u00e2ge,groupe\\n30,\\u00d8\\n40,\\u65e5\\u672c\\n".encode()
        response = client.post(
            "/v1/datasets",
            headers={"Authorization": f"Bearer {key}"},
            files={"file": ("d.csv", body, "text/csv")},
            data={"schema": json.dumps(schema)},
        )
        print(response.status_code, response.json().get("n_rows"))
    out = data_dir / "releases" / "x"
    out.mkdir(parents=True)
    artifacts.write_csv_and_parquet(
        out / "a.csv", out / "a.parquet", [pa.table({"groupe": ["\\u00d8"]})]
    )
    print(sorted(p.name for p in out.iterdir()))
"""


def test_a_non_ascii_data_dir_in_the_c_locale_takes_uploads_and_writes_artifacts(
    tmp_path: Path,
) -> None:
    """pyarrow names files in UTF-8: a DATA_DIR such as ``données`` reached it as
    surrogates in the C locale, and every upload was a 500 (UnicodeEncodeError)."""
    data_dir = tmp_path / "dàta dir"
    result = run_python(UPLOAD, c_locale_env(), os.fsencode(data_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["201 2", "['a.csv', 'a.parquet']"], result.stderr[-3000:]
    assert (data_dir / "releases" / "x" / "a.parquet").is_file()


def test_a_data_dir_that_is_not_utf8_is_refused_with_a_message(tmp_path: Path) -> None:
    """A name of Latin-1 bytes has no UTF-8 text that pyarrow could open it by."""
    data_dir = Path(os.fsdecode(os.fsencode(tmp_path) + b"/d\xe0ta"))
    with pytest.raises(ConfigError, match="not a UTF-8 path"):
        Settings(data_dir=data_dir, redis_url=None).prepare()
    assert not data_dir.exists()


READ_BACK = """
    import sys
    from pathlib import Path
    import pyarrow as pa
    from app.storage import tables

    assert sys.getfilesystemencoding() == "ascii", sys.getfilesystemencoding()
    path = Path(sys.argv[1]) / "datasets" / "d.parquet"
    key = tables.new_file_key()
    writer = tables.EncryptedTableWriter(path, pa.schema([("x", pa.float64())]), key)
    writer.write(pa.table({"x": [1.0, 2.0]}))
    writer.close()
    print(tables.open_table(path, key).read().column("x").to_pylist())
    print(tables.opens_with(path, key))
"""


def test_a_dataset_file_under_a_non_ascii_data_dir_opens_in_the_c_locale(
    tmp_path: Path,
) -> None:
    """Every release reads its dataset with open_table: the upload's write alone was not
    enough (the read of a measure is pyarrow's too)."""
    data_dir = tmp_path / "dàta dir"
    result = run_python(READ_BACK, c_locale_env(), os.fsencode(data_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["[1.0, 2.0]", "True"], result.stderr[-3000:]


def curator_in_c_locale(tmp_path: Path, *args: str | bytes) -> subprocess.CompletedProcess[str]:
    env = c_locale_env(CURATOR_DATA_DIR=str(tmp_path / "data"))
    env = {k: v for k, v in env.items() if not k.startswith("CURATOR_") or k.endswith("DATA_DIR")}
    return run_python("from app.cli import main; main()", env, *args)


def test_create_user_with_a_non_ascii_name_in_the_c_locale_shows_its_key(
    tmp_path: Path,
) -> None:
    """The C locale decodes arguments and encodes standard output as ASCII: the name
    typed (UTF-8) was refused as "control characters", and had it passed, printing it
    raised after the user was committed, losing the API key shown once."""
    assert curator_in_c_locale(tmp_path, "migrate").returncode == 0
    typed = "Zoë Ωmega".encode()
    result = curator_in_c_locale(tmp_path, "create-user", "--name", typed, "--role", "admin")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("created admin Zo\\xeb \\u03a9mega ("), lines
    assert lines[1].startswith("API key (shown once): "), lines
    engine = create_engine(f"sqlite:///{tmp_path / 'data' / 'curator.db'}")
    with engine.connect() as connection:
        assert connection.execute(text("SELECT name FROM users")).scalars().all() == ["Zoë Ωmega"]
    engine.dispose()


def test_create_user_refuses_a_name_that_is_not_utf8(tmp_path: Path) -> None:
    assert curator_in_c_locale(tmp_path, "migrate").returncode == 0
    result = curator_in_c_locale(tmp_path, "create-user", "--name", b"Zo\xeb", "--role", "admin")
    assert result.returncode == 2
    assert "--name is not UTF-8 text" in result.stderr
