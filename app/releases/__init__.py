"""Release requests, their two worker stages and their artifacts."""
