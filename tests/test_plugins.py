from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from pathlib import Path

import pytest
from code_sandbox import hookspecs
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hookspecs import HelperKind, ImageContents, ImageSpec, ProfileInfo, hookimpl
from code_sandbox.plugins import create_plugin_manager, select_profile
from code_sandbox.server import SandboxServer
from code_sandbox.settings import load_settings

CORE_SOURCE = Path(hookspecs.__file__).parent


class ToyProfile:
    """A test-only profile for an imaginary runtime; core must serve it through the hooks alone."""

    @hookimpl
    def code_sandbox_profile_info(self) -> ProfileInfo:
        return ProfileInfo(
            name="toy-offline",
            run_tool_name="run_toy",
            run_tool_description="Run a toy program.",
            language="Toy",
            entrypoint_suffixes=(".toy",),
            execute_tool_name="try_toy",
        )

    @hookimpl
    def code_sandbox_image_spec(self) -> ImageSpec:
        return ImageSpec(
            tag="toy:1",
            labels={"io.code-sandbox.profile": "toy-offline"},
            helper_digests={},
            runtime_path="/usr/bin/toy",
            runtime_version_label="io.code-sandbox.toy-version",
            runtime_version_argv=("/usr/bin/toy", "-V"),
        )

    @hookimpl
    def code_sandbox_build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        return ["/usr/bin/toy", "run", f"/workspace/{entrypoint}", *arguments]

    @hookimpl
    def code_sandbox_helper_argv(self, helper: HelperKind) -> list[str]:
        return ["/usr/bin/toy", f"/opt/toy/{helper}"]

    @hookimpl
    def code_sandbox_image_contents(self, runtime_binary: Path | None) -> ImageContents:
        return ImageContents(
            runtime_source=runtime_binary or Path("/usr/bin/toy"), runtime_path="/usr/bin/toy", runtime_version="1"
        )


def test_installed_plugins_provide_exactly_the_javascript_offline_profile() -> None:
    pm = create_plugin_manager()
    names = [info.name for info in pm.hook.code_sandbox_profile_info()]
    assert names == ["javascript-offline"]
    profile = select_profile(pm, None)
    assert profile.info.run_tool_name == "run_javascript"
    assert profile.info.entrypoint_suffixes == (".js", ".mjs", ".cjs")


def test_javascript_run_argv_is_a_list_with_proto_disabled() -> None:
    profile = select_profile(create_plugin_manager(), None)
    argv = profile.build_run_argv("src/main.mjs", ["--flag", "a b", "$(x)"])
    assert argv == ["/usr/local/bin/node", "--disable-proto=throw", "/workspace/src/main.mjs", "--flag", "a b", "$(x)"]


def test_a_second_profile_is_served_through_the_hooks_alone_when_named() -> None:
    pm = create_plugin_manager(plugins=[ToyProfile()])
    profile = select_profile(pm, "toy-offline")
    assert profile.info.run_tool_name == "run_toy"
    assert profile.build_run_argv("a.toy", ["x"]) == ["/usr/bin/toy", "run", "/workspace/a.toy", "x"]
    assert profile.helper_argv("runner") == ["/usr/bin/toy", "/opt/toy/runner"]
    assert profile.image_spec().tag == "toy:1"
    # The JavaScript profile's answers do not leak into the toy profile's calls, nor the reverse.
    javascript = select_profile(pm, "javascript-offline")
    assert javascript.helper_argv("runner") == ["/usr/local/bin/node", "--disable-sigusr1", "/opt/sandbox/runner.mjs"]


def test_two_profiles_without_a_name_is_a_startup_error() -> None:
    pm = create_plugin_manager(plugins=[ToyProfile()])
    with pytest.raises(SandboxError) as caught:
        select_profile(pm, None)
    assert caught.value.code == ErrorCode.PROFILE_ERROR
    assert "CODE_SANDBOX_PROFILE" in caught.value.message


def test_no_profile_is_a_startup_error() -> None:
    with pytest.raises(SandboxError) as caught:
        select_profile(create_plugin_manager(load_entry_points=False), None)
    assert caught.value.code == ErrorCode.PROFILE_ERROR


def test_naming_a_profile_that_is_not_installed_is_a_startup_error() -> None:
    with pytest.raises(SandboxError) as caught:
        select_profile(create_plugin_manager(), "cobol-online")
    assert caught.value.code == ErrorCode.PROFILE_ERROR


def test_a_profile_that_answers_nothing_gives_a_profile_error() -> None:
    class Mute:
        @hookimpl
        def code_sandbox_profile_info(self) -> ProfileInfo:
            return ProfileInfo("mute", "run_mute", "", "Mute", (".m",), "execute_mute")

    profile = select_profile(create_plugin_manager(load_entry_points=False, plugins=[Mute()]), None)
    with pytest.raises(SandboxError) as caught:
        profile.image_spec()
    assert caught.value.code == ErrorCode.PROFILE_ERROR


def test_every_hookspec_is_documented_with_params_and_return() -> None:
    specs = [obj for name, obj in inspect.getmembers(hookspecs) if name.startswith("code_sandbox_")]
    assert len(specs) == 5
    for spec in specs:
        doc = inspect.getdoc(spec) or ""
        assert ":return:" in doc, spec.__name__
        for parameter in inspect.signature(spec).parameters:
            assert f":param {parameter}:" in doc, (spec.__name__, parameter)


def test_core_never_imports_the_javascript_package() -> None:
    for source in CORE_SOURCE.rglob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(name.startswith("code_sandbox_javascript") for name in names), source.name


def test_only_the_engine_module_imports_docker() -> None:
    importers: set[str] = set()
    for source in CORE_SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(name == "docker" or name.startswith("docker.") for name in names):
                    importers.add(source.name)
    assert importers == {"engine.py"}


def test_the_server_names_its_run_and_one_shot_tools_as_the_profile_says() -> None:
    profile = select_profile(create_plugin_manager(plugins=[ToyProfile()]), "toy-offline")
    server = SandboxServer(load_settings({}), profile)
    assert {"run_toy", "try_toy"} <= set(server.tool_defs)
    assert not {name for name in server.tool_defs if "javascript" in name}
