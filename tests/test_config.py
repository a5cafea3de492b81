"""Settings: defaults, the data key, refusing bad configurations."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from app.config import KEY_FILE_NAME, ConfigError, Settings, load_settings


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("DATA_DIR", "DATABASE_URL", "REDIS_URL", "DATA_KEY", "LOG_LEVEL"):
        monkeypatch.delenv(f"CURATOR_{name}", raising=False)
    settings = load_settings()
    assert settings.data_dir == Path("curator-data")
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'curator-data' / 'curator.db'}"
    assert settings.redis_url is None
    assert settings.log_level == "INFO"


def test_key_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d")
    key = settings.prepare()
    key_file = tmp_path / "d" / KEY_FILE_NAME
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    Fernet(key)
    assert Settings(data_dir=tmp_path / "d").prepare() == key
    # the directories it creates are the owner's only (database, queue, artifacts, key)
    for path in (settings.data_dir, settings.datasets_dir, settings.releases_dir, settings.tmp_dir):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


def test_explicit_key_wins(tmp_path: Path) -> None:
    key = Fernet.generate_key()
    assert Settings(data_dir=tmp_path, data_key=key.decode()).prepare() == key
    assert not (tmp_path / KEY_FILE_NAME).exists()


def test_bad_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CURATOR_DATA_KEY is not a Fernet key"):
        Settings(data_dir=tmp_path, data_key="not-a-key").prepare()


def test_world_readable_key_file_is_refused(tmp_path: Path) -> None:
    Settings(data_dir=tmp_path).prepare()
    (tmp_path / KEY_FILE_NAME).chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        Settings(data_dir=tmp_path).prepare()


def test_unwritable_data_dir_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot be created"):
        Settings(data_dir=blocker / "sub").prepare()


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("DATABASE_URL", "mysql://x", "CURATOR_DATABASE_URL"),
        ("REDIS_URL", "http://x", "CURATOR_REDIS_URL"),
        ("LOG_LEVEL", "LOUD", "CURATOR_LOG_LEVEL"),
        ("MAX_UPLOAD_BYTES", "-1", "CURATOR_MAX_UPLOAD_BYTES"),
        ("QUEUE_NAME", "a b", "CURATOR_QUEUE_NAME"),
    ],
)
def test_bad_values_are_refused_with_their_name(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(f"CURATOR_{name}", value)
    with pytest.raises(ConfigError, match=fragment):
        load_settings()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("METRICS_TOKEN", "short-secret-value"),
        ("DATABASE_URL", "mysql://curator:hunter2-secret@db/curator"),
    ],
)
def test_a_refused_value_is_not_quoted_in_the_error_or_its_cause(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """A refused setting may be a secret: the error names the setting, never its value,
    also in the pydantic error it is raised from (a traceback prints it: it quoted the
    input, ``input_value='short-secret-value'``)."""
    monkeypatch.setenv(f"CURATOR_{name}", value)
    with pytest.raises(ConfigError, match=f"CURATOR_{name}") as refused:
        load_settings()
    secret = value.split(":")[-1].split("@")[0] if "@" in value else value
    assert secret not in str(refused.value)
    assert secret not in str(refused.value.__cause__)


def test_every_setting_is_documented_in_the_readme_and_the_module() -> None:
    """Each field of :class:`Settings` is an environment variable a deployer sets: the
    README's Configuration table and this module's docstring both name it."""
    import app.config

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for field in Settings.model_fields:
        variable = f"CURATOR_{field.upper()}"
        assert f"| `{variable}` |" in readme, variable
        assert f"``{variable}``" in (app.config.__doc__ or ""), variable


def test_processes_starting_at_once_share_the_generated_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes started at once on a new data directory without CURATOR_DATA_KEY
    (two ``curator serve`` behind a load balancer, an API and a worker) both generate a
    key; the first to publish its file wins and the other takes that key. The file was
    created empty and then written: the second crashed with ``FileExistsError`` (its
    ``O_EXCL`` create lost) or, reading the file between its creation and its write,
    refused it as "not a Fernet key" (2 of 20 simultaneous starts here)."""
    from app import config

    data_dir = tmp_path / "d"
    theirs = Fernet.generate_key()
    generate = Fernet.generate_key

    def another_process_publishes_first() -> bytes:
        (data_dir / KEY_FILE_NAME).write_bytes(theirs + b"\n")
        (data_dir / KEY_FILE_NAME).chmod(0o600)
        return generate()

    monkeypatch.setattr(config.Fernet, "generate_key", another_process_publishes_first)
    assert Settings(data_dir=data_dir).prepare() == theirs
    monkeypatch.undo()
    assert Settings(data_dir=data_dir).prepare() == theirs
    # nothing of the losing key is left beside it
    assert sorted(p.name for p in data_dir.iterdir() if p.is_file()) == [KEY_FILE_NAME]


@pytest.mark.parametrize("error", [errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS])
def test_a_data_directory_without_hard_links_still_gets_its_generated_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    """The generated key is published with a hard link, which some filesystems refuse
    (vfat, some SMB/CIFS and FUSE mounts, Docker Desktop bind mounts of other days):
    a first start there failed with an uncaught OSError where it used to write the key.
    It falls back to the exclusive create of the name."""
    from app import config

    def no_links(*_args: object, **_kwargs: object) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(config.os, "link", no_links)
    data_dir = tmp_path / "d"
    key = Settings(data_dir=data_dir).prepare()
    Fernet(key)
    monkeypatch.undo()
    assert Settings(data_dir=data_dir).prepare() == key
    assert stat.S_IMODE((data_dir / KEY_FILE_NAME).stat().st_mode) == 0o600
    assert sorted(p.name for p in data_dir.iterdir() if p.is_file()) == [KEY_FILE_NAME]
