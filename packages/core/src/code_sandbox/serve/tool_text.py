"""What each tool says to a model: purpose, side effects, limits, result, and when to use a sibling instead.

Every limit is a placeholder filled from :data:`code_sandbox.limits.WORDS` (and the server's settings), and the
package list from the verified image, so the text cannot drift from what is enforced or installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.image.package_sets import shortened
from code_sandbox.limits import WORDS

if TYPE_CHECKING:
    from code_sandbox.profile import Profile, ProfileInfo
    from code_sandbox.settings import Settings


def words(settings: Settings, info: ProfileInfo) -> dict[str, str | int]:
    """The placeholders of every text here: the limits, the profile's names, and this server's settings."""
    return {
        **WORDS,
        "language": info.language,
        "run_tool": info.run_tool_name,
        "execute_tool": info.execute_tool_name,
        "example_path": info.example_path,
        "idle": settings.idle_timeout,
        "lifetime": settings.max_lifetime,
        "sessions": settings.max_sessions,
        "max_timeout": settings.max_timeout,
    }


def package_words(settings: Settings, profile: Profile, packages: tuple[str, ...]) -> dict[str, str | int]:
    """:func:`words` and ``{packages}``: the profile's sentence on what a program can import (the image's package
    set, shortened when long)."""
    return {**words(settings, profile.info), "packages": profile.describe_packages(shortened(packages))}


def run_tool_description(settings: Settings, profile: Profile, packages: tuple[str, ...] = ()) -> str:
    """The profile's run tool text with its placeholders (``{memory}``, ``{packages}``...) filled in."""
    return profile_text(settings, profile, profile.info.run_tool_description, packages)


GVISOR_RUNTIME = "runsc"


def evaluate_tool_description(settings: Settings, profile: Profile, packages: tuple[str, ...] = ()) -> str:
    """The profile's evaluate tool text, filled in like the run tool's; under gVisor, first the word that it is
    refused (the engine-only trust model allows no process to live between calls)."""
    text = profile_text(settings, profile, profile.info.evaluate_tool_description, packages)
    if settings.runtime != GVISOR_RUNTIME:
        return text
    return (
        f"Not available on this server (it runs sandboxes under gVisor): every call fails with NOT_SUPPORTED; use "
        f"{profile.info.run_tool_name} instead.\n\n{text}"
    )


def profile_text(settings: Settings, profile: Profile, text: str, packages: tuple[str, ...]) -> str:
    try:
        return text.format_map(package_words(settings, profile, packages))
    except (KeyError, ValueError, IndexError, AttributeError):
        raise SandboxError(
            ErrorCode.PROFILE_ERROR,
            "the profile's tool description has a placeholder that is not a known limit",
            hint="double literal braces ({{ and }}) in the profile's text",
        ) from None


def instructions(settings: Settings, info: ProfileInfo) -> str:
    """The server's ``instructions`` (sent with the ``initialize`` answer)."""
    return INSTRUCTIONS.format(**words(settings, info))


INSTRUCTIONS = """\
Disposable, offline {language} sandboxes for running code you wrote. Nothing you run can reach the network, \
the user's files or their secrets.
- One-off run: {execute_tool} (files in, result out, sandbox removed).
- Iterating: create_sandbox -> write_files -> {run_tool} -> read the result -> write_files (overwrite=true) -> \
{run_tool} again ... -> destroy_sandbox when done.
- A sandbox expires after {idle}s without a call and {lifetime}s after creation; at most {sessions} exist at once.
Errors start with a stable code (e.g. PATH_TRAVERSAL: ...). Codes that say the sandbox was destroyed mean: \
create a new one."""

CREATE_SANDBOX = """\
Create a new, empty, offline sandbox and return its session_id. Use it when you will write files and run them \
more than once (iterate, fix, rerun); for a single run use {execute_tool} instead, which needs no cleanup.

Side effects: starts one isolated container (no network, read-only system, {memory} memory, {cpus}, {processes} \
processes, a {workspace} workspace at /workspace). At most {sessions} sandboxes may exist at once \
(SESSION_LIMIT_EXCEEDED otherwise: destroy one you no longer need). The sandbox is destroyed automatically after \
{idle}s without a call or {lifetime}s after creation, whichever comes first.

Returns session_id (pass it to every other tool), expires_at, idle_timeout_seconds, profile and packages \
(the packages a program can import by name, as name@version; empty when there are none)."""

WRITE_FILES = """\
Write one or more files into a sandbox's workspace, creating parent directories: text, or any bytes (data, \
pictures) as base64 with encoding="base64". Use it to add source files before {run_tool}, and with \
overwrite=true to replace a file you are fixing. To run files once without keeping a sandbox, use \
{execute_tool} instead.

Limits, all checked before anything is written (a refused call changes nothing): 1-{files_per_call} files per \
call, {file_max} per file once decoded (FILE_TOO_LARGE), {request_max} per call, and a workspace of at most \
{entries} entries \
(files and directories both count) and {workspace} (WORKSPACE_LIMIT_EXCEEDED). Paths are relative \
('{example_path}'); '..', absolute paths and other escapes are refused (PATH_TRAVERSAL, INVALID_PATH).

Returns a status per file: written, overwritten, or exists (left untouched because overwrite was false)."""

LIST_FILES = """\
List files and directories in a sandbox's workspace, including files your programs created. Read-only. Use it \
to check what exists before reading or running; use read_file to see a file's content.

Returns entries {{path, type ('file' or 'directory'), size in bytes}} sorted by path, and truncated=true when \
more than {list_max} entries matched."""

READ_FILE = """\
Read a file from a sandbox's workspace, e.g. output your program wrote. Read-only. Use list_files first when \
you do not know the exact path.

Returns content (at most max_bytes bytes, never cutting a character), size (the whole file) and truncated. \
Text by default: files with invalid UTF-8 or NUL bytes are refused with BINARY_FILE; read them with \
encoding="base64" to get their bytes in base64. A whole PNG, JPEG, GIF or WebP of at most 1 MiB read that way \
also comes back as an image (image_type says which). Missing files: NOT_FOUND."""

DELETE_FILES = """\
Delete regular files from a sandbox's workspace. Irreversible. Use it to remove stale files before a rerun; to \
discard everything, use destroy_sandbox instead. Directories and the workspace root cannot be deleted.

Returns a status per path: deleted, missing (nothing there; not an error), or not_a_file (a directory, left \
alone)."""

DESTROY_SANDBOX = """\
Destroy a sandbox: stop its container and discard its workspace and every file in it. Irreversible. Call it \
when you are done iterating ({execute_tool} sandboxes need no destroy). Safe to call twice: destroying an \
unknown or already destroyed sandbox returns destroyed=false, not an error.

The sandbox is unusable once this returns and its container is removed right after. If the engine cannot be \
reached to stop it, the error is CONTAINER_REMOVAL_FAILED; the sandbox is disabled all the same and its \
removal is retried automatically."""

EXECUTE = """\
Run {language} in one call: create a fresh sandbox, write the given files, run the entrypoint, return the \
result, and destroy the sandbox whatever happened. Use it for a single self-contained run. To iterate (run, \
fix a file, run again) use create_sandbox, write_files and {run_tool} instead, which keep the files.

The program runs exactly as with {run_tool}: no network, {memory} memory, output capped at {output_cap} per stream, \
timeout_seconds up to {max_timeout}. Same file limits as write_files. Counts against the sandbox limit while \
it runs. Packages: {packages}.

Returns exit_code, signal, timed_out, oom_killed, stdout, stderr, the truncation flags, termination_reason, \
duration_ms, cpu_ms and peak_memory_bytes."""
