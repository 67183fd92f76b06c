"""The web application: the pages and the JSON API over one database, and the grading queue running in
background threads of the same process (never in a request handler).

May import: graders.arena (db, grading, api, pages).
"""
from __future__ import annotations

import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI

from graders.arena import api, pages
from graders.arena.db import Database
from graders.arena.grading import Grader, GradingQueue


def make_app(db: Database, grader: Grader, *, grading_threads: int = 1) -> FastAPI:
    queue = GradingQueue(db, grader, threads=grading_threads)
    stopping = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        queue.start()  # first of all: gradings a killed server left queued or running resume
        try:
            yield
        finally:
            stopping.set()
            queue.stop()

    app = FastAPI(title="fx-katas arena", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.db, app.state.queue, app.state.stopping = db, queue, stopping
    app.include_router(api.router)
    app.include_router(pages.router)
    return app
