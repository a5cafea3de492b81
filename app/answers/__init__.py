"""Answering queries from a release (post-processing; no budget spent)."""
