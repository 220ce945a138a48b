"""Load: many live sandboxes on one engine, a client keeping requests in flight, against bare docker execs.

    uv run python bench/load.py             # 100 sandboxes, 8 requests in flight, 60 s a phase (about 4 minutes)
    uv run python bench/load.py --quick     # 20 s a phase

Phase one: one server holds 100 live sandboxes and its client keeps 8 requests in flight for the duration, hello runs
and 64 KiB writes in turn, each on a sandbox no other request is using. Phase two: 4 servers side by side on the same
engine, 25 sandboxes each, 2 requests in flight each (8 in all). The floor: bare ``docker exec node -e`` of the same
hello, 8 in flight, in 8 containers of the same image and hardening. Reported: errors, p50/p95/p99 of each kind of
request, runs per second against execs per second, each server's RSS at the end, and what was left behind (nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import (
    ENVIRONMENT,
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_TAG,
    PROBE_UID,
    ContainerRequest,
    user_of,
)
from code_sandbox.hardening import environment as fixed_environment
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.settings import load_settings
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from run import nearest_rank, raw_create_and_start, server_rss_kib  # bench/run.py: quantiles, floor containers, RSS

RESULTS = Path(__file__).parent / "results"
HELLO = "console.log('hello')"
CHUNK = "x" * 65536


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples) or [float("nan")]
    return {
        "n": len(samples),
        "p50_ms": nearest_rank(ordered, 0.5) * 1000,
        "p95_ms": nearest_rank(ordered, 0.95) * 1000,
        "p99_ms": nearest_rank(ordered, 0.99) * 1000,
    }


class Tally:
    """Latencies by kind of request and the errors, across the tasks of one phase."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {"run": [], "write": []}
        self.errors: list[str] = []

    def summary(self, seconds: float) -> dict[str, Any]:
        return {
            "runs_per_second": len(self.samples["run"]) / seconds,
            "run": percentiles(self.samples["run"]),
            "write": percentiles(self.samples["write"]),
            "errors": len(self.errors),
            "first_errors": self.errors[:5],
        }


def server_params(state: Path, tag: str, sessions: int) -> StdioServerParameters:
    command = shutil.which("code-sandbox") or sys.exit("run with `uv run` so that code-sandbox is on PATH")
    env = {
        **os.environ,
        "CODE_SANDBOX_MAX_SESSIONS": str(sessions),
        "CODE_SANDBOX_WARM_POOL": "1",
        "CODE_SANDBOX_AUDIT_ENABLED": "false",
        "CODE_SANDBOX_IDLE_TIMEOUT": "600",
        "CODE_SANDBOX_MAX_LIFETIME": "900",
        "CODE_SANDBOX_TAG": tag,
        "XDG_STATE_HOME": str(state),
    }
    return StdioServerParameters(command=command, args=["serve"], env=env)


def server_rss_mib(state: Path) -> float:
    """The RSS of the server whose state directory is ``state``; NaN when it is not found."""
    try:
        return server_rss_kib(state) / 1024
    except RuntimeError:
        return float("nan")


async def one_server(sessions: int, in_flight: int, seconds: float, state: Path, tag: str, tally: Tally) -> float:
    """One server with ``sessions`` live sandboxes under ``in_flight`` requests for ``seconds``; its RSS at the end."""
    async with stdio_client(server_params(state, tag, sessions)) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        free: list[str] = []
        async with anyio.create_task_group() as group:

            async def make() -> None:
                created = await client.call_tool("create_sandbox", {})
                if created.is_error:
                    tally.errors.append(f"create_sandbox: {created.content}")
                    return
                sid = created.structured_content["session_id"]
                files = [{"path": "index.js", "content": HELLO}]
                written = await client.call_tool("write_files", {"session_id": sid, "files": files})
                if written.is_error:
                    tally.errors.append(f"write_files: {written.content}")
                free.append(sid)

            limiter = anyio.Semaphore(4)
            for _ in range(sessions):

                async def limited() -> None:
                    async with limiter:
                        await make()

                group.start_soon(limited)
        if len(free) != sessions:
            tally.errors.append(f"{sessions - len(free)} sandboxes could not be made")
        everyone = list(free)
        random.shuffle(free)
        deadline = time.monotonic() + seconds

        async def worker(index: int) -> None:
            turn = index
            while time.monotonic() < deadline:
                sid = free.pop(0)
                turn += 1
                started = time.perf_counter()
                if turn % 2:
                    call = await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "index.js"})
                    kind, good = "run", not call.is_error and call.structured_content["stdout"] == "hello\n"
                else:
                    files = [{"path": f"data/{turn % 7}.txt", "content": CHUNK}]
                    call = await client.call_tool("write_files", {"session_id": sid, "files": files, "overwrite": True})
                    kind, good = "write", not call.is_error
                elapsed = time.perf_counter() - started
                free.append(sid)
                if good:
                    tally.samples[kind].append(elapsed)
                else:
                    tally.errors.append(f"{kind}: {call.content}")

        async with anyio.create_task_group() as group:
            for index in range(in_flight):
                group.start_soon(worker, index)
        rss = await anyio.to_thread.run_sync(server_rss_mib, state)
        for sid in everyone:
            destroyed = await client.call_tool("destroy_sandbox", {"session_id": sid})
            if destroyed.is_error:
                tally.errors.append(f"destroy_sandbox: {destroyed.content}")
    return rss


def exec_floor(engine: DockerEngine, in_flight: int, seconds: float) -> dict[str, Any]:
    """Bare ``docker exec node -e "console.log('hello')"``, ``in_flight`` at once, each in a container of its own."""
    profile = select_profile(create_plugin_manager(), None)
    runtime = engine.runtime_in_force()
    image = engine.image_facts(profile.image_spec().tag)
    if image is None:
        sys.exit("build the image first: uv run code-sandbox build-image --offline")
    node = runtime_argv(engine, profile, ["/usr/local/bin/node"])
    env = {**ENVIRONMENT, **fixed_environment(user_space_kernel=runtime.user_space_kernel)}
    api = engine.client()
    labels = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(time.time()) + 600)}
    watchdog = runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), "600"])
    request = ContainerRequest(image_id=image.id, command=watchdog, labels=labels, apparmor=False)
    architecture = engine.daemon_facts().architecture
    containers: list[str] = []
    samples: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    try:
        for _ in range(in_flight):
            containers.append(raw_create_and_start(api, request, runtime, architecture))

        def worker(container_id: str) -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                exec_id = api.exec_create(container_id, [*node, "-e", HELLO], user=user_of(PROBE_UID), environment=env)
                output = api.exec_start(exec_id["Id"])
                elapsed = time.perf_counter() - started
                with lock:
                    (samples.append(elapsed) if output == b"hello\n" else errors.append(repr(output[:80])))

        threads = [threading.Thread(target=worker, args=(c,)) for c in containers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for container_id in containers:
            with contextlib.suppress(Exception):
                api.remove_container(container_id, force=True)
    return {"execs_per_second": len(samples) / seconds, "exec": percentiles(samples), "errors": len(errors)}


def left_behind(engine: DockerEngine, tag: str) -> int:
    """Containers of this benchmark's tag still there a moment after every server has ended."""
    end = time.monotonic() + 20
    while (left := len(engine.list_containers(f"{LABEL_TAG}={tag}"))) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 s a phase instead of 60")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of load a phase")
    parser.add_argument("--sessions", type=int, default=100, help="live sandboxes in all (default 100)")
    parser.add_argument("--in-flight", type=int, default=8, help="requests in flight in all (default 8)")
    parser.add_argument("--json", type=Path, default=RESULTS / "load.json", help="where to write the results")
    options = parser.parse_args()
    seconds = options.seconds or (20.0 if options.quick else 60.0)
    engine = DockerEngine.for_settings(load_settings())
    tag = f"bench-load-{secrets.token_hex(4)}"
    report: dict[str, Any] = {"seconds": seconds, "sessions": options.sessions, "in_flight": options.in_flight}
    print(
        f"load: {options.sessions} sandboxes, {options.in_flight} requests in flight, {seconds:.0f} s a phase",
        flush=True,
    )

    report["floor"] = exec_floor(engine, options.in_flight, seconds)
    with tempfile.TemporaryDirectory(prefix="code-sandbox-load-") as root:
        tally = Tally()
        rss = anyio.run(one_server, options.sessions, options.in_flight, seconds, Path(root) / "one", tag, tally)
        report["one_server"] = {**tally.summary(seconds), "server_rss_mib": [rss]}

        tally = Tally()
        rsses: list[float] = []

        async def four() -> None:
            async with anyio.create_task_group() as group:
                for index in range(4):

                    async def serve(index: int = index) -> None:
                        rsses.append(
                            await one_server(
                                options.sessions // 4, options.in_flight // 4, seconds, Path(root) / f"four-{index}",
                                tag, tally,
                            )
                        )  # fmt: skip

                    group.start_soon(serve)

        anyio.run(four)
        report["four_servers"] = {**tally.summary(seconds), "server_rss_mib": rsses}
    report["left_behind"] = left_behind(engine, tag)

    floor_rate = report["floor"]["execs_per_second"]
    lines = [
        f"floor: bare docker exec hello, {options.in_flight} in flight: {floor_rate:.1f}/s, "
        f"p50 {report['floor']['exec']['p50_ms']:.0f} ms, p95 {report['floor']['exec']['p95_ms']:.0f} ms",
    ]
    for name, title in (("one_server", "1 server x 100"), ("four_servers", "4 servers x 25")):
        phase = report[name]
        run, write = phase["run"], phase["write"]
        lines.append(
            f"{title}: {phase['errors']} errors; runs {phase['runs_per_second']:.1f}/s "
            f"({phase['runs_per_second'] / floor_rate:.2f}x the floor's execs); run p50/p95/p99 "
            f"{run['p50_ms']:.0f}/{run['p95_ms']:.0f}/{run['p99_ms']:.0f} ms; 64 KiB write p50/p95/p99 "
            f"{write['p50_ms']:.0f}/{write['p95_ms']:.0f}/{write['p99_ms']:.0f} ms; server RSS at the end "
            + ", ".join(f"{value:.0f}" for value in phase["server_rss_mib"])
            + " MiB"
        )
    lines.append(f"left behind: {report['left_behind']} containers")
    print("\n".join(lines))
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(report, indent=2))
    print(f"results written to {options.json}")
    if report["left_behind"] or report["one_server"]["errors"] or report["four_servers"]["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
