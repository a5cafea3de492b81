"""Pure numerics of the release mechanisms (DESIGN §6).

Nothing in this package imports the web framework, the database or the queue (an
import-linter contract in ``pyproject.toml`` enforces it). Data comes in already
normalised to ``[-1, 1]^d``; results are frozen dataclasses; post-processing
randomness comes from an injected ``numpy.random.Generator`` and privacy noise
from OpenDP's samplers (see :mod:`app.mechanisms.noise`).
"""
