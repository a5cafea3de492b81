"""Fast, exact draws from OpenDP's cryptographically secure byte source.

Why this module exists
----------------------
The randomisation that carries a privacy guarantee must come from a vetted, secure
sampler (DESIGN §2 rule 3). OpenDP's measurements are vetted but pay a Python/FFI call
per element (``make_randomized_response`` ~0.2 ms per row on this machine,
``make_randomized_response_bitvec`` ~0.9 µs per bit); a graph of 4039 vertices has 8.2
million vertex pairs and a randomized-response domain can be too large to list as
OpenDP's ``categories``.

What is used instead
--------------------
*The source* is OpenDP's own CSPRNG, ``opendp._data.fill_bytes`` (the function behind
every OpenDP sampler; its proof definition: "each bit is an iid draw from
Bernoulli(p=0.5)"). It delivers ~1.4 GB/s here, so 8.2 million 64-bit words take ~50 ms.
It is an internal OpenDP function; ``pyproject.toml`` pins OpenDP to one minor version.

*The transformations* are exact integer arithmetic, never floating point:

- :func:`bernoulli` returns ``U < T`` for ``U`` uniform on ``[0, 2^64)``, so
  ``P[True] = T / 2^64`` exactly. The mechanisms compute the integer threshold ``T``
  from their target probability with :func:`threshold`, rounding in the direction that
  keeps the privacy guarantee, and then compute the epsilon that the *rounded*
  probability really gives (never more than requested).
- :func:`uniform_below` is rejection sampling as in OpenDP's
  ``sample_uniform_uint_below``: draw ``U`` uniform on ``[0, 2^64)``, reject the last
  ``2^64 mod B`` values, return ``U mod B``. Exactly uniform on ``[0, B)``.

Floating-point samplers (``numpy.random``) are never used for a privacy-critical draw:
their outputs have holes that leak the input (Mironov 2012).

:func:`standard_normal` (for paper 002's Gaussian ``Phi``, whose guarantee is not
differential privacy) turns 53 secure bits into a uniform on the open interval
``(0, 1)`` and applies the inverse normal CDF. It is a floating-point approximation of
``N(0, 1)`` (truncated at about 8.3 sigma, probability < 1e-16), which is all that paper
002's analysis of a Gaussian ensemble can use; what matters there is that ``Phi``
cannot be predicted or reproduced from a seed, so it is drawn from the CSPRNG too.
"""

from __future__ import annotations

import ctypes
import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from opendp._data import fill_bytes
from scipy.special import ndtri

#: Every threshold is compared with a uniform 64-bit word.
TWO_64 = 1 << 64


def random_bytes(n_bytes: int) -> NDArray[np.uint8]:
    """``n_bytes`` bytes from OpenDP's CSPRNG (each bit iid Bernoulli(1/2))."""
    if n_bytes < 0:
        raise ValueError(f"n_bytes ({n_bytes}) must be >= 0")
    buffer = np.empty(n_bytes, dtype=np.uint8)
    if n_bytes == 0:
        return buffer
    pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    if not fill_bytes(pointer, n_bytes):
        raise RuntimeError("OpenDP's secure byte source failed (insufficient system entropy)")
    return buffer


def random_uint64(size: int) -> NDArray[np.uint64]:
    """``size`` independent words, each uniform on ``[0, 2^64)``."""
    return random_bytes(8 * size).view(np.uint64)


def threshold(probability: Decimal, rounding: Literal["up", "down"]) -> int:
    """The integer ``T`` in ``[0, 2^64]`` with ``T / 2^64`` = ``probability`` rounded.

    ``rounding="up"`` gives the smallest ``T`` with ``T / 2^64 >= probability``,
    ``"down"`` the largest with ``T / 2^64 <= probability``. ``probability`` is a
    ``Decimal`` so that callers can carry more precision than a float (the mechanisms
    use 60 digits and then add a margin of one unit, see their docstrings).
    """
    if not (Decimal(0) <= probability <= Decimal(1)):
        raise ValueError("probability must lie in [0, 1]")
    scaled = probability * TWO_64
    mode = ROUND_CEILING if rounding == "up" else ROUND_FLOOR
    value = int(scaled.to_integral_value(rounding=mode))
    return min(max(value, 0), TWO_64)


def bernoulli(size: int, threshold: int) -> NDArray[np.bool_]:
    """``size`` independent booleans, each ``True`` with probability exactly ``threshold/2^64``."""
    if not (0 <= threshold <= TWO_64):
        raise ValueError(f"threshold ({threshold}) must lie in [0, 2^64]")
    if threshold == TWO_64:
        return np.ones(size, dtype=np.bool_)
    if threshold == 0:
        return np.zeros(size, dtype=np.bool_)
    return random_uint64(size) < np.uint64(threshold)


def uniform_below(size: int, bound: int) -> NDArray[np.int64]:
    """``size`` independent integers, exactly uniform on ``[0, bound)``, ``1 <= bound <= 2^63``.

    Rejection sampling as OpenDP's ``sample_uniform_uint_below``: a word ``U`` is kept
    when ``U < 2^64 - (2^64 mod bound)`` (a whole number of copies of ``[0, bound)``)
    and mapped to ``U mod bound``. Each round keeps a word with probability > 1/2.
    """
    if not (1 <= bound <= 1 << 63):
        raise ValueError(f"bound ({bound}) must lie in [1, 2^63]")
    out = np.empty(size, dtype=np.uint64)
    limit = TWO_64 - (TWO_64 % bound)
    b = np.uint64(bound)
    todo = np.arange(size)
    while todo.size:
        words = random_uint64(todo.size)
        if limit == TWO_64:  # bound is a power of two: nothing to reject
            out[todo] = words % b
            break
        keep = words < np.uint64(limit)
        out[todo[keep]] = words[keep] % b
        todo = todo[~keep]
    return out.astype(np.int64)


def standard_normal(shape: tuple[int, ...]) -> NDArray[np.float64]:
    """Standard normal draws from the CSPRNG: ``ndtri((k + 1/2) / 2^53)``, ``k`` 53 secure bits.

    Not for differential privacy (floating point); see the module docstring.
    """
    count = math.prod(shape)
    words = random_uint64(count) >> np.uint64(11)
    uniforms = (words.astype(np.float64) + 0.5) * 2.0**-53
    normals: NDArray[np.float64] = ndtri(uniforms).reshape(shape)
    return normals
