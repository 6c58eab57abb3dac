"""The benchmark suite (not installed): run ``python benchmarks/run.py``."""
