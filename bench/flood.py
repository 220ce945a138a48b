"""What a stdout write flood in one sandbox costs the host and a neighbour, read from the host.

One sandbox's program writes one byte at a time to stdout (``--writes`` in all, evenly over ``--seconds``) while a
second sandbox reads a file again and again. The same neighbour loop also runs for as long with no flood. Reported:
the host CPU of the engine (``dockerd``, ``containerd``, its shims) and of this process (the server: sessions,
channels, the audit of each call) per second of flood, above the quiet window's; and the neighbour's ``read_file``
p50 in both windows. gVisor's sandboxes run their kernel inside the container's cgroup: that CPU is the sandbox's own
and is not counted here.

    uv run python bench/flood.py --runtime runsc
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import anyio
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.sessions import SessionManager
from code_sandbox.sandbox.workspace import read_file, write_files
from code_sandbox.settings import Settings, load_settings

ENGINE_PROCESSES = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2")
TICKS = os.sysconf("SC_CLK_TCK")

FLOOD = """
const fs = require('fs');
const writes = Number(process.argv[2]), seconds = Number(process.argv[3]);
const start = Date.now();
for (let n = 0; n < writes; n++) {
  fs.writeSync(1, 'x');
  if (n % 1000 === 999) {  // keep to the pace: this many writes by now
    const due = start + (n * seconds * 1000) / writes;
    while (Date.now() < due) {}
  }
}
"""


def host_cpu_seconds() -> float:
    """CPU time of the engine's processes and of this one, on the host, so far."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name in ENGINE_PROCESSES or name.startswith("containerd-shim") or int(pid) == os.getpid():
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


async def neighbour(manager: SessionManager, session_id: str, until: float, samples: list[float]) -> None:
    while time.monotonic() < until:
        started = time.monotonic()
        await read_file(manager, session_id, "note.txt", max_bytes=1024)
        samples.append((time.monotonic() - started) * 1000)
        await anyio.sleep(0.05)


async def main(options: argparse.Namespace) -> None:
    settings = load_settings()
    profile = select_profile(create_plugin_manager(), None)
    engine = DockerEngine.for_settings(settings)
    limits = Settings(max_sessions=3, default_timeout=options.seconds + 60, max_timeout=options.seconds + 60)
    manager = SessionManager(engine, profile, limits)
    try:
        flooder, reader = await manager.create(), await manager.create()
        await write_files(manager, flooder.id, [("flood.js", FLOOD)], overwrite=True)
        await write_files(manager, reader.id, [("note.txt", "a neighbour's file\n")], overwrite=True)
        quiet: list[float] = []
        before = host_cpu_seconds()
        await neighbour(manager, reader.id, time.monotonic() + options.seconds, quiet)
        quiet_cpu = host_cpu_seconds() - before
        loud: list[float] = []
        result: list[RunResult] = []
        before = host_cpu_seconds()
        started = time.monotonic()
        async with anyio.create_task_group() as group:

            async def flood() -> None:
                args = [str(options.writes), str(options.seconds)]
                timeout = limits.max_timeout
                result.append(await run_entrypoint(manager, flooder.id, "flood.js", args, timeout_seconds=timeout))

            group.start_soon(flood)
            await neighbour(manager, reader.id, started + options.seconds, loud)
        flood_seconds = time.monotonic() - started
        flood_cpu = host_cpu_seconds() - before
    finally:
        await manager.shutdown()
    run = result[0]
    per_second = max(flood_cpu - quiet_cpu * flood_seconds / options.seconds, 0.0) / flood_seconds
    print(f"runtime {engine.runtime_in_force().name}; {options.writes} one-byte writes over {options.seconds} s")
    print(f"flood: {len(run.stdout_raw)} bytes kept, {run.termination_reason}, {flood_seconds:.1f} s")
    print(
        f"host CPU of the engine and the server: {flood_cpu:.2f} s in the flood, {quiet_cpu:.2f} s quiet; "
        f"{per_second:.3f} s per second of flood above quiet (target <= 0.3)"
    )
    quiet_p50, loud_p50 = statistics.median(quiet), statistics.median(loud)
    print(
        f"neighbour read_file p50: {quiet_p50:.1f} ms quiet, {loud_p50:.1f} ms in the flood: "
        f"{loud_p50 / quiet_p50:.2f}x (target <= 2x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="What a stdout write flood in one sandbox costs the host")
    parser.add_argument("--runtime", default=None, help="the engine's container runtime (runsc: gVisor)")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--writes", type=int, default=600_000)
    parsed = parser.parse_args()
    if parsed.runtime is not None:
        os.environ["CODE_SANDBOX_RUNTIME"] = parsed.runtime
    anyio.run(main, parsed)
