"""FastAPI application factory."""
