"""Request field types shared by the packages' schemas."""

from __future__ import annotations

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
