"""Request field types shared by the packages' schemas."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidatorFunctionWrapHandler

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


def validated_as_declared(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A wrap validator that only runs the field's own validation. With
    ``WrapValidator(validated_as_declared, json_schema_input_type=T)`` a field validates as
    its declared type and the OpenAPI schema shows ``T`` (a schema only: e.g. any JSON
    object, checked later by the release type, shown as that type's models)."""
    return handler(value)


#: The Unicode categories a name or declared label may not hold: control characters (Cc:
#: C0, DEL and C1, so NUL, which PostgreSQL text cannot store, and the CR and LF of a
#: header or log line), format characters (Cf: bidirectional overrides, zero-width spaces,
#: a byte-order mark), and the line and paragraph separators (Zl, Zp).
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
#: Format characters that ordinary text needs: the zero-width non-joiner and joiner
#: (Persian, Indic scripts, emoji sequences).
_JOINERS = frozenset({"\u200c", "\u200d"})


def control_character_error(text: str) -> str | None:
    """Why ``text`` cannot be a name or a declared label (the first control character it
    holds, by code point and position, never the character itself), or None."""
    for position, char in enumerate(text, start=1):
        if unicodedata.category(char) in CONTROL_CATEGORIES and char not in _JOINERS:
            return (
                f"holds a control character (U+{ord(char):04X}, at character {position}); "
                "control, format and line or paragraph separator characters are not allowed"
            )
    return None


def no_control_characters(text: str) -> str:
    """An ``AfterValidator``: ``text`` unless it holds a control character."""
    problem = control_character_error(text)
    if problem is not None:
        raise ValueError(problem)
    return text
