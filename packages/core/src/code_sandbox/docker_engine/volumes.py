"""Podman's tmpfs volumes: each tmpfs mount of a sandbox is a volume of its own (Podman's tmpfs mounts refuse
``nr_inodes``, ``uid`` and ``gid``), made before its container, checked after, and removed with it or, once no
container uses it, by a sweep."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from code_sandbox.docker_engine.answers import ContainerMounts, VolumeAnswer, VolumeList, VolumeRow, parse_time
from code_sandbox.docker_engine.failures import APIError, NotFound, translate
from code_sandbox.docker_engine.sdk import Client
from code_sandbox.errors import ErrorCode, SandboxError
from code_sandbox.hardening import LABEL_MANAGED, LABEL_TAG, SUPERVISOR_UID, ContainerRequest

_VOLUME_NAME = re.compile(r"code-sandbox-[0-9a-f]{32}")
_PAGE_BYTES = 4096
_BIND_FLAGS = ("rw", "noexec", "nosuid", "nodev")
_NO_COPY = "nocopy"  # a new volume would otherwise get the image directory's content
_VOLUME_OPTIONS = ("nr_inodes", "mode", "uid", "gid")
_STARTING = (ErrorCode.CONTAINER_START_FAILED, "the sandbox container could not be started")
_REMOVING = (ErrorCode.CONTAINER_REMOVAL_FAILED, "the sandbox container could not be removed")


@dataclass(frozen=True)
class TmpfsVolume:
    """One tmpfs mount of a sandbox as Podman takes it: a tmpfs volume of the local driver, named at random."""

    name: str
    path: str
    options: str
    """The driver's ``o``: the mount options of the tmpfs."""
    flags: str
    """The bind's flags."""

    @classmethod
    def of(cls, path: str, tmpfs_options: str) -> TmpfsVolume:
        """:raises ValueError: an option with no Podman form (a new hardening option must be mapped here)."""
        options: list[str] = []
        flags: list[str] = []
        for option in tmpfs_options.split(","):
            key, _, value = option.partition("=")
            if option in _BIND_FLAGS:
                flags.append(option)
            elif key == "size":
                options.append(f"nr_blocks={-(-int(value) // _PAGE_BYTES)}")
            elif key in _VOLUME_OPTIONS:
                options.append(option)
            else:
                raise ValueError(f"the tmpfs option {key!r} has no Podman form")
        options += [flag for flag in flags if flag != "rw"]
        return cls(f"code-sandbox-{secrets.token_hex(16)}", path, ",".join(options), ",".join([*flags, _NO_COPY]))

    def driver_options(self) -> dict[str, str]:
        return {"type": "tmpfs", "device": "tmpfs", "o": self.options}

    def bind(self) -> str:
        return f"{self.name}:{self.path}:{self.flags}"


RUN_DIR = "/run"
RUN_OPTIONS = f"rw,noexec,nosuid,nodev,size=65536,nr_inodes=64,mode=0710,uid=0,gid={SUPERVISOR_UID}"
"""Podman's ``/run``, where it mounts its init (``/run/podman-init``, the host's catatonit, readable by all) and its
``.containerenv``: root's, group the supervisor's, mode 0710, so that the supervisor can start the init and no sandbox
uid can reach it (a process that runs a binary it can read is dumpable, and its parent could write native code into
it). A volume, since Podman's tmpfs mounts take no group."""


def tmpfs_volumes(request: ContainerRequest) -> list[TmpfsVolume]:
    mounts = {**request.hardening.tmpfs(request.uid), RUN_DIR: RUN_OPTIONS}
    return [TmpfsVolume.of(path, options) for path, options in mounts.items()]


class PodmanVolumes:
    """The tmpfs volumes of the containers one engine object makes, and the sweep of those left behind."""

    def __init__(self, client: Callable[[], Client]) -> None:
        self._client = client
        self._of: dict[str, tuple[str, ...]] = {}
        """The volumes of each container this engine made, removed with it (even after it removed itself)."""

    def create(self, volumes: Iterable[TmpfsVolume], labels: Mapping[str, str]) -> None:
        api = self._client()
        with translate(*_STARTING):
            for volume in volumes:
                api.create_volume(volume.name, driver="local", driver_opts=volume.driver_options(), labels=dict(labels))

    def adopt(self, container_id: str, volumes: list[TmpfsVolume]) -> None:
        """Record a new container's volumes, then check that each is the bounded tmpfs made for it: had a sweep
        removed one before the container's create, Podman would have made a plain directory of the same name, with
        no bound at all.

        :raises SandboxError: ``CONTAINER_START_FAILED`` (the caller removes the container and the volumes).
        """
        self._of[container_id] = tuple(volume.name for volume in volumes)
        api = self._client()
        with translate(*_STARTING):
            for volume in volumes:
                options = VolumeAnswer.model_validate(api.inspect_volume(volume.name)).Options or {}
                if any(options.get(key) != value for key, value in volume.driver_options().items()):
                    raise SandboxError(*_STARTING)

    def held_by(self, container_id: str) -> tuple[str, ...]:
        """The volumes a container mounts: recorded when this object made it, else asked of the engine."""
        known = self._of.get(container_id)
        if known is not None:
            return known
        with translate(*_REMOVING):
            try:
                data = ContainerMounts.model_validate(self._client().inspect_container(container_id))
            except NotFound:
                return ()
        names = (mount.Name or "" for mount in data.Mounts or () if mount.Type == "volume")
        return tuple(name for name in names if _VOLUME_NAME.fullmatch(name))

    def forget(self, container_id: str) -> None:
        self._of.pop(container_id, None)

    def remove(self, names: Iterable[str], *, wait: float = 5) -> None:
        """Remove volumes (never with ``force``, which on Podman removes the containers using them too); one still
        held by a container being removed is waited for, ``wait`` seconds at most."""
        api = self._client()
        deadline = time.monotonic() + wait
        for name in names:
            with translate(*_REMOVING):
                while True:
                    try:
                        api.remove_volume(name)
                    except NotFound:
                        pass
                    except APIError as exc:
                        if exc.status_code != 409 or time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
                        continue
                    break

    def listed(self, *, tag: str | None = None, unused: bool = False) -> list[VolumeRow]:
        """The tmpfs volumes of managed sandboxes (of ``tag``'s servers, when given; ``unused``: only those that no
        container uses)."""
        filters: dict[str, object] = {"label": f"{LABEL_MANAGED}=true"}  # one label: Podman ORs several
        if unused:
            filters["dangling"] = True
        with translate(ErrorCode.CONTAINER_UNAVAILABLE, "the Docker engine could not list sandbox volumes"):
            rows = VolumeList.model_validate(self._client().volumes(filters=filters)).Volumes or []
        return [
            row
            for row in rows
            if _VOLUME_NAME.fullmatch(row.Name)
            and (row.Labels or {}).get(LABEL_MANAGED) == "true"
            and (tag is None or (row.Labels or {}).get(LABEL_TAG) == tag)
        ]

    def remove_leftovers(self, *, tag: str | None, grace: float, now: Callable[[], float]) -> int:
        """Remove the unused sandbox volumes older than ``grace`` seconds: left by a container that removed itself,
        or by a crash. A younger one may be another server's, made a moment before its container. Returns how many
        could not be removed."""
        volumes = self.listed(tag=tag, unused=True)
        moment = now()  # after the listing: a volume made since is not in it
        failures = 0
        for volume in volumes:
            created = parse_time(volume.CreatedAt)
            if created is None or moment - created < grace:
                continue
            try:
                self.remove([volume.Name], wait=0)
            except SandboxError:
                failures += 1
        return failures
