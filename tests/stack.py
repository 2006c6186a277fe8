"""End-to-end tests start the real processes through backend.localstack."""
from backend.localstack import ROOT, Stack, free_port  # noqa: F401 (re-exported for the tests)
