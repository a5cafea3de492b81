"""An encrypted spool file for an upload in transit.

The request body is written here as it arrives, so a raw upload never touches the disk
in clear (DESIGN §2 rule 5), and is read back as a seekable file object (pyarrow's CSV
reader streams it; the Parquet reader seeks to the footer). Each fixed-size plaintext
chunk is sealed with AES-256-GCM under a key that exists only in this process's memory,
with the chunk index as associated data (chunks cannot be reordered or truncated
unnoticed). If the process dies, what is left on disk cannot be decrypted by anyone.
The spool is held (:mod:`app.storage.held`) from its creation until :meth:`remove`, so the
sweeper never takes a live upload's spool for a leftover.
"""

from __future__ import annotations

import io
import os
import secrets
from pathlib import Path
from types import TracebackType

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from app.storage.held import hold

CHUNK_BYTES = 1 << 20
_NONCE = 12
_TAG = 16
_RECORD = _NONCE + CHUNK_BYTES + _TAG


def _aad(index: int) -> bytes:
    return index.to_bytes(8, "big")


class EncryptedSpool:
    """Write plaintext in, read it back as a seekable binary file; delete with :meth:`remove`."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"upload-{secrets.token_hex(16)}.spool"
        self._aead = AESGCM(AESGCM.generate_key(bit_length=256))
        # open until remove(): it holds the spool's lock
        self._file = open(self.path, "xb")  # noqa: SIM115 - closed in remove()
        try:
            hold(self._file, self.path)
        except BaseException:
            self.remove()
            raise
        self._pending = bytearray()
        self._chunks = 0
        self.size = 0
        self._closed_for_writing = False

    def write(self, data: bytes) -> None:
        if self._closed_for_writing:
            raise ValueError("spool already finished")
        self._pending += data
        self.size += len(data)
        while len(self._pending) >= CHUNK_BYTES:
            self._seal(bytes(self._pending[:CHUNK_BYTES]))
            del self._pending[:CHUNK_BYTES]

    def _seal(self, chunk: bytes) -> None:
        nonce = os.urandom(_NONCE)
        self._file.write(nonce + self._aead.encrypt(nonce, chunk, _aad(self._chunks)))
        self._chunks += 1

    def finish(self) -> None:
        if not self._closed_for_writing:
            if self._pending:
                self._seal(bytes(self._pending))
                self._pending.clear()
            self._file.flush()  # for the reader's own handle; this one holds the lock
            self._closed_for_writing = True

    def open(self) -> SpoolReader:
        self.finish()
        return SpoolReader(self.path, self._aead, self.size)

    def remove(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> EncryptedSpool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


class SpoolReader(io.RawIOBase):
    """Seekable read-only view of an :class:`EncryptedSpool`."""

    def __init__(self, path: Path, aead: AESGCM, size: int) -> None:
        super().__init__()
        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._aead = aead
        self._size = size
        self._pos = 0
        self._cache_index = -1
        self._cache = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _chunk(self, index: int) -> bytes:
        if index != self._cache_index:
            self._file.seek(index * _RECORD)
            record = self._file.read(_RECORD)
            nonce, sealed = record[:_NONCE], record[_NONCE:]
            self._cache = self._aead.decrypt(nonce, sealed, _aad(index))
            self._cache_index = index
        return self._cache

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        written = 0
        while written < len(view) and self._pos < self._size:
            index, offset = divmod(self._pos, CHUNK_BYTES)
            chunk = self._chunk(index)
            take = min(len(view) - written, len(chunk) - offset)
            view[written : written + take] = chunk[offset : offset + take]
            written += take
            self._pos += take
        return written

    def close(self) -> None:
        self._file.close()
        super().close()
