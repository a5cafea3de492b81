"""privacy curator: differentially private synthetic data and synopses behind a REST API."""

__version__ = "0.1.0"
