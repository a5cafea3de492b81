"""Release artifacts on disk: ``<DATA_DIR>/releases/<release id>/v<synthesis version>/``.

Artifacts are differentially private outputs (or, for ``compressed``, the declared
non-DP release) and are stored in clear. A version is written into a temporary directory
and renamed into place when complete, so a reader never sees half an artifact and a
crashed synthesis leaves only a ``.tmp-*`` directory, removed on the next attempt (or, once
its run is over, by the sweeper: :func:`app.releases.stages.remove_stale_work`).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def release_dir(self, release_id: uuid.UUID) -> Path:
        return self.root / str(release_id)

    def version_dir(self, release_id: uuid.UUID, version: int) -> Path:
        return self.release_dir(release_id) / f"v{version}"

    def begin(self, release_id: uuid.UUID, version: int) -> Path:
        """A fresh temporary directory for writing ``version`` (stale ones are removed)."""
        base = self.release_dir(release_id)
        base.mkdir(parents=True, exist_ok=True)
        for stale in base.glob(f".tmp-v{version}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        work = base / f".tmp-v{version}-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        return work

    def publish(self, release_id: uuid.UUID, version: int, work: Path) -> Path:
        """Move a completed temporary directory into place as ``version``."""
        final = self.version_dir(release_id, version)
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
        return final

    def discard(self, work: Path) -> None:
        shutil.rmtree(work, ignore_errors=True)

    def prune(self, release_id: uuid.UUID, *keep_versions: int) -> None:
        """Remove versions other than ``keep_versions`` (after a re-synthesis succeeded)."""
        base = self.release_dir(release_id)
        if not base.exists():
            return
        keep = {f"v{version}" for version in keep_versions}
        for child in base.iterdir():
            if child.name not in keep and not child.name.startswith(".tmp-"):
                shutil.rmtree(child, ignore_errors=True)

    def work_dirs(self) -> list[tuple[uuid.UUID, int, Path]]:
        """Every temporary directory on disk, as ``(release id, version, path)``."""
        found = []
        if not self.root.exists():
            return []
        for base in self.root.iterdir():
            for work in base.glob(".tmp-v*-*"):
                try:
                    release_id = uuid.UUID(base.name)
                    version = int(work.name.removeprefix(".tmp-v").split("-", 1)[0])
                except ValueError:
                    continue
                found.append((release_id, version, work))
        return found

    def path(self, release_id: uuid.UUID, version: int, name: str) -> Path:
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad artifact name {name!r}")
        return self.version_dir(release_id, version) / name
