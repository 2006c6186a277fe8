"""The FastAPI app: REST routes, pages, and (optionally) the recorder thread beside them."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from backend.changes import ChangeFeed, WaiterLimit
from backend.db import make_engine, prepare_schema
from backend.dispatch import Dispatcher
from backend.errors import COMMON_ERRORS, install_error_handlers
from backend.pages import error_page
from backend.pages import router as pages_router
from backend.recorder import Recorder
from backend.routes import compare, health, history, jobs, plan, presets, suites, sweeps, tokens, workers
from backend.security import GuardMiddleware
from backend.settings import BackendSettings, get_settings


def create_app(settings: BackendSettings | None = None, with_recorder: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.recorder = None
        if with_recorder:
            app.state.recorder = Recorder(app.state.dispatcher.app, app.state.engine, app.state.changes,
                                          worker_settings=app.state.dispatcher.worker_settings,
                                          lost_after_s=settings.worker_lost_after_s,
                                          reap_interval_s=settings.reap_interval_s,
                                          retention=(settings.artifact_root, settings.artifact_max_age_days,
                                                     settings.artifact_max_total_mb)
                                          if settings.artifact_max_age_days or settings.artifact_max_total_mb else None)
            app.state.recorder.start()
        yield
        if app.state.recorder is not None:
            app.state.recorder.stop()
        app.state.dispatcher.close()

    app = FastAPI(title="benchlab", version="0.1.0", lifespan=lifespan,
                  description="Run and compare GPU benchmarks of attention kernels and data-parallel training.")
    app.state.settings = settings
    app.state.engine = make_engine(settings)
    prepare_schema(app.state.engine, settings.auto_migrate)
    app.state.dispatcher = Dispatcher(settings)
    app.state.changes = ChangeFeed()
    app.state.recorder = None
    app.state.waiters = WaiterLimit(settings.max_waiters)
    for r in (health.router, suites.router, sweeps.router, jobs.router, workers.router, compare.router,
              presets.router, tokens.router, history.router, plan.router, pages_router):
        app.include_router(r, responses=COMMON_ERRORS)
    app.add_middleware(GuardMiddleware, settings=settings)
    install_error_handlers(app, page_error=error_page)
    return app
