"""Request field types shared by the packages' schemas."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BeforeValidator,
    StringConstraints,
    ValidatorFunctionWrapHandler,
)

#: A plain decimal number as text (sign, digits, a point, an exponent), to be matched whole:
#: a spreadsheet reads one that starts with a sign as a number, not as a formula, and a
#: graph's first line with one in it is an edge, not a header. Unambiguous: the digits after
#: the point only follow a point (``[0-9]+\.?[0-9]*`` split a run of digits every way
#: between its two parts on a failed match, quadratic in its length: a 64 KiB first line of
#: digits and a letter held the GIL for minutes). One pattern for Python's ``re`` and
#: Arrow's RE2.
PLAIN_NUMBER = r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?"

#: Floats hold every integer up to here exactly; past it ``2^53 + 1`` reads as ``2^53``.
EXACT_FLOAT_INTEGERS = 2**53


def integral_number(value: object) -> object:
    """JSON does not tell ``6`` from ``6.0`` (RFC 8259, section 6), and many clients
    (JavaScript's numbers, Python's ``/``) send the second: a float with no fractional
    part, within the range where floats are exact integers, is that integer. Anything else
    goes to the strict integer check unchanged, so ``6.5``, ``true`` and ``"6"`` are still
    refused."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INTEGERS:
        return int(value)
    return value


#: A strict integer that also takes integral JSON floats (``6.0``).
Integer = Annotated[int, BeforeValidator(integral_number)]
#: A bounded one is written ``Annotated[int, Field(ge=..., le=...), BeforeValidator(
#: integral_number)]``: it validates as ``Annotated[Integer, Field(ge=..., le=...)]`` does
#: (the same errors), but the bounds reach the JSON schema as ``minimum`` and ``maximum``;
#: the latter wrote them as ``ge`` and ``le``, which no JSON Schema reader knows.


def unsigned_zero(value: float) -> float:
    """``-0.0`` read as ``0.0``: JSON's ``-0.0`` (or ``-0``) is a valid zero that compares
    equal to ``0`` and passes every range check, but is echoed, stored and hashed with its
    sign (a preview answered ``"delta": -0.0``)."""
    return 0.0 if value == 0 else value


#: A float whose zero is always ``0.0``.
UnsignedZeroFloat = Annotated[float, AfterValidator(unsigned_zero)]


def validated_as_declared(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A wrap validator that only runs the field's own validation. With
    ``WrapValidator(validated_as_declared, json_schema_input_type=T)`` a field validates as
    its declared type and the OpenAPI schema shows ``T`` (a schema only: e.g. any JSON
    object, checked later by the release type, shown as that type's models)."""
    return handler(value)


#: The Unicode categories a name or declared label may not hold: control characters (Cc:
#: C0, DEL and C1, so NUL, which PostgreSQL text cannot store, and the CR and LF of a
#: header or log line) and the line and paragraph separators (Zl, Zp).
CONTROL_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})
#: The format characters (Cf) it may not hold either, as inclusive code point ranges: those
#: that hide or reorder text, the zero-width space, word joiner and byte-order mark and the
#: bidirectional embedding, override and isolate controls ("Trojan Source"). Other format
#: characters are ordinary text: the joiners and tag characters of emoji (a flag such as
#: Scotland's), the left-to-right and right-to-left marks that right-to-left input methods
#: insert, the Arabic letter mark, the soft hyphen.
HIDDEN_FORMAT_CHARACTERS = (
    (0x200B, 0x200B),
    (0x2060, 0x2060),
    (0xFEFF, 0xFEFF),
    (0x202A, 0x202E),
    (0x2066, 0x2069),
)


def _refused(char: str) -> bool:
    if unicodedata.category(char) in CONTROL_CATEGORIES:
        return True
    code = ord(char)
    return any(low <= code <= high for low, high in HIDDEN_FORMAT_CHARACTERS)


def control_character_error(text: str) -> str | None:
    """Why ``text`` cannot be a name or a declared label (the first control character it
    holds, by code point and position, never the character itself), or None."""
    for position, char in enumerate(text, start=1):
        if _refused(char):
            return (
                f"holds a control character (U+{ord(char):04X}, at character {position}); "
                "control characters, line and paragraph separators, zero-width spaces, "
                "byte-order marks and bidirectional embedding, override and isolate "
                "controls are not allowed"
            )
    return None


def no_control_characters(text: str) -> str:
    """An ``AfterValidator``: ``text`` unless it holds a control character."""
    problem = control_character_error(text)
    if problem is not None:
        raise ValueError(problem)
    return text


#: A name a person gives (a user, a dataset): trimmed, 1-200 characters, no control
#: character (NUL cannot be stored in PostgreSQL text; escapes reach terminals).
Name = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    AfterValidator(no_control_characters),
]
