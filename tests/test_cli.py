from __future__ import annotations

from code_sandbox_cli.main import app
from typer.testing import CliRunner

runner = CliRunner()


def test_help_lists_every_operator_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("serve", "build-image", "verify-image", "reap"):
        assert command in result.output


def test_no_arguments_shows_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage" in result.output


def test_version_prints_the_package_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("code-sandbox 0.")


def test_build_image_without_offline_explains_the_supported_path() -> None:
    result = runner.invoke(app, ["build-image"])
    assert result.exit_code == 2
    assert "--offline" in result.output
    assert "Traceback" not in result.output


def test_every_command_has_help() -> None:
    for command in ("serve", "run", "doctor", "build-image", "verify-image", "reap"):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, command
