"""Estimated memory held by a Python object graph (the answer cache's byte limit)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

#: Objects visited at most; past it, what is left is not counted (a decoded release holds
#: a few dozen objects; its bytes are in a handful of numpy buffers).
MAX_OBJECTS = 100_000


def footprint(root: Any) -> int:
    """Bytes held by ``root`` and what it references: each numpy buffer counted once (a
    view leads to the array or bytes owning its buffer), plus the shallow size of every
    container and object met through tuples, lists, sets, dicts, instance ``__dict__``
    (which holds ``functools.cached_property`` values once computed) and dataclass fields.

    An estimate for a cache's budget, not an exact accounting: objects are met once each by
    ``id``, interned constants are counted as if owned, and C extension objects other than
    numpy arrays count their shallow size only (scipy.sparse matrices are plain objects
    holding numpy arrays, and are counted in full).
    """
    seen: set[int] = set()
    total = 0
    stack = [root]
    while stack and len(seen) < MAX_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)  # an array's own buffer included, a view's not
        if isinstance(obj, np.ndarray):
            if obj.base is not None:
                stack.append(obj.base)  # the array (or bytes, mmap) that owns the buffer
            if obj.dtype.hasobject:
                stack.extend(obj.ravel().tolist())
            continue
        if isinstance(obj, str | bytes | bytearray | int | float | complex | bool | type(None)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
            continue
        if isinstance(obj, tuple | list | set | frozenset):
            stack.extend(obj)
            continue
        if isinstance(obj, type):
            continue  # a class is shared, not owned
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            stack.append(state)
        if dataclasses.is_dataclass(obj):
            stack.extend(getattr(obj, f.name, None) for f in dataclasses.fields(obj))
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                stack.append(getattr(obj, name))
    return total
