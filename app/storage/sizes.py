"""Upper bounds on the bytes of the files a synthesis writes, from public sizes alone.

A release's artifacts are predicted before any budget is reserved
(:meth:`app.releases.registry.Mechanism.artifact_bytes`), and a request whose prediction
passes ``CURATOR_MAX_RELEASE_BYTES`` is refused. The bounds are deliberately loose (an
overestimate refuses a borderline request; an underestimate lets one past the cap), each
argued from how the file is encoded:

* CSV (pyarrow's writer, :func:`app.storage.artifacts.write_csv_and_parquet`): a float64
  is written as its shortest round-trip text, at most 25 characters: 17 significant
  digits, a sign, a point and a 5-character exponent (``-2.2250738585072014e-308``, 24),
  or, for exponents -6 and -5, which it writes as fixed point, a sign, ``0.`` and up to
  five zeros before them (``-0.0000012345678901234567``, 25); plus its separator:
  :data:`CSV_FLOAT_CELL`.
  A text cell is quoted, its quotes doubled, and a formula prefixed with ``'``
  (:func:`~app.storage.artifacts.spreadsheet_safe`): at most ``2 len + 3`` bytes and its
  separator. The header is the names, quoted the same way.
* Parquet (pyarrow's defaults: dictionary encoding falling back to plain past a 1 MiB
  dictionary page, Snappy): a float64 value costs 8 bytes plain, or 8 in the dictionary
  plus an index of at most 17 bits (a 1 MiB page holds at most 2^17 entries); Snappy
  expands incompressible input by at most ``n/6 + 32`` bytes. So at most
  ``(8 + 2.125) * 7/6 < 12`` bytes a value (:data:`PARQUET_FLOAT_CELL`; an int32's 4
  bytes the same way: :data:`PARQUET_INT32_CELL`), and per column
  chunk (a column of a row group) its page headers, statistics and footer entry, measured
  at about 360 bytes (2000 columns of 10 rows: 731 kB) and allowed
  :data:`PARQUET_CHUNK_OVERHEAD`. A text value: its bytes plus a 4-byte length, the same way.
* ``.npy``: 8 bytes a float64 and a header padded to a multiple of 64 bytes (128 for a
  two-dimensional shape; :data:`NPY_HEADER` allowed). ``.npz`` (``np.savez``, stored, not
  deflated): its members' ``.npy`` bytes and a zip entry each (local and central headers
  with the name and zip64 extras; :data:`ZIP_ENTRY` allowed).
* JSON descriptions (``release.json``): :data:`JSON_ALLOWANCE`, and what a caller adds for
  the parts that grow with the columns; a name as JSON text (:func:`json_text`) takes up
  to three times its UTF-8 bytes, as ``json.dumps`` escapes every non-ASCII character
  (``é``, 2 bytes: ``\\u00e9``, 6; an emoji, 4 bytes: a surrogate pair, 12).
* On disk (``du``) a file takes its bytes rounded up to whole blocks: :func:`files` adds a
  block a file.

``tests/storage/test_sizes.py`` checks each bound against what the writers produce, and
``tests/releases/test_release_size.py`` the predictions against the bytes real releases write.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

#: Bytes of one float64 cell of a CSV file, separator included (see the module doc).
CSV_FLOAT_CELL = 26
#: Bytes of one float64 value in a Parquet file, encoding and compression included.
PARQUET_FLOAT_CELL = 12
#: Bytes of one int32 (or smaller) value: ``(4 + 2.125) * 7/6``, rounded up.
PARQUET_INT32_CELL = 8
#: Bytes a Parquet column chunk may take beyond its values (headers, statistics, footer).
PARQUET_CHUNK_OVERHEAD = 1024
#: Bytes of a Parquet file beyond its column chunks (magic, schema, footer framing).
PARQUET_FILE_OVERHEAD = 4096
#: Rows pyarrow puts at most in one row group (``row_group_size``'s default, 1 Mi).
PARQUET_MAX_ROW_GROUP = 1 << 20
#: Bytes of an ``.npy`` header allowed (128 for the shapes written).
NPY_HEADER = 256
#: Bytes of one member's zip headers in an ``.npz`` (and the archive's end records).
ZIP_ENTRY = 512
#: Bytes allowed for a small JSON description (``release.json``).
JSON_ALLOWANCE = 64 << 10
#: A file's last block: what a file takes on disk past its bytes (4 KiB blocks).
BLOCK = 4096


def files(*bounds: int) -> int:
    """The bytes on disk of files of at most ``bounds`` bytes each: each bound and a
    :data:`BLOCK` for the file's partly filled last block (``du``'s count, not only the
    files' lengths)."""
    return sum(bound + BLOCK for bound in bounds)


def json_text(text: str) -> int:
    """Bytes of ``text`` as a JSON string (``json.dumps``, ASCII only): its quotes and at
    most 3 bytes a UTF-8 byte (a ``"`` or ``\\`` doubles; a 2-byte character becomes a
    6-byte ``\\uXXXX``, a 4-byte one two of them; control characters are refused in
    names and labels, ``app.core.types``)."""
    return 3 * len(text.encode()) + 2


def csv_text_cell(max_length: int) -> int:
    """Bytes of one text cell of at most ``max_length`` UTF-8 bytes, separator included."""
    return 2 * max_length + 4


def parquet_text_cell(max_length: int) -> int:
    """Bytes of one text value of at most ``max_length`` UTF-8 bytes in a Parquet file."""
    return math.ceil((max_length + 4 + 2.125) * 7 / 6) + 1


def csv_bytes(rows: int, cells: Sequence[int], names: Iterable[str]) -> int:
    """A CSV file of ``rows`` rows whose columns' cells take at most ``cells`` bytes
    each (:data:`CSV_FLOAT_CELL`, :func:`csv_text_cell`), with a header of ``names``."""
    header = sum(csv_text_cell(len(name.encode())) for name in names)
    return header + rows * sum(cells)


def row_groups(rows: int, chunk_rows: int) -> int:
    """Row groups of ``rows`` rows written ``chunk_rows`` at a time (each chunk a row group,
    split again past :data:`PARQUET_MAX_ROW_GROUP`); an empty file has one."""
    per_group = max(1, min(chunk_rows, PARQUET_MAX_ROW_GROUP))
    return max(1, math.ceil(rows / per_group))


def parquet_bytes(
    rows: int, cells: Sequence[int], names: Iterable[str], chunk_rows: int | None = None
) -> int:
    """A Parquet file of ``rows`` rows whose columns' values take at most ``cells`` bytes
    each (:data:`PARQUET_FLOAT_CELL`, :func:`parquet_text_cell`), written ``chunk_rows`` at
    a time (default: at once)."""
    groups = row_groups(rows, chunk_rows if chunk_rows is not None else max(rows, 1))
    schema = sum(2 * len(name.encode()) + 64 for name in names)
    return (
        PARQUET_FILE_OVERHEAD
        + schema * (groups + 1)
        + groups * len(cells) * PARQUET_CHUNK_OVERHEAD
        + rows * sum(cells)
    )


def npy_bytes(values: int, itemsize: int = 8) -> int:
    """An ``.npy`` file of ``values`` values of ``itemsize`` bytes."""
    return NPY_HEADER + values * itemsize


def npz_bytes(members: Iterable[int]) -> int:
    """An ``.npz`` archive (``np.savez``, stored) of float64/int64 members of the given
    numbers of values."""
    return ZIP_ENTRY + sum(ZIP_ENTRY + npy_bytes(values) for values in members)
