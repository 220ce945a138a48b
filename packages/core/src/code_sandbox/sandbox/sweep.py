"""The start-up sweep and `reap`: judging every managed container on the engine, and removing the garbage.

Containers of other servers' live sessions are left alone; stopped and expired ones go, and so do the orphans of a
server whose liveness marker (:mod:`code_sandbox.liveness`) shows that it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from code_sandbox.engine import ContainerFacts, Engine
from code_sandbox.errors import SandboxError
from code_sandbox.hardening import LABEL_EXPIRES_AT, LABEL_MANAGED, LABEL_OWNER, LABEL_TAG
from code_sandbox.liveness import owner_alive as marker_alive
from code_sandbox.liveness import prune_stopped_servers

logger = logging.getLogger(__name__)

CREATED_GRACE_SECONDS = 60
"""A created, never-started container younger than this may be another server's create or image probe; so may a
volume that no container uses yet."""

OwnerState = Literal["live", "dead", "unknown"]
OwnerAlive = Callable[[str], bool | None]
"""Answers for an owner token: ``True`` its server runs, ``False`` it stopped, ``None`` unknown."""


@dataclass(frozen=True)
class Verdict:
    """What the sweep decided about one managed container, and why."""

    container: ContainerFacts
    remove: bool
    reason: str
    expires_at: int | None
    owner: OwnerState = "unknown"


def _unknown(_owner: str) -> bool | None:
    return None


def judge_container(
    container: ContainerFacts, *, max_lifetime: int, now: float, owner_alive: OwnerAlive = _unknown
) -> Verdict:
    """Decide whether a managed container is garbage.

    Stopped -> remove. Past ``expires-at`` -> remove. Its server known to have stopped (``owner_alive`` says
    ``False``) -> remove as an orphan, even while it runs. Running and unexpired otherwise -> keep (it may be another
    client's live session). No valid ``expires-at``: remove only when Docker's creation time is older than the
    maximum lifetime; keep it when the creation time is unknown.
    """
    raw = container.labels.get(LABEL_EXPIRES_AT, "")
    expires_at = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 12 else None
    token = container.labels.get(LABEL_OWNER)
    alive = owner_alive(token) if token else None
    owner: OwnerState = "unknown" if alive is None else "live" if alive else "dead"

    def decide(remove: bool, reason: str) -> Verdict:
        return Verdict(container, remove, reason, expires_at, owner)

    young = container.created is not None and now - container.created < CREATED_GRACE_SECONDS
    if container.state == "created" and young:
        if owner == "dead":  # nobody is left to start it
            return decide(True, "orphan of a stopped server")
        return decide(False, "being created")  # another server may be about to start it
    if container.state != "running":
        return decide(True, "stopped")
    if expires_at is not None and expires_at <= now:
        return decide(True, "expired")
    if owner == "dead":
        return decide(True, "orphan of a stopped server")
    if expires_at is not None:
        return decide(False, "live")
    if container.created is None:
        return decide(False, "no expiry label and unknown creation time; kept for inspection")
    if now - container.created > max_lifetime:
        return decide(True, "no expiry label and older than the maximum lifetime")
    return decide(False, "no expiry label, younger than the maximum lifetime")


def survey_managed(
    engine: Engine, *, max_lifetime: int, state_dir: Path | None = None, tag: str | None = None
) -> list[Verdict]:
    """Judge every managed container on this Docker engine.

    :param state_dir: where servers record their liveness (:func:`code_sandbox.liveness.default_state_dir`); ``None``
        treats every owner as unknown.
    :param tag: judge only the containers of servers with this ``CODE_SANDBOX_TAG``.
    """
    now = engine.now()  # expiry labels are in the engine's time, and so are creation times
    labels = [f"{LABEL_MANAGED}=true", *([f"{LABEL_TAG}={tag}"] if tag is not None else [])]
    containers = engine.list_containers(*labels)  # before the liveness checks, never after
    owner_alive = _cached_liveness(state_dir) if state_dir is not None else _unknown
    return [judge_container(c, max_lifetime=max_lifetime, now=now, owner_alive=owner_alive) for c in containers]


Action = Literal["removed", "would remove", "kept", "REMOVAL FAILED"]


def apply_verdicts(
    engine: Engine,
    verdicts: list[Verdict],
    *,
    state_dir: Path | None,
    tag: str | None = None,
    everything: bool = False,
    dry_run: bool = False,
) -> list[Action]:
    """Remove the containers the verdicts call garbage (``everything``: all of them) and the volumes that no container
    uses any more (Podman's tmpfs volumes, :meth:`Engine.remove_leftover_volumes`), then forget the markers of
    stopped servers with nothing left (:func:`forget_stopped_servers`). A dry run changes nothing.

    :return: what happened to each container, in the verdicts' order.
    """
    actions: list[Action] = []
    removed: set[str] = set()
    for verdict in verdicts:
        if not (verdict.remove or everything):
            actions.append("kept")
        elif dry_run:
            actions.append("would remove")
        else:
            try:
                engine.remove_container(verdict.container.id)
            except SandboxError as error:
                logger.warning("a managed container could not be removed: %s", error.for_operator())
                actions.append("REMOVAL FAILED")
            else:
                removed.add(verdict.container.id)
                actions.append("removed")
    if not dry_run:
        try:
            # A volume is made before its container's create, which may take the engine's timeout and more.
            failures = engine.remove_leftover_volumes(tag=tag, grace=CREATED_GRACE_SECONDS + 3 * engine.timeout)
        except SandboxError as error:
            logger.warning("could not list leftover sandbox volumes (%s: %s)", error.code, error.for_operator())
        else:
            if failures:
                logger.warning("%d leftover sandbox volume(s) could not be removed; the next sweep retries", failures)
    if state_dir is not None and not dry_run:
        forget_stopped_servers(engine, state_dir, verdicts, removed=removed, tag=tag)
    return actions


def sweep_managed(
    engine: Engine, *, max_lifetime: int, state_dir: Path | None = None, tag: str | None = None
) -> tuple[list[Verdict], int]:
    """Remove the stopped, expired and orphaned managed containers (only those tagged ``tag``, when given).
    Returns the verdicts and the failed removals."""
    verdicts = survey_managed(engine, max_lifetime=max_lifetime, state_dir=state_dir, tag=tag)
    actions = apply_verdicts(engine, verdicts, state_dir=state_dir, tag=tag)
    for verdict, action in zip(verdicts, actions, strict=True):
        if action == "kept" and verdict.expires_at is None:
            logger.warning("kept a managed sandbox container: %s", verdict.reason)
    return verdicts, actions.count("REMOVAL FAILED")


def forget_stopped_servers(
    engine: Engine,
    state_dir: Path,
    verdicts: Iterable[Verdict],
    *,
    removed: Collection[str],
    tag: str | None = None,
) -> None:
    """Delete the markers of stopped servers none of whose containers remain (``removed``: the IDs that went).

    A marker that still has a container keeps its evidence, so the next sweep retries a failed removal. Verdicts of
    one ``tag`` do not show the other containers of a server, so then every managed container is listed again; if
    that fails, no marker is deleted.
    """
    if tag is None:
        remaining = [v.container for v in verdicts if v.container.id not in removed]
    else:
        try:
            remaining = engine.list_containers(f"{LABEL_MANAGED}=true")
        except SandboxError:
            return
    owners = (container.labels.get(LABEL_OWNER) for container in remaining)
    prune_stopped_servers(state_dir, keep={owner for owner in owners if owner})


def _cached_liveness(state_dir: Path) -> OwnerAlive:
    """One liveness check per owner and survey, so all of a server's containers get the same answer."""
    answers: dict[str, bool | None] = {}

    def alive(owner: str) -> bool | None:
        if owner not in answers:
            answers[owner] = marker_alive(state_dir, owner)
        return answers[owner]

    return alive
