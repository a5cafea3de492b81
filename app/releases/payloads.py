"""JSON-safe encoding of measurement payloads that contain numpy arrays.

Measurements live in the database (so that storing them and committing the spend are one
transaction); arrays are stored as ``{"__ndarray__": {"dtype", "shape", "data"}}`` with
``data`` the zlib-compressed bytes in base64. Decoding restores dtype and shape exactly.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

_KEY = "__ndarray__"
_FLOAT = "__float__"  # non-finite floats (inf, -inf, nan), which JSON cannot carry


def pack(value: Any) -> Any:
    """Replace every numpy array (recursively) by its encoded form; numpy scalars by Python ones."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return {
            _KEY: {
                "dtype": array.dtype.str,
                "shape": list(array.shape),
                "data": base64.b64encode(zlib.compress(array.tobytes(), 6)).decode("ascii"),
            }
        }
    if isinstance(value, np.generic):
        return pack(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT: repr(value)}
    if isinstance(value, Mapping):
        return {str(k): pack(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [pack(v) for v in value]
    return value


def unpack(value: Any) -> Any:
    """Inverse of :func:`pack`."""
    if isinstance(value, Mapping):
        if set(value) == {_FLOAT}:
            return float(value[_FLOAT])
        if set(value) == {_KEY}:
            spec = value[_KEY]
            raw = zlib.decompress(base64.b64decode(spec["data"]))
            return np.frombuffer(raw, dtype=np.dtype(spec["dtype"])).reshape(spec["shape"]).copy()
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unpack(v) for v in value]
    return value
