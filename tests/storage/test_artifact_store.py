"""The release artifact store's directories (``app.storage.artifacts.ArtifactStore``)."""

from __future__ import annotations

import uuid
from pathlib import Path

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
