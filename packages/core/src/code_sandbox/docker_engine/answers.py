"""The engine's answers, as far as this adapter reads them: each JSON answer of the SDK is validated into one of these
models before anything is read from it, so a field of an unexpected type is a refused answer, never a crash further
on. Field names are the API's; null and absent read alike. Then each becomes the engine boundary's own data."""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from code_sandbox.docker_engine.address import printable
from code_sandbox.engine import ContainerFacts, DaemonFacts, ImageConfig, ImageFacts, normalise_arch
from code_sandbox.engine.models import PODMAN


class _Answer(BaseModel):
    """Fields this adapter does not read are ignored."""

    model_config = ConfigDict(frozen=True)


class ComponentDetails(_Answer):
    APIVersion: str | None = None


class Component(_Answer):
    Name: str = ""
    Version: str | None = None
    Details: ComponentDetails | None = None


class VersionAnswer(_Answer):
    ApiVersion: str
    Version: str | None = None
    Components: list[Component] | None = None

    @property
    def podman(self) -> Component | None:
        return next((c for c in self.Components or () if c.Name.startswith("Podman")), None)


class RuntimeEntry(_Answer):
    path: str | None = None


class InfoAnswer(_Answer):
    Architecture: str = ""
    OSType: str = ""
    SystemTime: str | None = None
    SecurityOptions: list[str] | None = None
    Runtimes: dict[str, RuntimeEntry | None] | None = None
    DefaultRuntime: str | None = None
    ServerVersion: str | None = None
    OperatingSystem: str | None = None
    MemTotal: int = Field(default=0, ge=0)

    def facts(self, version: VersionAnswer, podman_runtime: tuple[str, str] | None) -> DaemonFacts:
        """What the engine is; ``podman_runtime`` is the service's own runtime when Podman serves the API."""
        options = self.SecurityOptions or []
        registered = {name: (entry.path if entry else None) or "" for name, entry in (self.Runtimes or {}).items()}
        default_runtime = self.DefaultRuntime or "runc"
        if podman_runtime is not None:
            default_runtime = podman_runtime[0]
            registered = {podman_runtime[0]: podman_runtime[1]}
        return DaemonFacts(
            runtimes=registered,
            default_runtime=default_runtime,
            product=PODMAN if podman_runtime is not None else "Docker Engine",
            version=printable(version.Version or self.ServerVersion or ""),
            operating_system=printable(self.OperatingSystem or ""),
            architecture=normalise_arch(self.Architecture),
            os_type=self.OSType,
            memory_bytes=self.MemTotal,
            apparmor=any(option.startswith("name=apparmor") for option in options),
            apparmor_profile="containers-default" if podman_runtime is not None else "docker-default",
            seccomp=any(option.startswith("name=seccomp") and "profile=unconfined" not in option for option in options),
        )


class OciRuntime(_Answer):
    name: str | None = None
    path: str | None = None


class PodmanHost(_Answer):
    ociRuntime: OciRuntime | None = None


class PodmanInfo(_Answer):
    """Podman's own ``/libpod/info``."""

    host: PodmanHost | None = None


class PodmanImage(_Answer):
    """Podman's own ``/libpod/images/{id}/json``."""

    Annotations: dict[str, str] | None = None


class HealthcheckAnswer(_Answer):
    Test: list[str] | None = None


class ConfigAnswer(_Answer):
    """The ``Config`` of an image or a container: the Docker API gives both the same shape."""

    Labels: dict[str, str] | None = None
    User: str | None = None
    Env: list[str] | None = None
    Entrypoint: list[str] | None = None
    Cmd: list[str] | None = None
    WorkingDir: str | None = None
    Healthcheck: HealthcheckAnswer | None = None
    Volumes: dict[str, object] | None = None
    ExposedPorts: dict[str, object] | None = None
    OnBuild: list[str] | None = None
    StopSignal: str | None = None
    Shell: list[str] | None = None

    def config(self) -> ImageConfig:
        return ImageConfig(
            env=tuple(self.Env or ()),
            entrypoint=tuple(self.Entrypoint or ()),
            cmd=tuple(self.Cmd or ()),
            working_dir=self.WorkingDir or "",
            healthcheck=tuple((self.Healthcheck.Test if self.Healthcheck else None) or ()),
            volumes=tuple(sorted(self.Volumes or {})),
            exposed_ports=tuple(sorted(self.ExposedPorts or {})),
            on_build=tuple(self.OnBuild or ()),
            stop_signal=self.StopSignal or "",
            shell=tuple(self.Shell or ()),
        )


class ImageAnswer(_Answer):
    Id: str
    Architecture: str | None = None
    Size: int | None = None
    Config: ConfigAnswer | None = None

    def facts(self) -> ImageFacts:
        config = self.Config or ConfigAnswer()
        return ImageFacts(
            id=self.Id,
            labels=dict(config.Labels or {}),
            user=config.User or "",
            architecture=normalise_arch(self.Architecture or ""),
            size=self.Size or 0,
            config=config.config(),
        )


class ContainerState(_Answer):
    Status: str | None = None


class Mount(_Answer):
    Type: str | None = None
    Name: str | None = None


class ContainerMounts(_Answer):
    """A container's inspect document, read for its mounts alone (a removal must not hang on anything else)."""

    Mounts: list[Mount] | None = None


class ContainerAnswer(ContainerMounts):
    """A container's inspect document."""

    Id: str
    Created: str | None = None
    Config: ConfigAnswer | None = None
    State: ContainerState | None = None

    def facts(self) -> ContainerFacts:
        return ContainerFacts(
            id=self.Id,
            labels=dict((self.Config.Labels if self.Config else None) or {}),
            state=(self.State.Status if self.State else None) or "",
            created=parse_time(self.Created),
        )


class ContainerRow(_Answer):
    """A container as the list call gives it."""

    Id: str
    Labels: dict[str, str] | None = None
    State: str | None = None
    Created: object = None
    """Seconds since the epoch on Docker; read as unknown when it is anything else."""

    def facts(self) -> ContainerFacts:
        created = float(self.Created) if isinstance(self.Created, int | float) else None
        return ContainerFacts(id=self.Id, labels=dict(self.Labels or {}), state=self.State or "", created=created)


class Created(_Answer):
    """What a create call returns."""

    Id: str


class ExecState(_Answer):
    Running: bool | None = None
    ExitCode: int | None = None
    Pid: int | None = None
    """0 while the process has not started, and for good when the runtime could not start it (the engine then
    writes its own error to the exec's stdout)."""


class VolumeRow(_Answer):
    Name: str = ""
    Labels: dict[str, str] | None = None
    CreatedAt: str | None = None


class VolumeList(_Answer):
    Volumes: list[VolumeRow] | None = None


class VolumeAnswer(_Answer):
    Options: dict[str, str] | None = None


class BuildError(_Answer):
    message: str | None = None


class BuildAux(_Answer):
    ID: str | None = None


class BuildEvent(_Answer):
    """One line of a build's progress stream."""

    stream: str | None = None
    error: str | None = None
    errorDetail: BuildError | None = None
    aux: BuildAux | str | None = None
    """The image ID from the classic builder; BuildKit's trace (a string) says nothing this adapter reads."""

    @property
    def failure(self) -> str | None:
        if self.error is None and self.errorDetail is None:
            return None
        return self.error or (self.errorDetail.message if self.errorDetail else None) or ""

    @property
    def image_id(self) -> str | None:
        return self.aux.ID if isinstance(self.aux, BuildAux) else None


_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def parse_time(value: object) -> float | None:
    """Seconds since the epoch from the engine's RFC 3339 time with up to nanoseconds, e.g.
    ``2026-12-02T15:48:04.123456789Z`` (Docker) or ``2026-12-02T16:48:04.1+01:00`` (Podman); ``None`` otherwise."""
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    main, fraction, zone = match.groups()
    try:
        parsed = datetime.fromisoformat(main + ("+00:00" if zone == "Z" else zone))
    except ValueError:
        return None
    return parsed.timestamp() + (float("0." + fraction) if fraction else 0.0)


class _CpuUsage(_Answer):
    total_usage: int = 0


class _CpuStats(_Answer):
    cpu_usage: _CpuUsage | None = None


class _MemoryStats(_Answer):
    usage: int | None = None
    max_usage: int | None = None


class StatsAnswer(_Answer):
    """One sample of ``GET /containers/{id}/stats?stream=false&one-shot=true``."""

    cpu_stats: _CpuStats | None = None
    memory_stats: _MemoryStats | None = None
