"""The jailed transport, for gVisor with a profile whose runner can jail (:attr:`ProfileInfo.jailed_runs`).

gVisor's kernel does not keep a process out of another of the same uid, and shows every process's ``/proc/<pid>/fd`` to
every uid; it does keep a uid out of root's processes (no signal, no ptrace, no ``/proc/<pid>/mem``). So the channel
(``runner --channel --jailed``) runs as root, privileged in gVisor's kernel alone, and starts every program, the next
run's waiting process and an evaluation context through the jail (:mod:`code_sandbox.image.jail`): as the sandbox uid,
in a PID namespace of its own whose ``/proc`` lists that run's processes only. User code cannot name a process of
ours, let alone reach it; the channel does file operations as the sandbox uid (effective ids), and the supervisor's
survey (uid 65533) proves after each call, as under runc, that nothing of the sandbox uid outlived it. A call is the
same frames over the same held exec as under runc: no ``docker exec`` per call, which gVisor makes slow.
"""

from __future__ import annotations

import time

from code_sandbox.channel.channels import ChannelTransport
from code_sandbox.channel.protocol import (
    KillAllAnswer,
    Refusal,
    parse_answer,
)
from code_sandbox.channel.transport import Target, untrusted
from code_sandbox.engine import Engine, ExecStream, LineRequest
from code_sandbox.hardening import ROOT_USER
from code_sandbox.profile import Profile


class JailedTransport(ChannelTransport):
    """The channel transport with a jailed, root channel (see the module's docstring), running the readable runtime."""

    def __init__(self, engine: Engine, profile: Profile) -> None:
        super().__init__(engine, profile, readable_runtime=True)

    def _open_channel(self, target: Target) -> ExecStream:
        argv = [*self.execs.helper_argv("runner"), "--channel", "--jailed"]
        return self.engine.open_exec(target.container, argv, user=ROOT_USER, privileged=True)

    def kill_all(self, target: Target, *, timeout: float) -> KillAllAnswer | Refusal:
        """Kills the channel (root's: the sandbox uid's kill-all could not reach it) and every jail, then every process
        of the sandbox uid, from a privileged exec of its own; the next call opens a new channel."""
        self._forget_context(target)
        argv = [*self.execs.helper_argv("runner"), "--kill-all", "--jailed"]
        try:
            with untrusted():
                held = self.engine.open_exec(target.container, argv, user=ROOT_USER, privileged=True)
                try:
                    deadline = time.monotonic() + timeout
                    line = held.read_line(LineRequest(deadline, max_stdout=4096, max_stderr=4096))
                finally:
                    held.close()
                return parse_answer(line, KillAllAnswer)
        finally:
            self._drop(target)
