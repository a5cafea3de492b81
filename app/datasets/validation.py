"""Validate an uploaded table against its declared schema and store it normalised.

One streaming pass over the file (CSV via pyarrow's incremental reader, Parquet by row
group): every cell of every declared column is checked; continuous columns are
normalised with the *declared* bounds, ``x' = 2 (x - lower) / (upper - lower) - 1``
(clipped to ``[-1, 1]`` or rejected, per the dataset's policy); categorical columns
become category indices (int32); binary columns 0/1 (int8). The normalised batches go to
an encrypted Parquet file. Problems are counted per column and kind, for the whole file,
and reported together, with counts and never with values: pyarrow's own error messages
quote rows, so they are translated, never forwarded.
"""

from __future__ import annotations

import io
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from app.core.errors import InvalidUpload, is_storage_full
from app.datasets.schemas import (
    MAX_CELL_BYTES,
    BinaryColumn,
    CategoricalColumn,
    Column,
    ContinuousColumn,
    PublicColumn,
)
from app.storage import tables
from app.storage.tables import EncryptedTableWriter

CSV_BLOCK_BYTES = 4 << 20
#: The CSV reader's block grows with the declared columns (:func:`csv_block_bytes`): a
#: block of 4 MiB was 285 rows at d = 2000, and each was written as a row group of its own.
CSV_BLOCK_BYTES_PER_COLUMN = 32 << 10


def csv_block_bytes(d: int) -> int:
    """The CSV reader's block for ``d`` declared columns: ``max(4 MiB, d * 32 KiB)``."""
    return max(CSV_BLOCK_BYTES, d * CSV_BLOCK_BYTES_PER_COLUMN)


# MAX_CELL_BYTES (defined with the schema, app.datasets.schemas): the longest cell, in
# bytes. A declared category is at most 200 characters (800 bytes of UTF-8), a number or
# a flag far less, so no valid cell comes near it. What it bounds is a Parquet
# decompression bomb: one long string stored once in a column's dictionary decodes to its
# length times the rows (a 787-byte file of 200 rows of a 10 MB string took 4 GiB of
# memory, a batch of 65,536 such rows would take 640 GB). Cells are measured on the
# dictionary before it is expanded (``read_dictionary``), so a batch of valid cells
# decodes to at most 64 MiB a column. A public column may declare a shorter limit
# (``max_bytes``, enforced by PublicCheck).
#: The most bytes of text (or bytes) columns a Parquet row group may hold, encoded, over
#: the declared columns, as its footer says. Distinct long strings compress to a few
#: bytes a page (zstd: 1 MB of one letter to 47 bytes), and a batch decodes every
#: distinct value it holds before any cell can be measured: a 100 KB file of 2000 such
#: cells among 10^6 rows took 5 GiB, the worst within this limit 1.5 GiB. A row group of
#: 10^6 rows stays within it with 19 text columns of 10-byte cells stored plain (14 bytes
#: a cell with its length; categories are dictionary-encoded, a few bits a row); a larger
#: one is refused with the advice to write smaller row groups. The footer is the writer's
#: word: one forged to understate its sizes is not caught here.
MAX_ROW_GROUP_TEXT_BYTES = 256 << 20
_NUMBER = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
_NAN = r"^\s*[+-]?nan\s*$"
_INFINITY = r"^\s*[+-]?(inf|infinity)\s*$"
_BINARY_TRUE = ("1", "true", "1.0")
_BINARY_FALSE = ("0", "false", "0.0")

FileFormat = Literal["csv", "parquet"]


@dataclass
class Problems:
    """Problems found so far: (column or None, kind) -> number of offending rows, or None
    for a problem that is not about rows (a missing column, a file that cannot be read)."""

    counts: dict[tuple[str | None, str], int | None] = field(default_factory=dict)

    def add_rows(self, column: str | None, problem: str, rows: int) -> None:
        """Count ``rows`` offending rows of ``column`` (or, with ``None``, of the file;
        nothing recorded for 0)."""
        if rows:
            self.counts[(column, problem)] = (self.counts.get((column, problem)) or 0) + rows

    def add(self, column: str | None, problem: str) -> None:
        """Record a problem of a column (or, with ``None``, of the file) that has no row count."""
        self.counts[(column, problem)] = None

    def __bool__(self) -> bool:
        return bool(self.counts)

    def raise_if_any(self) -> None:
        if not self.counts:
            return
        problems = [
            {"column": column, "problem": problem, "rows": rows}
            for (column, problem), rows in self.counts.items()
        ]
        parts = [
            (f"column {p['column']!r}: " if p["column"] is not None else "")
            + str(p["problem"])
            + (f" ({p['rows']} rows)" if p["rows"] is not None else "")
            for p in problems
        ]
        raise InvalidUpload(
            "the file does not match the schema: " + "; ".join(parts), problems=problems
        )


NOT_UTF8 = (
    "the file is not valid UTF-8 text (Latin-1 or Windows-1252?): save it as UTF-8 (in "
    "Excel: 'CSV UTF-8'), or upload Parquet"
)


def file_problem(message: str) -> InvalidUpload:
    """An error about the file as a whole (no column)."""
    return InvalidUpload(
        f"the file does not match the schema: {message}",
        problems=[{"column": None, "problem": message, "rows": None}],
    )


def _byte_size(size: int) -> str:
    """``4 MiB``, ``64 KiB`` or ``100 bytes``: the largest unit that divides ``size``."""
    for shift, unit in ((20, "MiB"), (10, "KiB")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


def _describe_arrow_error(
    exc: Exception, fmt: FileFormat, reader: io.RawIOBase, block_bytes: int
) -> str:
    """A message for a pyarrow read error that never quotes the file's contents."""
    text = str(exc)
    if "Empty CSV file" in text:
        reader.seek(0)
        # a UTF-8 byte-order mark alone is what Excel's "CSV UTF-8" writes of an empty sheet
        head = (reader.read(SNIFF_BYTES) or b"").removeprefix(b"\xef\xbb\xbf").strip()
        if head and b"\n" not in head and b"\r" not in head:
            # pyarrow's word for a first block without a line end: a header and no rows,
            # or a first line longer than the block, which rows may follow
            if reader.seek(0, io.SEEK_END) > block_bytes:
                return (
                    f"the first line is longer than {_byte_size(block_bytes)}, the most "
                    "the CSV reader takes at once: a header of very long names, or a file "
                    "without line ends?"
                )
            return "the file has no data rows (it is a single line)"
        return "the file is empty"
    if "UTF8" in text or "UTF-8" in text:
        return NOT_UTF8
    if fmt == "parquet":
        return "the file could not be read as Parquet (is it truncated or corrupt?)"
    return "the file could not be read as CSV"


# Column checks --------------------------------------------------------------------------


def _as_text(array: pa.Array) -> pa.Array | None:
    """The column as trimmed strings (nulls as ""), or None if its type has no text form."""
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        text = array
    elif pa.types.is_string_view(array.type):
        text = pc.cast(array, pa.string())  # the string functions take no string_view
    elif (
        pa.types.is_integer(array.type)
        or pa.types.is_floating(array.type)
        or pa.types.is_decimal(array.type)  # its digits, as a CSV cell: "1.0" at scale 1
        or pa.types.is_boolean(array.type)
    ):
        text = pc.cast(array, pa.string())
    elif pa.types.is_dictionary(array.type):
        return _as_text(array.cast(array.type.value_type))
    else:
        return None
    return pc.utf8_trim_whitespace(pc.fill_null(text, ""))


def _cell_lengths(array: pa.Array) -> pa.Array | None:
    """The byte length of each cell of a text or bytes column (nulls for nulls), taken from
    a dictionary's values without expanding it; None for other types (fixed widths)."""
    if pa.types.is_dictionary(array.type):
        lengths = _cell_lengths(array.dictionary)
        return None if lengths is None else pc.take(lengths, array.indices)
    if (
        pa.types.is_string(array.type)
        or pa.types.is_large_string(array.type)
        or pa.types.is_binary(array.type)
        or pa.types.is_large_binary(array.type)
    ):
        return pc.binary_length(array)
    if pa.types.is_string_view(array.type) or pa.types.is_binary_view(array.type):
        return pc.binary_length(pc.cast(array, pa.large_binary()))
    return None


def _used_values_only(array: pa.DictionaryArray) -> pa.DictionaryArray:
    """The array with a dictionary of the values its rows use. Parquet's reader hands every
    batch of a row group the dictionary read so far, and Arrow sizes a decoded batch by the
    dictionary's mean value length times the rows: a batch of short cells after one of a
    bomb's long ones asked for 65 GB."""
    used = pc.unique(pc.drop_null(array.indices))
    return pa.DictionaryArray.from_arrays(
        pc.index_in(array.indices, value_set=used), pc.take(array.dictionary, used)
    )


def _mask(array: pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


class ColumnCheck(Protocol):
    @property
    def name(self) -> str: ...

    def process(self, array: pa.Array, problems: Problems) -> pa.Array: ...

    @property
    def arrow_type(self) -> pa.DataType: ...


@dataclass
class ContinuousCheck:
    spec: ContinuousColumn
    policy: Literal["clip", "reject"]
    clipped: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.float64()

    def process(self, array: pa.Array, problems: Problems) -> pa.Array:
        n = len(array)
        if (
            pa.types.is_integer(array.type)
            or pa.types.is_floating(array.type)
            or pa.types.is_decimal(array.type)
        ):
            empty = _mask(pc.is_null(array))
            # safe=False: an integer beyond 2^53 or a decimal rounds to the nearest double
            # (pyarrow's safe cast refused it, and the refusal read as an unreadable file)
            values = np.asarray(
                pc.fill_null(pc.cast(array, pa.float64(), safe=False), 0.0).to_numpy(
                    zero_copy_only=False
                ),
                dtype=np.float64,
            )
            nan = np.isnan(values) & ~empty
            non_numeric = np.zeros(n, dtype=bool)
        else:
            text = _as_text(array)
            if text is None or pa.types.is_boolean(array.type):
                problems.add_rows(self.name, f"has type {array.type}; expected numbers", n)
                return pa.nulls(n, pa.float64())
            empty = _mask(pc.equal(text, ""))
            lowered = pc.utf8_lower(text)
            nan = _mask(pc.match_substring_regex(lowered, _NAN))
            infinite_text = _mask(pc.match_substring_regex(lowered, _INFINITY))
            numeric = pc.match_substring_regex(text, _NUMBER)
            values = np.array(  # a writable copy: Arrow-backed views are read-only
                pc.cast(pc.if_else(numeric, text, "0"), pa.float64()).to_numpy(
                    zero_copy_only=False
                ),
                dtype=np.float64,
            )
            values[infinite_text] = np.inf
            non_numeric = ~(_mask(numeric) | empty | nan | infinite_text)
        infinite = np.isinf(values) & ~empty
        problems.add_rows(self.name, "empty cells", int(empty.sum()))
        problems.add_rows(self.name, "NaN cells", int(nan.sum()))
        problems.add_rows(self.name, "infinite values", int(infinite.sum()))
        problems.add_rows(self.name, "non-numeric values", int(non_numeric.sum()))
        good = ~(empty | nan | infinite | non_numeric)
        lower, upper = self.spec.lower, self.spec.upper
        outside = good & ((values < lower) | (values > upper))
        if self.policy == "reject":
            problems.add_rows(
                self.name,
                f"values outside the declared bounds [{lower}, {upper}]",
                int(outside.sum()),
            )
        else:
            self.clipped += int(outside.sum())
        values = np.where(good, values, lower)
        normalised = np.clip(2.0 * (values - lower) / (upper - lower) - 1.0, -1.0, 1.0)
        return pa.array(normalised, type=pa.float64())


@dataclass
class CategoricalCheck:
    spec: CategoricalColumn

    def __post_init__(self) -> None:
        self._value_set = pa.array(self.spec.labels, type=pa.string())

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.int32()

    def process(self, array: pa.Array, problems: Problems) -> pa.Array:
        text = _as_text(array)
        if text is None:
            problems.add_rows(
                self.name, f"has type {array.type}; expected category labels", len(array)
            )
            return pa.nulls(len(array), pa.int32())
        # the declared categories are in Unicode normal form C (schemas); so are cells
        text = pc.utf8_normalize(text, form="NFC")
        empty = _mask(pc.equal(text, ""))
        codes = pc.index_in(text, value_set=self._value_set)
        unknown = _mask(pc.is_null(codes)) & ~empty
        problems.add_rows(self.name, "empty cells", int(empty.sum()))
        problems.add_rows(self.name, "values that are not declared categories", int(unknown.sum()))
        return pc.cast(pc.fill_null(codes, 0), pa.int32())


@dataclass
class BinaryCheck:
    spec: BinaryColumn

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.int8()

    def process(self, array: pa.Array, problems: Problems) -> pa.Array:
        text = _as_text(array)
        if text is None:
            problems.add_rows(self.name, f"has type {array.type}; expected 0/1", len(array))
            return pa.nulls(len(array), pa.int8())
        lowered = pc.utf8_lower(text)
        ones = _mask(pc.is_in(lowered, value_set=pa.array(_BINARY_TRUE)))
        zeros = _mask(pc.is_in(lowered, value_set=pa.array(_BINARY_FALSE)))
        empty = _mask(pc.equal(text, ""))
        problems.add_rows(self.name, "empty cells", int(empty.sum()))
        problems.add_rows(
            self.name, "values other than 0/1/true/false", int((~(ones | zeros | empty)).sum())
        )
        return pa.array(ones.astype(np.int8), type=pa.int8())


@dataclass
class PublicCheck:
    """A public column's cells: text (a number as its text), none empty, none longer than
    the declared ``max_bytes`` (UTF-8 bytes of the trimmed cell, as stored and released).
    A longer cell is reported by count and by the data row of the first (header not
    counted), never by its value."""

    spec: PublicColumn
    #: Data rows before the batch being processed (set by :func:`_process`).
    rows_before: int = 0
    #: The data row (1-based) of the first cell longer than ``max_bytes``, once found.
    first_long: int | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.string()

    def process(self, array: pa.Array, problems: Problems) -> pa.Array:
        text = _as_text(array)
        if text is None:
            problems.add_rows(
                self.name, f"has type {array.type}; expected text or numbers", len(array)
            )
            return pa.nulls(len(array), pa.string())
        problems.add_rows(self.name, "empty cells", int(_mask(pc.equal(text, "")).sum()))
        limit = self.spec.max_bytes
        if limit < MAX_CELL_BYTES:
            long = _mask(pc.greater(pc.binary_length(text), limit))
            if long.any():
                if self.first_long is None:
                    self.first_long = self.rows_before + int(np.argmax(long)) + 1
                problems.add_rows(
                    self.name,
                    f"cells longer than its declared max_bytes ({limit} bytes), the first "
                    f"at data row {self.first_long} (the header not counted)",
                    int(long.sum()),
                )
        return pc.cast(text, pa.string())


def make_check(spec: Column, policy: Literal["clip", "reject"]) -> ColumnCheck:
    if isinstance(spec, ContinuousColumn):
        return ContinuousCheck(spec, policy)
    if isinstance(spec, CategoricalColumn):
        return CategoricalCheck(spec)
    if isinstance(spec, PublicColumn):
        return PublicCheck(spec)
    return BinaryCheck(spec)


# Reading ---------------------------------------------------------------------------------


PARQUET_SUFFIXES = (".parquet", ".pq")


SNIFF_BYTES = 4096

# Signatures of files that are not text, each with what to upload instead (a CSV parser
# would call a ZIP "empty" and UTF-16 "ragged").
_NOT_TEXT = (
    (b"\xff\xfe", "UTF-16 or UTF-32 text (it starts with such a byte-order mark)"),
    (b"\xfe\xff", "UTF-16 text (it starts with such a byte-order mark)"),
    (b"PK\x03\x04", "a ZIP archive (an Excel .xlsx workbook is one)"),
    (b"\x1f\x8b", "gzip-compressed"),
    (b"\xd0\xcf\x11\xe0", "an Excel .xls workbook (or another OLE2 document)"),
)


def refuse_non_text(reader: io.RawIOBase, expected: str) -> None:
    """Refuse, with a message that says what the file is, a text upload whose first bytes
    show it is not UTF-8 text: a known binary signature, a UTF-16/32 byte-order mark, or a
    NUL byte (no UTF-8 text has one; UTF-16 text without a byte-order mark has many).
    Names the kind of file only, never its contents; ``expected`` ends the message."""
    head = reader.read(SNIFF_BYTES) or b""
    reader.seek(0)
    for signature, kind in _NOT_TEXT:
        if head.startswith(signature):
            raise file_problem(f"the file is {kind}, not UTF-8 text: upload {expected}")
    if b"\x00" in head:
        raise file_problem(
            "the file is not UTF-8 text: it contains NUL bytes (UTF-16 text, or a binary "
            f"file?): upload {expected}"
        )


def detect_format(reader: io.RawIOBase, size: int, filename: str | None = None) -> FileFormat:
    """Parquet when the file starts with Parquet's magic bytes ``PAR1``, CSV otherwise; a
    file the client named ``*.parquet`` that does not start with them is refused as such
    (read as CSV, its bytes would get a CSV parser's complaint), and so is a file whose
    first bytes show it is not text (:func:`refuse_non_text`)."""
    if size == 0:
        raise file_problem("the file is empty")
    head = reader.read(4) or b""
    reader.seek(0)
    if head == b"PAR1":  # even if too short to be one: a Parquet file cut short
        return "parquet"
    if filename is not None and filename.lower().endswith(PARQUET_SUFFIXES):
        raise file_problem(
            "the file is named as Parquet but is not a Parquet file "
            "(it does not start with Parquet's magic bytes PAR1)"
        )
    refuse_non_text(reader, "CSV as UTF-8 text, or Parquet")
    return "csv"


_OTHER_SEPARATORS = (
    (b";", "semicolons", ", with '.' as the decimal mark"),
    (b"\t", "tabs", ""),
)


def _refuse_other_separators(reader: io.RawIOBase, declared: list[str]) -> None:
    """Refuse, saying so, a CSV separated by semicolons (Excel's export where the decimal
    mark is a comma) or tabs: its first line has no comma, so its header is one column,
    which cannot name the two or more declared ones (with one declared column, a header
    without a comma is normal, and nothing is checked)."""
    head = reader.read(SNIFF_BYTES) or b""
    reader.seek(0)
    line, end, _ = head.replace(b"\r", b"\n").partition(b"\n")
    if len(declared) < 2 or b"," in line or not (end or len(head) < SNIFF_BYTES):
        return
    for separator, name, advice in _OTHER_SEPARATORS:
        if separator in line:
            raise file_problem(
                f"the file is separated by {name}, not commas (its first line has no "
                f"comma): upload comma-separated CSV{advice}"
            )


@dataclass
class RaggedRows:
    """pyarrow's handler of rows whose number of fields is not the header's: notes the
    numbers of the first ``LISTED`` (records of the file, the header being 1: blank lines
    are not counted, a cell's quoted line end starts none) and skips them, so that the
    rest of the file is still checked; at the next, it stops the read (each row costs a
    Python call, ~15 us: a file of short ragged rows took 13 s a million). pyarrow's own
    error would quote the row."""

    LISTED = 5

    count: int = 0
    first: list[int] = field(default_factory=list)
    stopped: bool = False

    def __call__(self, row: Any) -> str:
        if self.count == self.LISTED:
            self.stopped = True
            return "error"
        self.count += 1
        if row.number is not None:
            self.first.append(row.number)
        return "skip"

    def report(self, problems: Problems) -> None:
        """Record the rows, by number and (unless the read stopped) count: neither is a
        cell of the file."""
        if not self.count:
            return
        problem = (
            "rows with a different number of fields than the header row, the first at "
            f"rows [{', '.join(map(str, self.first))}{', ...' if self.stopped else ''}] "
            "(the header is row 1; a comma in a cell that is not quoted, or a quote left "
            "open?)"
        )
        if self.stopped:
            problems.add(None, problem)
        else:
            problems.add_rows(None, problem, self.count)


def _csv_options(
    ragged: RaggedRows, block_bytes: int
) -> tuple[pacsv.ReadOptions, pacsv.ParseOptions]:
    # newlines_in_values: a quoted cell may hold a line end (RFC 4180); without it the
    # reader cuts its blocks at any line end, inside such a cell too, and refused a valid
    # file as ragged or unreadable depending on where a block boundary fell.
    # use_threads=False: the handler of ragged rows learns their numbers only then (no
    # cost measured: the streaming reader converts one block at a time)
    return (
        pacsv.ReadOptions(block_size=block_bytes, use_threads=False),
        pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=ragged),
    )


def _open(
    reader: Any, fmt: FileFormat, declared: list[str], ragged: RaggedRows
) -> tuple[list[str], Iterator[pa.RecordBatch]]:
    if fmt == "csv":
        read_options, parse_options = _csv_options(ragged, csv_block_bytes(len(declared)))
        stream = pacsv.open_csv(
            reader,
            read_options=read_options,
            parse_options=parse_options,
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.string() for name in declared},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                null_values=[],
                include_columns=declared,
                include_missing_columns=False,
            ),
        )
        return list(stream.schema.names), iter(stream)
    parquet = pq.ParquetFile(reader, pre_buffer=False)
    # read_dictionary: text stays dictionary-encoded (each distinct value decoded once per
    # batch), so that _process measures cells before any long one is repeated per row; it
    # takes leaf columns only (a nested one is refused by its type)
    leaves = {parquet.schema.column(i).path for i in range(len(parquet.schema))}
    reader.seek(0)
    parquet = pq.ParquetFile(
        reader, pre_buffer=False, read_dictionary=[n for n in declared if n in leaves]
    )
    names = list(parquet.schema_arrow.names)
    present = [n for n in declared if n in names]
    # batches of about 64 MiB of float64 however wide (tables.batch_rows), whatever the
    # file's row groups
    return names, parquet.iter_batches(batch_size=tables.batch_rows(len(declared)), columns=present)


def _in_declared(path: str, declared: set[str]) -> bool:
    """Whether the Parquet leaf ``path`` (its field names joined by dots) is a declared
    column or inside one. A declared name may hold dots itself ("c.x", whose leaf path is
    "c.x"), so every dot-separated prefix of the path is a candidate, not the first part
    alone."""
    parts = path.split(".")
    return any(".".join(parts[:k]) in declared for k in range(1, len(parts) + 1))


def max_cells(max_upload_bytes: int) -> int:
    """The most cells (rows times declared columns) an upload of at most
    ``max_upload_bytes`` may hold: those of a CSV file of that size with one digit and one
    separator a cell. A Parquet file may encode far more in as many bytes."""
    return max_upload_bytes // 2


def _check_parquet_sizes(
    reader: Any, declared: list[str], problems: Problems, max_cells: int | None = None
) -> None:
    """Refuse, from the footer and before any page is decoded, a row group whose declared
    text columns hold more than :data:`MAX_ROW_GROUP_TEXT_BYTES` encoded, and a file whose
    rows times declared columns exceed ``max_cells`` (a few KB of run-length encoded zeros
    decode to 10^7 rows: the scale audit's 874 KB file was 2 10^8 cells)."""
    metadata = pq.ParquetFile(reader).metadata
    # the row groups' counts, which the reader decodes, not the file's total (a footer
    # may state any total: the review's file said 8192 and held 10^6 rows)
    rows = sum(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    if max_cells is not None and rows * len(declared) > max_cells:
        problems.add(
            None,
            f"the file holds {rows} rows of {len(declared)} declared columns, "
            f"more than {max_cells} cells (the most a CSV file at the upload limit could "
            "hold, one digit and a separator each): upload fewer rows",
        )
        return
    declared_set = set(declared)
    over = 0
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        text_bytes = 0
        for position in range(group.num_columns):
            chunk = group.column(position)
            # a nested column's chunks count as its own: their leaves may be text
            if _in_declared(chunk.path_in_schema, declared_set) and chunk.physical_type in (
                "BYTE_ARRAY",
                "FIXED_LEN_BYTE_ARRAY",
            ):
                text_bytes += chunk.total_uncompressed_size
        over += text_bytes > MAX_ROW_GROUP_TEXT_BYTES
    if over:
        problems.add(
            None,
            f"{over} row group(s) of the file hold more than {MAX_ROW_GROUP_TEXT_BYTES >> 20} "
            "MiB of text in the declared columns: write it with smaller row groups "
            "(pyarrow: pq.write_table(table, path, row_group_size=100_000))",
        )


def _header_names(
    reader: Any, fmt: FileFormat, declared: list[str], ragged: RaggedRows
) -> list[str]:
    if fmt == "csv":
        read_options, parse_options = _csv_options(ragged, csv_block_bytes(len(declared)))
        stream = pacsv.open_csv(
            reader,
            read_options=read_options,
            parse_options=parse_options,
            convert_options=pacsv.ConvertOptions(strings_can_be_null=False, null_values=[]),
        )
        try:
            return list(stream.schema.names)
        except UnicodeDecodeError:  # pyarrow decodes the header's names only when asked
            raise file_problem(NOT_UTF8) from None
    return list(pq.ParquetFile(reader).schema_arrow.names)


#: The name pandas' to_parquet gives an index it writes as a column (one that is not a
#: plain 0..n-1 range, such as the index of filtered rows); never a cell of the file.
_PANDAS_INDEX = re.compile(r"__index_level_\d+__")


def _undeclared_hint(position: int, name: str) -> str | None:
    """What an undeclared column may be, if its name shows it (names that are no cell)."""
    if not name.strip():
        return f"column {position} has no name: does every line end with a comma?"
    if _PANDAS_INDEX.fullmatch(name):
        return f"{name} is pandas' index: write the file with to_parquet(..., index=False)"
    return None


def _loose(name: str) -> str:
    return unicodedata.normalize("NFC", name.strip()).casefold()


def _check_header(file_names: list[str], declared: list[str], problems: Problems) -> None:
    declared_set = set(declared)
    counts = Counter(file_names)
    near_misses = False
    for name in declared:
        if counts[name] == 0:
            # a header cell that is the declared name in another case or with spaces
            # around it ("x, c, b"): names are public, so saying where it is quotes nothing
            near = [
                i + 1
                for i, other in enumerate(file_names)
                if other not in declared_set and _loose(other) == _loose(name)
            ]
            near_misses = near_misses or bool(near)
            problems.add(
                name,
                "missing from the file"
                + (
                    f": column {near[0]} of the file has its name but for case, "
                    "surrounding spaces or Unicode form (NFC/NFD) (the names must match "
                    "exactly)"
                    if near
                    else ""
                ),
            )
        elif counts[name] > 1:
            problems.add(name, f"appears {counts[name]} times in the file's header")
    # Header names not in the schema are reported by position: a file without a header row
    # would otherwise have its first data row quoted back.
    extra = [i + 1 for i, name in enumerate(file_names) if name not in declared_set]
    if extra:
        hints = [h for i in extra if (h := _undeclared_hint(i, file_names[i - 1]))]
        problems.add(
            None,
            f"{len(extra)} column(s) of the file are not declared in the schema "
            f"(positions {extra[:20]}{'...' if len(extra) > 20 else ''}): declare them, or "
            "remove them from the file" + (f" ({hints[0]})" if hints else ""),
        )
    if problems and extra and not near_misses and all(counts[name] == 0 for name in declared):
        problems.add(None, "no declared column was found: does the file start with a header row?")


def _process(
    check: ColumnCheck, array: pa.Array, problems: Problems, rows_before: int = 0
) -> pa.Array:
    """Check one batch of a column (``rows_before``: the data rows of earlier batches)."""
    if isinstance(check, PublicCheck):
        check.rows_before = rows_before
    lengths = _cell_lengths(array)
    if lengths is not None:
        long = int(pc.sum(pc.greater(lengths, MAX_CELL_BYTES)).as_py() or 0)
        if long:
            # refused before the check expands a dictionary-encoded column (MAX_CELL_BYTES)
            problems.add_rows(check.name, f"cells longer than {MAX_CELL_BYTES} bytes", long)
            return pa.nulls(len(array), check.arrow_type)
    if pa.types.is_dictionary(array.type):
        array = _used_values_only(array)
    try:
        return check.process(array, problems)
    except pa.ArrowInvalid as exc:
        if "UTF8" not in str(exc):
            raise
        # a Parquet string column of bytes that are not UTF-8: pyarrow reads it unchecked,
        # and the check's first text function fails (on which rows, it does not say)
        problems.add(check.name, "text that is not valid UTF-8")
        return pa.nulls(len(array), check.arrow_type)


@dataclass(frozen=True)
class StoredTable:
    format: FileFormat
    n_rows: int
    clipped: dict[str, int]


def validate_and_store(
    reader: io.RawIOBase,
    size: int,
    columns: list[Column],
    policy: Literal["clip", "reject"],
    destination: Path,
    key: bytes,
    filename: str | None = None,
    max_cells: int | None = None,
) -> StoredTable:
    """Validate the whole file, write the normalised table encrypted to ``destination``
    (``filename``: the client's name for it, a hint to :func:`detect_format` only;
    ``max_cells``: the most rows times declared columns a Parquet file may decode to,
    read from its footer; the service passes :func:`max_cells` of its upload limit).

    Raises :class:`InvalidUpload` (nothing written) if any problem is found.
    """
    fmt = detect_format(reader, size, filename)
    declared = [c.name for c in columns]
    # the header's read parses the first block too: its ragged rows are found again later
    header_ragged, ragged = RaggedRows(), RaggedRows()
    try:
        if fmt == "csv":
            _refuse_other_separators(reader, declared)
        file_names = _header_names(reader, fmt, declared, header_ragged)
        reader.seek(0)
        problems = Problems()
        _check_header(file_names, declared, problems)
        if fmt == "parquet" and not problems:
            _check_parquet_sizes(reader, declared, problems, max_cells)
            reader.seek(0)
        problems.raise_if_any()
        _, batches = _open(reader, fmt, declared, ragged)
        checks = [make_check(spec, policy) for spec in columns]
        schema = pa.schema([pa.field(c.name, c.arrow_type, nullable=False) for c in checks])
        writer: EncryptedTableWriter | None = None
        # validated rows not written yet, fewer than a row group: a CSV block is a few
        # hundred rows of a wide table, and written as it came each was a row group
        group_rows = tables.batch_rows(len(checks))
        pending: pa.Table | None = None
        n_rows = 0
        try:
            for batch in batches:
                n_rows += batch.num_rows
                if max_cells is not None and n_rows * len(checks) > max_cells:
                    # what was decoded, whatever the footer said (it was checked above)
                    raise file_problem(
                        f"the file holds more than {max_cells // len(checks)} rows of "
                        f"{len(checks)} declared columns, more than {max_cells} cells: "
                        "upload fewer rows"
                    )
                before = n_rows - batch.num_rows
                arrays = [
                    _process(check, batch.column(check.name), problems, before) for check in checks
                ]
                if problems:
                    pending = None
                    continue  # keep counting problems; nothing more is written
                validated = pa.Table.from_arrays(arrays, schema=schema)
                pending = validated if pending is None else pa.concat_tables([pending, validated])
                whole = pending.num_rows - pending.num_rows % group_rows
                if whole:
                    if writer is None:
                        writer = EncryptedTableWriter(destination, schema, key)
                    writer.write(pending.slice(0, whole))
                    pending = pending.slice(whole)
            if pending is not None and pending.num_rows and not problems:
                if writer is None:
                    writer = EncryptedTableWriter(destination, schema, key)
                writer.write(pending)
        finally:
            if writer is not None:
                writer.close()
    except InvalidUpload:
        destination.unlink(missing_ok=True)
        raise
    except (pa.ArrowException, OSError) as exc:
        # pyarrow's read errors only; anything else is a bug and must surface as one.
        destination.unlink(missing_ok=True)
        if is_storage_full(exc):
            # the stored table's write, refused by a full or read-only disk: the file is
            # not at fault (a 422 told its curator it could not be read as CSV)
            raise
        for stopped in (r for r in (header_ragged, ragged) if r.stopped):
            problems = Problems()
            stopped.report(problems)
            problems.raise_if_any()
        raise file_problem(
            _describe_arrow_error(exc, fmt, reader, csv_block_bytes(len(declared)))
        ) from None
    except BaseException:
        destination.unlink(missing_ok=True)
        raise
    ragged.report(problems)
    if problems or n_rows == 0:
        destination.unlink(missing_ok=True)
        if n_rows == 0 and not ragged.count:
            problems.add(None, "the file has no data rows")
        problems.raise_if_any()
    clipped = {c.name: c.clipped for c in checks if isinstance(c, ContinuousCheck) and c.clipped}
    return StoredTable(format=fmt, n_rows=n_rows, clipped=clipped)
