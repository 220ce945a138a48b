from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path

import code_sandbox_cli
import pytest
from code_sandbox import hookspecs
from code_sandbox.channel.protocol import PROTOCOL_VERSION
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hookspecs import hookimpl
from code_sandbox.plugins import create_plugin_manager, installed_profiles, select_profile
from code_sandbox.profile import HelperKind, ImageContents, ImageSpec, Profile, ProfileInfo
from code_sandbox.sandbox.service import SandboxService
from code_sandbox.serve.server import SandboxServer
from code_sandbox.settings import load_settings

CORE_SOURCE = Path(hookspecs.__file__).parent


class ToyProfile(Profile):
    """A test-only profile for an imaginary runtime; core must serve it through the profile API alone."""

    info = ProfileInfo(
        name="toy-offline",
        language="Toy",
        run_tool_name="run_toy",
        run_tool_description="Run a toy program.",
        execute_tool_name="try_toy",
        entrypoint_suffixes=(".toy",),
        default_entrypoints=("main.toy",),
        example_path="src/a.toy",
        runtime_description="a toy binary",
        protocol_version=PROTOCOL_VERSION,
    )

    def image_spec(self) -> ImageSpec:
        return ImageSpec(
            tag="toy:1",
            labels={"io.code-sandbox.profile": "toy-offline"},
            helper_digests={},
            runtime_path="/usr/bin/toy",
            runtime_version_label="io.code-sandbox.toy-version",
            runtime_version_argv=("/usr/bin/toy", "-V"),
        )

    def image_contents(self, runtime: Path | None) -> ImageContents:
        return ImageContents(
            runtime_source=runtime or Path("/usr/bin/toy"), runtime_path="/usr/bin/toy", runtime_version="1"
        )

    def build_run_argv(self, entrypoint: str, arguments: Sequence[str]) -> list[str]:
        return ["/usr/bin/toy", "run", f"/workspace/{entrypoint}", *arguments]

    def helper_argv(self, helper: HelperKind) -> list[str]:
        return ["/usr/bin/toy", f"/opt/toy/{helper}"]

    def probe_argv(self) -> list[str]:
        return ["/usr/bin/toy", "--probe"]


class ToyPlugin:
    def __init__(self, *profiles: Profile) -> None:
        self.profiles = profiles or (ToyProfile(),)

    @hookimpl
    def code_sandbox_register_profiles(self, register: Callable[[Profile], None]) -> None:
        for profile in self.profiles:
            register(profile)


def test_installed_plugins_provide_exactly_the_javascript_offline_profile() -> None:
    pm = create_plugin_manager()
    assert list(installed_profiles(pm)) == ["javascript-offline"]
    profile = select_profile(pm, None)
    assert profile.info.run_tool_name == "run_javascript"
    assert profile.info.entrypoint_suffixes == (".js", ".mjs", ".cjs", ".ts", ".mts", ".cts")


def test_javascript_run_argv_is_a_list_with_proto_disabled() -> None:
    profile = select_profile(create_plugin_manager(), None)
    argv = profile.build_run_argv("src/main.mjs", ["--flag", "a b", "$(x)"])
    assert argv == ["/usr/local/bin/node", "--disable-proto=throw", "/workspace/src/main.mjs", "--flag", "a b", "$(x)"]


def test_a_second_profile_is_served_through_the_profile_api_alone_when_named() -> None:
    pm = create_plugin_manager(plugins=[ToyPlugin()])
    profile = select_profile(pm, "toy-offline")
    assert profile.info.run_tool_name == "run_toy"
    assert profile.build_run_argv("a.toy", ["x"]) == ["/usr/bin/toy", "run", "/workspace/a.toy", "x"]
    assert profile.helper_argv("runner") == ["/usr/bin/toy", "/opt/toy/runner"]
    assert profile.image_spec().tag == "toy:1"
    # Each profile answers for itself: the JavaScript profile's answers stay its own.
    javascript = select_profile(pm, "javascript-offline")
    assert javascript.helper_argv("runner") == ["/usr/local/bin/node", "--disable-sigusr1", "/opt/sandbox/runner.mjs"]


def test_two_profiles_without_a_name_is_a_startup_error() -> None:
    pm = create_plugin_manager(plugins=[ToyPlugin()])
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


def test_a_plugin_that_registers_something_else_is_a_startup_error() -> None:
    class Confused:
        @hookimpl
        def code_sandbox_register_profiles(self, register: Callable[[object], None]) -> None:
            register(ToyProfile.info)  # the info, not a profile

    with pytest.raises(SandboxError) as caught:
        select_profile(create_plugin_manager(load_entry_points=False, plugins=[Confused()]), None)
    assert caught.value.code == ErrorCode.PROFILE_ERROR


def test_two_profiles_with_one_name_is_a_startup_error() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[ToyPlugin(ToyProfile(), ToyProfile())])
    with pytest.raises(SandboxError) as caught:
        select_profile(pm, "toy-offline")
    assert caught.value.code == ErrorCode.PROFILE_ERROR


def test_a_profile_of_another_helper_protocol_version_is_refused() -> None:
    class Older(ToyProfile):
        info = replace(ToyProfile.info, protocol_version=PROTOCOL_VERSION - 1)

    pm = create_plugin_manager(load_entry_points=False, plugins=[ToyPlugin(Older())])
    with pytest.raises(SandboxError) as caught:
        select_profile(pm, None)
    assert caught.value.code == ErrorCode.PROFILE_ERROR
    assert "protocol" in caught.value.message


def test_the_hookspec_and_every_profile_method_are_documented() -> None:
    specs = [obj for name, obj in inspect.getmembers(hookspecs) if name.startswith("code_sandbox_")]
    assert [spec.__name__ for spec in specs] == ["code_sandbox_register_profiles"]
    doc = inspect.getdoc(specs[0]) or ""
    assert ":return:" in doc and ":param register:" in doc
    for name in Profile.__abstractmethods__:
        assert inspect.getdoc(getattr(Profile, name)), name
    documented = (Path(__file__).parents[1] / "docs" / "profiles.md").read_text()
    for name in [
        *Profile.__abstractmethods__,
        *(f.name for f in fields(ProfileInfo)),
        "code_sandbox_register_profiles",
    ]:
        assert f"`{name}" in documented, name


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


def test_only_the_docker_adapter_imports_docker_and_only_its_sdk_module_reaches_private_sdk_names() -> None:
    importers: set[str] = set()
    private: set[str] = set()
    for source in CORE_SOURCE.rglob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(name == "docker" or name.startswith("docker.") for name in names):
                    importers.add(source.parent.name)
            # The SDK's private names this adapter needs: the client's request helpers and version, the attach
            # stream's socket and response.
            if isinstance(node, ast.Attribute) and node.attr in {"_get", "_url", "_result", "_version", "_post"}:
                private.add(source.name)
            if isinstance(node, ast.Constant) and node.value in {"_sock", "_response"}:
                private.add(source.name)
    assert importers == {"docker_engine"}
    assert private == {"sdk.py"}


def test_the_server_names_its_run_and_one_shot_tools_as_the_profile_says() -> None:
    profile = select_profile(create_plugin_manager(plugins=[ToyPlugin()]), "toy-offline")
    server = SandboxServer(SandboxService(load_settings({}), profile))
    assert {"run_toy", "try_toy"} <= set(server.tool_defs)
    assert not {name for name in server.tool_defs if "javascript" in name}


RUNTIME_WORDS = re.compile(
    r"\b(node(js)?|javascript|typescript|npm|npx|yarn|pnpm|corepack|deno|bun|cpython|pip|pypi|ruby|gem)\b"
    r"|\.[mc]?js\b|--node\b",
    re.IGNORECASE,
)


def test_core_and_the_cli_name_no_runtime() -> None:
    """Everything runtime-specific comes from the profile: a runtime's name in core or the CLI is a leak."""
    sources = [*CORE_SOURCE.rglob("*.py"), *Path(code_sandbox_cli.__file__).parent.rglob("*.py")]
    leaks = [
        f"{source.name}:{number}: {line.strip()}"
        for source in sources
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if RUNTIME_WORDS.search(line)
    ]
    assert leaks == []
