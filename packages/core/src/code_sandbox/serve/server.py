"""The MCP surface: the SDK's low-level ``Server`` with a table of tools, each a thin translation into core.

The server owns argument validation (strict models, our error codes, no echo of submitted values) by answering
``tools/list`` and ``tools/call`` itself; the SDK's decorated tools would quote the caller's input back. Every
failure of a tool becomes a tool result with ``isError: true`` whose text starts with a stable code
(:mod:`code_sandbox.serve.tool_calls`); a call that names no tool gets JSON-RPC's invalid-params error.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, cast

import anyio
from mcp.server import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ContentBlock,
    ImageContent,
    ListToolsResult,
    PaginatedRequestParams,
    ServerCapabilities,
    TextContent,
)
from pydantic import BaseModel

from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.sandbox.evaluation import evaluate_code
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import EvaluateOutput, ReadFileOutput, RunOutput, RunResult
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.sandbox.sessions import session_hash
from code_sandbox.sandbox.workspace import delete_files, list_files, read_file, write_files
from code_sandbox.serve import tool_text
from code_sandbox.serve.schemas import (
    CreateSandboxInput,
    CreateSandboxOutput,
    DeleteFilesInput,
    DeleteFilesOutput,
    DeleteStatus,
    DestroyOutput,
    Entry,
    EvaluateInput,
    ExecuteInput,
    FileStatus,
    ListFilesInput,
    ListFilesOutput,
    ListSnapshotsInput,
    ListSnapshotsOutput,
    ReadFileInput,
    RunInput,
    SessionInput,
    SnapshotInput,
    SnapshotOutput,
    SnapshotRow,
    WriteFilesInput,
    WriteFilesOutput,
    evaluate_input_model,
    run_input_models,
)
from code_sandbox.serve.tool_calls import (
    Context,
    Counts,
    ToolDef,
    error_result,
    live_progress,
    result_text,
    tool_annotations,
)
from code_sandbox.threads import in_engine_thread
from code_sandbox.timeline import milestone

logger = logging.getLogger(__name__)

UNKNOWN_TOOL = "UNKNOWN_TOOL"
"""The audit log's result for a call that named no tool (the client got JSON-RPC's invalid-params error)."""


def _files_with_counts(params: WriteFilesInput | ExecuteInput, counts: Counts) -> list[tuple[str, str | bytes]]:
    """The (path, text or bytes) pairs of a files argument, counted into the audit record (bytes as written)."""
    files = [(f.path, f.data()) for f in params.files]
    sizes = [len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data) for _path, data in files]
    counts.update(files=len(files), bytes=sum(sizes))
    return files


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _run_counts(counts: Counts, result: RunResult) -> None:
    counts.update(
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        oom_killed=result.oom_killed,
        output_bytes=result.output_bytes,
        cleanup="ok",
        leftover_killed=result.leftover_processes_killed,
        cpu_ms=result.cpu_ms,
        peak_memory_bytes=result.peak_memory_bytes,
    )


class SandboxServer(Server[None]):
    """The code-sandbox MCP server for one profile: the SDK's low-level server with our tool table."""

    def __init__(self, service: SandboxService) -> None:
        """``service``: the sandboxes, which the caller built (and may have started): their settings and profile
        are the server's."""
        settings, profile = service.settings, service.profile
        info = profile.info
        self.execute_tool_name = info.execute_tool_name
        words = tool_text.package_words(settings, profile, ())
        super().__init__(
            "code-sandbox",
            version=metadata.version("code-sandbox-core"),
            instructions=tool_text.instructions(settings, info),
            lifespan=self._lifespan,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.settings = settings
        self.profile = profile
        self.service = service
        self.engine = self.service.engine
        self.manager = self.service.manager
        self.audit = self.service.audit
        run_model, execute_model = run_input_models(
            entrypoint_suffixes=info.entrypoint_suffixes,
            example_entrypoint=info.default_entrypoints[0],
            default_timeout=settings.default_timeout,
            max_timeout=settings.max_timeout,
        )
        # The hints describe effects on the user's world, which no tool has: each acts only in a disposable sandbox
        # that the caller made (README, "Annotations"). So nothing is destructive or open-world, and a client's
        # default approvals (Codex's asks before a destructive call) let every tool run.
        reads = tool_annotations(read_only=True, idempotent=True)
        changes, repeatable = tool_annotations(read_only=False, idempotent=False), tool_annotations(idempotent=True)
        tools: list[ToolDef[Any, Any]] = [
            ToolDef("create_sandbox", tool_text.CREATE_SANDBOX.format(**words), CreateSandboxInput,
                    CreateSandboxOutput, changes, self._create),
            ToolDef("write_files", tool_text.WRITE_FILES.format(**words), WriteFilesInput, WriteFilesOutput,
                    repeatable, self._write),
            ToolDef("list_files", tool_text.LIST_FILES.format(**words), ListFilesInput, ListFilesOutput, reads,
                    self._list),
            ToolDef("read_file", tool_text.READ_FILE.format(**words), ReadFileInput, ReadFileOutput, reads, self._read),
            ToolDef("delete_files", tool_text.DELETE_FILES.format(**words), DeleteFilesInput, DeleteFilesOutput,
                    repeatable, self._delete),
            ToolDef(info.run_tool_name, "", run_model, RunOutput, changes, self._run),
            ToolDef("destroy_sandbox", tool_text.DESTROY_SANDBOX.format(**words), SessionInput, DestroyOutput,
                    repeatable, self._destroy),
            ToolDef(self.execute_tool_name, "", execute_model, RunOutput, changes, self._execute),
            ToolDef("snapshot_sandbox", tool_text.SNAPSHOT_SANDBOX.format(**words), SnapshotInput, SnapshotOutput,
                    changes, self._snapshot),
            ToolDef("list_snapshots", tool_text.LIST_SNAPSHOTS.format(**words), ListSnapshotsInput,
                    ListSnapshotsOutput, reads, self._list_snapshots),
        ]  # fmt: skip
        if info.evaluate_tool_name is not None:
            evaluate_model = evaluate_input_model(
                default_timeout=settings.default_timeout, max_timeout=settings.max_timeout
            )
            tools.append(ToolDef(info.evaluate_tool_name, "", evaluate_model, EvaluateOutput, changes, self._evaluate))
        self.tool_defs = {tool.name: tool for tool in tools}
        self._described: tuple[str, ...] = ()
        """The package list the run tools' descriptions name now."""
        self._name_packages(())

    # -- protocol -----------------------------------------------------------------------------------------------

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> ServerCapabilities:
        """The SDK's, with ``tools.listChanged``: a session whose tool list was answered from an outdated record
        is told to list the tools again (:mod:`code_sandbox.serve.handshake`)."""
        asked = notification_options or NotificationOptions()
        options = NotificationOptions(asked.prompts_changed, asked.resources_changed, tools_changed=True)
        return super().get_capabilities(
            options,
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, _server: Server[None]) -> AsyncGenerator[None]:
        async with self.service.running():
            yield None

    async def _list_tools(self, _ctx: Context, _params: PaginatedRequestParams | None) -> ListToolsResult:
        await self._describe_packages()
        return ListToolsResult(tools=[tool.describe() for tool in self.tool_defs.values()])

    async def _describe_packages(self) -> None:
        """Name the verified image's packages in the run tools' descriptions. An image that is missing or fails
        verification vendors nothing: every tool that needs a sandbox then says so (IMAGE_INVALID)."""
        try:
            packages = await self.manager.provisioner.image_packages()
        except SandboxError:
            packages = ()
        if packages != self._described:
            self._name_packages(packages)

    def _name_packages(self, packages: tuple[str, ...]) -> None:
        """Write the descriptions that name the packages (run, execute, evaluate) for ``packages``."""
        settings, profile, info = self.settings, self.profile, self.profile.info
        texts = {
            info.run_tool_name: tool_text.run_tool_description(settings, profile, packages),
            self.execute_tool_name: tool_text.EXECUTE.format(**tool_text.package_words(settings, profile, packages)),
        }
        if info.evaluate_tool_name is not None:
            texts[info.evaluate_tool_name] = tool_text.evaluate_tool_description(settings, profile, packages)
        for name, text in texts.items():
            self.tool_defs[name] = replace(self.tool_defs[name], description=text)
        self._described = packages

    async def _call_tool(self, ctx: Context, params: CallToolRequestParams) -> CallToolResult:
        name, arguments = params.name, params.arguments or {}
        started = time.monotonic()
        counts: Counts = {}
        raw_session = arguments.get("session_id")
        hashed = session_hash(raw_session) if isinstance(raw_session, str) else None
        tool = self.tool_defs.get(name)
        if tool is None:  # a protocol error, as the specification has it: the call names no tool there is
            self.audit.record(tool="<unknown>", session_hash=hashed, result=UNKNOWN_TOOL, duration_ms=0, counts={})
            raise MCPError(INVALID_PARAMS, "no tool of that name; call tools/list")
        result_code = "OK"
        try:
            output = await tool.call(arguments, ctx, counts)
            hashed = cast(str | None, counts.pop("session_hash", hashed))
            structured = output.model_dump(mode="json")
            if isinstance(output, ReadFileOutput) and output.image_type is not None:
                # The picture once, as a picture: its base64 stays out of the text a model reads.
                blocks: list[ContentBlock] = [
                    TextContent(type="text", text=output.model_dump_json(exclude={"content"})),
                    ImageContent(type="image", data=output.content, mime_type=output.image_type),
                ]
            else:
                blocks = [TextContent(type="text", text=result_text(output, structured))]
            milestone("first tool call answered")
            return CallToolResult(content=blocks, structured_content=structured)
        except SandboxError as error:
            result_code = str(error.code)
            if error.engine_text is not None:  # the engine's words are for the operator's log, never the client
                logger.warning("tool %s failed: %s: %s", tool.name, error.code, error.for_operator())
            return error_result(error)
        except anyio.get_cancelled_exc_class():
            result_code = "CANCELLED"
            raise
        except Exception:
            logger.exception("tool %s failed unexpectedly", tool.name)
            result_code = str(ErrorCode.INTERNAL_ERROR)
            return error_result(SandboxError(ErrorCode.INTERNAL_ERROR, "an internal error occurred"))
        finally:
            self.audit.record(
                tool=tool.name,
                session_hash=hashed,
                result=result_code,
                duration_ms=int((time.monotonic() - started) * 1000),
                counts=counts,
            )

    # -- tools --------------------------------------------------------------------------------------------------

    async def _create(self, params: CreateSandboxInput, _ctx: Context, counts: Counts) -> BaseModel:
        session = await self.service.create(from_snapshot=params.from_snapshot, fork_of=params.fork_of)
        counts["session_hash"] = session.hash
        return CreateSandboxOutput(
            session_id=session.id,
            expires_at=_iso(session.expires_at),
            idle_timeout_seconds=self.settings.idle_timeout,
            profile=self.profile.name,
            packages=list(session.packages),
        )

    async def _snapshot(self, params: SnapshotInput, _ctx: Context, counts: Counts) -> BaseModel:
        info, content = await self.service.snapshot(params.session_id, params.name)
        counts.update(files=info.files, bytes=info.bytes)
        return SnapshotOutput(
            name=info.name,
            files=info.files,
            bytes=info.bytes,
            skipped=content.skipped,
        )

    async def _list_snapshots(self, _params: ListSnapshotsInput, _ctx: Context, counts: Counts) -> BaseModel:
        kept = await self.service.list_snapshots()
        now = await in_engine_thread(self.engine.now)
        counts["snapshots"] = len(kept)
        return ListSnapshotsOutput(
            snapshots=[
                SnapshotRow(
                    name=info.name, profile=info.profile, files=info.files, bytes=info.bytes,
                    age_seconds=max(0, int(now - info.created)),
                )
                for info in kept
            ]
        )  # fmt: skip

    async def _write(self, params: WriteFilesInput, _ctx: Context, counts: Counts) -> BaseModel:
        files = _files_with_counts(params, counts)
        statuses = await write_files(self.manager, params.session_id, files, overwrite=params.overwrite)
        return WriteFilesOutput(
            results=[FileStatus(path=path, status=status) for (path, _c), status in zip(files, statuses, strict=True)]
        )

    async def _list(self, params: ListFilesInput, _ctx: Context, counts: Counts) -> BaseModel:
        entries, truncated = await list_files(
            self.manager, params.session_id, params.path, recursive=params.recursive, max_depth=params.max_depth
        )
        counts["files"] = len(entries)
        return ListFilesOutput(
            entries=[Entry(path=e.path, type=e.type, size=e.size) for e in entries], truncated=truncated
        )

    async def _read(self, params: ReadFileInput, _ctx: Context, counts: Counts) -> BaseModel:
        result = await read_file(
            self.manager, params.session_id, params.path, max_bytes=params.max_bytes, encoding=params.encoding
        )
        counts.update(bytes=result.size, truncated=result.truncated)
        return result

    async def _delete(self, params: DeleteFilesInput, _ctx: Context, counts: Counts) -> BaseModel:
        statuses = await delete_files(self.manager, params.session_id, params.paths)
        counts["files"] = len(params.paths)
        return DeleteFilesOutput(
            results=[DeleteStatus(path=p, status=s) for p, s in zip(params.paths, statuses, strict=True)]
        )

    async def _destroy(self, params: SessionInput, _ctx: Context, _counts: Counts) -> BaseModel:
        return DestroyOutput(destroyed=await self.service.destroy(params.session_id))

    async def _execute(self, params: ExecuteInput, ctx: Context, counts: Counts) -> BaseModel:
        progress, output = live_progress(ctx)
        result = await self.service.execute(
            _files_with_counts(params, counts),
            params.entrypoint,
            params.arguments,
            timeout_seconds=params.timeout_seconds,
            progress=progress,
            output=output,
            on_created=lambda session: counts.update(session_hash=session.hash),
        )
        _run_counts(counts, result)
        return result

    async def _run(self, params: RunInput, ctx: Context, counts: Counts) -> BaseModel:
        progress, output = live_progress(ctx)
        result = await run_entrypoint(
            self.manager,
            params.session_id,
            params.entrypoint,
            params.arguments,
            timeout_seconds=params.timeout_seconds,
            progress=progress,
            output=output,
        )
        _run_counts(counts, result)
        return result

    async def _evaluate(self, params: EvaluateInput, ctx: Context, counts: Counts) -> BaseModel:
        progress, output = live_progress(ctx)
        counts.update(code_chars=len(params.code), reset=params.reset)
        result = await evaluate_code(
            self.manager,
            params.session_id,
            params.code,
            timeout_seconds=params.timeout_seconds,
            reset=params.reset,
            progress=progress,
            output=output,
        )
        counts.update(
            context_reset=result.context_reset,
            context_ended=result.context_ended,
            output_bytes=result.output_bytes,
            cpu_ms=result.cpu_ms,
            peak_memory_bytes=result.peak_memory_bytes,
        )
        return result
