"""An image with a vendored package set (ms@2.1.3, a real tarball), against a real Docker engine: the build, its
verification, and what a program and a model see of it over the MCP wire.

The image is built under a tag of this worker's own (:class:`OwnTagProfile`); the end-to-end test of the command
line builds under the allowlisted tag in the worker's own engine. Neither touches the shared image.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.image import build_offline_image, verify_image
from code_sandbox.image.package_sets import PACKAGES_DIGEST_LABEL, PACKAGES_LABEL
from code_sandbox.profile import PackageSet, Profile
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.serve.server import SandboxServer
from code_sandbox.settings import load_settings
from mcp import Client

from tests.support.images import untag_image
from tests.support.own_tag import OwnTagProfile, Variant, variant_of
from tests.support.run import command_env, worker_tag
from tests.support.second_engine import SecondEngine
from tests.test_server import ok

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("image_id", "cleanup_managed")]

DATA = Path(__file__).parent / "data" / "packages"
LOCKFILE = DATA / "package-lock.json"
CLI = str(Path(sys.executable).parent / "code-sandbox")


@pytest.fixture(scope="module")
def vendored(profile: Profile) -> PackageSet:
    return profile.package_set(LOCKFILE, sources=DATA, progress=lambda _text: None)


@pytest.fixture(scope="module")
def package_profile(engine: DockerEngine, profile: Profile, vendored: PackageSet, image_id: str) -> Iterator[Profile]:
    """The installed profile whose image (under this worker's own tag) vendors ms@2.1.3; removed afterwards."""
    del image_id  # built first: the shared image is there to compare with
    own = OwnTagProfile(profile, f"code-sandbox-test-packages:{worker_tag()}")
    build_offline_image(engine, own, runtime=None, progress=lambda _text: None, packages=vendored)
    yield own
    untag_image(engine, own.image_spec().tag)


def test_the_package_image_verifies_and_grows_by_the_set_only(
    engine: DockerEngine, profile: Profile, package_profile: Profile, vendored: PackageSet
) -> None:
    report = verify_image(engine, package_profile)
    assert report.passed, report.checks
    assert report.packages == ("ms@2.1.3",)
    assert report.image is not None and report.image.labels[PACKAGES_LABEL] == "ms@2.1.3"
    plain = engine.image_facts(profile.image_spec().tag)
    assert plain is not None
    assert report.image.size - plain.size == sum(map(len, vendored.files.values()))


def test_the_image_without_packages_has_no_package_labels_and_no_tree(engine: DockerEngine, profile: Profile) -> None:
    report = verify_image(engine, profile)
    assert report.image is not None
    assert PACKAGES_LABEL not in report.image.labels and PACKAGES_DIGEST_LABEL not in report.image.labels
    assert [(check.passed, check.detail) for check in report.checks if check.name == "package set"] == [(True, "none")]


@pytest.fixture
def package_variant(engine: DockerEngine, package_profile: Profile) -> Iterator[Variant]:
    facts = engine.image_facts(package_profile.image_spec().tag)
    assert facts is not None
    tag = f"code-sandbox-test-package-variant:{worker_tag()}"
    with variant_of(engine, package_profile, facts.id, tag) as variant:
        yield variant


def test_verify_fails_after_one_vendored_file_changes(package_variant: Variant) -> None:
    # Root-owned and 0444 like the original: only the content differs from the digest.
    package_variant.build(
        "COPY index.js /node_modules/ms/index.js", {"index.js": b"module.exports = () => 0\n"}, mode=0o444
    )
    assert package_variant.failed_checks() == {"package set"}


def test_verify_fails_after_a_file_is_added_to_the_tree(package_variant: Variant) -> None:
    package_variant.build("COPY extra.js /node_modules/ms/extra.js", {"extra.js": b"1\n"}, mode=0o444)
    assert package_variant.failed_checks() == {"package set"}


def _server(engine: DockerEngine, tmp_path: Path, profile: Profile) -> Client:
    environ = {"CODE_SANDBOX_AUDIT_LOG": str(tmp_path / "audit.jsonl"), "CODE_SANDBOX_WARM_POOL": "0"}
    server = SandboxServer(SandboxService(load_settings(environ), profile, engine=engine, state_dir=tmp_path / "state"))
    return Client(server, mode="legacy")


async def _descriptions(client: Client) -> dict[str, str]:
    return {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}


PROGRAMS = {
    "hours.js": "console.log(require('ms')('2h'))\n",
    "minute.mjs": "import ms from 'ms'\nconsole.log(ms(60000))\n",
    "missing.js": "require('left-pad')\n",
    "writes.js": """\
const fs = require('fs')
const attempts = [
  () => fs.writeFileSync('/node_modules/ms/index.js', 'module.exports = 0'),
  () => fs.mkdirSync('/node_modules/left-pad'),
  () => fs.chmodSync('/node_modules/ms/index.js', 0o777),
  () => fs.unlinkSync('/node_modules/ms/package.json'),
]
for (const attempt of attempts) {
  try { attempt(); console.log('WRITTEN') } catch (error) { console.log(error.code) }
}
""",
}


@pytest.mark.anyio
async def test_vendored_packages_work_over_the_mcp_wire_and_nothing_else_does(
    engine: DockerEngine, tmp_path: Path, package_profile: Profile
) -> None:
    async with _server(engine, tmp_path, package_profile) as client:
        tools = await _descriptions(client)
        assert "npm packages, read-only" in tools["run_javascript"] and "ms@2.1.3" in tools["run_javascript"]
        assert "ms@2.1.3" in tools["execute_javascript"]
        created = ok(await client.call_tool("create_sandbox", {}))
        assert created["packages"] == ["ms@2.1.3"]
        session = created["session_id"]
        files = [{"path": path, "content": content} for path, content in PROGRAMS.items()]
        ok(await client.call_tool("write_files", {"session_id": session, "files": files}))

        async def run(entrypoint: str) -> dict[str, Any]:
            return ok(await client.call_tool("run_javascript", {"session_id": session, "entrypoint": entrypoint}))

        hours, minute, missing, writes = [await run(path) for path in PROGRAMS]
        assert (hours["exit_code"], hours["stdout"]) == (0, "7200000\n")
        assert (minute["exit_code"], minute["stdout"]) == (0, "1m\n")
        assert missing["exit_code"] == 1 and "code: 'MODULE_NOT_FOUND'" in missing["stderr"]
        assert writes["exit_code"] == 0
        assert set(writes["stdout"].split()) <= {"EROFS", "EACCES", "EPERM"}, writes["stdout"]
        assert writes["stdout"].split()[0] in ("EROFS", "EACCES")


@pytest.mark.anyio
async def test_without_packages_the_tools_say_there_are_none(
    engine: DockerEngine, tmp_path: Path, profile: Profile
) -> None:
    async with _server(engine, tmp_path, profile) as client:
        tools = await _descriptions(client)
        for name in ("run_javascript", "execute_javascript"):
            assert "Packages: Node.js's built-in modules only (anything else: MODULE_NOT_FOUND" in tools[name]
        assert ok(await client.call_tool("create_sandbox", {}))["packages"] == []


def test_build_image_with_packages_then_serve_over_stdio(
    tmp_path: Path, second_engine: SecondEngine, profile: Profile
) -> None:
    """The operator's path end to end, in the worker's own engine: build with --packages, verify, serve."""
    env = command_env(audit_log=str(tmp_path / "audit.jsonl"), warm_pool="0")
    env |= {"DOCKER_HOST": second_engine.base_url, "XDG_STATE_HOME": str(tmp_path / "state")}
    tag = profile.image_spec().tag
    try:
        built = subprocess.run(
            [CLI, "build-image", "--offline", "--packages", str(LOCKFILE), "--tarballs", str(DATA)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
        assert built.stdout.endswith(", packages: ms@2.1.3\n")
        verified = subprocess.run([CLI, "verify-image"], env=env, capture_output=True, text=True, timeout=120)
        assert "PASS  package set" in verified.stdout and verified.returncode == 0, verified.stdout
        answers = _serve(env, [
            ("tools/list", {}),
            ("tools/call", {"name": "execute_javascript", "arguments": {"entrypoint": "index.js",
                "files": [{"path": "index.js", "content": "console.log(require('ms')('2h'))"}]}}),
        ])  # fmt: skip
        run_tool = next(tool for tool in answers[0]["tools"] if tool["name"] == "run_javascript")
        assert "ms@2.1.3" in run_tool["description"]
        assert answers[1]["structuredContent"].get("stdout") == "7200000\n", answers[1]
    finally:
        untag_image(second_engine.engine, tag)  # the next test of this worker finds the engine without it


def _serve(env: dict[str, str], requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send ``requests`` to ``code-sandbox serve`` after the handshake, one at a time; their results in order."""
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    with subprocess.Popen([CLI, "serve"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as server:
        assert server.stdin is not None and server.stdout is not None

        def ask(number: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            assert server.stdin is not None and server.stdout is not None
            message = {"jsonrpc": "2.0", "id": number, "method": method, "params": params}
            server.stdin.write(json.dumps(message).encode() + b"\n")
            server.stdin.flush()
            answer = json.loads(server.stdout.readline())
            assert answer["id"] == number, answer
            return answer["result"]

        ask(0, "initialize", hello)
        server.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        results = [ask(number, method, params) for number, (method, params) in enumerate(requests, 1)]
        server.stdin.close()
        assert server.wait(timeout=30) == 0
    return results
