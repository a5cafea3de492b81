"""Data for `curator demo` and the README walkthrough (WDBC and a curator's schema)."""
