"""The real transports over an engine that edits one helper's raw answer: faults that no honest helper produces on
demand (a garbled answer, a flood of lines), injected at the bytes the host parses, around a real container.

:class:`EditedTransport` edits answers on the session's channel (file operations and runs, as the server sends
them); :func:`edited_execs` edits exec results (the exec form, where an exit code exists). Both edit at the
engine boundary (:class:`~tests.support.forwarding_engine.EditedEngine`). Install either with :func:`install`, which
closes the channels the manager's previous transport held.
"""

from __future__ import annotations

from collections.abc import Callable

from code_sandbox.channel.channels import ChannelTransport
from code_sandbox.channel.jailed import JailedTransport
from code_sandbox.channel.observed import transport_for
from code_sandbox.channel.transport import HelperExecs, Transport
from code_sandbox.engine import Engine
from code_sandbox.profile import Profile
from code_sandbox.sandbox.sessions import SessionManager

from tests.support.forwarding_engine import EditedEngine, ExecEdit, LineEdit


class EditedTransport(ChannelTransport):
    """The channel transport; the answer to every request of ``operation`` (``"run"``, ``"list"``...) is edited.
    ``operations`` records the operation of every request sent."""

    def __init__(self, engine: Engine, profile: Profile, operation: str, edit: LineEdit) -> None:
        self.edited = EditedEngine(engine, line_edits={operation: edit})
        super().__init__(self.edited, profile)

    @property
    def operations(self) -> list[str]:
        return self.edited.operations


class EditedJailedTransport(JailedTransport):
    """:class:`EditedTransport`'s edits on the jailed transport (gVisor's jailed runs)."""

    def __init__(self, engine: Engine, profile: Profile, operation: str, edit: LineEdit) -> None:
        self.edited = EditedEngine(engine, line_edits={operation: edit})
        super().__init__(self.edited, profile)


def edited_transport(
    manager: SessionManager, operation: str, edit: LineEdit, engine: Engine | None = None
) -> EditedTransport | EditedJailedTransport:
    """The transport ``manager`` uses (channel or jailed), with ``operation``'s answers edited; over ``engine`` if
    given, the manager's otherwise."""
    jailed = isinstance(transport_for(manager.provisioner.engine, manager.provisioner.profile), JailedTransport)
    kind = EditedJailedTransport if jailed else EditedTransport
    return kind(engine or manager.provisioner.engine, manager.provisioner.profile, operation, edit)


def edited_execs(engine: Engine, profile: Profile, match: Callable[[list[str]], bool], edit: ExecEdit) -> HelperExecs:
    """The exec form of helper calls; every exec whose argv ``match`` accepts gets its result edited."""
    return HelperExecs(EditedEngine(engine, exec_match=match, exec_edit=edit), profile)


def install(manager: SessionManager, transport: Transport) -> None:
    """Make ``transport`` the manager's, closing what the previous one held (its sandboxes' channels)."""
    manager.provisioner.transport.close_all()
    manager.provisioner.transport = transport


def is_kill_all(argv: list[str]) -> bool:
    """The runner's kill-all (``runner --kill-all``), an exec of its own."""
    return any(arg.endswith("runner.mjs") for arg in argv) and argv[-1] == "--kill-all"
