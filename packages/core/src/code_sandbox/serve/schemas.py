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

SESSION_ID_PATTERN = r"^[A-Za-z0-9_-]{43}$"


class StrictInput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


SessionId = Annotated[
    str,
    Field(
        description="The sandbox's opaque ID, exactly as create_sandbox returned it (43 URL-safe characters).",
        pattern=SESSION_ID_PATTERN,
        min_length=43,
        max_length=43,
    ),
]
PathInput = Annotated[
    WorkspacePath,
    Field(
        description=(
            "A path relative to the workspace root, with '/' separators, e.g. 'data/input.txt'. No absolute paths, "
            "'..', '.', empty components, drive letters, ':' or a leading '-'; no control, invisible (bidi, "
            "zero-width), line-separator, private-use or unassigned characters. "
            f"At most {MAX_PATH_BYTES} bytes and {MAX_PATH_DEPTH} levels."
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
            description=f"The file's full text, or with encoding base64 its bytes in base64. At most "
            f"{WORDS['file_max']} once encoded (UTF-8) or decoded (base64).",
            max_length=(MAX_FILE_BYTES + 2) // 3 * 4,
        ),
    ]
    encoding: Encoding = Field(
        default="utf-8",
        description="utf-8 (the default): content is text. base64: content is any bytes (a picture, a zip...), "
        "in standard base64.",
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
            "1 to {files_per_call} files to write. Missing parent directories are created. Limits: {file_max} a "
            "file, {request_max} a request, and a workspace of at most {entries} entries (files and directories "
            "both count) and {workspace}."
        ).format(**WORDS),
        min_length=1,
        max_length=MAX_FILES_PER_CALL,
    ),
]


class CreateSandboxInput(StrictInput):
    pass


class SessionInput(StrictInput):
    session_id: SessionId


class WriteFilesInput(StrictInput):
    session_id: SessionId
    files: Files
    overwrite: bool = Field(
        default=False,
        description="Replace files that already exist. When false (the default) an existing file is left "
        "untouched and reported as 'exists'.",
    )


class ListFilesInput(StrictInput):
    session_id: SessionId
    path: str = Field(
        default=".",
        description="The directory to list, relative to the workspace root; '.' (the default) is the root. "
        "The same rules as every path: no control or invisible characters.",
        min_length=1,
        max_length=MAX_PATH_BYTES,
    )
    recursive: bool = Field(default=True, description="Descend into subdirectories (up to max_depth).")
    max_depth: int = Field(
        default=MAX_LIST_DEPTH,
        ge=0,
        le=MAX_LIST_DEPTH,
        description="How many directory levels below 'path' to descend; 0 lists only its direct children.",
    )


class ReadFileInput(StrictInput):
    session_id: SessionId
    path: PathInput
    max_bytes: int = Field(
        default=DEFAULT_READ_BYTES,
        ge=1,
        le=MAX_FILE_BYTES,
        description=f"Return at most this many bytes (default {DEFAULT_READ_BYTES}, at most {WORDS['file_max']}); "
        "a cut sets truncated=true, and never splits a character of text.",
    )
    encoding: Encoding = Field(
        default="utf-8",
        description="utf-8 (the default): return text (BINARY_FILE if the file is not UTF-8 text). base64: return "
        "the bytes in base64, whatever they are; a whole PNG, JPEG, GIF or WebP picture of at most 1 MiB also "
        "comes back as an image.",
    )


class DeleteFilesInput(StrictInput):
    session_id: SessionId
    paths: list[PathInput] = Field(
        description=f"1 to {MAX_FILES_PER_CALL} regular files to delete. Directories and the workspace root cannot "
        "be deleted.",
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
            description=f"{action} after this many seconds (1 to {max_timeout}, default {default_timeout}); {then}.",
        ),
    )


def evaluate_input_model(*, default_timeout: int, max_timeout: int) -> type[EvaluateInput]:
    """The evaluate tool's input model, bounded by this server's settings."""
    code: Any = (
        str,
        Field(
            description="The code to evaluate in the sandbox's context, one statement or many; the value of the last "
            f"one is returned. At most {WORDS['code_max']} (characters).",
            max_length=MAX_CODE_CHARS,
        ),
    )
    timeout = _timeout_field(
        default_timeout,
        max_timeout,
        "End the evaluation",
        "the context then ends too and the next call starts a fresh one",
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
            f"'{example_entrypoint}'. The same rules as every path: no control or invisible characters.",
            min_length=1,
            max_length=MAX_PATH_BYTES,
        ),
    )
    arguments: Any = (
        list[Argument],
        Field(
            default_factory=list,
            description=f"Command-line arguments, passed verbatim (no shell): at most {MAX_ARGUMENTS}, each at most "
            f"{MAX_ARGUMENT_BYTES} bytes, no NUL characters.",
            max_length=MAX_ARGUMENTS,
        ),
    )
    timeout = _timeout_field(default_timeout, max_timeout, "Kill the program", "the result then has timed_out=true")
    run = create_model(
        "RunInput", __base__=RunInput, entrypoint=entrypoint, arguments=arguments, timeout_seconds=timeout
    )
    execute = create_model(
        "ExecuteInput", __base__=ExecuteInput, entrypoint=entrypoint, arguments=arguments, timeout_seconds=timeout
    )
    return run, execute


# -- outputs -----------------------------------------------------------------------------------------------------


class CreateSandboxOutput(Output):
    session_id: str = Field(description="Pass this to every other tool. It is a secret-like random token.")
    expires_at: str = Field(description="UTC time (ISO 8601) when the sandbox is destroyed whatever happens.")
    idle_timeout_seconds: int = Field(description="The sandbox is destroyed after this long without a call.")
    profile: str = Field(description="The name of the runtime profile that serves the sandbox.")
    packages: list[str] = Field(
        description="The packages a program in this sandbox can import by name, as name@version; empty: none."
    )


class FileStatus(Output):
    path: str = Field(description="The normalised path.")
    status: WriteStatus = Field(
        description="written: created; overwritten: replaced; exists: already there and left as it was."
    )


class WriteFilesOutput(Output):
    results: list[FileStatus] = Field(description="One status per requested file, in request order.")


class Entry(Output):
    path: str = Field(description="Relative to the workspace root.")
    type: Literal["file", "directory"] = Field(description="A file or a directory.")
    size: int = Field(description="Bytes; 0 for directories.")


class ListFilesOutput(Output):
    entries: list[Entry] = Field(description="Sorted by path.")
    truncated: bool = Field(
        description=f"True when more than {WORDS['list_max']} entries existed and the list was cut."
    )


class DeleteStatus(Output):
    path: str = Field(description="As requested.")
    status: DeleteOutcome = Field(
        description="deleted; missing: there was no such file; not_a_file: a directory or other non-file, left alone."
    )


class DeleteFilesOutput(Output):
    results: list[DeleteStatus] = Field(description="One status per requested path, in request order.")


class DestroyOutput(Output):
    destroyed: bool = Field(
        description="True when a live sandbox was destroyed now; false when it was already gone (not an error)."
    )
