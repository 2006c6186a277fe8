"""GPU-side half of benchlab: the Celery app and task, suites, harness and job runner."""
