"""The release types the service offers; importing this package registers them."""

from app.releases.adapters import (
    compressed,
    graph_cuts,
    randomized_response,
    smooth_synopsis,
    smooth_synthetic,
)

__all__ = [
    "compressed",
    "graph_cuts",
    "randomized_response",
    "smooth_synopsis",
    "smooth_synthetic",
]
