"""Benchmarks of fedge, run as modules from the repository root (``python -m benchmarks.engine``).

They print ratios measured side by side in one process; tests only smoke-test the harness, never timings.
"""
