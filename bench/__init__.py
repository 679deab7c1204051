"""Benchmarks: ``python -m bench`` (``make bench``) prints JSON lines, then a table."""
