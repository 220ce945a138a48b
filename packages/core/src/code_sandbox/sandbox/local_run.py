"""`code-sandbox run`: run a local file or folder in a fresh sandbox of the served profile, without an MCP client.

The files are read into memory and run as the one-shot tool runs its files (:meth:`SandboxService.execute`); output
streams back while the program runs, and the sandbox is removed afterwards whatever happened.
"""

from __future__ import annotations

import stat
from collections.abc import Sequence
from pathlib import Path

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.limits import MAX_FILES_PER_CALL
from code_sandbox.paths import validate_path
from code_sandbox.sandbox.relay import OutputSink
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.service import SandboxService


def collect_files(path: Path, *, ignored: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Read a file, or every file under a folder, as (workspace path, text). Symlinks are refused, not followed.

    :param ignored: folder names not to copy (the profile's dependency caches); hidden entries are never copied.
    """
    root = path if path.is_dir() else path.parent
    candidates = [path] if not path.is_dir() else sorted(_walk(path, ignored))
    files: list[tuple[str, str]] = []
    for candidate in candidates:
        relative = candidate.relative_to(root).as_posix()
        if stat.S_ISLNK(candidate.lstat().st_mode):
            raise SandboxError(
                ErrorCode.INVALID_PATH,
                "symbolic links are not copied into a sandbox",
                hint="replace the link with the file it points to",
            )
        try:
            text = candidate.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise SandboxError(
                ErrorCode.BINARY_FILE, "only UTF-8 text files can be copied into a sandbox", hint="remove binary files"
            ) from None
        files.append((validate_path(relative), text))
    if not files:
        raise SandboxError(ErrorCode.NOT_FOUND, "there is no file to run", hint="pass a file or a folder of files")
    if len(files) > MAX_FILES_PER_CALL:
        raise SandboxError(
            ErrorCode.WORKSPACE_LIMIT_EXCEEDED,
            f"a sandbox takes at most {MAX_FILES_PER_CALL} files",
            hint="run a smaller folder",
        )
    return files


def _walk(folder: Path, ignored: frozenset[str]) -> list[Path]:
    found: list[Path] = []
    for entry in folder.iterdir():
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and not entry.is_symlink():
            if entry.name not in ignored:
                found.extend(_walk(entry, ignored))
        else:
            found.append(entry)
    return found


def choose_entrypoint(files: Sequence[tuple[str, str]], requested: str | None, defaults: Sequence[str]) -> str:
    """The requested entrypoint, else the only file, else the first of the profile's default entrypoints."""
    names = [name for name, _text in files]
    if requested is not None:
        return validate_path(requested)
    if len(names) == 1:
        return names[0]
    for name in defaults:
        if name in names:
            return name
    raise SandboxError(
        ErrorCode.INVALID_REQUEST,
        f"the folder has no {' or '.join(defaults)}; say which file to run",
        hint="add --entrypoint FILE",
    )


async def run_local(
    service: SandboxService,
    path: Path,
    *,
    entrypoint: str | None,
    arguments: Sequence[str],
    timeout_seconds: int | None,
    output: OutputSink,
) -> RunResult:
    """Run a local file or folder as a one-shot of ``service``, started for it alone: its liveness marker and its
    sandbox, without a server's sweep, reaper or warm pool."""
    info = service.profile.info
    files = collect_files(path, ignored=info.ignored_directories)
    chosen = choose_entrypoint(files, entrypoint, info.default_entrypoints)
    async with service.running(background=False):
        return await service.execute(files, chosen, arguments, timeout_seconds=timeout_seconds, output=output)
