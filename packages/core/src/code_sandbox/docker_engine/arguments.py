"""The arguments of a hardened container's create call, from :mod:`code_sandbox.hardening` and the runtime in force:
the benchmark's raw floor uses the same."""

from __future__ import annotations

from docker.types import LogConfig, Ulimit

from code_sandbox.engine import RuntimeFacts
from code_sandbox.hardening import (
    HOSTNAME,
    LABEL_RUNTIME,
    SEALED_TMPFS,
    SUPERVISOR_USER,
    WORKSPACE_DIR,
    ContainerRequest,
    Hardening,
    sealed_dirs,
)
from code_sandbox.hardening import environment as fixed_environment
from code_sandbox.seccomp import profile_text


def ulimits(hardening: Hardening) -> list[Ulimit]:
    """No core dumps; the open-file limit."""
    return [Ulimit(name="core", soft=0, hard=0), Ulimit(name="nofile", soft=hardening.nofile, hard=hardening.nofile)]


def gvisor_limits(hardening: Hardening) -> dict[str, object]:
    """Under gVisor, the PID limit is the sentry's (:attr:`Hardening.sentry_tasks`) and the sandbox's tasks are bounded
    inside gVisor's kernel, which enforces ``RLIMIT_NPROC`` per uid on every fork and thread."""
    nproc = Ulimit(name="nproc", soft=hardening.pids_limit, hard=hardening.pids_limit)
    return {"pids_limit": hardening.sentry_tasks, "ulimits": [*ulimits(hardening), nproc]}


def build_create_arguments(
    request: ContainerRequest, *, start: bool, runtime: RuntimeFacts, architecture: str
) -> tuple[dict[str, object], dict[str, object]]:
    """The docker SDK arguments for a hardened container: ``create_container`` keywords and ``create_host_config``
    keywords. Every value comes from :mod:`code_sandbox.hardening` and the runtime in force; the benchmark's raw floor
    uses the same."""
    hardening = request.hardening
    sealed = sealed_dirs(user_space_kernel=runtime.user_space_kernel)
    host_config: dict[str, object] = {
        "runtime": runtime.name,
        "network_mode": "none",
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": hardening.security_opt(apparmor=request.apparmor, seccomp=profile_text(architecture)),
        "mem_limit": hardening.memory_bytes,
        "memswap_limit": hardening.memory_bytes,
        "nano_cpus": hardening.nano_cpus,
        "pids_limit": hardening.pids_limit,
        "init": True,
        "ulimits": ulimits(hardening),
        "tmpfs": {**hardening.tmpfs(request.uid), **dict.fromkeys(sealed, SEALED_TMPFS)},
        "log_config": LogConfig(type="none"),
        "auto_remove": start,
        "privileged": False,
        "cgroupns": "private",
        "ipc_mode": "none",  # no /dev/shm: it would be writable memory outside the workspace quota
        **(gvisor_limits(hardening) if runtime.user_space_kernel else {}),
    }
    # Nothing the image says changes how the container starts: the entrypoint is ours (the image's and its command
    # are then both ignored), every variable the image sets is set here (empty unless ours), and its health check
    # is switched off. Anonymous volumes that an image's VOLUME makes go with the container (``v=True``).
    environment = {
        **dict.fromkeys(request.image_environment, ""),
        **fixed_environment(user_space_kernel=runtime.user_space_kernel),
    }
    create: dict[str, object] = {
        "image": request.image_id,
        "entrypoint": request.command[:1],
        "command": request.command[1:],
        "user": SUPERVISOR_USER,
        "environment": environment,
        "healthcheck": {"Test": ["NONE"]},
        "labels": {**request.labels, LABEL_RUNTIME: runtime.name},
        "hostname": HOSTNAME,
        "network_disabled": True,
        "working_dir": WORKSPACE_DIR,
        # A lifeline (:mod:`code_sandbox.docker_engine.lifelines`): stdin open, and closed when its one client goes.
        "stdin_open": request.lifeline,
    }
    return create, host_config
