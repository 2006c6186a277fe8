"""The API side of benchlab: FastAPI app, storage, sweep expansion, recorder, CLI. Never imports torch."""
