"""The container runtime setting (``CODE_SANDBOX_RUNTIME``) and gVisor (``runsc``) as an opt-in second wall: every
container of a server runs under the runtime asked for, the runtime is checked against the engine at start, and
``doctor`` and ``verify-image`` work under it. These tests need runsc registered with the engine (CI does it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from code_sandbox.docker_engine import DockerEngine
from code_sandbox.doctor import run_doctor
from code_sandbox.engine import DaemonFacts
from code_sandbox.hardening import (
    LABEL_EXPIRES_AT,
    LABEL_MANAGED,
    LABEL_RUNTIME,
    LABEL_TAG,
    ContainerRequest,
)
from code_sandbox.image import verify_image
from code_sandbox.image.seal import seal_architectures, seal_library
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sweep import sweep_managed
from code_sandbox.settings import SettingsError, load_settings

from tests.conftest import WORKER_TAG
from tests.support.forwarding_engine import ForwardingEngine
from tests.support.inspect import inspect_container
from tests.support.profiles import with_jailed_runs
from tests.support.run import command_env
from tests.support.runtimes import runtime_engine

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
CLI = str(Path(sys.executable).parent / "code-sandbox")


@pytest.fixture(scope="module")
def gvisor() -> Iterator[DockerEngine]:
    """An engine whose containers run under runsc, tagged for this worker."""
    yield from runtime_engine("runsc", WORKER_TAG + "-runsc")


def test_a_runtime_name_must_look_like_one() -> None:
    assert load_settings({"CODE_SANDBOX_RUNTIME": "runsc"}).runtime == "runsc"
    assert load_settings({"CODE_SANDBOX_RUNTIME": ""}).runtime is None  # unset: the engine's default
    for bad in ("run sc", "-runsc", "runsc\n", "x" * 65, "rünsc", "../runc"):
        with pytest.raises(SettingsError) as caught:
            load_settings({"CODE_SANDBOX_RUNTIME": bad})
        assert caught.value.variable == "CODE_SANDBOX_RUNTIME"
        assert bad not in caught.value.message


def test_an_unregistered_runtime_stops_serve_at_start_with_exit_2_and_one_line() -> None:
    result = subprocess.run(
        [CLI, "serve"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env=command_env(runtime="no-such-runtime", audit_enabled="false"),
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""  # nothing on the protocol's stream
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert "CODE_SANDBOX_RUNTIME" in lines[0] and "runc" in lines[0] and "runsc" in lines[0]
    assert "no-such-runtime" not in lines[0]


def test_the_default_runtime_is_the_engines_and_every_container_is_labelled_with_it(
    engine: DockerEngine, profile: Profile, image_id: str
) -> None:
    assert engine.runtime is None
    runtime = engine.runtime_in_force()
    assert runtime.name == engine.daemon_facts().default_runtime == "runc"
    assert not runtime.user_space_kernel
    request = ContainerRequest(image_id, [*profile.helper_argv("watchdog"), "60"], {LABEL_MANAGED: "true"}, False)
    container = engine.create_container(request, start=False)
    try:
        inspect = inspect_container(engine, container)
        assert inspect["HostConfig"]["Runtime"] == "runc"
        assert inspect["Config"]["Labels"][LABEL_RUNTIME] == "runc"
        assert "CODE_SANDBOX_SEAL=optional" not in inspect["Config"]["Env"]
    finally:
        engine.remove_container(container)


def test_doctor_says_gvisor_is_in_force_names_the_trust_model_and_its_probe_runs(
    gvisor: DockerEngine, profile: Profile, image_id: str
) -> None:
    """Under gVisor the probe runs the runtime's readable copy (gVisor cannot execute the unreadable one), and doctor
    names the trust model in force (SECURITY.md, "Under gVisor"): jailed runs for a profile whose runner jails them,
    engine-only for one whose runner cannot."""
    del image_id
    findings = {finding.name: finding for finding in run_doctor(gvisor, profile, {"CODE_SANDBOX_RUNTIME": "runsc"})}
    assert findings["runtime"].passed and "gVisor" in findings["runtime"].detail
    assert "trust model: jailed runs" in findings["runtime"].detail
    unjailed = with_jailed_runs(profile, False)
    findings = {finding.name: finding for finding in run_doctor(gvisor, unjailed, {"CODE_SANDBOX_RUNTIME": "runsc"})}
    assert "trust model: engine-only" in findings["runtime"].detail
    assert findings["hardening enforced"].passed, findings["hardening enforced"].detail


def test_doctor_names_the_sealed_helpers_trust_model_under_runc_and_recommends_registered_gvisor(
    engine: DockerEngine, gvisor: DockerEngine, profile: Profile
) -> None:
    del gvisor  # runsc is registered (the fixture fails in CI, and skips elsewhere, when it is not)
    findings = {finding.name: finding for finding in run_doctor(engine, with_jailed_runs(profile, True), {})}
    assert "trust model: sealed helpers" in findings["runtime"].detail
    advice = findings["runtime"].fix or ""
    assert findings["runtime"].detail.endswith("gVisor's runsc is registered")
    assert advice.startswith("recommended: set CODE_SANDBOX_RUNTIME=runsc") and "every tool works" in advice
    findings = {finding.name: finding for finding in run_doctor(engine, with_jailed_runs(profile, False), {})}
    assert "engine-only model" in (findings["runtime"].fix or "")  # what this profile would get there, said first


def test_doctor_names_the_engines_runtimes_when_the_one_asked_for_is_missing(profile: Profile) -> None:
    engine = DockerEngine(runtime="no-such-runtime")
    try:
        findings = {finding.name: finding for finding in run_doctor(engine, profile, {})}
    finally:
        engine.close()
    assert not findings["runtime"].passed
    assert "runsc" in findings["runtime"].detail and "runc" in findings["runtime"].detail
    assert findings["hardening enforced"].detail == "not checked: the runtime asked for is missing"


def test_doctor_explains_how_to_register_runsc_when_it_is_installed_but_not(engine: DockerEngine) -> None:
    from code_sandbox.doctor import Finding, _check_runtime  # pyright: ignore[reportPrivateUsage]

    class Unregistered(ForwardingEngine):
        def daemon_facts(self) -> DaemonFacts:
            return replace(super().daemon_facts(), runtimes={"runc": "runc"})

    findings: list[Finding] = []
    assert _check_runtime(findings, Unregistered(engine), local=True, jailed_runs=True, runsc="/usr/bin/runsc")
    assert findings[0].passed and findings[0].fix is not None
    assert '"runtimeArgs": ["--network=none"]' in findings[0].fix and "daemon.json" in findings[0].fix


def test_verify_image_runs_its_hardened_probe_under_the_configured_runtime(
    gvisor: DockerEngine, profile: Profile, image_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    del image_id
    runtimes: list[str] = []
    create = gvisor.create_container

    def spy(request: ContainerRequest, **options: Any) -> str:
        container = create(request, **options)
        runtimes.append(inspect_container(gvisor, container)["HostConfig"]["Runtime"])
        return container

    monkeypatch.setattr(gvisor, "create_container", spy)
    report = verify_image(gvisor, profile)
    assert runtimes and set(runtimes) == {"runsc"}
    # gVisor runs the readable copy, which the image holds beside the unreadable runtime, byte for byte.
    assert report.passed, [check for check in report.checks if not check.passed]
    checks = {check.name: check.detail for check in report.checks}
    assert checks["trust model"].startswith("jailed runs:")
    assert checks["readable runtime"].endswith("is the recorded copy, root-owned, mode 755")


def test_a_sweep_removes_expired_containers_of_every_runtime_alike(
    engine: DockerEngine, gvisor: DockerEngine, profile: Profile, image_id: str
) -> None:
    tag = WORKER_TAG + "-sweep"
    expired = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: "1", LABEL_TAG: tag}
    watchdog = [*profile.helper_argv("watchdog"), "60"]
    made = [
        runner.create_container(ContainerRequest(image_id, watchdog, expired, engine.daemon_facts().apparmor))
        for runner in (DockerEngine(labels={LABEL_TAG: tag}), DockerEngine(labels={LABEL_TAG: tag}, runtime="runsc"))
    ]
    try:
        verdicts, failed = sweep_managed(engine, max_lifetime=600, tag=tag)
        assert failed == 0
        assert {verdict.container.labels[LABEL_RUNTIME] for verdict in verdicts} == {"runc", "runsc"}
        assert [engine.container_facts(container) for container in made] == [None, None]
    finally:
        for container in made:
            engine.remove_container(container)


@pytest.mark.parametrize("architecture", seal_architectures())
def test_the_seal_is_a_shared_object_for_its_machine_with_nothing_but_an_initialiser(architecture: str) -> None:
    seal = seal_library(architecture)
    assert seal is not None and seal[:4] == b"\x7fELF" and seal[4] == 2  # ELF64
    machine = int.from_bytes(seal[18:20], "little")
    assert machine == {"x86_64": 62, "aarch64": 183}[architecture]
    assert int.from_bytes(seal[16:18], "little") == 3  # a shared object
    assert len(seal) < 512
    assert seal_library("riscv64") is None
