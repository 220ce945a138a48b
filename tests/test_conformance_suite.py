"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, pinned in tests/support/clients) against
the server object ``serve`` builds, at every protocol version the suite has scenarios for. The suite is an HTTP
client, so the server is mounted on the SDK's streamable-HTTP app on 127.0.0.1 for these tests only
(tests/support/http_mount.py): the product stays stdio, and a test checks that the mount answers ``initialize``,
``server/discover`` and ``tools/list`` exactly as ``serve`` does."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.serve.handshake import KNOWN_VERSIONS, VERSION_KEY

from tests.support import clients
from tests.support.http_mount import mounted
from tests.test_server import server_env
from tests.test_startup import RawClient

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("image_id", "cleanup_managed")]

SUITE_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25", "2026-07-28")
"""The versions the suite has server scenarios for: every version the server accepts but 2024-11-05, which the suite
does not take."""
EXPECTED_FAILURES = Path(__file__).parent / "data" / "conformance-expected-failures.yml"
CLIENT = {"name": "conformance-check", "version": "0"}
STATELESS_META = {VERSION_KEY: "2026-07-28", "io.modelcontextprotocol/clientInfo": CLIENT,
                  "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip


@pytest.fixture(scope="module")
def mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("mount")
    clients.ensure_installed()
    with mounted(server_env(state)) as url:
        yield url


def _expected_failures() -> dict[str, set[str] | None]:
    """The listed scenarios: each with the checks that may fail, or ``None`` for all of them."""
    listed: dict[str, set[str] | None] = {}
    for scenario, check in re.findall(r"^  - ([a-z0-9-]+)(?::([a-z0-9-]+))?", EXPECTED_FAILURES.read_text(), re.M):
        if not check:
            listed[scenario] = None
        elif (checks := listed.setdefault(scenario, set())) is not None:
            checks.add(check)
    return listed


@pytest.mark.serial  # some hundred requests at once: CPU the other tests' deadlines need
@pytest.mark.parametrize("version", SUITE_VERSIONS)
def test_the_official_conformance_suite_passes_every_scenario_that_applies(
    mount: str, version: str, tmp_path: Path
) -> None:
    """Every failed check is one listed in tests/data/conformance-expected-failures.yml, with its reason. (The list is
    read here, not by the suite: its own stale-list check fails a run when a scenario passes that warned before,
    and some of these warn or fail by turns.)"""
    suite = clients.package("@modelcontextprotocol/conformance") / "dist" / "index.js"
    completed = subprocess.run(
        [str(clients.node22()), str(suite), "server", "--url", mount, "--suite", "all", "--spec-version", version,
         "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    scenarios = {
        re.sub(r"^server-|-\d{4}-\d\d-\d\dT.*$", "", path.name): json.loads((path / "checks.json").read_text())
        for path in tmp_path.iterdir()
    }
    assert scenarios, completed.stdout[-2000:] + completed.stderr[-2000:]
    expected = _expected_failures()
    unexpected = {
        f"{name}:{check['id']}"
        for name, checks in scenarios.items()
        for check in checks
        if (check["status"] == "FAILURE" and name not in expected)
        or (check["status"] == "FAILURE" and (allowed := expected.get(name)) is not None and check["id"] not in allowed)
    }
    assert not unexpected, sorted(unexpected)
    passed = [name for name, checks in scenarios.items() if all(c["status"] != "FAILURE" for c in checks)]
    assert passed, "no scenario passed"
    print(f"conformance {version}: {len(passed)} of {len(scenarios)} scenarios passed")  # noqa: T201 - for -s


def _post(url: str, message: dict[str, Any], session: str | None) -> tuple[Any, str | None]:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json",
               "mcp-method": message["method"]}  # fmt: skip
    if session is not None:
        headers["mcp-session-id"] = session
    if VERSION_KEY in message.get("params", {}).get("_meta", {}):
        headers["mcp-protocol-version"] = message["params"]["_meta"][VERSION_KEY]
    request = urllib.request.Request(url, data=json.dumps(message).encode(), headers=headers, method="POST")  # noqa: S310
    with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310 - the test's own loopback URL
        text = answer.read().decode()
        session = answer.headers.get("mcp-session-id", session)
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return (json.loads(data[-1]) if data else json.loads(text) if text.strip() else None), session


def _over_http(url: str, messages: list[dict[str, Any]]) -> list[Any]:
    answers: list[Any] = []
    session: str | None = None
    for message in messages:
        body, session = _post(url, message, session)
        if "id" in message:
            answers.append(body["result"])
    return answers


def _over_stdio(tmp_path: Path, messages: list[dict[str, Any]]) -> list[Any]:
    client = RawClient(tmp_path)
    answers: list[Any] = []
    for message in messages:
        client.send(message)
        if "id" in message:
            answers.append(client.receive()["result"])
    client.finish()
    return answers


def _session(version: str) -> list[dict[str, Any]]:
    return [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]  # fmt: skip


STATELESS = [
    {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": STATELESS_META}},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": STATELESS_META}},
]


@pytest.mark.serial  # two servers started and an HTTP one: CPU the other tests' deadlines need
@pytest.mark.parametrize("version", KNOWN_VERSIONS)
def test_the_mount_answers_as_serve_does(mount: str, version: str, tmp_path: Path) -> None:
    messages = STATELESS if version == KNOWN_VERSIONS[-1] else _session(version)
    over_http = _over_http(mount, messages)
    assert over_http == _over_stdio(tmp_path, messages)  # the SDK's answers, a first start's
    assert over_http == _over_stdio(tmp_path, messages)  # and the record's, a later start's
    assert len(over_http[-1]["tools"]) == 11
