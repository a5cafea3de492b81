"""SQLAlchemy ORM classes."""
