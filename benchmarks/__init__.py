"""Study and tuning scripts (not installed): run them as `python -m benchmarks.NAME` from the repository root."""
