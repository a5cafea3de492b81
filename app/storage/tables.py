"""Validated tables at rest: Parquet with modular encryption.

Every page and the footer are encrypted with AES-GCM data keys that Parquet generates
per file; the data keys are wrapped with a *file key* of the dataset's own (a Fernet key,
:func:`new_file_key`), and the file key is kept in the dataset's database row sealed
with the service's Fernet key (``CURATOR_DATA_KEY``, passed around as its bytes;
:func:`seal_file_keys`). So a stolen file is useless without both the row and the
service key, and deleting a dataset's data forgets its file key (crypto-shredding): a
copy of the file, or its blocks left on the disk, can no longer be opened by anyone,
the service included. Files stored before datasets had keys of their own have their
data keys wrapped with the service key directly (``file_keys`` is null), and open with
it (:func:`file_ring`) until a key rotation gives them keys of their own.

The service key passed around is a *key ring*: the current Fernet key, then any
previous ones (``CURATOR_PREVIOUS_DATA_KEYS``), joined by commas (Fernet keys are
url-safe base64, which has none). New file keys are sealed with the current key; a
sealed key opens with any key of the ring (:class:`cryptography.fernet.MultiFernet`).
:func:`rotate` re-encrypts a file under a fresh file key, so that the previous service
keys can be retired (``curator rotate-data-key``).

Reads stream row groups (:class:`app.storage.source.EncryptedTableSource`), so a worker
never needs the whole table in memory: the file is opened without pyarrow's
``pre_buffer`` (its default), which reads every row group's column chunks ahead into a
cache that lives as long as the reader, so that a pass held the whole compressed file
(about 420 MB at 10^7 rows of 10 columns).
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from app.storage.held import create_held

FOOTER_KEY_ID = "curator-footer"
#: The most rows of a batch or of a row group written (:func:`batch_rows`).
ROW_GROUP_ROWS = 65_536
#: The fewest rows of a batch, however wide the table (a smaller one costs more in
#: per-batch overhead than it saves in memory).
MIN_BATCH_ROWS = 1024
#: What a batch of rows may hold as float64, ``8 d`` bytes a row (:func:`batch_rows`).
BATCH_BYTES = 64 << 20


def batch_rows(d: int, capped: bool = True) -> int:
    """Rows of a batch of ``d`` columns: about :data:`BATCH_BYTES` of float64, at most
    :data:`ROW_GROUP_ROWS` (unless not ``capped``) and at least
    :data:`MIN_BATCH_ROWS` (``clamp(64 MiB // 8d, 1024, 65536)``): a fixed 65,536 rows was
    1 GiB of float64 at ``d = 2000``. Used for the row groups written, the batches read and
    the batches validated. Files already stored keep the row groups they were written
    with: readers ask for batches of rows, whatever the row groups."""
    rows = max(MIN_BATCH_ROWS, BATCH_BYTES // (8 * max(d, 1)))
    return min(ROW_GROUP_ROWS, rows) if capped else rows


#: What separates the keys of a key ring (module doc).
KEY_RING_SEPARATOR = b","
#: Suffix of the file :func:`rotate` writes before it replaces a table.
ROTATING_SUFFIX = ".rotating"


def key_ring(current: bytes, previous: Sequence[bytes] = ()) -> bytes:
    """The key ring of ``current`` (wraps new files) and ``previous`` (still open old ones;
    a repeat of ``current`` is dropped)."""
    return KEY_RING_SEPARATOR.join([current, *(k for k in previous if k != current)])


def current_key(ring: bytes) -> bytes:
    """The ring's first key: the one new files are wrapped with."""
    return ring.split(KEY_RING_SEPARATOR, 1)[0]


def _fernet(ring: bytes) -> MultiFernet:
    """The ring's keys, the first one encrypting, any one decrypting."""
    return MultiFernet([Fernet(k) for k in ring.split(KEY_RING_SEPARATOR)])


def new_file_key() -> bytes:
    """A fresh file key: the Fernet key that wraps one dataset file's data keys."""
    return Fernet.generate_key()


def _unsealable() -> PermissionError:
    return PermissionError(
        "no key of CURATOR_DATA_KEY and CURATOR_PREVIOUS_DATA_KEYS opens this dataset's "
        "file key (was the data key changed?)"
    )


def seal_file_keys(ring: bytes, file_keys: Sequence[bytes]) -> str:
    """``file_keys`` (the key a dataset's file is encrypted under, then, during a
    rotation, the one it was) as stored in the dataset's row: joined as a key ring and
    encrypted with the service ring's current key (Fernet)."""
    token = Fernet(current_key(ring)).encrypt(KEY_RING_SEPARATOR.join(file_keys))
    return token.decode("ascii")


def unseal_file_keys(ring: bytes, sealed: str) -> list[bytes]:
    """The file keys of :func:`seal_file_keys`, opened with any key of the service ring;
    :class:`PermissionError` if none opens them."""
    try:
        return _fernet(ring).decrypt(sealed.encode("ascii")).split(KEY_RING_SEPARATOR)
    except InvalidToken:
        raise _unsealable() from None


def sealed_with(key: bytes, sealed: str) -> bool:
    """Whether ``key`` alone (one Fernet key) opens ``sealed``."""
    try:
        Fernet(key).decrypt(sealed.encode("ascii"))
    except InvalidToken:
        return False
    return True


def file_ring(ring: bytes, sealed: str | None) -> bytes:
    """What a dataset's file opens with: its own keys (``sealed``, the dataset's
    ``file_keys``; none for a file stored before datasets had keys of their own), then
    the service ring, which wraps such older files' data keys directly."""
    own = [] if sealed is None else unseal_file_keys(ring, sealed)
    return KEY_RING_SEPARATOR.join([*own, ring])


class _FernetKms(pe.KmsClient):  # type: ignore[misc]
    def __init__(self, fernet: MultiFernet) -> None:
        super().__init__()
        self._fernet = fernet

    def wrap_key(self, key_bytes: bytes, master_key_identifier: str) -> str:
        return self._fernet.encrypt(key_bytes).decode("ascii")

    def unwrap_key(self, wrapped_key: str, master_key_identifier: str) -> bytes:
        try:
            return self._fernet.decrypt(wrapped_key.encode("ascii"))
        except InvalidToken:
            raise PermissionError(
                "no key of CURATOR_DATA_KEY and CURATOR_PREVIOUS_DATA_KEYS opens this file "
                "(was the data key changed?)"
            ) from None


def _crypto(key: bytes) -> tuple[pe.CryptoFactory, pe.KmsConnectionConfig]:
    # pyarrow caches KMS clients per connection config: a key-specific (one-way) instance id
    # keeps two keys in one process (tests, key rotation) from sharing a cached client.
    fingerprint = hashlib.sha256(b"curator-kms-instance:" + key).hexdigest()[:32]
    fernet = _fernet(key)
    factory = pe.CryptoFactory(lambda _config: _FernetKms(fernet))
    return factory, pe.KmsConnectionConfig(kms_instance_id=fingerprint)


def _encryption(key: bytes) -> pe.FileEncryptionProperties:
    factory, connection = _crypto(key)
    config = pe.EncryptionConfiguration(
        footer_key=FOOTER_KEY_ID,
        uniform_encryption=True,
        plaintext_footer=False,
        double_wrapping=True,
        internal_key_material=True,
        cache_lifetime=timedelta(minutes=1),
    )
    return factory.file_encryption_properties(connection, config)


def _decryption(key: bytes) -> pe.FileDecryptionProperties:
    factory, connection = _crypto(key)
    return factory.file_decryption_properties(
        connection, pe.DecryptionConfiguration(cache_lifetime=timedelta(minutes=1))
    )


def arrow_path(path: Path) -> str:
    """``path`` as pyarrow takes a file name: text that pyarrow encodes in UTF-8, strictly,
    to get the bytes it asks the system for. Python decodes a name's bytes with the file
    system's encoding, which is ASCII in the C locale (``LC_ALL=C`` without UTF-8 mode):
    the non-ASCII bytes of a DATA_DIR such as ``/srv/données`` are then surrogates, which
    pyarrow refused (an upload was a 500); in a Latin-1 locale the text would name another
    file. Decoding the name's own bytes as UTF-8 gives text that pyarrow turns back into
    them. Raises ``UnicodeDecodeError`` for bytes that are not UTF-8, which pyarrow cannot
    name at all: :meth:`app.config.Settings.prepare` refuses such a DATA_DIR."""
    return os.fsencode(path).decode("utf-8")


class EncryptedTableWriter:
    """Write record batches to an encrypted Parquet file (row groups of at most
    :func:`batch_rows` of the schema's columns)."""

    def __init__(self, path: Path, schema: pa.Schema, key: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rows = 0
        self.row_group_rows = batch_rows(len(schema))
        self._writer = pq.ParquetWriter(
            arrow_path(path), schema, encryption_properties=_encryption(key), compression="zstd"
        )

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Write the rows as row groups of ``row_group_rows`` (the last one may be short:
        a caller that writes many small batches buffers them to ``row_group_rows``)."""
        self._writer.write(batch, row_group_size=self.row_group_rows)
        self.rows += batch.num_rows

    def close(self) -> None:
        self._writer.close()


def open_table(path: Path, key: bytes) -> pq.ParquetFile:
    """The encrypted table, read one row group at a time (no ``pre_buffer``: module doc)."""
    return pq.ParquetFile(
        arrow_path(path), decryption_properties=_decryption(key), pre_buffer=False
    )


def opens_with(path: Path, key: bytes) -> bool:
    """Whether ``key`` (a key or a ring) opens the table at ``path``."""
    try:
        open_table(path, key).close()
    except PermissionError:
        return False
    return True


def rotate(
    path: Path,
    ring: bytes,
    file_key: bytes,
    before_replace: Callable[[], None] | None = None,
    replace: Callable[[Callable[[], None]], None] | None = None,
) -> None:
    """Re-encrypt the table at ``path`` under ``file_key``. The file is read with
    ``ring`` (:func:`file_ring`), row group by row group, written beside it (a random
    name ending in ``ROTATING_SUFFIX``), checked, and moved over it in one rename: a
    reader that opened the old file keeps reading it, one that opens the path afterwards
    gets the new file, never half of either. ``before_replace`` runs once the new file is
    written and checked, before the rename: the caller records the new key there, so
    that a reader that has read it opens either file; if it raises, the old file stays
    and the new one is removed. ``replace``, if given, is called with the function that
    renames the copy over the file, and does the rename: the caller holds there what makes
    it conditional (the dataset's row lock, its keys still those it recorded); if it
    raises without renaming, the old file stays too. Raises :class:`PermissionError` if
    no key of the ring opens the file, :class:`FileNotFoundError` if it is removed
    meanwhile (its dataset deleted: nothing is put back)."""
    # a name of its own: two rotations run at once each write a whole file, and neither
    # writes into the other's (the caller's ``before_replace`` and ``replace`` let one of
    # them through)
    staging = path.with_name(f"{path.name}.{secrets.token_hex(6)}{ROTATING_SUFFIX}")
    source = open_table(path, ring)
    # held until done: the sweeper takes no live rotation's copy for a leftover (held.py)
    try:
        held = create_held(staging)
    except BaseException:
        source.close()
        raise
    with held:
        _rotate(path, staging, source, file_key, before_replace, replace)


def _rotate(
    path: Path,
    staging: Path,
    source: pq.ParquetFile,
    file_key: bytes,
    before_replace: Callable[[], None] | None,
    replace: Callable[[Callable[[], None]], None] | None,
) -> None:
    try:
        writer = EncryptedTableWriter(staging, source.schema_arrow, file_key)
        try:
            for batch in source.iter_batches(batch_size=writer.row_group_rows):
                writer.write(batch)
        finally:
            writer.close()
        rows = source.metadata.num_rows
    finally:
        source.close()
    try:
        check = open_table(staging, file_key)
        try:
            if check.metadata.num_rows != rows:
                raise OSError(f"{staging.name} holds {check.metadata.num_rows} rows, not {rows}")
        finally:
            check.close()
        with staging.open("rb") as handle:
            os.fsync(handle.fileno())
        if not path.exists():
            raise FileNotFoundError(f"{path.name} was removed while it was re-encrypted")
        if before_replace is not None:
            before_replace()
        rename = functools.partial(os.replace, staging, path)
        if replace is None:
            rename()
        else:
            replace(rename)
    finally:
        staging.unlink(missing_ok=True)
