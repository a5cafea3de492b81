"""Datasets: upload, schema validation, grants."""
