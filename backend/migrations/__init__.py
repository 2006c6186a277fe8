"""Alembic migrations of benchlab's database (run with `benchlab db upgrade`, or by the API at start)."""
