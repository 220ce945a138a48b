"""`code-sandbox doctor`: check every precondition of a working, safe set-up and say how to fix what fails.

Each check is independent, so one failure (a stopped daemon, say) still lets the others report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from code_sandbox.channel.protocol import ProbeAnswer, ProtocolViolation, parse_message
from code_sandbox.channel.transport import runtime_argv
from code_sandbox.docker_engine import HTTP_IGNORES_TLS, DockerEngine, EngineAddress
from code_sandbox.engine import TRUST_MODELS, Engine, ExecRequest, RuntimeFacts, TrustModel
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, PROBE_UID, ContainerRequest, Hardening, user_of
from code_sandbox.image import verify_image
from code_sandbox.limits import MiB, sessions_backed
from code_sandbox.profile import Profile
from code_sandbox.sandbox.audit import UnsafeAuditFileError, default_audit_path, open_audit_file
from code_sandbox.sandbox.provisioner import require_capacity
from code_sandbox.settings import Settings, load_settings


@dataclass(frozen=True)
class Finding:
    """One row of the doctor's table; ``fix`` is set when the check failed."""

    name: str
    passed: bool
    detail: str
    fix: str | None = None


def run_doctor(engine: DockerEngine, profile: Profile | None, environ: dict[str, str] | None = None) -> list[Finding]:
    """Run every check and return the table's rows."""
    findings: list[Finding] = []
    settings = _check_settings(findings, environ)
    docker_ok = _check_docker(findings, engine)
    jailed = profile is not None and profile.info.jailed_runs
    runtime_ok = docker_ok and _check_runtime(findings, engine, local=engine.address.local, jailed_runs=jailed)
    if docker_ok and settings is not None:
        _check_capacity(findings, engine, settings)
    if runtime_ok and profile is not None:
        _check_hardening(findings, engine, profile)
        _check_image(findings, engine, profile)
    elif profile is not None:
        reason = "the runtime asked for is missing" if docker_ok else "Docker is not reachable"
        for name in ("hardening enforced", "image"):
            findings.append(Finding(name, False, f"not checked: {reason}", "fix the row above first"))
    _check_audit_log(findings, settings)
    return findings


def _check_settings(findings: list[Finding], environ: dict[str, str] | None) -> Settings | None:
    try:
        settings = load_settings(environ)
    except SandboxError as error:
        findings.append(Finding("settings", False, error.message, error.hint or "fix or unset the variable"))
        return None
    findings.append(Finding("settings", True, "all CODE_SANDBOX_* values are valid"))
    return settings


def _check_docker(findings: list[Finding], engine: DockerEngine) -> bool:
    try:
        address = engine.address
    except SandboxError as error:
        findings.append(Finding("docker", False, error.message, "fix or unset the variable"))
        return False
    _check_tls(findings, address)
    if not address.checked:
        findings.append(Finding("docker", False, f"not contacted at {address.described()}: anyone on the way "
                                "could pose as the engine", "fix the tls row first"))  # fmt: skip
        return False
    try:
        engine.ping()
        daemon = engine.daemon_facts()
    except SandboxError as error:
        if address.local:
            fix = "start Docker (Docker Desktop, or `sudo systemctl start docker`) and check `docker info` works"
        else:
            fix = error.hint or "check that the engine runs and that `docker info` works with the same settings"
        findings.append(Finding("docker", False, f"{error.for_operator()} at {address.described()}", fix))
        return False
    if daemon.os_type != "linux":
        findings.append(
            Finding(
                "docker", False, f"the engine runs {daemon.os_type} containers", "switch Docker to Linux containers"
            )
        )
        return False
    findings.append(
        Finding(
            "docker",
            True,
            f"{daemon.product} {daemon.version} at {address.described()}: Linux containers, "
            f"{daemon.architecture}, {daemon.operating_system or 'unknown OS'}",
        )
    )
    return True


def _check_tls(findings: list[Finding], address: EngineAddress) -> None:
    """An engine reached over the network must be reached over TLS that checks the engine's certificate, with a
    client key nobody else can read: whoever can talk to the engine can run anything on its host."""
    if address.local:
        return
    if address.ssh:
        findings.append(Finding("tls", True, "not needed: ssh checks the host's key (known_hosts) and this user's"))
        return
    if address.plain_http and address.tls is not None:
        findings.append(
            Finding("tls", False, f"the engine address {HTTP_IGNORES_TLS}: anyone on the way can read and change "
                    "every call", "write the address as tcp:// (or https://) so that TLS is used")
        )  # fmt: skip
        return
    if address.tls is None:
        findings.append(
            Finding(
                "tls",
                False,
                "the engine is reached without TLS: anyone who can reach its port controls the engine",
                "serve the engine with --tlsverify and set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH",
            )
        )
        return
    if not address.tls_verify:
        findings.append(
            Finding(
                "tls",
                False,
                "TLS without checking the engine's certificate: a machine in the middle could pose as the engine",
                "set DOCKER_TLS_VERIFY=1",
            )
        )
        return
    key = address.tls.cert[1] if isinstance(address.tls.cert, tuple) else None
    if key is not None and _mode_lets_others(str(key), 0o077):
        findings.append(
            Finding("tls", False, "the client key (key.pem) can be read by other users", "chmod 600 key.pem")
        )
        return
    ca = address.tls.ca_cert
    if ca is not None and (_mode_lets_others(ca, 0o022) or _mode_lets_others(os.path.dirname(ca), 0o022)):
        findings.append(
            Finding("tls", False, "other users can replace ca.pem (it or its directory is writable by them)",
                    "chmod go-w on ca.pem and on the directory that holds it")
        )  # fmt: skip
        return
    findings.append(Finding("tls", True, "the engine's certificate is checked against ca.pem; a client certificate "
                                         "proves this client"))  # fmt: skip


def _mode_lets_others(path: str, bits: int) -> bool:
    try:
        return bool(os.stat(path).st_mode & bits)
    except OSError:
        return False


GVISOR_REGISTRATION = (
    'add {"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}} to '
    "/etc/docker/daemon.json, reload the engine (`sudo kill -HUP $(pidof dockerd)`), "
    "then set CODE_SANDBOX_RUNTIME=runsc"
)
"""How to register gVisor with a local Docker engine; without ``--network=none`` runsc may refuse to start a
container that has no network namespace of its own to configure."""


GVISOR_ADVICE: dict[TrustModel, str] = {
    "jailed runs": "recommended: set CODE_SANDBOX_RUNTIME=runsc. gVisor's kernel then stands between sandboxes and "
    "this host's, and counts what a sandbox holds in it against its memory; every tool works (jailed runs), each "
    'call costs more, cpu_ms and peak_memory_bytes are null (README, "Stronger isolation with gVisor")',
    "engine-only": "set CODE_SANDBOX_RUNTIME=runsc for gVisor's kernel between sandboxes and this host's: this "
    "profile gets the engine-only model there (no evaluation, no warm pool; README, "
    '"Stronger isolation with gVisor")',
    "sealed helpers": "",
}
"""What ``doctor`` advises where runsc is registered but not in force, by the trust model it would bring."""


def _check_runtime(
    findings: list[Finding], engine: Engine, *, local: bool, jailed_runs: bool, runsc: str | None = None
) -> bool:
    try:
        runtime = engine.runtime_in_force()
    except SandboxError as error:
        findings.append(
            Finding(
                "runtime", False, error.message, error.hint or "set CODE_SANDBOX_RUNTIME to one of those, or unset it"
            )
        )
        return False
    model = runtime.trust_model(jailed_runs=jailed_runs, architecture=engine.daemon_facts().architecture)
    trust = f"; trust model: {TRUST_MODELS[model]}"
    if runtime.user_space_kernel:
        findings.append(
            Finding(
                "runtime", True, f"{runtime.name}: gVisor, a user-space kernel between sandboxes and the host's{trust}"
            )
        )
        return True
    detail = f"{runtime.name}: sandboxes share the host's kernel{trust}"
    installed = runsc if runsc is not None else shutil.which("runsc")
    registered = any(PurePosixPath(path).name == "runsc" for path in engine.daemon_facts().runtimes.values())
    if installed and not registered and local and not engine.daemon_facts().podman:
        findings.append(
            Finding("runtime", True, detail + "; gVisor's runsc is installed but not registered", GVISOR_REGISTRATION)
        )
    elif registered and not engine.daemon_facts().podman:
        gvisor = RuntimeFacts("runsc", "runsc").trust_model(
            jailed_runs=jailed_runs, architecture=engine.daemon_facts().architecture
        )
        findings.append(Finding("runtime", True, detail + "; gVisor's runsc is registered", GVISOR_ADVICE[gvisor]))
    else:
        findings.append(Finding("runtime", True, detail))
    return True


def _check_capacity(findings: list[Finding], engine: Engine, settings: Settings) -> None:
    daemon = engine.daemon_facts()
    memory = daemon.memory_bytes
    if not memory:
        findings.append(Finding("capacity", True, "the engine does not report its memory; not judged"))
        return
    wanted = f"{settings.max_sessions} sandboxes at once"
    try:
        require_capacity(daemon, settings)
    except SandboxError as error:
        findings.append(Finding("capacity", False, f"{wanted}: {error.message}", error.hint))
        return
    backed = f"the engine's {memory / (1024 * MiB):.1f} GiB backs up to {sessions_backed(memory)}"
    findings.append(Finding("capacity", True, f"{wanted}; {backed}"))


def _check_hardening(findings: list[Finding], engine: Engine, profile: Profile) -> None:
    image = engine.image_facts(profile.image_spec().tag)
    if image is None:
        findings.append(Finding("hardening enforced", False, "not checked: no image", "build the image first"))
        return
    daemon = engine.daemon_facts()
    hardening = Hardening()
    labels = {LABEL_MANAGED: "true", LABEL_EXPIRES_AT: "0"}  # a probe: any sweep may remove it
    request = ContainerRequest(
        image.id, runtime_argv(engine, profile, [*profile.helper_argv("watchdog"), "60"]), labels, daemon.apparmor,
        image_environment=image.config.env_names,
    )  # fmt: skip
    try:
        container_id = engine.create_container(request)
    except SandboxError as error:
        findings.append(
            Finding(
                "hardening enforced",
                False,
                f"a hardened container could not start: {error.for_operator()}",
                error.hint
                or "the engine may lack seccomp, cgroup memory/pids limits or tmpfs support; use a current Docker",
            )
        )
        return
    try:
        result = engine.exec(
            container_id,
            ExecRequest(
                runtime_argv(engine, profile, profile.probe_argv()),
                user=user_of(PROBE_UID),
                timeout=30,
                max_stdout=65536,
                repeatable=True,
            ),
        )
        seen = parse_message(result.stdout.strip(), ProbeAnswer)
    except (SandboxError, ProtocolViolation):
        findings.append(
            Finding("hardening enforced", False, "the probe did not answer", "run `code-sandbox verify-image`")
        )
        return
    finally:
        with contextlib.suppress(SandboxError):
            engine.remove_container(container_id)
    checks: list[tuple[str, Callable[[], bool]]] = [
        ("no network", lambda: set(seen.interfaces) <= {"lo"}),
        ("read-only root", lambda: seen.root_writable is False),
        ("no capabilities", lambda: seen.cap_eff is not None and int(seen.cap_eff, 16) == 0),
    ]
    if not engine.runtime_in_force().user_space_kernel:
        # gVisor's kernel shows a sandbox neither its cgroup files nor its seccomp and no-new-privileges state, and it
        # applies no AppArmor profile: the host's limits bind the gVisor sandbox as a whole (SECURITY.md).
        checks += [
            ("memory limit", lambda: seen.memory_max == hardening.memory_bytes),
            ("PID limit", lambda: seen.pids_max == hardening.pids_limit),
            ("seccomp", lambda: seen.seccomp == 2),
            ("no-new-privileges", lambda: seen.no_new_privs is True),
        ]
        if daemon.apparmor:
            expected = daemon.apparmor_profile
            checks.append(("AppArmor", lambda: expected is not None and expected in (seen.apparmor or "")))
    failed = [name for name, ok in checks if not ok()]
    passed_names = ", ".join(name for name, _ok in checks)
    findings.append(
        Finding(
            "hardening enforced",
            not failed,
            passed_names if not failed else "not enforced: " + ", ".join(failed),
            None
            if not failed
            else "the engine does not enforce these limits; use Docker Engine 20.10+ on Linux "
            "with cgroups and seccomp, or Docker Desktop with Linux containers",
        )
    )


def _check_image(findings: list[Finding], engine: Engine, profile: Profile) -> None:
    try:
        report = verify_image(engine, profile)
    except SandboxError as error:
        findings.append(Finding("image", False, error.for_operator(), "run `code-sandbox build-image --offline`"))
        return
    if report.passed and report.image is not None:
        findings.append(Finding("image", True, f"{profile.image_spec().tag} passes verify-image"))
        return
    failed = [check.name for check in report.checks if not check.passed]
    missing = report.image is None
    fix = "run `code-sandbox build-image --offline`, then `code-sandbox verify-image`"
    if report.engine_fault is not None:
        fix = "fix the hardening row above first"
    findings.append(
        Finding(
            "image",
            False,
            f"{profile.image_spec().tag} is missing"
            if missing
            else f"{profile.image_spec().tag} fails: {', '.join(failed)}",
            fix,
        )
    )


def _check_audit_log(findings: list[Finding], settings: Settings | None) -> None:
    if settings is not None and not settings.audit_enabled:
        findings.append(Finding("audit log", True, "disabled (CODE_SANDBOX_AUDIT_ENABLED=false)"))
        return
    path = (settings.audit_log if settings else None) or default_audit_path()
    try:
        os.close(open_audit_file(path))
    except UnsafeAuditFileError:
        findings.append(
            Finding(
                "audit log",
                False,
                "the audit log's path is not a regular file owned by this user with mode 0600",
                "remove what is at the path (a symlink, FIFO, directory or another user's file) or `chmod 600` "
                "your own file, or set CODE_SANDBOX_AUDIT_LOG to another file",
            )
        )
        return
    except OSError:
        findings.append(
            Finding(
                "audit log",
                False,
                "the audit log cannot be written",
                "set CODE_SANDBOX_AUDIT_LOG to a writable file, or CODE_SANDBOX_AUDIT_ENABLED=false",
            )
        )
        return
    findings.append(Finding("audit log", True, "writable"))
