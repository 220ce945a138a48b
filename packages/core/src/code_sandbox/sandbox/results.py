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
    exit_code: int | None = Field(description="The program's exit code; null when a signal killed it.")
    signal: str | None = Field(description="The signal that killed the program (e.g. SIGKILL), else null.")
    timed_out: bool = Field(description="True when the program was killed at timeout_seconds.")
    oom_killed: bool = Field(description=f"True when the {WORDS['memory']} memory limit killed the program.")
    stdout: str = Field(description=f"Standard output, UTF-8 (invalid bytes replaced), at most {WORDS['output_cap']}.")
    stderr: str = Field(description=f"Standard error, UTF-8 (invalid bytes replaced), at most {WORDS['output_cap']}.")
    stdout_truncated: bool = Field(
        description=f"True when stdout passed {WORDS['output_cap']}; the program was then killed."
    )
    stderr_truncated: bool = Field(
        description=f"True when stderr passed {WORDS['output_cap']}; the program was then killed."
    )
    termination_reason: TerminationReason = Field(description="Why the program ended.")
    duration_ms: int = Field(description="Wall-clock run time in milliseconds.")
    cpu_ms: int | None = Field(
        description="CPU time (user + system) the run used, in milliseconds: the program and every process it "
        "started, read from the sandbox's cgroup counter before and after the run (so a program cannot misreport "
        "it; the supervising runner's own small share is included). Under gVisor, the engine's counter for the whole "
        "sandbox, gVisor's own kernel included. Null where no counter can be read."
    )
    peak_memory_bytes: int | None = Field(
        description="The most memory the run used at once, in bytes: the sandbox cgroup's memory (the program, "
        "its children and the files they wrote to /workspace and /tmp) above what it used just before the run, "
        "from the cgroup's high-water mark when the run set a new one, else its highest sample (every 20 ms), "
        "so a short spike below an earlier run's peak can be missed; if the program stopped or reprioritised the "
        "supervising runner, the cgroup's high-water mark instead (never less than the truth). Under gVisor, from "
        "the engine's high-water mark when the run set a new one, gVisor's own kernel included, else null. Null "
        "where the counter cannot be read."
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
    name: str = Field(description="The error's name, e.g. TypeError; Uncaught when something else was thrown.")
    message: str = Field(description="The error's message (or what was thrown, rendered).")
    stack: str = Field(description="The stack frames in your code (evaluated code, workspace files, packages).")


class EvaluateOutput(Output):
    value: str | None = Field(
        description=f"The value of the last statement, rendered for reading (at most {WORDS['value_max']} of "
        "characters, nested objects abbreviated); null when the code threw or the context ended."
    )
    error: ThrownErrorOutput | None = Field(
        description="What the code threw, or the rejection of a promise it awaited; null when it did not. The "
        "context lives on."
    )
    stdout: str = Field(description=f"What this call wrote to standard output, at most {WORDS['output_cap']}.")
    stderr: str = Field(description=f"What this call wrote to standard error, at most {WORDS['output_cap']}.")
    stdout_truncated: bool = Field(description=f"True when stdout passed {WORDS['output_cap']}; the context ended.")
    stderr_truncated: bool = Field(description=f"True when stderr passed {WORDS['output_cap']}; the context ended.")
    context_reset: bool = Field(
        description="True when this call started a fresh context: the first call, after reset=true, or after the "
        "context ended (a timeout, output cap, memory limit, crash, or a run in this sandbox)."
    )
    context_ended: ContextEnd | None = Field(
        description="Null while the context lives on; else why it ended during this call (every variable is gone)."
    )
    timed_out: bool = Field(description="True when the evaluation was stopped at timeout_seconds.")
    oom_killed: bool = Field(description=f"True when the {WORDS['memory']} memory limit ended the context.")
    duration_ms: int = Field(description="Wall-clock time of the call in milliseconds.")
    cpu_ms: int | None = Field(description="CPU time the call used, in milliseconds, as for runs.")
    peak_memory_bytes: int | None = Field(description="The most memory the call used at once, as for runs.")


class Evaluation(EvaluateOutput):
    """How one evaluation ended: the evaluate tool's output, and what the host alone uses (excluded from it)."""

    model_config = ConfigDict(frozen=True)

    output_bytes: int = Field(exclude=True)
    """Both streams' bytes as the runner counted them, past the cap too."""


class ReadFileOutput(Output):
    content: str = Field(
        description="The file's text, or its first max_bytes bytes cut at a character boundary; with encoding "
        "base64, its bytes (at most max_bytes of them) in base64."
    )
    size: int = Field(description="The whole file's size in bytes.")
    truncated: bool = Field(description="True when content is only the beginning of the file.")
    image_type: str | None = Field(
        default=None,
        description="image/png, image/jpeg, image/gif or image/webp when content is a whole picture of at most "
        "1 MiB (found by its first bytes, not its name); the result then also carries it as an image.",
    )
