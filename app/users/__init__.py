"""Users, API keys and roles."""
