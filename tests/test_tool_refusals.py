"""How a call that cannot be served is answered, as every client the users have reads it: an error result is text
alone (no ``structuredContent`` for a schema-checking client to refuse), a misspelled field is named, a client's own
scheduling argument is let through, and a tool that does not exist is JSON-RPC's invalid-params error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from code_sandbox.docker_engine import DockerEngine
from mcp import MCPError
from mcp.types import INVALID_PARAMS, TextContent

from tests.test_server import SECRET, connect, error_code, ok

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("image_id", "cleanup_managed")]


async def test_an_error_result_is_its_code_and_message_as_text_alone(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        result = await client.call_tool("list_files", {"session_id": "A" * 43})
    assert result.is_error and result.structured_content is None
    assert [block.type for block in result.content] == ["text"]
    assert isinstance(result.content[0], TextContent)
    assert result.content[0].text == "INVALID_SESSION: no such sandbox; it was destroyed, expired, or never existed"


async def test_a_tool_that_does_not_exist_is_the_json_rpc_invalid_params_error(
    tmp_path: Path, engine: DockerEngine
) -> None:
    async with connect(engine, tmp_path) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool(f"no_such_tool_{SECRET}", {})
        after = await client.call_tool("list_files", {"session_id": "A" * 43})  # the session goes on
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.message == "no tool of that name; call tools/list"
    assert error_code(after) == "INVALID_SESSION"
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert [(record["tool"], record["result"]) for record in audit[:1]] == [("<unknown>", "UNKNOWN_TOOL")]


async def test_a_misspelled_field_is_named_and_its_value_is_not(tmp_path: Path, engine: DockerEngine) -> None:
    async with connect(engine, tmp_path) as client:
        result = await client.call_tool("list_files", {"sesion_id": SECRET})
        nested = await client.call_tool(
            "write_files", {"session_id": "A" * 43, "files": [{"path": "a.js", "content": "", "mode": SECRET}]}
        )
    assert error_code(result) == "INVALID_REQUEST"
    text = result.content[0].text  # type: ignore[union-attr]
    assert 'arguments: unknown field "sesion_id" (not allowed)' in text
    assert "session_id: Field required" in text
    assert SECRET not in text
    assert 'files.0: unknown field "mode" (not allowed)' in nested.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("a\x1b[2Jb\u202ec\n", r'"a\x1b[2Jb\u202ec\n"'),  # escaped: nothing it holds reaches a terminal as control
        ("x" * 500, '"' + "x" * 64 + '..."'),  # bounded: a name is never a payload
        ('quo"te\\', r'"quo\"te\\"'),
    ],
)
async def test_an_unknown_fields_name_is_escaped_and_bounded(
    tmp_path: Path, engine: DockerEngine, name: str, shown: str
) -> None:
    async with connect(engine, tmp_path) as client:
        result = await client.call_tool("create_sandbox", {name: 1})
    assert error_code(result) == "INVALID_REQUEST"
    expected = f"INVALID_REQUEST: invalid arguments: arguments: unknown field {shown} (not allowed)"
    assert result.content[0].text == expected  # type: ignore[union-attr]


async def test_gemini_clis_wait_for_previous_argument_does_not_break_a_call(
    tmp_path: Path, engine: DockerEngine
) -> None:
    """Gemini CLI declares ``wait_for_previous`` on every tool it gives its model, and passes it on."""
    async with connect(engine, tmp_path) as client:
        declared = json.dumps([tool.input_schema for tool in (await client.list_tools()).tools])
        sid = ok(await client.call_tool("create_sandbox", {"wait_for_previous": True}))["session_id"]
        files = [{"path": "a.js", "content": "console.log(6 * 7)"}]
        ok(await client.call_tool("write_files", {"session_id": sid, "files": files, "wait_for_previous": False}))
        run = ok(await client.call_tool("run_javascript", {"session_id": sid, "entrypoint": "a.js",
                                                          "wait_for_previous": True}))  # fmt: skip
        ok(await client.call_tool("destroy_sandbox", {"session_id": sid, "wait_for_previous": True}))
    assert run["stdout"] == "42\n"
    assert "wait_for_previous" not in declared  # the client declares it, not the server
