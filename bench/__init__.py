"""Benchmarks: measured, never asserted (results in docs/benchmarks.md)."""
