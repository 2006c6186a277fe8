"""`python -m backend.cli`: the `benchlab` command."""
from backend.cli import main

main()
