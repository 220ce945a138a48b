"""The clients users have, real and pinned (tests/support/clients), each registered with the README's commands and
driven through a sandbox's life: create, write, run, an error of each kind, destroy. The reference SDK's client and
Inspector call the tools themselves; Codex, Gemini CLI and Claude Code are driven by a scripted model on 127.0.0.1
(tests/support/scripted_model.py), and the test reads what each showed its model."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.serve.handshake import KNOWN_VERSIONS, VERSION_KEY

from tests.support import clients
from tests.support.run import worker_containers
from tests.support.scripted_model import DONE, Call, ScriptedModel
from tests.test_server import CLI, SECRET, server_env

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("image_id", "cleanup_managed")]

PROGRAM = "console.log(6 * 7)"
MISSING_SESSION = "A" * 43
LIFE: list[tuple[str, dict[str, Any], str]] = [
    ("create_sandbox", {}, '"session_id"'),
    ("write_files", {"session_id": "$session_id", "files": [{"path": "main.js", "content": PROGRAM}]}, "written"),
    ("run_javascript", {"session_id": "$session_id", "entrypoint": "main.js"}, "42"),
    ("read_file", {"session_id": "$session_id", "path": "missing.txt"}, "NOT_FOUND: "),
    ("read_file", {"session_id": "$session_id", "path": "../etc/passwd"}, "PATH_TRAVERSAL: "),
    ("list_files", {"session_id": MISSING_SESSION}, "INVALID_SESSION: "),
    ("list_files", {"session_id": "$session_id", "recursiv": SECRET}, 'unknown field "recursiv"'),
    ("run_javascript", {"session_id": "$session_id", "entrypoint": "main.py"}, "INVALID_PATH: "),
    ("destroy_sandbox", {"session_id": "$session_id"}, '"destroyed": true'),
]
"""A sandbox's life as a model lives it: each call, and what its output must show the model."""


@pytest.fixture(scope="module")
def installed() -> Path:
    return clients.ensure_installed()


def _settings_env(tmp_path: Path) -> dict[str, str]:
    """The server's settings for this test (this worker's tag, the audit log and state under ``tmp_path``)."""
    env = server_env(tmp_path)
    return {key: value for key, value in env.items() if key.startswith("CODE_SANDBOX_") or key == "XDG_STATE_HOME"}


UNKNOWN_FIELD = 6
"""The step of LIFE with a misspelled field."""


def _assert_seen(outputs: list[str], client: str, instead: dict[int, str] | None = None) -> None:
    """Each call's output, in order, shows the model what it must (or, for the steps in ``instead``, what the client
    itself says); no submitted value comes back."""
    assert len(outputs) == len(LIFE), (client, outputs)
    expected = [(tool, (instead or {}).get(i, shown)) for i, (tool, _arguments, shown) in enumerate(LIFE)]
    for (tool, shown), output in zip(expected, outputs, strict=True):
        compact = output.replace('\\"', '"').replace('": ', '":').replace('":', '": ')
        assert shown in compact, (client, tool, output)
    assert SECRET not in "".join(outputs), client


# -- the reference SDK's client and Inspector --------------------------------------------------------------------


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_the_reference_sdks_client_gets_every_result_and_every_error_with_its_code(
    tmp_path: Path, engine: DockerEngine, installed: Path
) -> None:
    """Its callTool checks structuredContent against the output schema even on an error (an error result carrying
    one failed as "-32602 Structured content does not match"), and throws the JSON-RPC error of an unknown tool."""
    plan = [{"name": tool, "arguments": arguments} for tool, arguments, _shown in LIFE]
    plan.append({"name": "no_such_tool", "arguments": {}})
    completed = subprocess.run(
        [str(clients.node22()), str(Path(clients.__file__).parent / "ts_client.mjs"), CLI, "serve"],
        input=json.dumps(plan), capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
        env={**os.environ, **_settings_env(tmp_path), "SDK_DIR": str(clients.package("@modelcontextprotocol/sdk"))},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    listed, *answers = [json.loads(line) for line in completed.stdout.splitlines()]
    assert len(listed["listed"]) == 11
    *lived, unknown = answers
    outputs: list[str] = []
    for answer in lived:
        assert "result" in answer, answer  # nothing thrown: every result passed the SDK's checks
        outputs.append(json.dumps(answer["result"].get("structuredContent")) + answer["result"]["content"][0]["text"])
    _assert_seen(outputs, "the SDK's client")
    assert unknown["thrown"]["code"] == -32602
    assert worker_containers(engine) == []


def _inspector(tmp_path: Path, *method: str) -> subprocess.CompletedProcess[str]:
    env = _settings_env(tmp_path)
    options = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    return subprocess.run(
        [str(clients.launcher()), "--cli", *options, CLI, "serve", "--method", *method],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
        env={**os.environ, **env, "PATH": clients.with_node22(os.environ["PATH"])},
    )  # fmt: skip


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_inspectors_strict_lint_finds_nothing_in_the_tool_list(tmp_path: Path, installed: Path) -> None:
    """``--strict`` lints every schema for portability: a nullable type list (``["integer", "null"]``) was one of 13
    warnings."""
    completed = _inspector(tmp_path, "tools/list", "--strict", "--format", "json")
    assert completed.returncode == 0, completed.stderr[-2000:]
    answer = json.loads(completed.stdout)
    assert len(answer["result"]["tools"]) == 11
    assert "schemaFindings" not in answer, answer.get("schemaFindings")
    assert "portability" not in completed.stderr, completed.stderr


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_inspector_shows_an_error_result_with_its_code(tmp_path: Path, installed: Path) -> None:
    completed = _inspector(
        tmp_path, "tools/call", "--tool-name", "list_files", "--tool-arg", f"session_id={MISSING_SESSION}"
    )
    assert "does not match the tool's output schema" not in completed.stdout + completed.stderr
    result = json.loads(completed.stdout)
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("INVALID_SESSION: ")


# -- Codex ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def codex_home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A Codex home of the test's own whose model is the scripted one; the environment to run ``codex`` in. Nothing
    but the model's port is configured beyond the README's registration."""
    home = tmp_path / "codex-home"
    home.mkdir()
    user_home = tmp_path / "home"
    user_home.mkdir()
    env = {
        "PATH": clients.with_node22(os.environ["PATH"]),
        "HOME": str(user_home),
        "CODEX_HOME": str(home),
        "SCRIPTED_MODEL_KEY": "not-a-key",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    yield home, env


def _codex_config(home: Path, model: ScriptedModel) -> None:
    (home / "config.toml").write_text(
        'model = "scripted"\nmodel_provider = "scripted"\ncheck_for_update_on_startup = false\n\n'
        "[features]\nplugins = false\n\n[analytics]\nenabled = false\n\n"
        f'[model_providers.scripted]\nname = "scripted"\nbase_url = "{model.url}/v1"\nwire_api = "responses"\n'
        'env_key = "SCRIPTED_MODEL_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n'
    )


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_codex_exec_with_the_readmes_registration_uses_every_tool(
    tmp_path: Path, engine: DockerEngine, installed: Path, codex_home: tuple[Path, dict[str, str]]
) -> None:
    """Under its default approvals ``codex exec`` refuses a tool marked destructive (``MCP tool call requires
    approval``); our tools are not, since none reaches the user's world. Its first turn starts about a second after
    it spawns the server, with the tools listed by then: the list comes from the record."""
    home, env = codex_home
    codex = str(clients.command("codex"))
    settings = [arg for key, value in _settings_env(tmp_path).items() for arg in ("--env", f"{key}={value}")]
    steps = [Call(tool, arguments) for tool, arguments, _shown in LIFE]
    with ScriptedModel(steps) as model:
        _codex_config(home, model)
        # README, "Register with a client": codex mcp add code-sandbox -- /abs/path/.venv/bin/code-sandbox serve
        registered = subprocess.run(
            [codex, "mcp", "add", *settings, "code-sandbox", "--", CLI, "serve"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        _first_start(tmp_path, env)
        completed = subprocess.run(
            [codex, "exec", "--skip-git-repo-check", "Use the sandbox."], env=env, cwd=tmp_path,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert DONE in completed.stdout, completed.stdout  # not "did not declare": the first turn had every tool
        _assert_seen(model.openai_outputs(), "codex")
    assert model.stray == []
    assert worker_containers(engine) == []


def _first_start(tmp_path: Path, env: dict[str, str]) -> None:
    """What a machine's first server of a build does once for each protocol version a client asks for: verify the image
    and record the answers the SDK gives. Every later start answers ``tools/list`` from that record at once; this one
    waits for the SDK, and a client that starts its turn first (Codex, about a second after the spawn) misses the
    tools on that first start."""
    for version in KNOWN_VERSIONS[:-1]:  # the session ones; the last is stateless
        _one_session(tmp_path, env, version)
    meta = {VERSION_KEY: KNOWN_VERSIONS[-1], "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "first-start", "version": "0"}}  # fmt: skip
    _exchange(tmp_path, env, [
        {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}},
    ])  # fmt: skip


def _one_session(tmp_path: Path, env: dict[str, str], version: str) -> None:
    _exchange(tmp_path, env, [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": version,
         "capabilities": {}, "clientInfo": {"name": "first-start", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ])  # fmt: skip


def _exchange(tmp_path: Path, env: dict[str, str], messages: list[dict[str, Any]]) -> None:
    """Send ``messages`` to a server of the test's settings; the second answer must be a tool list."""
    with subprocess.Popen(
        [CLI, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**env, **_settings_env(tmp_path)}, text=True,
    ) as server:  # fmt: skip
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write("".join(json.dumps(message) + "\n" for message in messages))
        server.stdin.flush()
        answers = [json.loads(server.stdout.readline()) for _ in range(2)]
        server.stdin.close()
        assert server.wait(timeout=60) == 0
    assert "tools" in answers[1]["result"], answers[1]


# -- Gemini CLI ----------------------------------------------------------------------------------------------------

GEMINI_SETTINGS = {
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "ide": {"enabled": False},
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": True}},
}
"""The user's settings: the scripted model is reached as an API-key endpoint, and nothing else is reached (no usage
statistics, telemetry or update check). Folder trust stays on, as it is by default."""


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_gemini_cli_with_the_readmes_registration_uses_every_tool_and_shows_each_code(
    tmp_path: Path, engine: DockerEngine, installed: Path
) -> None:
    """Gemini CLI shows its model the text block alone, adds ``wait_for_previous`` to every tool it declares (and
    passes it on), and runs on the reference SDK's client, which refused every error result that carried
    structuredContent. Headless (``-p``), it offers a server's tools only to a server the run allows."""
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".gemini").mkdir(parents=True)
    project.mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    # README: the folder-trust step (the dialog on a first start, or this file).
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))
    gemini = str(clients.command("gemini"))
    steps = [Call(tool, {**arguments, "wait_for_previous": True}) for tool, arguments, _shown in LIFE]
    with ScriptedModel(steps) as model:
        env = {
            "PATH": clients.with_node22(os.environ["PATH"]), "HOME": str(home), "GEMINI_API_KEY": "not-a-key",
            "GOOGLE_GEMINI_BASE_URL": model.url, "GEMINI_CLI_NO_RELAUNCH": "true", "NO_PROXY": "127.0.0.1,localhost",
        }  # fmt: skip
        settings = [arg for key, value in _settings_env(tmp_path).items() for arg in ("-e", f"{key}={value}")]
        # README, "Register with a client": gemini mcp add --scope user code-sandbox /abs/.venv/bin/code-sandbox serve
        registered = subprocess.run(
            [gemini, "mcp", "add", "--scope", "user", *settings, "code-sandbox", CLI, "serve"],
            env=env, cwd=project, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        _first_start(tmp_path, env)
        completed = subprocess.run(
            [gemini, "-m", "gemini-2.5-flash", "--allowed-mcp-server-names", "code-sandbox", "-p", "Use the sandbox."],
            env=env, cwd=project, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert DONE in completed.stdout, completed.stdout
        # Gemini CLI checks arguments against the input schema itself: a misspelled field never reaches the server.
        _assert_seen(model.gemini_outputs(), "gemini", {UNKNOWN_FIELD: "must NOT have additional properties"})
        ours = [tool for tool in model.declared_tools() if tool["name"].startswith("mcp_code-sandbox_")]
        assert len(ours) == 11
        assert all("wait_for_previous" in json.dumps(tool) for tool in ours)  # Gemini's own, on every tool
    assert model.stray == []
    assert worker_containers(engine) == []


# -- Claude Code ---------------------------------------------------------------------------------------------------


@pytest.mark.serial  # a client and its node or binary: CPU the other tests' deadlines need
def test_claude_code_with_the_server_allowed_uses_every_tool_and_shows_each_code(
    tmp_path: Path, engine: DockerEngine, installed: Path
) -> None:
    """Claude Code opens with the stateless protocol (server/discover), asks before each MCP call until the server is
    allowed (README), and shows its model structuredContent when a result has it, the text of an error."""
    home, config = tmp_path / "home", tmp_path / "claude"
    home.mkdir()
    config.mkdir()
    server = {"type": "stdio", "command": CLI, "args": ["serve"], "env": _settings_env(tmp_path)}
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": {"code-sandbox": server}}))
    claude = clients.package("@anthropic-ai/claude-code-linux-x64") / "claude"
    with ScriptedModel([Call(tool, arguments) for tool, arguments, _shown in LIFE]) as model:
        env = {
            "PATH": clients.with_node22(os.environ["PATH"]), "HOME": str(home), "CLAUDE_CONFIG_DIR": str(config),
            "TMPDIR": str(home),
            "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "not-a-key", "ENABLE_TOOL_SEARCH": "false",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1", "HTTPS_PROXY": model.url, "HTTP_PROXY": model.url,
            "NO_PROXY": "127.0.0.1,localhost",
        }  # fmt: skip
        _first_start(tmp_path, env)
        completed = subprocess.run(
            [str(claude), "-p", "Use the sandbox.", "--mcp-config", str(tmp_path / "mcp.json"), "--strict-mcp-config",
             "--allowedTools", "mcp__code-sandbox"],
            env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert DONE in completed.stdout, completed.stdout
        _assert_seen(model.anthropic_outputs(), "claude")
    assert model.stray == []
    assert worker_containers(engine) == []
