"""Errors raised by the mechanisms for arguments they cannot accept."""


class MechanismError(ValueError):
    """A mechanism was called with arguments it cannot accept.

    The message names the argument and the rule it breaks (``"epsilon (-1.0) must be
    positive"``). It never contains data values: a message may reach an API client.
    """


class SolverError(RuntimeError):
    """A numerical solver (LP, eigen-decomposition...) failed on well-formed input."""
