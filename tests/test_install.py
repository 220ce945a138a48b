"""The product as a user installs it: wheels built from this workspace, installed into a fresh virtual environment
outside the checkout, and every command run from another directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from code_sandbox.profile import Profile

from tests.support.images import untag_image
from tests.support.run import command_env
from tests.support.second_engine import SecondEngine

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("image_id")]

ROOT = Path(__file__).parents[1]


def _uv() -> str:
    return shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def _install(root: Path) -> Path:
    """Build every workspace package as a wheel and install them into a new virtual environment under ``root``."""
    uv = _uv()
    wheels, venv = root / "wheels", root / "venv"
    for argv in (
        [uv, "build", "--all-packages", "--wheel", "--out-dir", str(wheels)],
        [uv, "venv", "--quiet", str(venv)],
    ):
        subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, timeout=300)
    built = sorted(str(wheel) for wheel in wheels.glob("*.whl"))
    assert len(built) == 3, built  # core, the javascript profile, the CLI
    install = [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *built]
    subprocess.run(install, cwd=root, check=True, capture_output=True, timeout=600)
    return venv / "bin" / "code-sandbox"


def test_the_installed_wheels_work_from_any_directory(
    tmp_path: Path, second_engine: SecondEngine, profile: Profile
) -> None:
    command = _install(tmp_path / "install")
    elsewhere = tmp_path / "elsewhere"  # not the checkout, and not inside it
    elsewhere.mkdir()
    env = command_env(audit_log=str(elsewhere / "audit.jsonl")) | {"XDG_STATE_HOME": str(elsewhere / "state")}

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(command), *args],
            cwd=elsewhere, env=env | extra, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    verified = run("verify-image")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "PASS  helpers match the profile's" in verified.stdout
    (elsewhere / "hello.js").write_text("console.log('hello from', process.version)")
    ran = run("run", "hello.js")
    assert (ran.returncode, ran.stdout) == (0, "hello from v22.20.0\n"), ran.stderr
    doctor = run("doctor")
    assert doctor.returncode == 0, doctor.stdout
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
         "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]  # fmt: skip
    with subprocess.Popen(
        [str(command), "serve"], cwd=elsewhere, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as server:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write("".join(json.dumps(m) + "\n" for m in messages).encode())
        server.stdin.flush()
        answers = [json.loads(server.stdout.readline()) for _ in messages[::2]]  # the two requests
        server.stdin.close()
        assert server.wait(timeout=30) == 0
    assert [a["id"] for a in answers] == [1, 2]
    assert "run_javascript" in {tool["name"] for tool in answers[1]["result"]["tools"]}
    # The offline build works from the installed packages too (the pinned node wheel and the helpers); it builds
    # into the worker's own engine, so the shared image is never touched, and reaches it as a remote engine is
    # reached: DOCKER_HOST over TLS, with the engine's certificate checked.
    second = second_engine.tls_environment
    untag_image(second_engine.engine, profile.image_spec().tag)
    built = run("build-image", "--offline", **second)
    assert built.returncode == 0, built.stderr
    assert run("verify-image", **second).returncode == 0

    # A third party's profile: the example python-offline package, built and installed beside the product, is
    # found through its entry point, must then be chosen by name, and builds, verifies and runs with no change to
    # core. Its image goes into the worker's own engine too.
    _install_wheel(ROOT / "examples" / "profile-python", tmp_path / "install")
    ambiguous = run("verify-image")
    assert ambiguous.returncode == 2 and "javascript-offline, python-offline" in ambiguous.stderr
    python = {**second, "CODE_SANDBOX_PROFILE": "python-offline"}
    built = run("build-image", "--offline", **python)
    assert built.returncode == 0, built.stderr
    assert run("verify-image", **python).returncode == 0
    (elsewhere / "hello.py").write_text("import platform\nprint('hello from', platform.python_implementation())\n")
    ran = run("run", "hello.py", **python)
    assert (ran.returncode, ran.stdout) == (0, "hello from CPython\n"), ran.stderr
    untag_image(second_engine.engine, "code-sandbox-python:1.0.0")


def _install_wheel(project: Path, root: Path) -> None:
    """Build ``project`` as a wheel and install it into the virtual environment :func:`_install` made."""
    uv = _uv()
    wheels = root / "third-party"
    build = [uv, "build", "--wheel", "--out-dir", str(wheels), str(project)]
    subprocess.run(build, cwd=ROOT, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("*.whl")
    install = [uv, "pip", "install", "--quiet", "--python", str(root / "venv" / "bin" / "python"), str(wheel)]
    subprocess.run(install, cwd=root, check=True, capture_output=True, timeout=300)
