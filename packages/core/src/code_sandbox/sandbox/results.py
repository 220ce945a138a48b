"""What a run, an evaluation and a read return: the run, evaluate and read tools' output models, built once from the
helper's checked answer (:mod:`.execution`, :mod:`.evaluation`, :mod:`.workspace`) and handed to the client as they
are, and beside a run's or an evaluation's output, never serialised, what only the host uses (audit counts, the bytes
``code-sandbox run`` prints)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from code_sandbox.channel.protocol import ContextEnd
from code_sandbox.limits import WORDS

TerminationReason = Literal["exited", "signaled", "timed_out", "OUTPUT_LIMIT_EXCEEDED", "oom_killed"]


class Output(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunOutput(Output):
    exit_code: int | None = Field(description="Null when a signal killed the program.")
    signal: str | None = Field(description="The signal that killed it, e.g. SIGKILL.")
    timed_out: bool = Field(description="Killed at timeout_seconds.")
    oom_killed: bool = Field(description="Killed by the memory limit.")
    stdout: str = Field(description="Standard output as UTF-8 (invalid bytes replaced).")
    stderr: str = Field(description="Standard error as UTF-8 (invalid bytes replaced).")
    stdout_truncated: bool = Field(description=f"True when stdout passed {WORDS['output_cap']}, or was cut.")
    stderr_truncated: bool = Field(description=f"True when stderr passed {WORDS['output_cap']}, or was cut.")
    termination_reason: TerminationReason = Field(description="Why the program ended.")
    duration_ms: int = Field(description="Wall-clock time.")
    cpu_ms: int | None = Field(description="CPU time of the program and its children; null if unreadable.")
    peak_memory_bytes: int | None = Field(
        description="Peak memory above the sandbox's use before the run (written files count); null if unreadable."
    )


class RunResult(RunOutput):
    """How a program ended, exactly: the run tools' output, and what the host alone uses (excluded from it)."""

    model_config = ConfigDict(frozen=True)

    output_bytes: int = Field(exclude=True)
    """Both streams' bytes as the runner counted them, past the cap too."""
    leftover_processes_killed: int = Field(exclude=True)
    stdout_raw: bytes = Field(default=b"", exclude=True, repr=False)
    """The kept bytes of stdout, before their decoding replaced what is not UTF-8."""
    stderr_raw: bytes = Field(default=b"", exclude=True, repr=False)


class ThrownErrorOutput(Output):
    name: str = Field(description="E.g. TypeError; Uncaught when a non-error was thrown.")
    message: str = Field(description="The message, or what was thrown, rendered.")
    stack: str = Field(description="The frames in your code.")


class EvaluateOutput(Output):
    value: str | None = Field(
        description=f"The last statement's value as util.inspect renders it, at most {WORDS['value_max']}; null with "
        "error or context_ended."
    )
    error: ThrownErrorOutput | None = Field(
        description="What the code threw, or an awaited promise's rejection; the context lives on."
    )
    stdout: str = Field(description="What this call wrote to standard output.")
    stderr: str = Field(description="What this call wrote to standard error.")
    stdout_truncated: bool = Field(description=f"True when stdout passed {WORDS['output_cap']}, or was cut.")
    stderr_truncated: bool = Field(description=f"True when stderr passed {WORDS['output_cap']}, or was cut.")
    context_reset: bool = Field(description="True when this call started a fresh context.")
    context_ended: ContextEnd | None = Field(description="Why the context ended in this call; null while it lives.")
    timed_out: bool = Field(description="context_ended is timed_out.")
    oom_killed: bool = Field(description="context_ended is oom_killed.")
    duration_ms: int = Field(description="Wall-clock time of the call.")
    cpu_ms: int | None = Field(description="CPU time of the call; null if unreadable.")
    peak_memory_bytes: int | None = Field(description="Peak memory above the use before the call; null if unreadable.")


class Evaluation(EvaluateOutput):
    """How one evaluation ended: the evaluate tool's output, and what the host alone uses (excluded from it)."""

    model_config = ConfigDict(frozen=True)

    output_bytes: int = Field(exclude=True)
    """Both streams' bytes as the runner counted them, past the cap too."""


class ReadFileOutput(Output):
    content: str = Field(description="The text, or with encoding base64 the bytes in base64; max_bytes at most.")
    size: int = Field(description="The whole file's size in bytes.")
    truncated: bool = Field(description="True when content is the file's beginning only.")
    image_type: str | None = Field(
        default=None,
        description="The MIME type when the file was also sent as an image.",
    )
