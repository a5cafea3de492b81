"""Task queue (Huey) setup."""
