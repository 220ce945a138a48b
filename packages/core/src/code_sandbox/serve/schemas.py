"""The MCP tools' input and output models: strict, bounded, every field described. The run and evaluate tools'
outputs are core's results (:mod:`code_sandbox.sandbox.results`).

Input models refuse unknown fields and never coerce types. Bounds appear in the JSON schema, so a client sees
them before it calls. The run models are built per server, because their timeout bounds are settings.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

from code_sandbox.channel.protocol import DeleteOutcome, WorkspacePath, WriteStatus
from code_sandbox.limits import (
    DEFAULT_READ_BYTES,
    MAX_ARGUMENT_BYTES,
    MAX_ARGUMENTS,
    MAX_CODE_CHARS,
    MAX_FILE_BYTES,
    MAX_FILES_PER_CALL,
    MAX_LIST_DEPTH,
    MAX_PATH_BYTES,
    MAX_PATH_DEPTH,
    WORDS,
)
from code_sandbox.sandbox.results import Output
from code_sandbox.sandbox.snapshot_store import NAME_PATTERN as SNAPSHOT_NAME_PATTERN

SESSION_ID_PATTERN = r"^[A-Za-z0-9_-]{43}$"


class StrictInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


SessionId = Annotated[
    str,
    Field(
        description="From create_sandbox.",
        pattern=SESSION_ID_PATTERN,  # it bounds the length too: a schema that repeated it would cost every client
    ),
]
PathInput = Annotated[
    WorkspacePath,
    Field(
        description=(
            f"Relative to the workspace, e.g. 'data/in.txt'; {MAX_PATH_DEPTH} levels at most; no '..', absolute path, "
            "':', leading '-' or invisible character."
        )
    ),
]
"""A path argument: the helper protocol's path, its bound (:data:`MAX_PATH_BYTES`) in the schema, described."""


Encoding = Literal["utf-8", "base64"]


class FileInput(StrictInput):
    path: PathInput
    content: Annotated[
        str,
        Field(
            description="The file's text, or with encoding base64 its bytes in base64.",
            max_length=(MAX_FILE_BYTES + 2) // 3 * 4,
        ),
    ]
    encoding: Encoding = Field(
        default="utf-8",
        description="utf-8: content is text; base64: content is any bytes in standard base64.",
    )

    _decoded: bytes | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _base64_decodes(self) -> FileInput:
        if self.encoding == "base64":
            try:
                self._decoded = base64.b64decode(self.content, validate=True)  # decoded once, kept for data()
            except (binascii.Error, ValueError):
                raise ValueError("content is not valid base64") from None
        return self

    def data(self) -> str | bytes:
        """The file's text, or its bytes (base64 decoded)."""
        return self._decoded if self._decoded is not None else self.content


Files = Annotated[
    list[FileInput],
    Field(
        description=(
            "The files: {file_max} each, {request_max} in all (FILE_TOO_LARGE); the workspace holds at most "
            "{entries} files and directories and {workspace} (WORKSPACE_LIMIT_EXCEEDED)."
        ).format(**WORDS),
        min_length=1,
        max_length=MAX_FILES_PER_CALL,
    ),
]


SnapshotName = Annotated[str, Field(pattern=SNAPSHOT_NAME_PATTERN)]


class CreateSandboxInput(StrictInput):
    from_snapshot: SnapshotName | None = Field(default=None, description="A snapshot's name.")
    fork_of: Annotated[str, Field(pattern=SESSION_ID_PATTERN)] | None = Field(default=None, description="A session_id.")

    @model_validator(mode="after")
    def _one_origin(self) -> CreateSandboxInput:
        if self.from_snapshot is not None and self.fork_of is not None:
            raise ValueError("give from_snapshot or fork_of, not both")
        return self


class SnapshotInput(StrictInput):
    session_id: SessionId
    name: SnapshotName | None = Field(default=None, description="Omit for a generated name.")


class ListSnapshotsInput(StrictInput):
    pass


class SessionInput(StrictInput):
    session_id: SessionId


class WriteFilesInput(StrictInput):
    session_id: SessionId
    files: Files
    overwrite: bool = Field(
        default=False,
        description="Replace existing files; when false an existing file is left as it is (status exists).",
    )


class ListFilesInput(StrictInput):
    session_id: SessionId
    path: str = Field(
        default=".",
        description="The directory to list, relative to the workspace root; '.' is the root (NOT_FOUND, INVALID_PATH).",
        min_length=1,
        max_length=MAX_PATH_BYTES,
    )
    recursive: bool = Field(default=True, description="Descend into subdirectories.")
    max_depth: int = Field(
        default=MAX_LIST_DEPTH,
        ge=0,
        le=MAX_LIST_DEPTH,
        description="Levels below path to descend; 0: direct children only.",
    )


class ReadFileInput(StrictInput):
    session_id: SessionId
    path: PathInput
    max_bytes: int = Field(
        default=DEFAULT_READ_BYTES,
        ge=1,
        le=MAX_FILE_BYTES,
        description="The most bytes returned: a longer file gives its beginning, truncated=true (text is never cut "
        "mid-character).",
    )
    encoding: Encoding = Field(
        default="utf-8",
        description="utf-8: text (BINARY_FILE for invalid UTF-8 or NUL bytes); base64: any bytes, and a PNG, JPEG, "
        "GIF or WebP within max_bytes and 1 MiB also as an image.",
    )


class DeleteFilesInput(StrictInput):
    session_id: SessionId
    paths: list[PathInput] = Field(
        description="Regular files to delete; one invalid path refuses the whole call before anything is deleted.",
        min_length=1,
        max_length=MAX_FILES_PER_CALL,
    )


Argument = Annotated[str, Field(max_length=MAX_ARGUMENT_BYTES)]


class RunInput(StrictInput):
    """The run tool's arguments; :func:`run_input_models` bounds and describes them for one server."""

    session_id: SessionId
    entrypoint: str
    arguments: list[Argument]
    timeout_seconds: int


class ExecuteInput(StrictInput):
    """The one-shot tool's arguments; :func:`run_input_models` bounds and describes them for one server."""

    files: Files
    entrypoint: str
    arguments: list[Argument]
    timeout_seconds: int


class EvaluateInput(StrictInput):
    """The evaluate tool's arguments; :func:`evaluate_input_model` bounds and describes them for one server."""

    session_id: SessionId
    code: str
    timeout_seconds: int
    reset: bool


def _timeout_field(default_timeout: int, max_timeout: int, action: str, then: str) -> Any:
    return (
        int,
        Field(
            default=default_timeout,
            ge=1,
            le=max_timeout,
            description=f"Seconds before {action}{then}.",
        ),
    )


def evaluate_input_model(*, default_timeout: int, max_timeout: int) -> type[EvaluateInput]:
    """The evaluate tool's input model, bounded by this server's settings."""
    code: Any = (
        str,
        Field(
            description="One statement or many; the last one's value is returned.",
            max_length=MAX_CODE_CHARS,
        ),
    )
    timeout = _timeout_field(
        default_timeout,
        max_timeout,
        "the evaluation is stopped",
        "; the context ends too",
    )
    reset: Any = (bool, Field(default=False, description="Discard the context first and start a fresh one."))
    return create_model("EvaluateInput", __base__=EvaluateInput, code=code, timeout_seconds=timeout, reset=reset)


def run_input_models(
    *, entrypoint_suffixes: tuple[str, ...], example_entrypoint: str, default_timeout: int, max_timeout: int
) -> tuple[type[RunInput], type[ExecuteInput]]:
    """The run tool's and the one-shot tool's input models, bounded by this server's settings."""
    suffixes = ", ".join(entrypoint_suffixes)
    entrypoint: Any = (
        str,
        Field(
            description=f"The file to run, relative to the workspace root, ending in {suffixes}; e.g. "
            f"'{example_entrypoint}'.",
            min_length=1,
            max_length=MAX_PATH_BYTES,
        ),
    )
    arguments: Any = (
        list[Argument],
        Field(
            default_factory=list,
            description="Command-line arguments, passed verbatim (no shell).",
            max_length=MAX_ARGUMENTS,
        ),
    )
    timeout = _timeout_field(default_timeout, max_timeout, "the program is killed", " (timed_out=true)")
    run = create_model(
        "RunInput", __base__=RunInput, entrypoint=entrypoint, arguments=arguments, timeout_seconds=timeout
    )
    execute = create_model(
        "ExecuteInput", __base__=ExecuteInput, entrypoint=entrypoint, arguments=arguments, timeout_seconds=timeout
    )
    return run, execute


# -- outputs -----------------------------------------------------------------------------------------------------


class CreateSandboxOutput(Output):
    session_id: str = Field(description="Pass it to every other tool; keep it private.")
    expires_at: str = Field(description="UTC time (ISO 8601) when the sandbox is destroyed whatever happens.")
    idle_timeout_seconds: int = Field(description="The sandbox is destroyed after this long without a call.")
    profile: str = Field(description="The runtime profile serving the sandbox.")
    packages: list[str] = Field(description="What a program can import by name, as name@version.")


class FileStatus(Output):
    path: str = Field(description="The normalised path.")
    status: WriteStatus = Field(description="exists: already there, left as it was (overwrite=false).")


class WriteFilesOutput(Output):
    results: list[FileStatus] = Field(description="One status per requested file, in request order.")


class Entry(Output):
    path: str = Field(description="Relative to the workspace root.")
    type: Literal["file", "directory"] = Field(description="A file or a directory.")
    size: int = Field(description="Bytes; 0 for directories.")


class ListFilesOutput(Output):
    entries: list[Entry] = Field(description="Sorted by path.")
    truncated: bool = Field(description=f"True when the list was cut at {WORDS['list_max']} entries or 2 MiB.")


class DeleteStatus(Output):
    path: str = Field(description="As requested.")
    status: DeleteOutcome = Field(description="missing: nothing there (not an error); not_a_file: left alone.")


class DeleteFilesOutput(Output):
    results: list[DeleteStatus] = Field(description="One status per requested path, in request order.")


class DestroyOutput(Output):
    destroyed: bool = Field(
        description="True when a live sandbox was destroyed now; false when it was already gone (not an error)."
    )


class SnapshotOutput(Output):
    name: str = Field(description="For from_snapshot.")
    files: int = Field(description="Files kept.")
    bytes: int = Field(description="Their bytes.")
    skipped: int = Field(description="FIFOs and sockets, not kept.")


class SnapshotRow(Output):
    name: str = Field(description="For from_snapshot.")
    profile: str = Field(description="Its profile.")
    files: int = Field(description="Files kept.")
    bytes: int = Field(description="Their bytes.")
    age_seconds: int = Field(description="Since saved.")


class ListSnapshotsOutput(Output):
    snapshots: list[SnapshotRow] = Field(description="Oldest first.")
