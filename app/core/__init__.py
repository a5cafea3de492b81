"""Shared plumbing: database engine and sessions, errors, auth dependencies."""
