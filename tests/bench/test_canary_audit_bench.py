"""bench.canary_audit can fail: a raw value planted in any of the encodings it searches
for, in a log line, an array or a plain Parquet file, is reported as a finding, while the
service's encrypted table of the same rows holds none of them.

The real audit (``python -m bench.canary_audit``, a minute or two against a running
service) is not a test; these check its patterns, its scanner and its verdicts.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from app.datasets.schemas import ContinuousColumn
from app.datasets.validation import validate_and_store
from app.storage import tables
from bench import canary_audit as audit

COLS = audit.table(audit.SEED, 200)


def _patterns() -> audit.Patterns:
    return audit.merge(
        audit.raw_patterns(COLS, "raw", audit.FLOAT32_ROWS),
        audit.text_patterns(audit.REFUSED, "refused"),
        audit.text_patterns({c: c for c in audit.CATEGORIES}, "declared_category"),
    )


def _verdicts(blobs: dict[str, bytes]) -> dict[tuple[str, str], str]:
    found = audit.search(audit.Scanner(_patterns()), blobs)
    return {(r["where"], r["what"]): r["verdict"] for r in found}


def test_planted_raw_values_are_findings_in_every_encoding() -> None:
    lo, hi = audit.BOUNDS["c_beta"]
    text = COLS["c_beta"][3]
    value = float(text)
    normalised = 2.0 * (value - lo) / (hi - lo) - 1.0
    blobs = {
        "logs/serve.log": f"INFO something happened: {text} rows\n".encode(),
        "data/tmp/leak.npy": np.array([0.5, value, 0.25]).tobytes(),
        "data/tmp/normalised.npy": np.array([0.5, normalised]).tobytes(),
        "data/tmp/single.npy": np.array(
            [0.5, float(COLS["c_alpha"][1]), 0.25], np.float32
        ).tobytes(),
        "redis(before)": audit.REFUSED["undeclared category"].encode("utf-16-le"),
        "logs/worker.log": f"category {audit.CATEGORIES[0]} seen\n".encode(),
        "data/curator.db": audit.CATEGORIES[1].encode(),
    }
    verdicts = _verdicts(blobs)
    assert verdicts[("logs/serve.log", "raw:ascii")] == "finding"
    assert verdicts[("data/tmp/leak.npy", "raw:float64")] == "finding"
    assert verdicts[("data/tmp/normalised.npy", "raw:normalised_float64")] == "finding"
    assert verdicts[("data/tmp/single.npy", "raw:float32")] == "weak (4-byte match)"
    assert verdicts[("redis(before)", "refused:undeclared category:utf16")] == "finding"
    # a declared category is public in the declaration, not in a log line
    assert verdicts[("logs/worker.log", f"declared_category:{audit.CATEGORIES[0]}:utf8")] == (
        "finding"
    )
    assert verdicts[("data/curator.db", f"declared_category:{audit.CATEGORIES[1]}:utf8")] == (
        "expected"
    )


def test_a_value_inside_a_longer_number_or_a_float64s_high_half_is_not_a_finding() -> None:
    text = COLS["c_gamma"][0]
    longer = f"1{text}7,{text}3\n".encode()  # a synthetic value printed with more digits
    assert _verdicts({"downloads/sample.csv": longer}) == {}
    # the float32 of a normalised value in [0.5, 1) is the high word of a float64 near
    # 2^-11 (a support weight): not the value
    lo, hi = audit.BOUNDS["c_beta"]
    normalised = next(
        n
        for n in (2.0 * (float(t) - lo) / (hi - lo) - 1.0 for t in COLS["c_beta"][:20])
        if 0.5 <= n < 1.0
    )
    high = int.from_bytes(np.float32(normalised).tobytes(), "little")
    weight = np.frombuffer(((high << 32) | 0x6D29840E).to_bytes(8, "little"), "<f8")
    blob = np.array([0.1, weight[0], 0.2]).tobytes()
    verdicts = _verdicts({"data/releases/r/v0/support.parquet": blob})
    assert set(verdicts.values()) == {"chance (the high half of an unrelated float64)"}


def test_the_services_encrypted_table_holds_no_canary_and_a_plain_copy_does(
    tmp_path: Path,
) -> None:
    names = list(audit.BOUNDS)
    csv = "\n".join(
        [",".join(names)] + [",".join(row) for row in zip(*(COLS[c] for c in names), strict=True)]
    ).encode()
    columns = [
        ContinuousColumn(name=c, kind="continuous", lower=lo, upper=hi)
        for c, (lo, hi) in audit.BOUNDS.items()
    ]
    stored = tmp_path / "stored.parquet"
    validate_and_store(io.BytesIO(csv), len(csv), columns, "clip", stored, tables.new_file_key())
    plain = io.BytesIO()
    pq.write_table(pq.read_table(io.BytesIO(_plain_parquet(csv))), plain)
    verdicts = _verdicts(
        {"data/datasets/stored.parquet": stored.read_bytes(), "tmp/plain.parquet": plain.getvalue()}
    )
    assert not [k for k, v in verdicts.items() if k[0].startswith("data/") and v == "finding"]
    assert verdicts[("tmp/plain.parquet", "raw:float64")] == "finding"


def _plain_parquet(csv: bytes) -> bytes:
    import pyarrow.csv as pcsv

    sink = io.BytesIO()
    pq.write_table(pcsv.read_csv(io.BytesIO(csv)), sink)
    return sink.getvalue()


def test_canary_texts_have_ten_significant_digits() -> None:
    for c in audit.BOUNDS:
        for text in COLS[c]:
            digits = text.replace("-", "").replace(".", "").lstrip("0")
            assert len(digits) == 10, text
