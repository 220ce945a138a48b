"""`run` and `doctor`, as a user runs them: the console script in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from code_sandbox.profile import Profile

from tests.support.images import untag_image
from tests.support.run import command_env
from tests.support.second_engine import SecondEngine

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("image_id", "cleanup_managed")]

CLI = str(Path(sys.executable).parent / "code-sandbox")
ROOT = Path(__file__).parents[1]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Liveness markers of the commands under test go to a directory of the test's own, not the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=command_env(audit_enabled="false") | (env or {}),
        cwd=cwd,
        check=False,
    )


def test_the_hello_example_prints_its_greeting() -> None:
    result = cli("run", "examples/hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Hello from the isolated container\n"


def test_run_mirrors_the_exit_code_and_passes_arguments(tmp_path: Path) -> None:
    (tmp_path / "main.js").write_text("console.log(process.argv.slice(2).join('|')); process.exit(7)")
    result = cli("run", str(tmp_path / "main.js"), "--", "a b", "--flag")
    assert result.returncode == 7
    assert result.stdout == "a b|--flag\n"


def test_run_reports_a_signal_like_a_shell(tmp_path: Path) -> None:
    (tmp_path / "index.js").write_text("process.kill(process.pid, 'SIGKILL')")
    (tmp_path / "helper.js").write_text("module.exports = 1")
    assert cli("run", str(tmp_path)).returncode == 128 + 9


def test_run_streams_output_while_the_program_runs(tmp_path: Path) -> None:
    (tmp_path / "slow.js").write_text("console.log('first'); setTimeout(() => { console.error('second'); }, 2000);")
    env = command_env(audit_enabled="false")
    with subprocess.Popen(
        [CLI, "run", str(tmp_path / "slow.js")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"first\n"
        first_seen = time.monotonic()
        assert proc.stderr.readline() == b"second\n"
        second_seen = time.monotonic()
        assert proc.wait(timeout=60) == 0
    assert second_seen - first_seen > 1.5  # "first" arrived while the program was still running


def test_run_refuses_a_folder_without_an_entrypoint_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "a.js").write_text("1")
    (tmp_path / "b.js").write_text("2")
    result = cli("run", str(tmp_path))
    assert result.returncode == 1
    assert "--entrypoint" in result.stderr and "Traceback" not in result.stderr


def test_doctor_passes_on_a_healthy_set_up(tmp_path: Path) -> None:
    result = cli("doctor", env={"CODE_SANDBOX_AUDIT_ENABLED": "true", "CODE_SANDBOX_AUDIT_LOG": str(tmp_path / "a")})
    assert result.returncode == 0, result.stdout
    for check in ("docker", "hardening enforced", "image", "settings", "audit log"):
        assert f"PASS  {check}" in result.stdout


def test_doctor_reports_a_stopped_daemon_with_its_fix(tmp_path: Path) -> None:
    result = cli("doctor", env={"DOCKER_HOST": f"unix://{tmp_path}/missing.sock"})
    assert result.returncode == 1
    assert "FAIL  docker" in result.stdout
    assert "fix: start Docker" in result.stdout


def test_doctor_reports_a_missing_image_with_its_fix(second_engine: SecondEngine, profile: Profile) -> None:
    # The worker's own engine, without the allowlisted tag (an earlier test of the worker may have loaded it).
    untag_image(second_engine.engine, profile.image_spec().tag)
    assert second_engine.engine.image_facts(profile.image_spec().tag) is None
    result = cli("doctor", env={"DOCKER_HOST": second_engine.base_url})
    assert result.returncode == 1
    assert "PASS  docker" in result.stdout  # the engine answered: only the image is missing
    assert "FAIL  image" in result.stdout
    assert "build-image --offline" in result.stdout


def test_doctor_reports_invalid_settings() -> None:
    result = cli("doctor", env={"CODE_SANDBOX_MAX_SESSIONS": "0"})
    assert result.returncode == 1
    assert "FAIL  settings" in result.stdout and "CODE_SANDBOX_MAX_SESSIONS" in result.stdout
