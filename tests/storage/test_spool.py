"""The encrypted upload spool: what is read back equals what was written; tampering fails."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag

from app.storage import spool as spool_module
from app.storage.spool import EncryptedSpool


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_module, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(spool_module, "_RECORD", 12 + 1000 + 16)


def _filled(tmp_path: Path, data: bytes, piece: int = 333) -> EncryptedSpool:
    spool = EncryptedSpool(tmp_path)
    for start in range(0, len(data), piece):
        spool.write(data[start : start + piece])
    return spool


def test_random_access_reads_match_the_plaintext(tmp_path: Path) -> None:
    data = os.urandom(4567)
    spool = _filled(tmp_path, data)
    assert spool.size == len(data)
    on_disk = spool.path.read_bytes()
    assert data[:64] not in on_disk
    with spool.open() as reader:
        assert reader.read() == data
        rng = np.random.default_rng(0)
        for _ in range(200):
            start = int(rng.integers(0, len(data)))
            length = int(rng.integers(0, 2500))
            reader.seek(start)
            assert reader.read(length) == data[start : start + length]
        reader.seek(-10, io.SEEK_END)
        assert reader.read() == data[-10:]
    spool.remove()
    assert not spool.path.exists()


def test_tampering_is_detected(tmp_path: Path) -> None:
    spool = _filled(tmp_path, os.urandom(2500))
    spool.finish()
    raw = bytearray(spool.path.read_bytes())
    raw[1500] ^= 1
    spool.path.write_bytes(bytes(raw))
    with spool.open() as reader, pytest.raises(InvalidTag):
        reader.read()
    spool.remove()


def test_chunks_cannot_be_reordered(tmp_path: Path) -> None:
    spool = _filled(tmp_path, os.urandom(2000))
    spool.finish()
    raw = spool.path.read_bytes()
    record = 12 + 1000 + 16
    spool.path.write_bytes(raw[record : 2 * record] + raw[:record])
    with spool.open() as reader, pytest.raises(InvalidTag):
        reader.read()
    spool.remove()


def test_empty_spool(tmp_path: Path) -> None:
    spool = EncryptedSpool(tmp_path)
    with spool.open() as reader:
        assert reader.read() == b""
    spool.remove()
