"""Latency and memory of code-sandbox against the raw Docker floor, measured in one run on one machine.

    uv run python bench/run.py            # 30 iterations per figure (about 4 minutes)
    uv run python bench/run.py --quick    # 8 iterations, under a minute

Each figure is reported with its ratio to the floor it is built on: the same Docker operations made directly
with the docker SDK, the same image and the same hardening. Results go to bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import snapshots
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import DockerEngine, build_create_arguments
from code_sandbox.engine import RuntimeFacts
from code_sandbox.hardening import ENVIRONMENT, LABEL_EXPIRES_AT, LABEL_MANAGED, PROBE_UID, ContainerRequest, user_of
from code_sandbox.hardening import environment as fixed_environment
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.sessions import HELPERS_IDLE_SECONDS, REAPER_INTERVAL_SECONDS, Session, SessionManager
from code_sandbox.sandbox.supervision import verify_cleanup
from code_sandbox.sandbox.workspace import write_files
from code_sandbox.settings import Settings, load_settings
from code_sandbox.timeline import PREFIX
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

RESULTS = Path(__file__).parent / "results"
TURN_SECONDS = 0.2
"""The pause before a repeated call: far shorter than a model's turn, long enough for what a call starts ahead."""
SMALL_FILE = [{"path": "index.js", "content": "console.log('hello')"}]
HUNDRED_FILES = [{"path": f"src/f{i:02}.js", "content": "x" * 10240} for i in range(98)]  # + src/ + index.js


def timed(samples: list[float]) -> Callable[[Callable[[], Any]], Any]:
    def run(function: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = function()
        samples.append(time.perf_counter() - started)
        return result

    return run


async def atimed(samples: list[float], awaitable: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await awaitable
    samples.append(time.perf_counter() - started)
    return result


def nearest_rank(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted, non-empty samples, as the sample nearest its rank."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = nearest_rank(ordered, 0.95)
    return {"p50_ms": statistics.median(ordered) * 1000, "p95_ms": p95 * 1000, "n": len(ordered)}


# -- the raw floor -----------------------------------------------------------------------------------------------


def raw_floor(engine: DockerEngine, iterations: int, image_id: str, watchdog: list[str], runtime: RuntimeFacts
              ) -> dict[str, list[float]]:  # fmt: skip
    api = engine.client()  # the SDK's client, reaching the engine as every figure does (DOCKER_HOST, TLS, context)
    samples: dict[str, list[float]] = {
        "create+start": [], "exec node -e 0": [], "remove": [], "stream 1 MiB": [], "create+exec+remove": []
    }  # fmt: skip
    labels = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(time.time()) + 600)}
    request = ContainerRequest(image_id=image_id, command=watchdog, labels=labels, apparmor=False)
    if engine.daemon_facts().podman:
        # Podman cannot take the tmpfs options as Docker does: the floor's container is made (with its two tmpfs
        # volumes) and removed the one way Podman allows, the adapter's.
        def create() -> str:
            return engine.create_container(request)

        def remove(container_id: str) -> None:
            engine.remove_container(container_id)
    else:

        def create() -> str:
            return raw_create_and_start(api, request, runtime, engine.daemon_facts().architecture)

        def remove(container_id: str) -> None:
            api.remove_container(container_id, force=True)

    for _ in range(iterations):
        container_id = timed(samples["create+start"])(create)
        timed(samples["exec node -e 0"])(lambda: _raw_exec_node(api, container_id))  # noqa: B023
        timed(samples["stream 1 MiB"])(lambda: _raw_stream(api, container_id))  # noqa: B023
        timed(samples["remove"])(lambda: remove(container_id))  # noqa: B023
        # What a one-shot is made of by hand: a container, one exec, removal, one after another.
        started = time.perf_counter()
        container_id = create()
        _raw_exec_node(api, container_id)
        remove(container_id)
        samples["create+exec+remove"].append(time.perf_counter() - started)
    return samples


def raw_create_and_start(api: Any, request: ContainerRequest, runtime: RuntimeFacts, architecture: str) -> str:
    create_kwargs, host_kwargs = build_create_arguments(request, start=True, runtime=runtime, architecture=architecture)
    container = api.create_container(**create_kwargs, host_config=api.create_host_config(**host_kwargs))
    api.start(container["Id"])
    return str(container["Id"])


RUNTIME = ["/usr/local/bin/node"]
"""The runtime binary the floor execs: under gVisor, its readable copy (set in ``main``)."""
ENV: dict[str, str] = dict(ENVIRONMENT)
GVISOR = [False]
EVALUATES = [True]
"""Whether the trust model in force keeps an evaluation context (all but gVisor's engine-only one)."""
"""Whether the runtime in force is gVisor (set in ``main``)."""


def _raw_exec_node(api: Any, container_id: str) -> None:
    exec_id = api.exec_create(container_id, [*RUNTIME, "-e", "0"], user=user_of(PROBE_UID), environment=ENV)["Id"]
    api.exec_start(exec_id)
    if api.exec_inspect(exec_id)["ExitCode"] != 0:
        raise RuntimeError("node -e 0 failed in the raw floor")


def _raw_stream(api: Any, container_id: str) -> None:
    """The same bytes write_files sends for 100 x 10 KiB, through one exec's stdin, read by node."""
    payload = b"".join(f["content"].encode() for f in HUNDRED_FILES) + SMALL_FILE[0]["content"].encode()
    # Read to a known length, as the helpers do (a half-close does not cross every transport: TLS, ssh).
    want = 4 + len(payload)
    source = (f"let n=0;process.stdin.on('data',c=>{{n+=c.length;if(n>={want}){{process.stdout.write(String(n));"
              "process.exit(0)}})")  # fmt: skip
    exec_id = api.exec_create(
        container_id,
        [*RUNTIME, "-e", source],
        stdin=True,
        user=user_of(PROBE_UID),
        environment=ENV,
    )["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    raw.sendall(struct.pack(">I", 0) + payload)
    while raw.recv(65536):
        pass
    raw.close()
    sock.close()


# -- the core API and the MCP surface ----------------------------------------------------------------------------


async def core_api(iterations: int, warm_pool: int) -> dict[str, list[float]]:
    settings = Settings(max_sessions=3, warm_pool=warm_pool, runtime=load_settings().runtime)
    profile = select_profile(create_plugin_manager(), None)
    manager = SessionManager(DockerEngine.for_settings(settings), profile, settings)
    samples: dict[str, list[float]] = {
        "create": [], "run hello": [], "run hello again": [], "cleanup survey": [], "destroy": []
    }  # fmt: skip
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(manager.pool.run)
            await manager.create()  # the first create verifies the image once
            for _ in range(iterations):
                await manager.pool.wait_for_pool()
                session = await atimed(samples["create"], manager.create())
                await write_files(manager, session.id, [("index.js", "console.log('hello')")], overwrite=False)
                await atimed(
                    samples["run hello"], run_entrypoint(manager, session.id, "index.js", [], timeout_seconds=10)
                )
                await anyio.sleep(TURN_SECONDS)  # the next run of an iterating client, a turn later
                await atimed(
                    samples["run hello again"], run_entrypoint(manager, session.id, "index.js", [], timeout_seconds=10)
                )
                # A survey started and read at once, as after a cancel; a run starts its own beside the program.
                async with manager.channel(session.id) as channel:
                    await atimed(samples["cleanup survey"], verify_cleanup(channel))
                # What destroy_sandbox waits for (the removal is confirmed after its reply).
                stopped = await atimed(samples["destroy"], manager.stop(session.id))
                await manager.remove_quietly(stopped)
            group.cancel_scope.cancel()
    finally:
        await manager.shutdown()
    return samples


def _server_params(warm_pool: int, state: Path | None = None, *, verbose: bool = False) -> StdioServerParameters:
    command = shutil.which("code-sandbox") or sys.exit("run with `uv run` so that code-sandbox is on PATH")
    env = {**os.environ, "CODE_SANDBOX_WARM_POOL": str(warm_pool), "CODE_SANDBOX_AUDIT_ENABLED": "false"}
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    return StdioServerParameters(command=command, args=["serve", *(["--verbose"] if verbose else [])], env=env)


async def mcp_surface(iterations: int, warm_pool: int) -> dict[str, list[float]]:
    evaluates = EVALUATES[0]  # refused under gVisor's engine-only trust model
    names = ["create_sandbox", "write_files 1 small", "write_files 100 x 10 KiB", "run_javascript hello", "read_file",
             "run_javascript hello again",
             *(["evaluate_javascript first", "evaluate_javascript follow-up"] if evaluates else []),
             "destroy_sandbox", "execute_javascript"]  # fmt: skip
    samples: dict[str, list[float]] = {name: [] for name in names}
    async with stdio_client(_server_params(warm_pool)) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        first: dict[str, Any] = (await client.call_tool("create_sandbox", {})).structured_content or {}
        await client.call_tool("destroy_sandbox", {"session_id": first["session_id"]})
        for _ in range(iterations):
            await anyio.sleep(1.0 if warm_pool else 0)  # let the pool refill, as between a model's turns
            created = await atimed(samples["create_sandbox"], client.call_tool("create_sandbox", {}))
            sid = created.structured_content["session_id"]
            await atimed(
                samples["write_files 1 small"],
                client.call_tool("write_files", {"session_id": sid, "files": SMALL_FILE}),
            )
            await atimed(
                samples["write_files 100 x 10 KiB"],
                client.call_tool("write_files", {"session_id": sid, "files": HUNDRED_FILES}),
            )
            run = await atimed(
                samples["run_javascript hello"],
                client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "index.js"}),
            )
            if run.structured_content["stdout"] != "hello\n":
                raise RuntimeError("run_javascript did not print hello")
            await atimed(samples["read_file"], client.call_tool("read_file", {"session_id": sid, "path": "index.js"}))
            await anyio.sleep(TURN_SECONDS)
            again = await atimed(
                samples["run_javascript hello again"],
                client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "index.js"}),
            )
            if again.structured_content["stdout"] != "hello\n":
                raise RuntimeError("run_javascript did not print hello the second time")
            if evaluates:
                evaluate = {"session_id": sid, "code": "const data = [1, 2, 3]"}
                await atimed(samples["evaluate_javascript first"], client.call_tool("evaluate_javascript", evaluate))
                evaluate = {"session_id": sid, "code": "data.reduce((a, b) => a + b)"}
                follow_up = await atimed(
                    samples["evaluate_javascript follow-up"], client.call_tool("evaluate_javascript", evaluate)
                )
                if follow_up.structured_content["value"] != "6":
                    raise RuntimeError("the follow-up evaluation did not see the first one's data")
            await atimed(samples["destroy_sandbox"], client.call_tool("destroy_sandbox", {"session_id": sid}))
            await anyio.sleep(1.0 if warm_pool else 0)
            await atimed(
                samples["execute_javascript"],
                client.call_tool("execute_javascript", {"files": SMALL_FILE, "entrypoint": "index.js"}),
            )
    return samples


async def cold_first_result(iterations: int, state: Path) -> dict[str, list[float]]:
    """What a client that launches the server and calls at once waits for: spawn to the ``initialize`` reply, and
    spawn to the first ``execute_javascript`` result; and, from the server's start-up milestones (``--verbose``,
    :mod:`code_sandbox.timeline`), when each of its steps was done. The state directory is the one an earlier server
    of this machine used (image verification recorded), as for every launch but the very first."""
    samples: dict[str, list[float]] = {
        "spawn to initialize": [], "initialize to tools/list": [], "spawn to first execute_javascript": []
    }  # fmt: skip
    arguments = {"files": SMALL_FILE, "entrypoint": "index.js"}
    for _ in range(iterations):
        with tempfile.TemporaryFile("w+") as log:
            spawned, started = time.monotonic(), time.perf_counter()
            params = _server_params(1, state, verbose=True)
            async with stdio_client(params, errlog=log) as (read, write), ClientSession(read, write) as client:
                await client.initialize()
                initialized = time.perf_counter()
                samples["spawn to initialize"].append(initialized - started)
                await client.list_tools()  # what Codex needs before its model's first turn, about a second in
                samples["initialize to tools/list"].append(time.perf_counter() - initialized)
                result = await client.call_tool("execute_javascript", arguments)
                samples["spawn to first execute_javascript"].append(time.perf_counter() - started)
                if result.is_error:
                    raise RuntimeError("execute_javascript failed in the cold-path benchmark")
            log.seek(0)
            for line in log:
                if PREFIX in line:
                    name, at = line.split(PREFIX, 1)[1].rsplit(" at monotonic ", 1)
                    samples.setdefault(f"milestone: {name.strip()}", []).append(float(at) - spawned)
    return samples


def sdk_import_ms() -> float:
    """What importing the MCP SDK's server costs alone (``-X importtime``, cumulative, in a fresh interpreter)."""
    completed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import mcp.server.stdio, mcp.server"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    total = 0
    for line in completed.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if len(fields) == 3 and fields[2].strip().startswith("mcp") and not fields[2].startswith("  "):
            total += int(fields[1])  # a top-level import of the SDK's: its cumulative microseconds
    return total / 1000


async def server_memory_and_startup(calls: int) -> dict[str, float]:
    started = time.perf_counter()
    async with stdio_client(_server_params(1)) as (read, write), ClientSession(read, write) as client:
        await client.initialize()
        startup = time.perf_counter() - started
        sid = (await client.call_tool("create_sandbox", {})).structured_content["session_id"]
        await client.call_tool("write_files", {"session_id": sid, "files": SMALL_FILE})
        for index in range(calls):
            tool = ("list_files", "read_file", "run_javascript")[index % 3]
            arguments = {"session_id": sid, "path": "index.js", "entrypoint": "index.js"}
            allowed = {"list_files": ["session_id"], "read_file": ["session_id", "path"],
                       "run_javascript": ["session_id", "entrypoint"]}[tool]  # fmt: skip
            await client.call_tool(tool, {k: arguments[k] for k in allowed})
        rss_kib = server_rss_kib()
        await client.call_tool("destroy_sandbox", {"session_id": sid})
    return {"startup_to_initialize_ms": startup * 1000, "rss_after_calls_mib": rss_kib / 1024, "calls": calls}


def server_rss_kib(state: Path | None = None) -> int:
    """The RSS of the running ``code-sandbox serve``; with ``state``, of the one whose state directory that is (told
    apart by its environment, where several run side by side)."""
    marker = f"XDG_STATE_HOME={state}".encode()
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            serving = pid.isdigit() and b"code-sandbox\x00serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
            if serving and (state is None or marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\x00")):
                status = Path(f"/proc/{pid}/status").read_text()
                return int(status.split("VmRSS:")[1].split()[0])
    raise RuntimeError("the server process was not found")


# -- density: proportional set size ------------------------------------------------------------------------------

ROLES = (
    ("docker-init", "docker-init"), ("watchdog.mjs", "watchdog"), ("--channel", "channel"),
    ("--supervise", "supervisor"), ("start.mjs", "next run"), ("setInterval", "idle node"),
)  # fmt: skip
"""A process's role from its command line, the first that matches (docker-init's names the watchdog it starts)."""


def container_memory(api: Any, container_id: str) -> list[dict[str, Any]]:
    """Every process of a container's memory cgroup, as the host sees it (smaps_rollup): pid, role, PSS (anonymous and
    file-backed) in KiB. Read on the engine's host: this benchmark runs there."""
    pid = api.inspect_container(container_id)["State"]["Pid"]
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    path = next((line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory"), None)
    procs = (
        Path(f"/sys/fs/cgroup/memory{path}/cgroup.procs")
        if path
        else Path(f"/sys/fs/cgroup{lines[0].split(':', 2)[2]}/cgroup.procs")
    )
    rows: list[dict[str, Any]] = []
    for member in procs.read_text().split():
        with contextlib.suppress(OSError):
            fields: dict[str, int] = {}
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines()[1:]:
                name, value = line.split(":", 1)
                fields[name] = int(value.split()[0])
            cmdline = Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            role = next((role for key, role in ROLES if key in cmdline), cmdline.split(" ", 1)[0])
            rows.append({"pid": int(member), "role": role, "pss_kib": fields["Pss"],
                         "anon_kib": fields.get("Pss_Anon", 0), "file_kib": fields.get("Pss_File", 0)})  # fmt: skip
    return rows


async def density(count: int, image_id: str, runtime: RuntimeFacts, engine: DockerEngine) -> dict[str, Any]:
    """The memory of ``count`` used sandboxes (each: created, one file written, one hello run) against as many floor
    containers (one idle node, the same image and hardening), all alive at once so that the pages they share are
    shared alike: right after their last call, and once idle (:data:`code_sandbox.sandbox.sessions.HELPERS_IDLE_SECONDS`
    after it, when a sandbox lets go of the helpers it holds between calls)."""
    api = engine.client()
    labels = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: str(int(time.time()) + 600)}
    idle_node = [*RUNTIME, "-e", "setInterval(() => {}, 1 << 30)"]
    floor_request = ContainerRequest(image_id=image_id, command=idle_node, labels=labels, apparmor=False)
    architecture = engine.daemon_facts().architecture
    floors: list[str] = []
    settings = Settings(max_sessions=count, warm_pool=0, runtime=load_settings().runtime)
    profile = select_profile(create_plugin_manager(), None)
    manager = SessionManager(DockerEngine.for_settings(settings), profile, settings)
    result: dict[str, Any] = {"sandboxes": count}
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(manager.run_reaper)
            sessions: list[Session] = []
            for _ in range(count):
                floors.append(raw_create_and_start(api, floor_request, runtime, architecture))
                session = await manager.create()
                await write_files(manager, session.id, [("index.js", "console.log('hello')")], overwrite=False)
                await run_entrypoint(manager, session.id, "index.js", [], timeout_seconds=10)
                sessions.append(session)
            await anyio.sleep(2)  # every container's processes settled (the last next-run process booted)
            result["busy"] = [container_memory(api, s.container_id) for s in sessions]
            result["floor"] = [container_memory(api, f) for f in floors]
            await anyio.sleep(HELPERS_IDLE_SECONDS + 2 * REAPER_INTERVAL_SECONDS)
            result["idle"] = [container_memory(api, s.container_id) for s in sessions]
            group.cancel_scope.cancel()
    finally:
        await manager.shutdown()
        for container_id in floors:
            with contextlib.suppress(Exception):
                api.remove_container(container_id, force=True)
    for name in ("busy", "floor", "idle"):
        per_container = [sum(row["pss_kib"] for row in rows) for rows in result[name]]
        result[f"{name}_pss_mib"] = statistics.mean(per_container) / 1024
        result[f"{name}_processes"] = statistics.mean(len(rows) for rows in result[name])
    return result


def holds(rows: list[dict[str, Any]]) -> str:
    """One container's processes: role and PSS in MiB (anonymous + file-backed)."""
    return ", ".join(
        f"{row['role']} {row['pss_kib'] / 1024:.1f} ({row['anon_kib'] / 1024:.1f}+{row['file_kib'] / 1024:.1f})"
        for row in sorted(rows, key=lambda row: -row["pss_kib"])
    )


# -- report ------------------------------------------------------------------------------------------------------

README = Path(__file__).parent.parent / "README.md"
TABLE_START, TABLE_END = "<!-- bench table: bench/run.py --readme -->\n```text\n", "```\n<!-- end of bench table -->"


def write_readme_table(report: list[str]) -> None:
    """Replace the table between README's markers with this run's."""
    text = README.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    README.write_text(text[:start] + "\n".join(report) + "\n" + text[end:])
    print(f"table written to {README.name}")


def snapshot_ratios(cold: dict[str, dict[str, float]], warm: dict[str, dict[str, float]]) -> list[str]:
    """A restore against a plain ``create_sandbox``: against one that starts its container (the pool's default
    restore against a create with the pool off), and against the create of the same setting."""
    restore, plain = "create_sandbox from_snapshot", "create_sandbox"
    lines = [
        "create_sandbox from a snapshot of 10 MiB (pool on) / a plain create_sandbox that starts its container "
        f"(pool off): {warm[restore]['p50_ms'] / cold[plain]['p50_ms']:.2f}x (p50; target 1.5x)"
    ]
    for pool, figures in (("off", cold), ("on", warm)):
        lines.append(
            f"create_sandbox from a snapshot of 10 MiB / a plain create_sandbox, both pool {pool}: "
            f"{figures[restore]['p50_ms'] / figures[plain]['p50_ms']:.2f}x (p50)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 iterations per figure, under a minute")
    parser.add_argument("--iterations", type=int, default=None, help="iterations per figure (default 30)")
    parser.add_argument("--json", type=Path, default=RESULTS / "latest.json", help="where to write the results")
    parser.add_argument("--readme", action="store_true", help="put the table into README.md (its Performance part)")
    parser.add_argument(
        "--runtime",
        default=None,
        help="the engine's container runtime for every figure, floor included (runsc: gVisor)",
    )
    options = parser.parse_args()
    if options.runtime is not None:  # the servers this starts read it too
        os.environ["CODE_SANDBOX_RUNTIME"] = options.runtime
    iterations = options.iterations or (8 if options.quick else 30)

    profile = select_profile(create_plugin_manager(), None)
    engine = DockerEngine.for_settings(load_settings())
    runtime = engine.runtime_in_force()
    GVISOR[0] = runtime.user_space_kernel
    model = runtime.trust_model(jailed_runs=profile.info.jailed_runs, architecture=engine.daemon_facts().architecture)
    EVALUATES[0] = model != "engine-only"
    RUNTIME[:] = runtime_argv(engine, profile, RUNTIME)
    ENV.update(fixed_environment(user_space_kernel=runtime.user_space_kernel))
    image = engine.image_facts(profile.image_spec().tag)
    if image is None:
        sys.exit("build the image first: uv run code-sandbox build-image --offline")
    watchdog = runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), "600"])

    print(
        f"code-sandbox benchmark: {iterations} iterations, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{engine.daemon_facts().product} at {engine.address.described()}, runtime {runtime.name}",
        flush=True,
    )
    floor = {k: summary(v) for k, v in raw_floor(engine, iterations, image.id, watchdog, runtime).items()}
    core_cold = {k: summary(v) for k, v in anyio.run(core_api, iterations, 0).items()}
    core_warm = {k: summary(v) for k, v in anyio.run(core_api, iterations, 1).items()}
    mcp_cold = {k: summary(v) for k, v in anyio.run(mcp_surface, iterations, 0).items()}
    mcp_warm = {k: summary(v) for k, v in anyio.run(mcp_surface, iterations, 1).items()}
    server = anyio.run(server_memory_and_startup, 60 if options.quick else 200)
    memory = anyio.run(density, 10 if options.quick else 20, image.id, runtime, engine) if not GVISOR[0] else None
    cp_floor = summary(snapshots.docker_cp_floor(engine, image.id, iterations))
    snap_cold = {k: summary(v) for k, v in anyio.run(snapshots.through_mcp, iterations, 0).items()}
    snap_warm = {k: summary(v) for k, v in anyio.run(snapshots.through_mcp, iterations, 1).items()}
    with tempfile.TemporaryDirectory(prefix="code-sandbox-bench-") as state:
        anyio.run(cold_first_result, 1, Path(state))  # the machine's first launch: it records the verification
        cold = {k: summary(v) for k, v in anyio.run(cold_first_result, 3 if options.quick else 10, Path(state)).items()}

    rows: list[tuple[str, dict[str, float], str | None, float | None]] = []
    floor[snapshots.CP_FLOOR] = cp_floor
    for name, stats in floor.items():
        rows.append((f"raw: {name}", stats, None, None))
    ratios = {
        "core: create (pool off)": (core_cold["create"], "create+start"),
        "core: create (pool on)": (core_warm["create"], "create+start"),
        "core: run hello": (core_cold["run hello"], "exec node -e 0"),
        "core: run hello again": (core_cold["run hello again"], "exec node -e 0"),
        "core: cleanup survey alone": (core_cold["cleanup survey"], "exec node -e 0"),
        "core: destroy": (core_cold["destroy"], "remove"),
        "mcp: create_sandbox (pool off)": (mcp_cold["create_sandbox"], "create+start"),
        "mcp: create_sandbox (pool on)": (mcp_warm["create_sandbox"], "create+start"),
        "mcp: write_files 1 small (pool off)": (mcp_cold["write_files 1 small"], "exec node -e 0"),
        "mcp: write_files 1 small (pool on)": (mcp_warm["write_files 1 small"], "exec node -e 0"),
        "mcp: write_files 100 x 10 KiB (pool off)": (mcp_cold["write_files 100 x 10 KiB"], "stream 1 MiB"),
        "mcp: write_files 100 x 10 KiB (pool on)": (mcp_warm["write_files 100 x 10 KiB"], "stream 1 MiB"),
        "mcp: run_javascript hello": (mcp_cold["run_javascript hello"], "exec node -e 0"),
        "mcp: run_javascript hello again": (mcp_cold["run_javascript hello again"], "exec node -e 0"),
        "mcp: read_file": (mcp_cold["read_file"], "exec node -e 0"),
        "mcp: destroy_sandbox": (mcp_cold["destroy_sandbox"], "remove"),
        "mcp: execute_javascript (pool on)": (mcp_warm["execute_javascript"], "create+exec+remove"),
        "cold: spawn to first execute_javascript": (cold["spawn to first execute_javascript"], "create+exec+remove"),
    }
    for pool, figures in (("off", snap_cold), ("on", snap_warm)):
        ratios[f"snapshot_sandbox 10 MiB (pool {pool})"] = (
            figures["snapshot_sandbox"],
            "docker cp 1,000 files / 10 MiB",
        )
        ratios[f"create_sandbox from it (pool {pool})"] = (figures["create_sandbox from_snapshot"], "create+start")
        ratios[f"create_sandbox beside it (pool {pool})"] = (figures["create_sandbox"], "create+start")
    if EVALUATES[0]:
        ratios["mcp: evaluate_javascript first"] = (mcp_cold["evaluate_javascript first"], "exec node -e 0")
        ratios["mcp: evaluate_javascript follow-up"] = (mcp_cold["evaluate_javascript follow-up"], "exec node -e 0")
    for name, (stats, floor_name) in ratios.items():
        rows.append((name, stats, floor_name, stats["p50_ms"] / floor[floor_name]["p50_ms"]))

    report = [f"{'figure':<42} {'p50 ms':>8} {'p95 ms':>8}  ratio to floor (p50)"]
    for name, stats, floor_name, ratio in rows:
        tail = f"{ratio:5.2f}x {floor_name}" if ratio is not None else "(floor)"
        report.append(f"{name:<42} {stats['p50_ms']:8.1f} {stats['p95_ms']:8.1f}  {tail}")
    follow_up = (
        mcp_cold["evaluate_javascript follow-up"]["p50_ms"] / mcp_cold["run_javascript hello"]["p50_ms"]
        if EVALUATES[0] else None
    )  # fmt: skip
    report += [
        "",
        *snapshot_ratios(snap_cold, snap_warm),
        f"trust model: {model}",
        *([f"evaluate_javascript follow-up / run_javascript hello: {follow_up:.2f}x (p50)"] if follow_up else []),
        f"server start-up to initialize reply: {cold['spawn to initialize']['p50_ms']:.0f} ms (p50; target 200 ms)",
        f"initialize reply to tools/list: {cold['initialize to tools/list']['p50_ms']:.0f} ms (p50; target 50 ms)",
        f"cold start, ms after spawn (p50; the MCP SDK's import alone: {sdk_import_ms():.0f} ms, -X importtime):",
        *(
            f"  {stats['p50_ms']:6.0f}  {name.removeprefix('milestone: ')}"
            for name, stats in sorted(
                ((n, v) for n, v in cold.items() if n.startswith("milestone: ")), key=lambda item: item[1]["p50_ms"]
            )
        ),
        f"server RSS after {server['calls']:.0f} calls: {server['rss_after_calls_mib']:.1f} MiB",
    ]
    if memory is not None:
        floor_pss = memory["floor_pss_mib"]
        report += [
            f"memory of a used sandbox, PSS ({memory['sandboxes']} of each alive at once; floor: one idle node in a "
            f"container, {floor_pss:.1f} MiB):",
            f"  idle ({HELPERS_IDLE_SECONDS:.0f} s after its last call): {memory['idle_pss_mib']:.1f} MiB, "
            f"{memory['idle_pss_mib'] / floor_pss:.2f}x; {memory['idle_processes']:.0f} processes: "
            f"{holds(memory['idle'][0])}",
            f"  busy (right after a call): {memory['busy_pss_mib']:.1f} MiB, "
            f"{memory['busy_pss_mib'] / floor_pss:.2f}x; {memory['busy_processes']:.0f} processes: "
            f"{holds(memory['busy'][0])}",
        ]
    print("\n" + "\n".join(report))
    if options.readme:
        write_readme_table(report)

    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps({
        "machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "docker": engine.client().version().get("Version")},
        "iterations": iterations, "runtime": runtime.name,
        "floor": floor, "core_pool_off": core_cold, "core_pool_on": core_warm,
        "mcp_pool_off": mcp_cold, "mcp_pool_on": mcp_warm, "server": server, "cold": cold, "memory": memory,
        "snapshots_pool_off": snap_cold, "snapshots_pool_on": snap_warm,
        "ratios": {name: ratio for name, _s, _f, ratio in rows if ratio is not None},
        "evaluate_follow_up_to_run_hello": follow_up,
    }, indent=2))  # fmt: skip
    print(f"results written to {options.json}")


if __name__ == "__main__":
    main()
