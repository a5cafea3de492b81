"""The measure stage's view of a stored dataset: a :class:`~app.mechanisms.data.RowSource`
that decrypts and streams the chosen columns of the encrypted Parquet table.

This is the only reader of raw rows in the service (DESIGN §2 rule 4); it is handed to a
mechanism's ``measure`` and nowhere else. Values are already normalised to ``[-1, 1]``
(continuous columns) or category codes, as validation stored them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy.typing import NDArray

from app.storage import tables

ProgressFn = Callable[[int], None]


@dataclass
class EncryptedTableSource:
    """Stream ``columns`` of an encrypted table as float64 ``(b, len(columns))`` batches."""

    path: Path
    key: bytes = field(repr=False)  # never in a repr that a log line could format
    columns: Sequence[str]
    n_rows: int
    #: Rows of a batch; 0 (the default): :func:`app.storage.tables.batch_rows` of the
    #: columns, so that a batch holds about 64 MiB of float64 however wide it is.
    batch_rows: int = 0
    #: Called with the number of rows read so far (all passes), after every batch.
    on_rows: ProgressFn | None = None
    #: Reads the file's key again when ``key`` does not open it: a key rotation replaced
    #: the file since the key was read (:func:`app.datasets.service.rotate_data_key`),
    #: before this pass opened it.
    reopen_key: Callable[[], bytes] | None = field(default=None, repr=False)
    rows_read: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.batch_rows <= 0:
            self.batch_rows = tables.batch_rows(len(self.columns))

    @property
    def n_cols(self) -> int:
        return len(self.columns)

    def _opened(self) -> pq.ParquetFile:
        """The file, opened with ``key``; if that does not open it, with the key read
        again (``reopen_key``), as long as the key read changes (rotations one after the
        other may each replace the file between a read of the key and the open)."""
        try:
            return tables.open_table(self.path, self.key)
        except PermissionError:
            if self.reopen_key is None:
                raise
            while True:
                tried, self.key = self.key, self.reopen_key()
                try:
                    return tables.open_table(self.path, self.key)
                except PermissionError:
                    if self.key == tried:  # no rotation since: the key does not open it
                        raise

    def _read(self) -> Iterator[pa.RecordBatch]:
        """One pass: batches of ``batch_rows`` rows, whatever the file's row groups."""
        parquet = self._opened()
        try:
            yield from parquet.iter_batches(batch_size=self.batch_rows, columns=list(self.columns))
        finally:
            parquet.close()

    def batches(self) -> Iterator[NDArray[np.float64]]:
        for batch in self._read():
            # progress first: a cancel it raises hands nothing to the mechanism, and the
            # release then counts as unread (refunded); then the count, so that anything
            # that fails once values are touched counts as read
            if self.on_rows is not None:
                self.on_rows(self.rows_read + batch.num_rows)
            self.rows_read += batch.num_rows
            yield (
                np.column_stack(
                    [
                        np.asarray(
                            batch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64
                        )
                        for name in self.columns
                    ]
                )
                if batch.num_rows
                else np.empty((0, self.n_cols))
            )

    def codes(self) -> Iterator[pa.RecordBatch]:
        """The raw Arrow batches (category codes, 0/1 and normalised values), for the
        mechanisms over finite domains."""
        for batch in self._read():
            if self.on_rows is not None:
                self.on_rows(self.rows_read + batch.num_rows)
            self.rows_read += batch.num_rows
            yield batch
