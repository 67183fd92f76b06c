"""The web application: the pages and the JSON API over one database, and the grading queue running in
background threads of the same process (never in a request handler).

Every response carries X-Frame-Options: DENY, X-Content-Type-Options: nosniff and a Content-Security-Policy
that lets a page load only this site's own script, style and connections (the pages have no inline script
or style), the answer to a request that failed (500) too. An error is a sentence: under /api/ as JSON
({"detail": "..."}), on a page as a small HTML page (graders.arena.pages.error_page), its status kept.

May import: graders.arena (db, grading, api, controls, pages).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from graders.arena import api, controls, pages
from graders.arena.db import Database
from graders.arena.grading import LEASE, Grader, GradingQueue

log = logging.getLogger("arena")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = [(b"x-frame-options", b"DENY"), (b"x-content-type-options", b"nosniff"),
                    (b"content-security-policy", CSP.encode()), (b"referrer-policy", b"same-origin")]


def is_api(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


class SecurityHeaders:
    """ASGI middleware around the whole application: the security headers on every response; and a request
    that raised before it answered is answered 500 with a sentence here (so that answer has them too)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *(h for h in SECURITY_HEADERS if h[0] not in names)]}
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if started:
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            sentence = "the server failed on this request (its log says why)"
            response = (api.Utf8JSONResponse({"detail": sentence}, status_code=500) if is_api(scope.get("path", ""))
                        else pages.error_page(500, sentence))
            await response(scope, receive, sending)


def make_app(db: Database, grader: Grader, *, grading_threads: int = 1, read_timeout: float = api.READ_TIMEOUT,
             lease: float = LEASE) -> FastAPI:
    queue = GradingQueue(db, grader, threads=grading_threads, lease=lease)
    stopping = threading.Event()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        queue.start()  # first of all: gradings left queued, or running under a lease that ran out, resume
        watcher = asyncio.create_task(app.state.board_changes.run(stopping))
        try:
            yield
        finally:
            stopping.set()
            watcher.cancel()
            queue.stop()

    app = FastAPI(title="fx-katas arena", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.db, app.state.queue, app.state.stopping, app.state.read_timeout = db, queue, stopping, read_timeout
    app.state.board_changes = pages.BoardChanges(db)  # the live board's one watcher of the database
    app.include_router(api.router)
    app.include_router(controls.router)
    app.include_router(pages.router)

    @app.exception_handler(HTTPException)
    async def refused(request: Request, exc: HTTPException):
        if exc.status_code == 404 and exc.detail == "Not Found":  # no route: say which address
            exc = HTTPException(404, f"no such {'endpoint' if is_api(request.url.path) else 'page'}: {request.url.path}",
                                exc.headers)
        if is_api(request.url.path):
            return await http_exception_handler(request, exc)
        return pages.error_page(exc.status_code, str(exc.detail), exc.headers)

    @app.exception_handler(RequestValidationError)
    async def unreadable(request: Request, exc: RequestValidationError):
        sentence = api.refusal(exc.errors())
        if is_api(request.url.path):
            return api.Utf8JSONResponse({"detail": sentence}, status_code=422)
        return pages.error_page(422, sentence)

    app.add_middleware(SecurityHeaders)
    return app
