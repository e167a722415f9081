"""The FastAPI app (create_app) and an in-process server thread for the tray (ServerThread).

    handle = start_background_server(cfg)          # or ServerThread(cfg, llm=llm).start()
    handle.url  -> "http://127.0.0.1:18000"          handle.stop()
"""
from __future__ import annotations

import logging
import threading
import time

import uvicorn
from fastapi import FastAPI

from engine.config import EngineConfig
from engine.errors import ResourceError
from engine.runtime.worker import EngineWorker
from engine.server import errors, openapi, responses, routes
from engine.server.cors import CORSMiddleware, GuardMiddleware
from engine.server.hosts import HostGuardMiddleware
from engine.server.portcheck import bind_socket
from engine.server.protocol import guarded_protocol

log = logging.getLogger("deepinfer.server")
MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11); more is a 400


def create_app(cfg: EngineConfig, worker: EngineWorker) -> FastAPI:
    # /docs and /redoc would load their JavaScript from a CDN (blank offline): off; /openapi.json stays
    app = FastAPI(title="DeepInfer", version="0.1.0", docs_url=None, redoc_url=None,
                  description="OpenAI-compatible endpoint of the local DeepInfer engine (see docs/api.md)")
    app.state.worker = worker
    app.state.cfg = cfg
    errors.install(app)
    app.include_router(routes.router)
    app.include_router(responses.router)
    # outermost first: CORS answers preflights and tags every response (errors too)
    app.add_middleware(GuardMiddleware, api_key=cfg.api_key, max_body=cfg.max_body_bytes)
    app.add_middleware(CORSMiddleware, origins=cfg.cors_origins)
    app.add_middleware(HostGuardMiddleware, bind_host=cfg.host, allow=cfg.allow_hosts)  # DNS rebinding: first
    openapi.install(app)
    return app


def uvicorn_server(app: FastAPI, log_level: str = "warning"):
    cfg: EngineConfig = app.state.cfg
    # slow clients: header/body read deadlines and half-closed requests (protocol.py), a connection
    # cap (503 beyond), 16 KiB of request line + headers at most
    config = uvicorn.Config(app, log_level=log_level, access_log=log_level in ("info", "debug"),
                            timeout_graceful_shutdown=3, timeout_keep_alive=5, lifespan="off",
                            http=guarded_protocol(cfg.header_timeout_s, cfg.body_timeout_s, cfg.max_connections),
                            limit_concurrency=cfg.max_connections + 1,  # uvicorn's own cap: a backstop
                            h11_max_incomplete_event_size=MAX_HEADER_BYTES)
    return uvicorn.Server(config)


class ServerThread:
    """uvicorn in a background thread + the engine thread; for the tray and tests.

    Pass `llm` to reuse an already loaded model (it stays usable after stop()).
    Port 0 picks a free port. The model loads in the engine thread; /health says "loading".
    """

    def __init__(self, cfg: EngineConfig, llm=None, worker: EngineWorker | None = None, log_level="warning"):
        self.sock = bind_socket(cfg.host, cfg.port)  # clear error now if the port is taken
        self.port = self.sock.getsockname()[1]
        host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
        self.url = f"http://{host}:{self.port}"
        self.own_worker = worker is None
        self.worker = worker or EngineWorker(cfg, llm=llm)
        self.app = create_app(cfg, self.worker)
        self.server = uvicorn_server(self.app, log_level)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="deepinfer-http", daemon=True)

    @property
    def base_url(self) -> str:  # what an OpenAI client wants
        return self.url + "/v1"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        if self.own_worker and not self.worker.thread.is_alive():
            self.worker.start()
        self.thread.start()
        t_end = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > t_end:
                raise ResourceError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 15.0):
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.own_worker:
            self.worker.stop()
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def start_background_server(cfg: EngineConfig, llm=None, log_level: str = "warning") -> ServerThread:
    return ServerThread(cfg, llm=llm, log_level=log_level).start()
