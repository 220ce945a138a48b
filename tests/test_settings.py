from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from code_sandbox.serve import stdio
from code_sandbox.settings import Settings, SettingsError, load_settings
from code_sandbox_cli.main import app
from typer.testing import CliRunner

from tests.support.run import command_env

CLI = str(Path(sys.executable).parent / "code-sandbox")


def test_defaults_match_the_documented_values() -> None:
    settings = load_settings({})
    assert settings == Settings(
        max_lifetime=600,
        idle_timeout=180,
        max_sessions=3,
        default_timeout=30,
        max_timeout=120,
        warm_pool=1,
        audit_enabled=True,
        audit_log=None,
        profile=None,
    )
    assert Settings() == settings  # one source of defaults: the dataclass and the loader agree


@pytest.mark.parametrize("raw", ["0", "101", "abc", "1e3", "+5", " 5", "5 ", "٣", "", "-1", "3.0", "1_0"])
def test_max_sessions_outside_ascii_digits_in_range_is_refused(raw: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"CODE_SANDBOX_MAX_SESSIONS": raw})
    assert caught.value.variable == "CODE_SANDBOX_MAX_SESSIONS"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"CODE_SANDBOX_DEFAULT_TIMEOUT": "60", "CODE_SANDBOX_MAX_TIMEOUT": "30"}, "CODE_SANDBOX_DEFAULT_TIMEOUT"),
        ({"CODE_SANDBOX_IDLE_TIMEOUT": "700", "CODE_SANDBOX_MAX_LIFETIME": "600"}, "CODE_SANDBOX_IDLE_TIMEOUT"),
        (
            {"CODE_SANDBOX_MAX_TIMEOUT": "120", "CODE_SANDBOX_MAX_LIFETIME": "120", "CODE_SANDBOX_IDLE_TIMEOUT": "60"},
            "CODE_SANDBOX_MAX_TIMEOUT",
        ),
        ({"CODE_SANDBOX_AUDIT_ENABLED": "True"}, "CODE_SANDBOX_AUDIT_ENABLED"),
        ({"CODE_SANDBOX_WARM_POOL": "4", "CODE_SANDBOX_MAX_SESSIONS": "3"}, "CODE_SANDBOX_WARM_POOL"),
        ({"CODE_SANDBOX_WARM_POOL": "-1"}, "CODE_SANDBOX_WARM_POOL"),
        ({"CODE_SANDBOX_AUDIT_ENABLED": "1"}, "CODE_SANDBOX_AUDIT_ENABLED"),
        ({"CODE_SANDBOX_AUDIT_LOG": ""}, "CODE_SANDBOX_AUDIT_LOG"),
        ({"CODE_SANDBOX_MAX_LIFETIME": "29"}, "CODE_SANDBOX_MAX_LIFETIME"),
        ({"CODE_SANDBOX_MAX_LIFETIME": "3601"}, "CODE_SANDBOX_MAX_LIFETIME"),
    ],
)
def test_invalid_values_and_failed_cross_checks_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(environ)
    assert caught.value.variable == variable


def test_bounds_are_inclusive() -> None:
    settings = load_settings(
        {
            "CODE_SANDBOX_MAX_LIFETIME": "3600",
            "CODE_SANDBOX_IDLE_TIMEOUT": "10",
            "CODE_SANDBOX_MAX_SESSIONS": "100",
            "CODE_SANDBOX_DEFAULT_TIMEOUT": "1",
            "CODE_SANDBOX_MAX_TIMEOUT": "300",
            "CODE_SANDBOX_AUDIT_ENABLED": "false",
            "CODE_SANDBOX_AUDIT_LOG": "/var/log/sandbox.jsonl",
        }
    )
    assert (settings.max_lifetime, settings.max_sessions, settings.max_timeout) == (3600, 100, 300)
    assert settings.audit_enabled is False
    assert settings.audit_log == Path("/var/log/sandbox.jsonl")


def _settings_env(extra_env: dict[str, str]) -> dict[str, str | None]:
    """For ``CliRunner.invoke``: none of the caller's settings (``None`` unsets a variable), then ``extra_env``."""
    return {key: None for key in os.environ if key.startswith("CODE_SANDBOX_")} | extra_env


@pytest.mark.parametrize(
    "extra_env",
    [
        {"CODE_SANDBOX_MAX_SESSIONS": "0"},
        {"CODE_SANDBOX_MAX_SESSIONS": "abc"},
        {"CODE_SANDBOX_MAX_SESSIONS": "1e3"},
        {"CODE_SANDBOX_MAX_SESSIONS": "+5"},
        {"CODE_SANDBOX_MAX_SESSIONS": "7Q7Q7Q7Q"},
        {"CODE_SANDBOX_DEFAULT_TIMEOUT": "100", "CODE_SANDBOX_MAX_TIMEOUT": "50"},
    ],
    ids=["zero", "abc", "1e3", "plus5", "marker", "default-above-max"],
)
def test_serve_with_an_invalid_setting_stops_with_exit_2_and_one_line_naming_the_variable(
    extra_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def serve_anyway(*_args: object) -> None:
        pytest.fail("serve started a server despite an invalid setting")

    monkeypatch.setattr(stdio, "run_stdio_server", serve_anyway)
    result = CliRunner().invoke(app, ["serve"], env=_settings_env(extra_env))
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    variable = next(iter(extra_env)) if len(extra_env) == 1 else "CODE_SANDBOX_DEFAULT_TIMEOUT"
    assert variable in lines[0]
    assert "Traceback" not in lines[0] and "7Q7Q" not in lines[0]  # the value is never echoed


def test_serve_with_an_invalid_setting_exits_2_with_one_stderr_line_and_no_stdout() -> None:
    # The process as a client starts it: stdout must stay empty (it is the protocol), one line on stderr.
    env = command_env(max_sessions="abc")
    with subprocess.Popen(
        [CLI, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as proc:
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert stdout == b""
    lines = stderr.decode().splitlines()
    assert len(lines) == 1
    assert "CODE_SANDBOX_MAX_SESSIONS" in lines[0]
    assert "Traceback" not in lines[0]


@pytest.mark.parametrize("raw", ["", "-lead", ".dot", "a b", "a/b", "ü", "x" * 64, "a\x00b", "a=b"])
def test_a_tag_outside_its_alphabet_or_length_is_refused_without_echoing_it(raw: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"CODE_SANDBOX_TAG": raw})
    assert caught.value.variable == "CODE_SANDBOX_TAG"
    assert raw not in caught.value.message or raw == ""


def test_a_tag_labels_every_container_of_the_server_and_no_tag_adds_nothing() -> None:
    assert load_settings({"CODE_SANDBOX_TAG": "claude-code_2.x"}).container_labels() == {
        "io.code-sandbox.tag": "claude-code_2.x"
    }
    assert load_settings({"CODE_SANDBOX_TAG": "x" * 63}).tag == "x" * 63
    assert load_settings({}).container_labels() == {}
