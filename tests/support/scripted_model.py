"""A scripted model on 127.0.0.1 for driving real clients (Codex, Gemini CLI) through their documented settings: each
client is pointed at it as its model provider, and it plays a script of tool calls, one per model request, then ends
the turn with a message. It records every request, so a test reads what the client showed its model as each tool's
output. Nothing leaves the machine: the clients are real, only the model is fake.

It speaks OpenAI's Responses API (``POST /v1/responses``, streamed; Codex), Gemini's
(``POST /v1beta/models/<model>:streamGenerateContent``, streamed, and ``:generateContent``; Gemini CLI) and
Anthropic's Messages API (``POST /v1/messages``, streamed; Claude Code). The step a request gets is the number of tool
calls already in its conversation, so a retried request does not skip one. The string ``$session_id`` in a step's
arguments stands for the sandbox ID that create_sandbox's output showed the model.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, cast

DONE = "All done."
"""What the model says when the script has run out: the turn ends."""
NOT_DECLARED = "The client did not declare the tool "
"""What the model says, ending the turn, when the client did not give it the tool of the next step."""
_SESSION_ID = re.compile(r'session_id[\\"]*:\s*[\\"]*([A-Za-z0-9_-]{43})[\\"]*,\s*[\\"]*expires_at')
"""A sandbox ID as create_sandbox's output shows it (a client's error text may quote another call's arguments)."""


@dataclass(frozen=True)
class Call:
    """One step: the model calls ``tool`` (its MCP name; the client's prefix is found in the declared tools)."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict[str, Any])


def _filled(value: Any, session_id: str | None) -> Any:
    if value == "$session_id":
        return session_id
    if isinstance(value, dict):
        return {key: _filled(item, session_id) for key, item in cast(dict[str, Any], value).items()}
    if isinstance(value, list):
        return [_filled(item, session_id) for item in cast(list[Any], value)]
    return value


class ScriptedModel:
    """The model server: ``with ScriptedModel(steps) as model:`` serves on ``model.url`` until the block ends."""

    def __init__(self, steps: list[Call]) -> None:
        self.steps = steps
        self.requests: list[tuple[str, dict[str, Any]]] = []
        """Every request as (path, JSON body), in arrival order."""
        self.stray: list[str] = []
        """Requests for anything but a model's answer (a proxy's CONNECT, an unknown path): none is expected."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted model", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append((path, body))

    def step(self, calls_so_far: int, outputs: list[str]) -> Call | None:
        """The step for a request whose conversation holds ``calls_so_far`` tool calls and these tools' ``outputs``,
        its arguments filled in from what the outputs showed."""
        if calls_so_far >= len(self.steps):
            return None
        step = self.steps[calls_so_far]
        found = _SESSION_ID.findall("\n".join(outputs))
        return Call(step.tool, _filled(step.arguments, found[-1] if found else None))

    # -- what the client showed the model -------------------------------------------------------------------------

    def last_conversation(self) -> dict[str, Any]:
        return self.requests[-1][1]

    def openai_outputs(self, body: dict[str, Any] | None = None) -> list[str]:
        """Codex: the outputs of the tool calls in the last request's conversation (or ``body``'s), each as the text
        the model read."""
        outputs: list[str] = []
        for item in (body or self.last_conversation()).get("input", []):
            if item.get("type") == "function_call_output":
                output = item.get("output")
                if isinstance(output, list):
                    output = "\n".join(part.get("text", "") for part in cast(list[dict[str, Any]], output))
                outputs.append(str(output))
        return outputs

    def gemini_outputs(self, body: dict[str, Any] | None = None) -> list[str]:
        """Gemini CLI: the function responses in the last request's conversation (or ``body``'s), each as JSON text."""
        return [
            json.dumps(part["functionResponse"].get("response"))
            for content in (body or self.last_conversation()).get("contents", [])
            for part in content.get("parts", [])
            if "functionResponse" in part
        ]

    def anthropic_outputs(self, body: dict[str, Any] | None = None) -> list[str]:
        """Claude Code: the tool results in the last request's conversation (or ``body``'s), each as text."""
        outputs: list[str] = []
        for message in (body or self.last_conversation()).get("messages", []):
            content: object = message.get("content")
            blocks = cast(list[dict[str, Any]], content) if isinstance(content, list) else []
            for block in blocks:
                if block.get("type") == "tool_result":
                    inner: object = block.get("content")
                    if isinstance(inner, list):
                        inner = "\n".join(part.get("text", "") for part in cast(list[dict[str, Any]], inner))
                    outputs.append(str(inner))
        return outputs

    def declared_tools(self) -> list[dict[str, Any]]:
        """The tools the last request declared to the model (Gemini's function declarations, or Codex's tools)."""
        body = self.last_conversation()
        if "tools" in body and isinstance(body["tools"], list) and body.get("contents") is not None:
            tools = cast(list[dict[str, Any]], body["tools"])
            return [decl for tool in tools for decl in tool.get("functionDeclarations", [])]
        return _flattened(cast(list[dict[str, Any]], body.get("tools", [])))


def _flattened(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's function tools, those inside a namespace (its MCP servers') included, each with its namespace."""
    found: list[dict[str, Any]] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            found += [{**inner, "namespace": tool.get("name")} for inner in tool.get("tools", [])]
        elif tool.get("type") == "function":
            found.append(tool)
    return found


def _sse(event: str | None, payload: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


def _openai_reply(model: ScriptedModel, body: dict[str, Any], n: int) -> bytes:
    conversation = cast(list[dict[str, Any]], body.get("input", []))
    step = model.step(sum(item.get("type") == "function_call" for item in conversation), model.openai_outputs(body))
    rid = f"resp_{n}"
    declared = [t for t in _flattened(body.get("tools", [])) if step and t["name"].split("__")[-1] == step.tool]
    if step is None or not declared:
        said = DONE if step is None else f"{NOT_DECLARED}{step.tool}"
        item: dict[str, Any] = {"type": "message", "role": "assistant", "id": f"msg_{n}",
                                "content": [{"type": "output_text", "text": said}]}  # fmt: skip
    else:
        item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": declared[0]["name"],
                "arguments": json.dumps(step.arguments)}  # fmt: skip
        if declared[0].get("namespace"):
            item["namespace"] = declared[0]["namespace"]
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    return b"".join([
        _sse("response.created", {"type": "response.created", "response": {"id": rid}}),
        _sse("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        _sse("response.completed", {"type": "response.completed", "response": {"id": rid, "usage": usage}}),
    ])  # fmt: skip


def _gemini_candidate(model: ScriptedModel, body: dict[str, Any]) -> dict[str, Any]:
    contents = cast(list[dict[str, Any]], body.get("contents", []))
    calls = sum("functionCall" in part for content in contents for part in content.get("parts", []))
    step = model.step(calls, model.gemini_outputs(body))
    declared = [decl["name"] for tool in body.get("tools", []) for decl in tool.get("functionDeclarations", [])]
    # The client's name for the server's tool (Gemini CLI's mcp_<server>_<tool>) before a built-in of the same name.
    names = sorted(
        (n for n in declared if step and (n == step.tool or n.endswith("_" + step.tool))),
        key=lambda n: n == getattr(step, "tool", ""),
    )
    if step is None or not names:
        parts: list[dict[str, Any]] = [{"text": DONE if step is None else f"{NOT_DECLARED}{step.tool}"}]
    else:
        parts = [{"functionCall": {"name": names[0], "args": step.arguments}}]
    return {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}


def _anthropic_reply(model: ScriptedModel, body: dict[str, Any], n: int) -> bytes:
    messages = cast(list[dict[str, Any]], body.get("messages", []))
    calls = sum(
        block.get("type") == "tool_use"
        for message in messages
        if isinstance(message.get("content"), list)
        for block in message["content"]
    )
    declared = [tool.get("name", "") for tool in body.get("tools", [])]
    step = model.step(calls, model.anthropic_outputs(body)) if declared else None
    names = [name for name in declared if step and name.endswith("__" + step.tool)]
    message: dict[str, Any] = {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": body.get("model"),
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    start: dict[str, Any] = {"type": "message_start", "message": message}
    if step is not None and names:
        block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{n}", "name": names[0], "input": {}}
        delta: dict[str, Any] = {"type": "input_json_delta", "partial_json": json.dumps(step.arguments)}
        stop = "tool_use"
    else:
        said = DONE if step is None or not declared else f"{NOT_DECLARED}{step.tool}"
        block, delta, stop = {"type": "text", "text": ""}, {"type": "text_delta", "text": said}, "end_turn"
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", start),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 1}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return b"".join(_sse(event, payload) for event, payload in events)


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def do_CONNECT(self) -> None:  # a proxy request: something tried to leave the machine
            model.stray.append(f"CONNECT {self.path}")
            self._send(403, b"", "text/plain")

        def do_GET(self) -> None:
            model.stray.append(f"GET {self.path}")
            self._send(404, b"{}", "application/json")

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            try:
                body = cast(dict[str, Any], json.loads(self.rfile.read(length) or b"{}"))
            except ValueError:
                body = {}
            path = self.path.split("?", 1)[0]
            n = len(model.requests) + 1
            if path.endswith("/v1/messages"):
                model.record(path, body)
                self._send(200, _anthropic_reply(model, body, n), "text/event-stream")
            elif path.endswith("/v1/messages/count_tokens"):
                self._send(200, b'{"input_tokens": 1}', "application/json")
            elif path.endswith("/responses"):
                model.record(path, body)
                self._send(200, _openai_reply(model, body, n), "text/event-stream")
            elif path.endswith(":streamGenerateContent"):
                model.record(path, body)
                chunk = {"candidates": [_gemini_candidate(model, body)], "usageMetadata": _GEMINI_USAGE}
                self._send(200, _sse(None, chunk), "text/event-stream")
            elif path.endswith(":generateContent"):  # the client's own side questions (next speaker, ...)
                answer = {"content": {"role": "model", "parts": [{"text": "{}"}]}, "finishReason": "STOP", "index": 0}
                chunk = {"candidates": [answer], "usageMetadata": _GEMINI_USAGE}
                self._send(200, json.dumps(chunk).encode(), "application/json")
            elif path.endswith(":countTokens"):
                self._send(200, b'{"totalTokens": 1}', "application/json")
            else:
                model.stray.append(f"POST {self.path}")
                self._send(404, b"{}", "application/json")

        def _send(self, status: int, data: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

    return Handler


_GEMINI_USAGE = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
