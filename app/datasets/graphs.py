"""Validate an uploaded edge list against its declared vertex count and store it.

Format: one undirected edge per line, two integer vertex ids separated by a comma, a tab
or a single space; an optional header line (e.g. ``source,target``: no field of it a
number); leading lines that start with ``#`` are skipped. Ids must lie in
``0..vertices-1``; self-loops and repeated edges (in either orientation) are refused.
Problems are counted, never quoted: under edge-level privacy even the number of edges is
not public, so the stored graph's size is not reported back either.

Stored as encrypted Parquet with int32 columns ``u < v``, sorted.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from app.core.types import PLAIN_NUMBER
from app.datasets.validation import Problems, file_problem, refuse_non_text
from app.mechanisms import graph_cuts
from app.storage.tables import EncryptedTableWriter

_INTEGER = r"^\s*\d+\s*$"
_SMALL_INTEGER = r"^\s*\d{1,9}\s*$"  # castable without overflow; longer ids are out of range
#: A field that reads as a number (:data:`app.core.types.PLAIN_NUMBER`): such a first line
#: is an edge, not a header.
_NUMBER = re.compile(PLAIN_NUMBER)
_BLOCK_BYTES = 4 << 20
GRAPH_SCHEMA = pa.schema(
    [pa.field("u", pa.int32(), nullable=False), pa.field("v", pa.int32(), nullable=False)]
)


@dataclass(frozen=True)
class StoredGraph:
    n_edges: int


def _is_number(field: str) -> bool:
    """Whether a field of a first line reads as a number: :data:`_NUMBER`, digits of any
    script (``１``, ``٣``: ``str.isdigit``), or what ``float`` takes (``nan``, ``inf``,
    ``1_000``): such a line is an edge, refused if it is not a valid one."""
    if _NUMBER.fullmatch(field) or field.isdigit():
        return True
    try:
        float(field)
    except ValueError:
        return False
    return True


def _layout(reader: io.RawIOBase) -> tuple[str, int, bool]:
    """(delimiter, leading comment lines, has a header) from the first lines, split as the
    CSV reader splits them (``\\n``, ``\\r\\n`` or ``\\r``; ``str.splitlines`` also breaks at
    form feeds and U+2028) and without a UTF-8 byte order mark, which the reader skips
    (kept, it made the first edge look like a header row, and that edge was dropped)."""
    text = (reader.read(64 * 1024) or b"").decode("utf-8-sig", "replace")
    head = re.split(r"\r\n|\r|\n", text)
    reader.seek(0)
    comments = 0
    for line in head:
        if line.startswith("#") or not line.strip():
            comments += 1
            continue
        delimiter = "," if "," in line else ("\t" if "\t" in line else " ")
        fields = line.split(delimiter)
        # a header names its columns: a line with a number in it is an edge, also one that
        # is not valid (``0 -1``, ``2 1.0``, ``0,2,``), refused with the other bad edges
        # (taken for a header, such a first edge was dropped in silence, and the 201 shows
        # no edge count to notice it by)
        header = not any(_is_number(f.strip()) for f in fields)
        return delimiter, comments, header
    raise file_problem("the file has no edges")


def validate_graph_and_store(
    reader: io.RawIOBase, size: int, vertices: int, destination: Path, key: bytes
) -> StoredGraph:
    """Validate every edge, then write the sorted edge set encrypted to ``destination``.

    Raises :class:`InvalidUpload` (nothing written) on any problem.
    """
    if size == 0:
        raise file_problem("the file is empty")
    refuse_non_text(reader, "the edge list as UTF-8 text")
    delimiter, comments, header = _layout(reader)
    problems = Problems()
    # the edge set as its packed pair bits (graph_cuts' stored form, 25 MB at the largest
    # vertex count): repeated edges are the listed ones less the bits set, and the memory
    # does not grow with the file (a list of int64 codes and its np.unique took about 88
    # bytes an edge, 10 GB for a 1 GiB edge list)
    bits = np.zeros(graph_cuts.pair_bytes(vertices), dtype=np.uint8)
    listed = 0
    try:
        stream = pacsv.open_csv(
            reader,
            read_options=pacsv.ReadOptions(
                block_size=_BLOCK_BYTES,
                skip_rows=comments + (1 if header else 0),
                column_names=["u", "v"],
            ),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(
                column_types={"u": pa.string(), "v": pa.string()},
                strings_can_be_null=False,
                null_values=[],
            ),
        )
        for batch in stream:
            u_text, v_text = batch.column("u"), batch.column("v")
            numeric = pc.and_(
                pc.match_substring_regex(u_text, _INTEGER),
                pc.match_substring_regex(v_text, _INTEGER),
            )
            small = pc.and_(
                pc.match_substring_regex(u_text, _SMALL_INTEGER),
                pc.match_substring_regex(v_text, _SMALL_INTEGER),
            )
            ok = np.asarray(numeric.to_numpy(zero_copy_only=False), dtype=bool)
            castable = np.asarray(small.to_numpy(zero_copy_only=False), dtype=bool)
            problems.add_rows("edges", "ids that are not non-negative integers", int((~ok).sum()))
            u = _ids(u_text, small)
            v = _ids(v_text, small)
            out_of_range = ok & (~castable | (u >= vertices) | (v >= vertices))
            problems.add_rows(
                "edges",
                f"ids outside 0..{vertices - 1} (the declared vertex count)",
                int(out_of_range.sum()),
            )
            loops = ok & ~out_of_range & (u == v)
            problems.add_rows("edges", "self-loops", int(loops.sum()))
            good = ok & ~out_of_range & ~loops
            low, high = np.minimum(u[good], v[good]), np.maximum(u[good], v[good])
            graph_cuts.add_pairs(bits, graph_cuts.pair_index(low, high, vertices))
            listed += low.size
    except pa.ArrowException as exc:
        text = str(exc)
        message = (
            "some lines do not have exactly two fields"
            if "Expected" in text and "columns" in text
            else "the file could not be read as an edge list"
        )
        raise file_problem(message) from None
    n_edges = graph_cuts.pair_count(bits)
    problems.add_rows("edges", "repeated edges (in either orientation)", listed - n_edges)
    if n_edges == 0 and not problems:
        problems.add(None, "the file has no edges")
    problems.raise_if_any()
    writer = EncryptedTableWriter(destination, GRAPH_SCHEMA, key)
    try:
        # in pair order, u < v: sorted as (u, v), as np.unique of u |V| + v sorted them
        for block in graph_cuts.pair_bits_to_edges(bits, vertices):
            if block.size:
                writer.write(
                    pa.RecordBatch.from_arrays(
                        [pa.array(np.ascontiguousarray(column)) for column in block.T],
                        schema=GRAPH_SCHEMA,
                    )
                )
    except BaseException:
        writer.close()
        destination.unlink(missing_ok=True)
        raise
    writer.close()
    return StoredGraph(n_edges=n_edges)


def _ids(text: pa.Array, numeric: pa.Array) -> np.ndarray:
    cleaned = pc.if_else(numeric, pc.utf8_trim_whitespace(text), "0")
    values = np.asarray(pc.cast(cleaned, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values
