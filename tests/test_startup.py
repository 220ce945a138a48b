"""``serve``'s start-up: the ``initialize`` answer recorded by a first server and sent by later ones before the SDK
has loaded, and the modules the start-up path may import before it answers."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.serve.handshake import (
    KNOWN_VERSIONS,
    VERSION_KEY,
    EarlyRequest,
    FrontDesk,
    RecordedAnswers,
    parse_response,
)
from code_sandbox.timeline import PREFIX
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

from tests.support.run import command_env

CLI = str(Path(sys.executable).parent / "code-sandbox")
PARAMS: dict[str, Any] = {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}
}  # fmt: skip
INITIALIZE: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": PARAMS}


class RawClient:
    """``code-sandbox serve`` spoken to line by line, so that every byte it writes to stdout is seen."""

    def __init__(self, tmp_path: Path, *, verbose: bool = False, runtime: str | None = None) -> None:
        env = command_env(
            audit_log=str(tmp_path / "audit.jsonl"), warm_pool="0", **({"runtime": runtime} if runtime else {})
        )
        env["XDG_STATE_HOME"] = str(tmp_path / "xdg-state")
        argv = [CLI, "serve", *(["-v"] if verbose else [])]
        self.process = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._stderr: list[bytes] = []
        self._readers = [
            threading.Thread(target=self._read, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self._stderr.extend(self.process.stderr)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        return json.loads(self._lines.get(timeout=30))

    def finish(self) -> str:
        """Close stdin, wait for the exit, and return stderr; every stdout line must have been received."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0
        for reader in self._readers:
            reader.join(timeout=10)
        for pipe in (self.process.stdout, self.process.stderr):
            assert pipe is not None
            pipe.close()
        assert self._lines.empty(), "the server wrote a line nobody asked for"
        return b"".join(self._stderr).decode()


def session(tmp_path: Path, *, verbose: bool = False) -> tuple[dict[str, Any], list[str], str]:
    """One client session: initialize, initialized, tools/list. Returns the initialize answer, the tool names and
    the server's stderr."""
    client = RawClient(tmp_path, verbose=verbose)
    client.send(INITIALIZE)
    answer = client.receive()
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    listed = client.receive()
    assert listed["id"] == 2, listed  # the SDK's own answer to initialize was held back
    return answer, [tool["name"] for tool in listed["result"]["tools"]], client.finish()


def records(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "xdg-state" / "code-sandbox" / "initialize").glob("*.json"))


def record_of(tmp_path: Path, key: str) -> Path:
    """The one record whose answer has ``key`` (``protocolVersion``: initialize's; ``tools``: tools/list's)."""
    [record] = [path for path in records(tmp_path) if key in json.loads(path.read_text())]
    return record


@pytest.mark.docker
def test_a_later_server_answers_initialize_from_the_record_exactly_as_the_sdk_did(tmp_path: Path) -> None:
    first, tools, stderr = session(tmp_path, verbose=True)
    assert first["id"] == 1 and first["result"]["serverInfo"]["name"] == "code-sandbox"
    assert "from the record" not in stderr
    assert json.loads(record_of(tmp_path, "protocolVersion").read_text()) == first["result"]
    assert [tool["name"] for tool in json.loads(record_of(tmp_path, "tools").read_text())["tools"]] == tools

    second, tools_again, stderr = session(tmp_path, verbose=True)
    at = _milestones(stderr)
    assert at["initialize answered from the record"] < at["tools/list answered from the record"]
    assert at["tools/list answered from the record"] < at["MCP SDK imported"]  # the list did not wait for the SDK
    assert "differed" not in stderr
    assert second == first and tools_again == tools
    assert "execute_javascript" in tools


@pytest.mark.docker
def test_a_stale_record_is_corrected_from_the_sdks_answer(tmp_path: Path) -> None:
    first, _tools, _stderr = session(tmp_path)
    record = record_of(tmp_path, "protocolVersion")
    record.write_text(json.dumps({**first["result"], "instructions": "stale"}))

    stale, _tools, stderr = session(tmp_path, verbose=True)
    assert stale["result"]["instructions"] == "stale"  # sent before the SDK could say otherwise
    assert "differed from the SDK's" in stderr
    assert json.loads(record.read_text()) == first["result"]  # the next start is right again


@pytest.mark.docker
def test_a_record_that_is_not_a_private_json_file_is_ignored(tmp_path: Path) -> None:
    first, _tools, _stderr = session(tmp_path)
    record = record_of(tmp_path, "protocolVersion")
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({**first["result"], "instructions": "planted"}))
    record.unlink()
    record.symlink_to(elsewhere)
    answer, _tools, stderr = session(tmp_path, verbose=True)
    assert answer == first and "from the record" not in stderr


def test_the_start_up_path_imports_neither_the_sdk_nor_dockers_client() -> None:
    script = (
        "import sys, code_sandbox_cli.main, code_sandbox.serve.stdio, code_sandbox.serve.handshake\n"
        "import code_sandbox.serve.tool_text\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types', 'docker', 'rich'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


@pytest.mark.parametrize(
    "message",
    [
        {**INITIALIZE, "method": "ping"},
        {**INITIALIZE, "jsonrpc": "1.0"},
        {**INITIALIZE, "id": True},
        {**INITIALIZE, "id": None},
        {**INITIALIZE, "params": {**PARAMS, "protocolVersion": 5}},
        {**INITIALIZE, "params": {**PARAMS, "protocolVersion": "v" * 65}},
        {**INITIALIZE, "params": {**PARAMS, "capabilities": []}},
        {**INITIALIZE, "params": {**PARAMS, "clientInfo": {"name": "t"}}},
        {key: value for key, value in INITIALIZE.items() if key != "params"},
    ],
)
def test_only_a_well_formed_initialize_is_answered_early(message: dict[str, Any]) -> None:
    assert FrontDesk().consider(json.dumps(message)) is None
    assert FrontDesk().consider(json.dumps(INITIALIZE)) == EarlyRequest(1, "initialize", "2025-06-18")


LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
META = {VERSION_KEY: "2026-07-28", "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
DISCOVER = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": META}}


def _desk(*lines: dict[str, Any], answered: str | None = None) -> FrontDesk:
    desk = FrontDesk()
    for line in lines:
        request = desk.consider(json.dumps(line))
        if request is not None and answered is not None:
            desk.answered(request, {"protocolVersion": answered})
    return desk


def test_a_sessions_tool_list_is_answered_early_only_after_its_initialize_was() -> None:
    assert _desk().consider(json.dumps(LIST)) is None  # no session yet
    recorded_only = EarlyRequest(2, "tools/list", "2025-06-18", record_only=True)
    assert _desk(INITIALIZE).consider(json.dumps(LIST)) == recorded_only  # its initialize went to the SDK
    desk = _desk(INITIALIZE, answered="2025-06-18")
    assert desk.consider(json.dumps(LIST)) == EarlyRequest(2, "tools/list", "2025-06-18")
    assert desk.consider(json.dumps({**LIST, "params": {"cursor": "x"}})) is None  # a page the record does not hold
    assert desk.consider(json.dumps({**LIST, "params": {"_meta": META}})) is None  # refused by the SDK on a session
    assert desk.consider(json.dumps({**INITIALIZE, "id": 9})) is None  # a second initialize: the SDK's to refuse


def test_a_stateless_connection_has_its_discover_and_tool_list_answered_early() -> None:
    desk = FrontDesk()
    assert desk.consider(json.dumps(DISCOVER)) == EarlyRequest(1, "server/discover", "2026-07-28", stateless=True)
    enveloped = {**LIST, "params": {"_meta": META}}
    assert desk.consider(json.dumps(enveloped)) == EarlyRequest(2, "tools/list", "2026-07-28", stateless=True)
    assert desk.consider(json.dumps(LIST)) is None  # no envelope on a stateless connection: the SDK refuses it
    assert desk.consider(json.dumps(INITIALIZE)) is None
    unknown = {**DISCOVER, "params": {"_meta": {**META, VERSION_KEY: "2099-01-01"}}}
    assert FrontDesk().consider(json.dumps(unknown)) is None


def test_a_first_line_too_long_to_judge_here_leaves_every_answer_to_the_sdk() -> None:
    desk = FrontDesk()
    assert desk.consider(json.dumps({**INITIALIZE, "params": {**PARAMS, "pad": "x" * 70_000}})) is None
    assert desk.consider(json.dumps(INITIALIZE)) is None and desk.era == "off"


def test_the_known_versions_are_the_sdks() -> None:
    assert KNOWN_VERSIONS == KNOWN_PROTOCOL_VERSIONS


def test_only_the_answer_to_the_watched_request_is_held_back() -> None:
    request = EarlyRequest(1, "initialize", "2025-06-18")
    answer = '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}'
    assert parse_response(answer, request) == (True, {"protocolVersion": "2025-06-18"})
    assert parse_response('{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"x"}}', request) == (True, None)
    assert parse_response('{"jsonrpc":"2.0","id":2,"result":{}}', request) == (False, None)
    assert parse_response('{"jsonrpc":"2.0","id":1,"method":"ping"}', request) == (False, None)
    assert parse_response('{"jsonrpc":"2.0","id":1,"result":{}}', request) == (False, None)  # a reused id's answer
    assert parse_response("not json", request) == (False, None)


ANSWER = {"protocolVersion": "2025-06-18", "instructions": "text"}
REQUEST = EarlyRequest(1, "initialize", "2025-06-18")


def test_recorded_answers_are_keyed_by_identity_method_and_protocol_version(tmp_path: Path) -> None:
    answers = RecordedAnswers(tmp_path / "initialize", ["code-sandbox", "1", "2", "text"])
    answers.put(REQUEST, ANSWER)
    assert answers.get(REQUEST) == ANSWER
    assert answers.get(EarlyRequest(1, "initialize", "2025-03-26")) is None
    assert answers.get(EarlyRequest(1, "tools/list", "2025-06-18")) is None
    assert RecordedAnswers(tmp_path / "initialize", ["code-sandbox", "1", "2", "other"]).get(REQUEST) is None
    [path] = (tmp_path / "initialize").iterdir()
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "initialize").stat().st_mode & 0o777 == 0o700


def test_only_an_answer_for_a_known_version_or_one_the_sdk_agreed_to_is_recorded(tmp_path: Path) -> None:
    answers = RecordedAnswers(tmp_path / "initialize", ["x"])
    answers.put(EarlyRequest(1, "initialize", "1999-01-01"), {**ANSWER})  # a client's invention, countered
    answers.put(REQUEST, {**ANSWER, "n": float("nan")})  # not JSON
    assert not (tmp_path / "initialize").exists() or not list((tmp_path / "initialize").iterdir())
    countered = EarlyRequest(1, "initialize", "2026-07-28")  # a known version, countered with 2025-11-25
    answers.put(countered, {**ANSWER, "protocolVersion": "2025-11-25"})
    assert answers.get(countered) == {**ANSWER, "protocolVersion": "2025-11-25"}


def test_a_record_that_is_a_fifo_not_json_or_in_a_shared_directory_reads_as_none(tmp_path: Path) -> None:
    directory = tmp_path / "initialize"
    answers = RecordedAnswers(directory, ["x"])
    answers.put(REQUEST, ANSWER)
    [path] = directory.iterdir()
    path.write_text('{"protocolVersion": NaN}')
    assert answers.get(REQUEST) is None
    path.unlink()
    os.mkfifo(path, 0o600)  # opened blocking, this would hang the server's start
    assert answers.get(REQUEST) is None
    path.unlink()
    answers.put(REQUEST, ANSWER)
    directory.chmod(0o770)
    assert answers.get(REQUEST) is None
    directory.chmod(0o700)
    assert answers.get(REQUEST) == ANSWER


@pytest.mark.docker
def test_a_stale_tool_list_is_corrected_and_the_session_told_to_list_again(tmp_path: Path) -> None:
    _first, tools, _stderr = session(tmp_path)
    record = record_of(tmp_path, "tools")
    listed = json.loads(record.read_text())
    record.write_text(json.dumps({**listed, "tools": listed["tools"][:1]}))  # an image rebuilt since, say
    client = RawClient(tmp_path, verbose=True)
    client.send(INITIALIZE)
    client.receive()
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    client.send(LIST)
    assert len(client.receive()["result"]["tools"]) == 1  # sent before the SDK could say otherwise
    assert client.receive() == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    client.send({**LIST, "id": 3})
    assert [tool["name"] for tool in client.receive()["result"]["tools"]] == tools
    assert "differed from the SDK's" in client.finish()
    assert json.loads(record.read_text()) == listed  # the next start is right again


@pytest.mark.docker
def test_a_stateless_client_gets_discover_and_the_tool_list_from_the_record(tmp_path: Path) -> None:
    enveloped = {**LIST, "params": {"_meta": META}}
    answers: list[tuple[dict[str, Any], dict[str, Any], str]] = []
    for _ in range(2):
        client = RawClient(tmp_path, verbose=True)
        client.send(DISCOVER)
        client.send(enveloped)
        answers.append((client.receive(), client.receive(), client.finish()))
    (discovered, listed, cold), (discovered_again, listed_again, warm) = answers
    assert discovered["result"]["supportedVersions"] == ["2026-07-28"] and "from the record" not in cold
    at = _milestones(warm)
    assert at["tools/list answered from the record"] < at["MCP SDK imported"]
    assert (discovered_again, listed_again) == (discovered, listed) and "differed" not in warm


@pytest.mark.docker
def test_an_early_answered_initialize_that_the_sdk_refuses_ends_the_connection(tmp_path: Path) -> None:
    session(tmp_path)  # records the answer
    client = RawClient(tmp_path, verbose=True)
    # Passes our check (the fields the spec requires are there) but not the SDK's: a capability of the wrong type.
    client.send({**INITIALIZE, "params": {**PARAMS, "capabilities": {"roots": True}}})
    assert client.receive()["result"]["serverInfo"]["name"] == "code-sandbox"  # answered from the record
    assert client.process.wait(timeout=30) == 0  # then the connection ends rather than go on half-agreed
    assert "refused an initialize that was answered early" in client.finish()


def _milestones(stderr: str) -> dict[str, float]:
    """The start-up milestones a verbose server logged, by name: when each was reached on the monotonic clock."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        if PREFIX in line:
            name, at = line.split(PREFIX, 1)[1].rsplit(" at monotonic ", 1)
            assert name.strip() not in found, f"logged twice: {name}"
            found[name.strip()] = float(at)
    return found


@pytest.mark.docker
def test_a_verbose_server_logs_its_start_up_milestones_once_in_order_on_the_shared_clock(tmp_path: Path) -> None:
    """The cold-start timeline (bench/run.py) reads these: the system's monotonic clock, which the client shares, and
    ``initialize`` answered from the record before the SDK has been imported."""
    session(tmp_path)  # the first server records the initialize answer
    spawned = time.monotonic()
    _answer, _tools, stderr = session(tmp_path, verbose=True)
    ended = time.monotonic()
    at = _milestones(stderr)
    order = ["serve started (the CLI imported)", "stdio claimed", "initialize answered from the record",
             "MCP SDK imported"]  # fmt: skip
    assert [at[name] for name in order] == sorted(at[name] for name in order), at
    assert "sandbox service built (Docker's client imported)" in at
    assert all(spawned < when < ended for when in at.values()), (spawned, at, ended)
