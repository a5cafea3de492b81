"""Errors raised by the mechanisms for arguments they cannot accept, and the size text
their messages (and the service's) use."""


class MechanismError(ValueError):
    """A mechanism was called with arguments it cannot accept.

    The message names the argument and the rule it breaks (``"epsilon (-1.0) must be
    positive"``). It never contains data values: a message may reach an API client.
    """


class SolverError(RuntimeError):
    """A numerical solver (LP, eigen-decomposition...) failed on well-formed input."""


def bytes_text(size: int) -> str:
    """``size`` bytes for a message, in the largest binary unit that keeps it at least 1:
    ``"4.0 GiB"``, ``"9.8 KiB"``, ``"512 bytes"``."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"
