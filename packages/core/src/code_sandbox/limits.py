"""Every limit a client can run into, once: enforced from here, and written into tool text, schemas and the CLI
from :data:`WORDS`, so that what a model is told cannot drift from what is enforced."""

from __future__ import annotations

MiB = 1024 * 1024

# The container (see hardening.Hardening, which takes its defaults from here).
MEMORY_BYTES = 512 * MiB
CPUS = 1
PROCESSES = 128
WORKSPACE_BYTES = 64 * MiB
SCRATCH_BYTES = 64 * MiB
"""The workspace tmpfs; the file helper refuses writes past it, counting file bytes."""

# What the engine's memory must back (CODE_SANDBOX_MAX_SESSIONS is refused past it).
MAX_SESSIONS = 100
SANDBOX_BACKING_BYTES = 64 * MiB
"""Each sandbox that may exist: its idle helpers (bench/run.py measures them), its kernel objects and page tables,
with room to spare."""
SERVER_BACKING_BYTES = 256 * MiB
"""The server itself and the engine's own share, on top of one sandbox at its full :data:`MEMORY_BYTES`."""


def sessions_backed(memory_bytes: int) -> int:
    """How many sandboxes an engine host with ``memory_bytes`` of memory backs: each at its idle cost, and any one of
    them at its full memory limit besides (capped at :data:`MAX_SESSIONS`)."""
    spare = memory_bytes - MEMORY_BYTES - SERVER_BACKING_BYTES
    return max(0, min(MAX_SESSIONS, spare // SANDBOX_BACKING_BYTES))


# The file tools.
MAX_PATH_BYTES = 1024
"""A workspace path's length in UTF-8 bytes; the tools' schemas state it in characters, as many as its bytes at most."""
MAX_PATH_DEPTH = 20
"""Components of a workspace path."""
MAX_FILE_BYTES = 2 * MiB
MAX_CODE_CHARS = 512 * 1024
"""The code of one evaluation, in characters: a request frame of it stays under the runner's 4 MiB whatever it holds."""
MAX_VALUE_CHARS = 64 * 1024
"""An evaluation's rendered value, in characters (the context cuts it there)."""
MAX_REQUEST_BYTES = 8 * MiB
MAX_ENTRIES = 100
"""Files and directories in a workspace, both counted."""
MAX_FILES_PER_CALL = 100
MAX_LIST_ENTRIES = 1000
MAX_LIST_DEPTH = 10
DEFAULT_READ_BYTES = 65536

# Runs.
OUTPUT_CAP_BYTES = MiB
"""Per stream; a program that writes more is killed and its output cut here."""
MAX_ARGUMENTS = 32
MAX_ARGUMENT_BYTES = 4096


def size(n_bytes: int) -> str:
    """A byte count as prose: ``2 MiB``, ``64 KiB`` or ``100 bytes``."""
    for unit, name in ((MiB, "MiB"), (1024, "KiB")):
        if n_bytes >= unit and n_bytes % unit == 0:
            return f"{n_bytes // unit} {name}"
    return f"{n_bytes} bytes"


WORDS: dict[str, str] = {
    "memory": size(MEMORY_BYTES),
    "cpus": f"{CPUS} CPU" if CPUS == 1 else f"{CPUS} CPUs",
    "processes": str(PROCESSES),
    "workspace": size(WORKSPACE_BYTES),
    "scratch": size(SCRATCH_BYTES),
    "file_max": size(MAX_FILE_BYTES),
    "request_max": size(MAX_REQUEST_BYTES),
    "entries": str(MAX_ENTRIES),
    "files_per_call": str(MAX_FILES_PER_CALL),
    "list_max": str(MAX_LIST_ENTRIES),
    "output_cap": size(OUTPUT_CAP_BYTES),
    "max_arguments": str(MAX_ARGUMENTS),
    "argument_max": size(MAX_ARGUMENT_BYTES),
    "code_max": size(MAX_CODE_CHARS),
    "value_max": size(MAX_VALUE_CHARS),
}
"""The limits as they are written in text: ``{memory}``, ``{output_cap}`` and the rest in any tool text, including
a profile's ``run_tool_description``."""
