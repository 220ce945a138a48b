"""One MCP tool and its calls: the definition the server lists (:class:`ToolDef`), arguments validated without
echo, a failure as a coded tool result, and what a call reports while it runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import anyio
from mcp.server import ServerRequestContext
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations
from pydantic import BaseModel, ValidationError

from code_sandbox.errors import ErrorCode, SandboxError, quoted
from code_sandbox.sandbox.answer_text import json_cost
from code_sandbox.sandbox.audit import AuditValue
from code_sandbox.sandbox.relay import LastLine, OutputSink, Progress

Counts = dict[str, AuditValue]
Context = ServerRequestContext[None]
In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)


@dataclass(frozen=True)
class ToolDef(Generic[In, Out]):
    """One tool: its name and text, strict input and output models, annotations, and the handler that turns a
    validated input into an output (recording what the audit log should count)."""

    name: str
    description: str
    input_model: type[In]
    output_model: type[Out]
    annotations: ToolAnnotations
    handler: Callable[[In, Context, Counts], Awaitable[Out]]

    def describe(self) -> Tool:
        return Tool(
            name=self.name,
            description=self.description,
            input_schema=compact_schema(self.input_model.model_json_schema()),
            output_schema=compact_schema(self.output_model.model_json_schema(), open_objects=True),
            annotations=self.annotations,
        )

    async def call(self, arguments: dict[str, Any], context: Context, counts: Counts) -> Out:
        arguments = {key: value for key, value in arguments.items() if key not in CLIENT_ARGUMENTS}
        try:
            params = self.input_model.model_validate(arguments)
        except ValidationError as exc:
            raise validation_error(exc) from None
        return await self.handler(params, context, counts)


CLIENT_ARGUMENTS = frozenset({"wait_for_previous"})
"""Arguments a client adds to every tool it declares to its model, for its own use, and may pass on: Gemini CLI's
``wait_for_previous`` (its model asks to run the call after the ones before it). A call never fails for one; its
value is ignored (the server already answers each session's calls in turn)."""

_NAMED = frozenset({"properties", "$defs", "patternProperties"})
"""Schema keywords whose value maps names to schemas: a key there is a name, never a keyword."""


def compact_schema(piece: Any, *, open_objects: bool = False, names: bool = False) -> Any:
    """A model's JSON schema as ``tools/list`` carries it, every client paying for each character: without the titles
    pydantic generates from names (the name says as much). Every bound stays as it was, and a nullable field stays an
    ``anyOf`` of single types: a type list (``["integer", "null"]``) is shorter, but strict validators warn of it, and
    a client that maps schemas onto a one-type dialect (Gemini's function declarations) may drop or refuse it.

    ``open_objects``: for an output schema, without ``additionalProperties: false``. A client that validates results
    against a list it cached then keeps working when a later server adds a field; inputs stay closed."""
    if isinstance(piece, list):
        return [compact_schema(item, open_objects=open_objects) for item in cast(list[Any], piece)]
    if not isinstance(piece, dict):
        return piece
    compact: dict[str, Any] = {}
    for key, value in cast(dict[str, Any], piece).items():
        if names:
            compact[key] = compact_schema(value, open_objects=open_objects)
        elif not (key == "title" and isinstance(value, str)) and not (open_objects and key == "additionalProperties"):
            compact[key] = compact_schema(value, open_objects=open_objects, names=key in _NAMED)
    return compact


def tool_annotations(*, read_only: bool = False, idempotent: bool) -> ToolAnnotations:
    """A tool's hints. Never destructive, never open-world: every effect stays in a disposable, offline sandbox."""
    return ToolAnnotations(
        read_only_hint=read_only, destructive_hint=False, idempotent_hint=idempotent, open_world_hint=False
    )


TEXT_COPY_BYTES = 768 * 1024
"""The most a result's text block may take on the wire when it repeats the result's JSON. A larger result carries its
data once, in ``structuredContent``, and its text block is :func:`result_summary`: Claude Code, Codex, VS Code and
Copilot CLI show their model ``structuredContent`` alone when a result has it, and carried twice a run at the output
caps made a 27 MB line. With the output streams' shares (:mod:`code_sandbox.sandbox.answer_text`) an answer stays
within its 4 MiB."""
HEAD_CHARS, TAIL_CHARS = 4000, 12000
"""How much of each long string a summary shows: its beginning, and more of its end, where a program's result and errors
usually are. Gemini CLI shows its model the text block alone (and cuts one past 40,000 characters itself)."""


def result_text(output: BaseModel, structured: dict[str, Any]) -> str:
    """The text block of a successful result: its JSON, the same as ``structured``, when that is small; else a
    summary."""
    if sum(len(value) for value in _strings(structured)) <= TEXT_COPY_BYTES // 3:
        text = output.model_dump_json()
        if json_cost(text) <= TEXT_COPY_BYTES:
            return text
    return result_summary(structured)


def result_summary(structured: dict[str, Any]) -> str:
    """A large result in a few lines: each field (a long string as its length, its beginning and its end, a list as its
    length), and where the whole of it is."""
    lines = ["The result is too large to repeat here; all of it is in structuredContent. Its fields:"]
    for key, value in structured.items():
        if isinstance(value, str) and len(value) > HEAD_CHARS + TAIL_CHARS:
            left_out = len(value) - HEAD_CHARS - TAIL_CHARS
            lines.append(f"{key}: {len(value)} characters, beginning with:\n{value[:HEAD_CHARS]}\n"
                         f"[{left_out} characters]\nand ending with:\n{value[-TAIL_CHARS:]}")  # fmt: skip
        elif isinstance(value, list):
            lines.append(f"{key}: {len(cast(list[Any], value))} items")
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False)}")
    return "\n".join(lines)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in cast(dict[str, object], value).values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in cast(list[object], value):
            yield from _strings(item)


def error_result(error: SandboxError) -> CallToolResult:
    """A failure as the model sees it: one text block, ``CODE: message``, and no ``structuredContent``. Every client
    shows its model the text of an error result when there is nothing structured; and the reference SDK's client
    (``@modelcontextprotocol/sdk``, so MCP Inspector and Gemini CLI) checks ``structuredContent`` against the tool's
    output schema even on an error, and would turn a structured error into its own "does not match the tool's output
    schema"."""
    return CallToolResult(content=[TextContent(type="text", text=f"{error.code}: {error.message}")], is_error=True)


# Schema violations that have a more precise code than INVALID_REQUEST: (last field name, pydantic error type).
_PRECISE_CODES = {("content", "string_too_long"): ErrorCode.FILE_TOO_LARGE}


FIELD_NAME_CHARS = 64
"""The most of an unknown field's name a refusal shows (escaped): enough for any real name, never a payload."""


def validation_error(exc: ValidationError) -> SandboxError:
    """Describe what is wrong by field and rule only, never a submitted value. An unknown field is named (a model that
    misspelled one must see which), its name escaped and cut at ``FIELD_NAME_CHARS``."""
    problems: list[str] = []
    codes: set[ErrorCode] = set()
    for error in exc.errors(include_input=False, include_url=False, include_context=False):
        location = [str(part) for part in error["loc"]]
        codes.add(_PRECISE_CODES.get((location[-1] if location else "", error["type"]), ErrorCode.INVALID_REQUEST))
        if error["type"] == "extra_forbidden":
            name = quoted(location[-1], FIELD_NAME_CHARS)
            problems.append(f"{'.'.join(location[:-1]) or 'arguments'}: unknown field {name} (not allowed)")
        else:
            problems.append(f"{'.'.join(location) or 'arguments'}: {error['msg']}")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    code = codes.pop() if len(codes) == 1 else ErrorCode.INVALID_REQUEST
    return SandboxError(code, "invalid arguments: " + "; ".join(problems[:5]) + more)


def live_progress(ctx: Context) -> tuple[Progress | None, OutputSink | None]:
    """What a run reports while it goes, if the client asked for progress (a progress token in the request):
    a notification at most once a second with the time, the output bytes and the last output line."""
    if progress_token_from_params(ctx.params) is None:
        return None, None  # no progress wanted: the run's output is not streamed either
    last = LastLine()
    sent = [float("-inf")]

    async def report(elapsed: float, output_bytes: int) -> None:
        await anyio.sleep(max(0.0, sent[0] + 1.0 - time.monotonic()))
        sent[0] = time.monotonic()
        message = f"running for {elapsed:.0f}s, {output_bytes} output bytes"
        if last.stream is not None:
            message += f"; last {last.stream} line: {last.text}"
        await ctx.session.report_progress(round(elapsed, 1), None, message)

    return report, last.feed
