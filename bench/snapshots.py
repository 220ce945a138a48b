"""Snapshots against their floors, for ``bench/run.py``: ``snapshot_sandbox`` of a workspace of 1,000 files and
10 MiB against one ``docker cp`` of the same tree to the engine, and ``create_sandbox`` from that snapshot against a
plain ``create_sandbox`` of the same server (pool off, then on).

The servers run under a tag and a state directory of their own, and every snapshot they keep is removed at the end.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.hardening import LABEL_TAG
from code_sandbox.sandbox.snapshot_store import LABEL_SNAPSHOT
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CP_FLOOR = "docker cp 1,000 files / 10 MiB"
FILES = 1000
FILE_BYTES = 10 * 1024 + 485  # 1,000 of them: 10 MiB
TREE_PROGRAM = f"""
const fs = require('fs');
for (let d = 0; d < 10; d++) {{
  fs.mkdirSync(`tree/d${{d}}`, {{ recursive: true }});
  for (let f = 0; f < {FILES // 10}; f++) {{
    fs.writeFileSync(`tree/d${{d}}/f${{f}}.bin`, Buffer.alloc({FILE_BYTES}, d + f));
  }}
}}
"""


def tree_tar() -> bytes:
    """The same tree as the program makes, as the tar ``docker cp`` sends."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for d in range(10):
            entry = tarfile.TarInfo(f"tree/d{d}")
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(entry)
            for f in range(FILES // 10):
                data = bytes([(d + f) % 256]) * FILE_BYTES
                entry = tarfile.TarInfo(f"tree/d{d}/f{f}.bin")
                entry.size, entry.mode = len(data), 0o644
                archive.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


def docker_cp_floor(engine: DockerEngine, image_id: str, iterations: int) -> list[float]:
    """One ``docker cp`` of the tree into a container (made, not started, from the sandbox image) per sample."""
    api = engine.client()
    data = tree_tar()
    samples: list[float] = []
    for _ in range(iterations):
        container = api.create_container(image_id, command=["/nonexistent"], network_disabled=True)["Id"]
        try:
            started = time.perf_counter()
            api.put_archive(container, "/tmp", data)  # noqa: S108 - inside the container
            samples.append(time.perf_counter() - started)
        finally:
            api.remove_container(container, force=True)
    return samples


def _params(warm_pool: int, tag: str, state: Path) -> StdioServerParameters:
    command = shutil.which("code-sandbox") or sys.exit("run with `uv run` so that code-sandbox is on PATH")
    env = {
        **os.environ, "CODE_SANDBOX_WARM_POOL": str(warm_pool), "CODE_SANDBOX_AUDIT_ENABLED": "false",
        "CODE_SANDBOX_TAG": tag, "XDG_STATE_HOME": str(state),
    }  # fmt: skip
    return StdioServerParameters(command=command, args=["serve"], env=env)


async def _timed(samples: list[float], call: Any) -> Any:
    started = time.perf_counter()
    result = await call
    samples.append(time.perf_counter() - started)
    if result.is_error:
        raise RuntimeError(f"a snapshot benchmark call failed: {result.content}")
    return result.structured_content


async def through_mcp(iterations: int, warm_pool: int) -> dict[str, list[float]]:
    """``snapshot_sandbox``, ``create_sandbox`` from it, and a plain ``create_sandbox``, each ``iterations`` times."""
    samples: dict[str, list[float]] = {"snapshot_sandbox": [], "create_sandbox from_snapshot": [], "create_sandbox": []}
    tag = f"bench-{secrets.token_hex(4)}"
    engine = DockerEngine(labels={LABEL_TAG: tag})
    with tempfile.TemporaryDirectory(prefix="code-sandbox-bench-") as state:
        try:
            async with (
                stdio_client(_params(warm_pool, tag, Path(state))) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                source = (await client.call_tool("create_sandbox", {})).structured_content["session_id"]
                program = [{"path": "tree.js", "content": TREE_PROGRAM}]
                await client.call_tool("write_files", {"session_id": source, "files": program})
                made = await client.call_tool("run_javascript", {"session_id": source, "entrypoint": "tree.js"})
                if made.structured_content["exit_code"] != 0:
                    raise RuntimeError("the tree program failed")
                for index in range(iterations):
                    name = f"bench-{index}"
                    saved = await _timed(
                        samples["snapshot_sandbox"],
                        client.call_tool("snapshot_sandbox", {"session_id": source, "name": name}),
                    )
                    if saved["files"] != FILES + 1:
                        raise RuntimeError("the snapshot did not keep the whole tree")
                    await anyio.sleep(1.0 if warm_pool else 0)  # let the pool refill, as between a model's turns
                    restored = await _timed(
                        samples["create_sandbox from_snapshot"],
                        client.call_tool("create_sandbox", {"from_snapshot": name}),
                    )
                    await client.call_tool("destroy_sandbox", {"session_id": restored["session_id"]})
                    await anyio.sleep(1.0 if warm_pool else 0)
                    plain = await _timed(samples["create_sandbox"], client.call_tool("create_sandbox", {}))
                    await client.call_tool("destroy_sandbox", {"session_id": plain["session_id"]})
        finally:
            for stored in engine.list_snapshots(f"{LABEL_TAG}={tag}"):
                if LABEL_SNAPSHOT in stored.labels:
                    engine.remove_snapshot(stored.id)
            engine.close()
    return samples
