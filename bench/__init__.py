"""Reproducible benchmarks; each module runs with ``python -m bench.<name>`` and writes
``bench/results/<name>.md`` and ``.json``."""
