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
    evaluate = info.evaluate_tool_name
    return {
        **WORDS,
        "language": info.language,
        "run_tool": info.run_tool_name,
        "execute_tool": info.execute_tool_name,
        "evaluate_tool": evaluate or "",
        # Where the profile has an evaluate tool, the other tools name it as the way to explore step by step.
        "or_explore": f" or to explore in with {evaluate}" if evaluate else "",
        "explore": f"; to explore step by step, {evaluate}" if evaluate else "",
        "explore_line": f"\n- Exploring step by step in a sandbox: {evaluate}, a persistent context."
        if evaluate
        else "",
        "example_path": info.example_path,
        "idle": settings.idle_timeout,
        "lifetime": settings.max_lifetime,
        "sessions": settings.max_sessions,
        "max_timeout": settings.max_timeout,
        "snapshots_max": settings.snapshots_max,
        "snapshot_age": _hours(settings.snapshot_max_age_hours),
        "snapshot_max": f"{settings.snapshot_max_mib} MiB",
        "no_context": f": no {evaluate} state" if evaluate else "",
    }


def _hours(hours: int) -> str:
    return f"{hours // 24} days" if hours % 24 == 0 else f"{hours} hours"


def package_words(settings: Settings, profile: Profile, packages: tuple[str, ...]) -> dict[str, str | int]:
    """:func:`words` and ``{packages}``: the profile's sentence on what a program can import (the image's package
    set, shortened when long)."""
    return {**words(settings, profile.info), "packages": profile.describe_packages(shortened(packages))}


def run_tool_description(settings: Settings, profile: Profile, packages: tuple[str, ...] = ()) -> str:
    """The profile's run tool text with its placeholders (``{memory}``, ``{packages}``...) filled in."""
    return profile_text(settings, profile, profile.info.run_tool_description, packages)


GVISOR_RUNTIME = "runsc"


def evaluate_tool_description(settings: Settings, profile: Profile, packages: tuple[str, ...] = ()) -> str:
    """The profile's evaluate tool text, filled in like the run tool's; under gVisor with a profile that cannot jail
    its runs, first the word that it is refused (the engine-only trust model allows no process to live between
    calls)."""
    text = profile_text(settings, profile, profile.info.evaluate_tool_description, packages)
    if settings.runtime != GVISOR_RUNTIME or profile.info.jailed_runs:
        return text
    return (
        f"Not available on this server (gVisor): calls fail with NOT_SUPPORTED; use {profile.info.run_tool_name}."
        f"\n\n{text}"
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
{run_tool} again ... -> destroy_sandbox when done.{explore_line}
- A sandbox expires after {idle}s without a call and {lifetime}s after creation; at most {sessions} exist at once.
Errors start with a stable code (e.g. PATH_TRAVERSAL: ...). INVALID_SESSION, SESSION_EXPIRED, or a message saying \
the sandbox was destroyed means: create a new one."""

CREATE_SANDBOX = """\
Create an empty, offline sandbox that lives across calls: write files, run, fix, rerun{or_explore}. For a single \
run, {execute_tool} needs no sandbox.

One isolated container: no network, read-only system, {memory} memory, {cpus}, {processes} processes, a \
{workspace} workspace. At most {sessions} exist at once (SESSION_LIMIT_EXCEEDED: destroy_sandbox one). It is \
destroyed, with its files, after {idle}s without a call or {lifetime}s after creation.

from_snapshot: start with a snapshot's files; fork_of: with a copy of a live sandbox's (no process or context \
carried)."""

SNAPSHOT_SANDBOX = """\
Save a sandbox's files (with modes and links) as a named snapshot that outlives sandbox and server, e.g. to try two \
ideas from one point: create_sandbox(from_snapshot) starts sandboxes from it. Files only{no_context}. \
{snapshot_max} each, {snapshots_max} kept (SNAPSHOT_LIMIT_EXCEEDED), each for {snapshot_age}."""

LIST_SNAPSHOTS = """\
List the snapshots create_sandbox can start from (from_snapshot), oldest first, with their files, bytes and age. \
Read-only."""

INTEGRITY = "A link or special file a program left destroys the sandbox at this call (WORKSPACE_INTEGRITY)."
"""What every file tool finds before it acts, said by each, since a model may read any one of them alone."""

WRITE_FILES = (
    """\
Write files into a sandbox's workspace, creating parent directories: text, or bytes as base64. Use it before \
{run_tool}, and with overwrite=true to change a file ({execute_tool} takes its own files). Limits and paths are \
checked first: a refusal changes nothing. A write that fails once begun (broken transfer, full workspace, a \
program's permissions) destroys the sandbox. """
    + INTEGRITY
)

LIST_FILES = (
    """\
List a sandbox's workspace: every file and directory with its size, sorted by path, hidden ones and what programs \
wrote included. Read-only. read_file gives a file's content. recursive=false lists path's direct children only \
(max_depth ignored). Past {list_max} entries the list is cut (truncated=true). """
    + INTEGRITY
)

READ_FILE = (
    """\
Read one file from a sandbox's workspace, e.g. output a program wrote. Read-only. list_files finds paths. A file \
longer than max_bytes gives its beginning, truncated=true, and size says how long it is. Text that is not UTF-8 is \
BINARY_FILE: read it with encoding base64. A directory is INVALID_PATH, a missing file NOT_FOUND. """
    + INTEGRITY
)

DELETE_FILES = (
    """\
Delete files from a sandbox's workspace, e.g. stale output before a rerun; destroy_sandbox discards everything. \
A missing file (missing) or a directory (not_a_file) is reported and left, never an error. """
    + INTEGRITY
)

DESTROY_SANDBOX = """\
Destroy a sandbox: its container and every file in it. Call it when done iterating ({execute_tool} needs none). \
Safe to repeat. Unusable once this returns; if the engine cannot be reached, CONTAINER_REMOVAL_FAILED: removal is \
retried, and it counts toward the limit until then."""

EXECUTE = """\
Run {language} once, without a sandbox of your own: the files are written to a fresh sandbox, the entrypoint runs, \
the result returns, and the sandbox and every file are destroyed. For several runs over the same files, \
create_sandbox, write_files, then {run_tool}{explore}.

It runs as {run_tool} runs it, with the same limits, and counts toward the {sessions}-sandbox limit \
(SESSION_LIMIT_EXCEEDED). Packages: {packages}."""
