"""The server object ``serve`` builds, mounted on the MCP SDK's streamable-HTTP app on 127.0.0.1, for the official
conformance suite (an HTTP client). Tests only: the product is stdio, and nothing here is reachable off loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import AsyncGenerator, Generator, Mapping
from pathlib import Path

import uvicorn
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.serve import tool_text
from code_sandbox.serve.server import SandboxServer
from code_sandbox.settings import load_settings
from starlette.applications import Starlette

PATH = "/mcp"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def mounted(environ: Mapping[str, str]) -> Generator[str]:
    """Serve on ``http://127.0.0.1:<port>/mcp`` while the block runs: the server built from ``environ``'s settings
    (and its ``XDG_STATE_HOME``) as ``serve`` builds it, its service running first, as under ``serve``."""
    settings = load_settings(environ)
    profile = select_profile(create_plugin_manager(), settings.profile)
    tool_text.run_tool_description(settings, profile)
    tool_text.evaluate_tool_description(settings, profile)
    service = SandboxService(settings, profile, state_dir=Path(environ["XDG_STATE_HOME"]) / "code-sandbox")
    server = SandboxServer(service)
    app: Starlette = server.streamable_http_app(streamable_http_path=PATH, host="127.0.0.1")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncGenerator[None]:
        async with service.running(), server.session_manager.run():
            yield

    app.router.lifespan_context = lifespan
    port = _free_port()
    web = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=web.run, name="http mount", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not web.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP mount did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}{PATH}"
    finally:
        web.should_exit = True
        thread.join(timeout=60)
        service.engine.close()
