"""The start-up sweep and `reap`: judging every managed container on the engine, and removing the garbage.

Containers of other servers' live sessions are left alone; stopped and expired ones go.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from code_sandbox.engine import ContainerFacts, DockerEngine
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED

logger = logging.getLogger(__name__)

CREATED_GRACE_SECONDS = 60
"""A created, never-started container younger than this may be another server's create or image probe."""


@dataclass(frozen=True)
class Verdict:
    """What the sweep decided about one managed container, and why."""

    container: ContainerFacts
    remove: bool
    reason: str
    expires_at: int | None


def judge_container(container: ContainerFacts, *, max_lifetime: int, now: float) -> Verdict:
    """Decide whether a managed container is garbage.

    Stopped -> remove. Past ``expires-at`` -> remove. Running and unexpired -> keep (it may be another client's
    live session). No valid ``expires-at``: remove only when Docker's creation time is older than the maximum
    lifetime; keep it when the creation time is unknown.
    """
    raw = container.labels.get(LABEL_EXPIRES_AT, "")
    expires_at = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 12 else None
    young = container.created is not None and now - container.created < CREATED_GRACE_SECONDS
    if container.state == "created" and young:
        return Verdict(container, False, "being created", expires_at)  # another server may be about to start it
    if container.state != "running":
        return Verdict(container, True, "stopped", expires_at)
    if expires_at is not None:
        if expires_at <= now:
            return Verdict(container, True, "expired", expires_at)
        return Verdict(container, False, "live", expires_at)
    if container.created is None:
        return Verdict(container, False, "no expiry label and unknown creation time; kept for inspection", None)
    if now - container.created > max_lifetime:
        return Verdict(container, True, "no expiry label and older than the maximum lifetime", None)
    return Verdict(container, False, "no expiry label, younger than the maximum lifetime", None)


def survey_managed(engine: DockerEngine, *, max_lifetime: int) -> list[Verdict]:
    """Judge every managed container on this Docker engine."""
    now = time.time()
    return [
        judge_container(container, max_lifetime=max_lifetime, now=now)
        for container in engine.list_containers(f"{LABEL_MANAGED}=true")
    ]


def sweep_managed(engine: DockerEngine, *, max_lifetime: int) -> tuple[list[Verdict], int]:
    """Remove the stopped and expired managed containers. Returns the verdicts and the number of failed removals."""
    verdicts = survey_managed(engine, max_lifetime=max_lifetime)
    failures = 0
    for verdict in verdicts:
        if verdict.remove:
            try:
                engine.remove_container(verdict.container.id)
            except SandboxError:
                failures += 1
        elif verdict.expires_at is None:
            logger.warning("kept a managed sandbox container: %s", verdict.reason)
    return verdicts, failures
