"""What a client's answers cost the server: the largest JSON-RPC line and the server's peak memory for concurrent runs
at the output cap, and ``tools/list`` latency while long runs hold the server.

    uv run python bench/answers.py                 # three concurrent 2 MiB runs (control bytes), 40 long runs
    uv run python bench/answers.py --long-runs 0   # the first part alone

The server is driven with raw JSON-RPC lines over its stdio, so every line it writes is measured as written. The
peak RSS is the kernel's high-water mark of the server process (``VmHWM``), against its RSS once it has answered a
first run. Results go to bench/results/answers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
FLOOD = (
    "const chunk = Buffer.alloc(64 * 1024, 1);\n"  # a control byte (0x01): the worst case for JSON escaping
    "for (let i = 0; i < 16; i++) { process.stdout.write(chunk); process.stderr.write(chunk); }\n"
)
"""1 MiB on stdout and 1 MiB on stderr: the output caps, exactly, in control bytes."""
SLEEPER = "setTimeout(() => console.log('done'), 30000);\n"


class Server:
    """``code-sandbox serve`` over raw stdio: requests by id, answers matched by id, every line's length kept."""

    def __init__(self, env: dict[str, str]) -> None:
        command = shutil.which("code-sandbox") or sys.exit("run with `uv run` so that code-sandbox is on PATH")
        self.process = subprocess.Popen([command, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        if self.process.stdin is None or self.process.stdout is None:
            raise RuntimeError("the server's pipes were not made")
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.longest = 0
        self._next = 0
        self._answers: dict[int, Any] = {}
        self._arrived = threading.Condition()
        self._writing = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.stdout:
            message = json.loads(line)
            with self._arrived:
                self.longest = max(self.longest, len(line))
                if "id" in message:
                    self._answers[message["id"]] = message
                    self._arrived.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *, notify: bool = False) -> int:
        with self._writing:
            self._next += 1
            message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
            if not notify:
                message["id"] = self._next
            self.stdin.write(json.dumps(message).encode() + b"\n")
            self.stdin.flush()
            return self._next

    def wait(self, request_id: int, timeout: float = 120) -> Any:
        with self._arrived:
            if not self._arrived.wait_for(lambda: request_id in self._answers, timeout):
                raise TimeoutError(f"no answer to request {request_id}")
            return self._answers.pop(request_id)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 120) -> Any:
        return self.wait(self.send(method, params), timeout)

    def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        answer = self.call("tools/call", {"name": name, "arguments": arguments})
        return answer["result"]

    def memory_kib(self, field: str) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(status.split(f"{field}:")[1].split()[0])

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=60)


def start(max_sessions: int) -> Server:
    env = {**os.environ, "CODE_SANDBOX_MAX_SESSIONS": str(max_sessions), "CODE_SANDBOX_WARM_POOL": "0",
           "CODE_SANDBOX_AUDIT_ENABLED": "false"}  # fmt: skip
    server = Server(env)
    server.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "bench", "version": "0"}})  # fmt: skip
    server.send("notifications/initialized", notify=True)
    return server


def session(server: Server, source: str) -> str:
    sid = server.tool("create_sandbox", {})["structuredContent"]["session_id"]
    server.tool("write_files", {"session_id": sid, "files": [{"path": "main.js", "content": source}]})
    return sid


def floods(runs: int) -> dict[str, Any]:
    server = start(runs + 1)
    try:
        sids = [session(server, FLOOD) for _ in range(runs)]
        warm = session(server, "console.log('hello')")
        server.tool("run_javascript", {"session_id": warm, "entrypoint": "main.js"})  # every code path loaded once
        server.tool("destroy_sandbox", {"session_id": warm})
        server.longest = 0
        before = server.memory_kib("VmRSS")
        Path(f"/proc/{server.process.pid}/clear_refs").write_text("5")  # VmHWM from here on
        ids = [server.send("tools/call", {"name": "run_javascript", "arguments": {"session_id": sid,
                                                                                  "entrypoint": "main.js"}})
               for sid in sids]  # fmt: skip
        answers = [server.wait(request_id) for request_id in ids]
        peak = server.memory_kib("VmHWM")
        for answer in answers:
            result = answer["result"]
            if result.get("isError"):
                raise RuntimeError(f"a flood run failed: {result['content'][0]['text']}")
        return {"runs": runs, "longest_line_bytes": server.longest, "rss_before_kib": before, "peak_rss_kib": peak,
                "rss_growth_mib": round((peak - before) / 1024, 1)}  # fmt: skip
    finally:
        server.close()


def long_runs(count: int) -> dict[str, Any]:
    server = start(count + 1)
    try:
        sids = [session(server, SLEEPER) for _ in range(count)]
        other = session(server, "console.log('hello')")
        ids = [server.send("tools/call", {"name": "run_javascript", "arguments": {"session_id": sid,
                                                                                  "entrypoint": "main.js"}})
               for sid in sids]  # fmt: skip
        time.sleep(3)  # every run started
        started = time.perf_counter()
        server.call("tools/list")
        listed = time.perf_counter() - started
        started = time.perf_counter()
        server.call("ping")
        pinged = time.perf_counter() - started
        started = time.perf_counter()
        hello = server.tool("run_javascript", {"session_id": other, "entrypoint": "main.js"})
        ran = time.perf_counter() - started
        if hello["structuredContent"]["stdout"] != "hello\n":
            raise RuntimeError("the other sandbox's run did not print hello")
        for request_id in ids:
            server.wait(request_id)
        return {"long_runs": count, "tools_list_ms": round(listed * 1000, 1), "ping_ms": round(pinged * 1000, 1),
                "other_run_ms": round(ran * 1000, 1)}  # fmt: skip
    finally:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="concurrent runs at the output cap")
    parser.add_argument("--long-runs", type=int, default=40, help="30-second runs in flight while tools/list is timed")
    options = parser.parse_args()
    report: dict[str, Any] = {"floods": floods(options.runs)}
    if options.long_runs:
        report["long_runs"] = long_runs(options.long_runs)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "answers.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
