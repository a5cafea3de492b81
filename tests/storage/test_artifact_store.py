"""The release artifact store's directories (``app.storage.artifacts.ArtifactStore``)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from app.storage import artifacts
from app.storage.artifacts import ArtifactStore


def test_discarding_a_first_run_leaves_no_release_directory(tmp_path: Path) -> None:
    """A release cancelled during its first synthesis: its run's work is discarded, and
    with it the release's directory, which that left empty (a soak run found one in
    thirty release directories empty). A run beginning afterwards makes it again."""
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    work = store.begin(release_id, 0)
    (work / "part.csv").write_text("x\n")
    store.discard(work)
    assert not store.release_dir(release_id).exists()
    again = store.begin(release_id, 0)
    assert again.is_dir()
    store.publish(release_id, 0, again)
    assert store.version_dir(release_id, 0).is_dir()


def test_discarding_a_later_run_keeps_the_published_version(tmp_path: Path) -> None:
    """A re-synthesis's work (or its unpublished version) is discarded; the version the
    release serves, and another run's work, stay (only an empty directory is removed)."""
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    first = store.begin(release_id, 0)
    (first / "sample.csv").write_text("x\n1\n")
    store.publish(release_id, 0, first)
    second = store.begin(release_id, 1)
    third = store.begin(release_id, 2)
    store.discard(second)
    assert not second.exists()
    assert third.is_dir()
    assert (store.version_dir(release_id, 0) / "sample.csv").read_text() == "x\n1\n"
    store.discard(third)
    store.discard(store.version_dir(release_id, 1))  # never published: nothing there
    assert sorted(p.name for p in store.release_dir(release_id).iterdir()) == ["v0"]


def test_a_version_is_gone_before_its_files_are_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune renames a version out of the way before deleting it. ``rmtree`` unlinks the
    files first and the directory last, so a reader could load some files of a version
    being removed, find its directory still there, and take the missing ones as never
    written (a moments release's bootstrap replicates: answers without a standard error).
    What a removal cut short (``.trash-*``) goes with the next prune."""
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    for version in (0, 1, 2):
        work = store.begin(release_id, version)
        (work / "replicates.npz").write_bytes(b"x")
        store.publish(release_id, version, work)
    base = store.release_dir(release_id)
    (base / ".trash-left-by-a-crash").mkdir()
    seen: list[tuple[str, bool, bool]] = []
    rmtree = artifacts.shutil.rmtree

    def watched(path: Path, *args: Any, **kwargs: Any) -> None:
        a_version = (Path(path) / "replicates.npz").exists()
        seen.append((Path(path).name, a_version, store.version_dir(release_id, 0).exists()))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(artifacts.shutil, "rmtree", watched)
    store.prune(release_id, 2, 1)
    assert all(name.startswith(".trash-") for name, _, _ in seen), seen
    versions = [v0_there for _, a_version, v0_there in seen if a_version]
    assert versions == [False], seen  # v0's files deleted once v0 itself was gone
    assert sorted(p.name for p in base.iterdir()) == ["v1", "v2"]


def test_listing_a_release_directory_removed_meanwhile_finds_nothing(tmp_path: Path) -> None:
    """A discard removes a release's directory once it is empty, maybe while another
    process lists it (``begin``'s stale runs, the sweeper's work directories): the listing
    is empty, not a FileNotFoundError that fails the stage or the sweep."""
    store = ArtifactStore(tmp_path)
    assert artifacts._listed(tmp_path / "gone", "*") == []
    assert store.leftovers() == ([], [])
    work = store.begin(uuid.uuid4(), 0)
    assert [path for _, _, path in store.leftovers()[0]] == [work]


def test_a_version_that_cannot_be_renamed_is_removed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails for another reason than a missing path (permissions, a mount
    point) does not stop a removal: the directory is deleted in place, as before renames,
    so a stage's error handling that discards its work never raises from it."""
    store = ArtifactStore(tmp_path)
    work = store.begin(uuid.uuid4(), 0)
    (work / "part.csv").write_text("x\n")

    def refused(self: Path, target: Path) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refused)
    store.discard(work)
    assert not work.exists()


def test_a_removal_whose_work_directory_is_emptied_meanwhile_still_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A removal renames into the release's work directory (``.work/<id>``), which another
    process removes whenever it finds it empty (a discard, a publish, the sweeper's pass of
    the trash). Removed between this removal's ``mkdir`` and its rename, the rename fails
    with FileNotFoundError, which was read as the version being gone already: a pruned
    version (or an unpublished one a cancelled run had moved into place) stayed on disk,
    and nothing listed it again."""
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    for version in (0, 1):
        work = store.begin(release_id, version)
        (work / "sample.csv").write_text("x\n1\n")
        store.publish(release_id, version, work)
    rename = Path.rename
    emptied: list[Path] = []

    def racing(self: Path, target: Path) -> Any:
        into = Path(target).parent
        if into.parent.name == artifacts.WORK_DIR and not emptied:
            emptied.append(into)
            into.rmdir()  # another process found it empty just now
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", racing)
    store.prune(release_id, 1)
    assert emptied  # the race happened
    assert not store.version_dir(release_id, 0).exists()
    assert store.version_dir(release_id, 1).is_dir()


def test_the_csv_quotes_formula_text_and_leaves_numbers_and_the_parquet_alone(
    tmp_path: Path,
) -> None:
    """write_csv_and_parquet's CSV prefixes a single quote to every text cell a
    spreadsheet reads as a formula (=, +, -, @, tab, CR first; OWASP's CSV-injection
    escape), in plain and dictionary-encoded text columns, but not to text that is a plain
    number nor to any number; the Parquet file keeps the values."""
    import csv
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    cells = ["=1+2", "+A1", "-A1", "@SUM(A1)", "\tx", "\r=x", "-1", "+2.5", "-3e-4", ".5", "ok", ""]
    quoted = ["'=1+2", "'+A1", "'-A1", "'@SUM(A1)", "'\tx", "'\r=x", *cells[6:]]
    table = pa.table(
        {
            "text": cells,
            "large": pa.array(cells, pa.large_string()),
            "coded": pa.array(cells).dictionary_encode(),
            "number": [-1.5 * i for i in range(len(cells))],
            "count": pa.array([-i for i in range(len(cells))], pa.int64()),
        }
    )
    csv_path, parquet_path = tmp_path / "sample.csv", tmp_path / "sample.parquet"
    artifacts.write_csv_and_parquet(csv_path, parquet_path, [table.slice(0, 5), table.slice(5)])
    rows = list(csv.reader(io.StringIO(csv_path.read_bytes().decode(), newline="")))
    assert rows[0] == ["text", "large", "coded", "number", "count"]
    body = rows[1:]
    for j in range(3):
        assert [row[j] for row in body] == quoted
    assert [float(row[3]) for row in body] == table.column("number").to_pylist()
    assert [int(row[4]) for row in body] == table.column("count").to_pylist()
    assert pq.read_table(parquet_path).equals(table)


def test_versions_lists_only_version_directories(tmp_path: Path) -> None:
    """A release's versions on disk, in order: its ``v<N>`` directories, not what a
    release stored beside them before the work directory (``.tmp-v<N>-*``, ``.trash-*``),
    a file, or a name whose digits ``int`` does not read (``v²``: ``str.isdigit`` took it,
    and the ValueError failed the sweeper's first pass, made again every pass)."""
    store = ArtifactStore(tmp_path)
    release_id = uuid.uuid4()
    base = store.release_dir(release_id)
    for name in ("v10", "v2", "v²", ".tmp-v3-0a1b2c3d", ".trash-0a1b", "vx", "v"):
        (base / name).mkdir(parents=True)
    (base / "v4").write_text("not a directory")
    assert store.versions(release_id) == [2, 10]
    assert store.versions(uuid.uuid4()) == []  # no directory
