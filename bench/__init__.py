"""Benchmarks: measured, never asserted.

Each run's log is in bench/results/, the current figures in docs/benchmarks.md.
"""
