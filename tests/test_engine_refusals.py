"""What the engine says when it refuses: the operator reads its own words (doctor, verify-image, the CLI's errors,
stderr logs), bounded and with every control character escaped, beside the fix; an MCP client gets a stable code and
our message, never the engine's text. The refusal shown is an OCI runtime's that cannot start containers on this host,
as crun cannot on hybrid cgroups: a Podman service of the module's own runs a runtime made to refuse."""

from __future__ import annotations

import io
import logging
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.errors import ENGINE_TEXT_LIMIT, ErrorCode, SandboxError, engine_words
from code_sandbox.hardening import LABEL_EXPIRES_AT
from code_sandbox.profile import Profile
from code_sandbox_cli.main import app
from mcp.types import TextContent
from typer.testing import CliRunner

from tests.conftest import WORKER_TAG
from tests.support.engines import podman_engine
from tests.support.images import tag_image
from tests.support.run import command_env, engine_command_env, worker_tag
from tests.support.second_engine import load_image
from tests.test_server import CLI, connect, error_code
from tests.test_sessions import _managed_container  # pyright: ignore[reportPrivateUsage]

pytestmark = [pytest.mark.docker]
TAG = worker_tag("refusing")
HOSTILE = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\u202e"
"""An OSC 52 clipboard write, a screen clear and a right-to-left override: what no terminal may receive raw."""
REFUSAL = "crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2 " + HOSTILE + " " + "z" * 600
RUNTIME = f"""#!{sys.executable}
# An OCI runtime that refuses every container, with crun's words on hybrid cgroups (and worse), as crun does here.
import sys
if "--version" in sys.argv:
    print("refuser version 1.0.0")
    sys.exit(0)
sys.stderr.write({REFUSAL!r} + "\\n")
sys.exit(1)
"""


def test_engine_words_escape_every_control_character_and_stop_at_the_limit() -> None:
    assert engine_words('a "quoted" \\ path\n\tnext') == '"a \\"quoted\\" \\\\ path\\n\\tnext"'
    shown = engine_words(HOSTILE + "ünïcode ok")
    assert shown == '"\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\u202eünïcode ok"'
    assert all(char.isprintable() for char in shown)
    long = engine_words("y" * 5000)
    assert long.endswith('..."') and len(long) == ENGINE_TEXT_LIMIT + len('"..."')
    error = SandboxError(ErrorCode.CONTAINER_START_FAILED, "ours", engine_text="x\x1b[31m" * 1000)
    assert error.engine_text is not None and "\x1b" not in error.engine_text
    assert len(error.engine_text) <= ENGINE_TEXT_LIMIT + len('"..."')
    assert str(error) == "CONTAINER_START_FAILED: ours"  # what a client is shown: the code and our message


@pytest.fixture(scope="module")
def refusing(engine: DockerEngine, image_id: str, profile: Profile, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[DockerEngine]:  # fmt: skip
    """A Podman service whose OCI runtime refuses every container, holding the verified image under its tag."""
    runtime = tmp_path_factory.mktemp("runtime") / "refuser"
    runtime.write_text(RUNTIME)
    runtime.chmod(stat.S_IRWXU)
    for podman in podman_engine(TAG, runtime=("refuser", str(runtime))):
        load_image(engine, podman, image_id)
        tag_image(podman, image_id, profile.image_spec().tag)
        yield podman


def _operator_command(refusing: DockerEngine, *argv: str) -> subprocess.CompletedProcess[str]:
    environment = engine_command_env({"DOCKER_HOST": str(refusing.address.url)}, audit_enabled="false")
    return subprocess.run([CLI, *argv], env=environment, capture_output=True, text=True, timeout=180, check=False)


def _assert_quotes_the_engine(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, "raw control characters reached it"
    quoted = text[text.index('the engine said: "') + len("the engine said: ") :]
    assert quoted.startswith('"refuser: crun: cgroups in hybrid mode not supported')  # Podman names the runtime
    assert "\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\u202e" in quoted  # escaped, not sent
    shown = quoted[: quoted.index('..."') + 4]
    assert len(shown) == ENGINE_TEXT_LIMIT + len('"..."')  # bounded: the 600 z's and the rest are cut


def test_doctor_says_podmans_runtime_cannot_run_here_quotes_the_engine_and_names_the_fix(
    refusing: DockerEngine,
) -> None:
    result = _operator_command(refusing, "doctor")
    rows = {line[6:26].strip(): line for line in result.stdout.splitlines() if line[:4] in ("PASS", "FAIL")}
    assert result.returncode == 1, result.stdout
    assert rows["docker"].startswith("PASS") and rows["runtime"].startswith("PASS"), result.stdout
    row = rows["hardening enforced"]
    assert row.startswith("FAIL"), result.stdout
    assert "Podman's container runtime cannot start containers on this host" in row
    _assert_quotes_the_engine(row)
    fix = result.stdout[result.stdout.index(row) + len(row) :]
    assert fix.strip().startswith("fix: the runtime is refuser; crun cannot run containers on hybrid cgroups"), fix
    image = next(line for line in result.stdout.splitlines() if line[6:26].strip() == "image")
    assert image.startswith("FAIL") and "build-image" not in result.stdout[result.stdout.index(image) :]
    assert 'runtime = "runc"' in fix and "systemd.unified_cgroup_hierarchy=1" in fix, result.stdout
    assert "\x1b" not in result.stdout + result.stderr


def test_verify_image_and_run_quote_the_engine_and_name_the_fix(refusing: DockerEngine, tmp_path: Path) -> None:
    verified = _operator_command(refusing, "verify-image")
    assert verified.returncode == 1
    row = next(line for line in verified.stdout.splitlines() if "hardened run" in line)
    assert row.startswith("FAIL") and 'runtime = "runc"' in row
    _assert_quotes_the_engine(row)
    (tmp_path / "index.js").write_text("console.log(1)")
    ran = _operator_command(refusing, "run", str(tmp_path))
    assert ran.returncode == 1 and ran.stdout == ""
    [line] = ran.stderr.splitlines()  # one line: the error, the engine's words, the fix
    assert "Podman's container runtime cannot start containers on this host" in line
    assert "(fix: the runtime is refuser; crun cannot run containers on hybrid cgroups" in line
    assert line.endswith("systemd.unified_cgroup_hierarchy=1 on its kernel command line)")
    _assert_quotes_the_engine(line)
    cli_tag = command_env()["CODE_SANDBOX_TAG"]
    assert refusing.list_containers(f"io.code-sandbox.tag={cli_tag}") == []
    assert refusing.sandbox_volumes(tag=cli_tag) == []


@pytest.mark.anyio
async def test_a_client_gets_a_stable_code_and_the_operators_log_the_engines_words(
    refusing: DockerEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with connect(refusing, tmp_path) as client:
        created = await client.call_tool("create_sandbox", {})
        executed = await client.call_tool("execute_javascript", {"files": [{"path": "a.js", "content": "1"}],
                                                                 "entrypoint": "a.js"})  # fmt: skip
    for result in (created, executed):
        assert error_code(result) == "CONTAINER_START_FAILED"
        [block] = result.content
        assert isinstance(block, TextContent)
        assert block.text == ("CONTAINER_START_FAILED: Podman's container runtime cannot start containers on this host")
        shown = result.model_dump_json()  # the text block and the structured content alike
        assert "refuser" not in shown and "hybrid" not in shown and "zzz" not in shown
    logged = [record.getMessage() for record in caplog.records if "the engine said" in record.getMessage()]
    assert len(logged) == 2, caplog.text
    for message in logged:
        _assert_quotes_the_engine(message)
    assert refusing.list_containers(f"io.code-sandbox.tag={TAG}") == []


def test_reap_logs_what_the_engine_said_when_a_removal_failed(
    engine: DockerEngine,
    image_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # liveness markers: the test's own, not the user's
    expired = _managed_container(engine, image_id, {LABEL_EXPIRES_AT: str(int(time.time()) - 5)})

    def refuse(*args: Any, **kwargs: Any) -> None:  # a fault the engine cannot be made to show on demand
        raise docker.errors.APIError(
            "500 Server Error", explanation="driver failed to remove root filesystem " + HOSTILE
        )

    try:
        monkeypatch.setattr(docker.APIClient, "remove_container", refuse)
        caplog.set_level(logging.WARNING)
        result = CliRunner().invoke(app, ["reap", "--tag", WORKER_TAG])
    finally:
        monkeypatch.undo()
        engine.remove_container(expired)
    assert result.exit_code == 1 and "REMOVAL FAILED" in result.output, result.output
    [logged] = [record.getMessage() for record in caplog.records if "could not be removed" in record.getMessage()]
    assert logged == (
        "a managed container could not be removed: the sandbox container could not be removed; the engine said: "
        '"driver failed to remove root filesystem \\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\u202e"'
    )


def _context(dockerfile: str) -> io.BytesIO:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = dockerfile.encode()
        entry = tarfile.TarInfo("Dockerfile")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    context.seek(0)
    return context


@pytest.mark.parametrize(
    ("dockerfile", "said"),
    [
        ("FROMX\x1b[2J scratch\n", "unknown instruction: FROMX\\x1b[2J"),  # refused before it starts
        ("FROM scratch\nCOPY missing /x\n", "COPY failed: "),  # failed midway, in the build's stream
    ],
)
def test_a_build_the_engine_refuses_carries_its_words_escaped(engine: DockerEngine, dockerfile: str, said: str) -> None:
    tag = f"code-sandbox-test-refused-{TAG}:1"
    with pytest.raises(SandboxError) as caught:
        engine.build_image(_context(dockerfile), tag=tag, labels={}, on_step=lambda _step: None)
    assert (caught.value.code, caught.value.message) == (
        ErrorCode.IMAGE_BUILD_FAILED,
        "the Docker engine could not build the image",
    )
    words = caught.value.engine_text
    assert words is not None and words.startswith('"') and said in words and "\x1b" not in words
    assert engine.image_facts(tag) is None
