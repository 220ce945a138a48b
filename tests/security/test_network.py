"""Network attacks: with networking off, nothing leaves the sandbox and sandboxes cannot reach each other.

Probes that only try to get out share the worker's sandbox; the listener needs two sandboxes of its own.
"""

from __future__ import annotations

import json

import anyio
import pytest
from code_sandbox.sandbox.execution import run_entrypoint
from code_sandbox.sandbox.results import RunResult
from code_sandbox.sandbox.workspace import write_files

from tests.security.conftest import Arena, SharedSandbox
from tests.support.inspect import inspect_container

pytestmark = [pytest.mark.docker, pytest.mark.anyio, pytest.mark.usefixtures("cleanup_managed")]

CONNECT = """
const net = require('net');
function attempt(host, port) {
  return new Promise(resolve => {
    const started = Date.now();
    const socket = net.connect({ host, port, timeout: 3000 });
    socket.on('connect', () => { socket.destroy(); resolve({ host, outcome: 'CONNECTED' }); });
    socket.on('timeout', () => { socket.destroy(); resolve({ host, outcome: 'TIMEOUT' }); });
    socket.on('error', e => resolve({ host, outcome: e.code, ms: Date.now() - started }));
  });
}
"""


async def test_dns_lookups_fail_fast(shared: SharedSandbox) -> None:
    source = """
const dns = require('dns'); const started = Date.now();
dns.lookup('example.com', (err) => console.log(JSON.stringify({ code: err && err.code, ms: Date.now() - started })));
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    assert outcome["code"] in ("ENOTFOUND", "EAI_AGAIN") and outcome["ms"] < 2000


async def test_no_address_is_reachable_public_metadata_gateway_host_or_loopback(shared: SharedSandbox) -> None:
    targets = [
        ("1.1.1.1", 443),
        ("2606:4700:4700::1111", 443),
        ("169.254.169.254", 80),
        ("172.17.0.1", 2375),
        ("host.docker.internal", 80),
        ("127.0.0.1", 2375),
        ("127.0.0.1", 22),
        ("::1", 80),
    ]
    source = (
        CONNECT
        + f"Promise.all({json.dumps(targets)}.map(([h, p]) => attempt(h, p)))"
        + (".then(r => console.log(JSON.stringify(r)));")
    )
    results = json.loads((await shared.probe(source, timeout=20)).stdout)
    assert len(results) == len(targets)
    for result in results:
        assert result["outcome"] in (
            "EPERM",  # no socket but AF_UNIX (seccomp); the rest are gVisor's netstack, which ignores the profile
            "ENETUNREACH",
            "EHOSTUNREACH",
            "ECONNREFUSED",
            "ENOTFOUND",
            "EAI_AGAIN",
            "EADDRNOTAVAIL",
        ), result


async def test_udp_to_a_public_resolver_fails(shared: SharedSandbox) -> None:
    source = """
const dgram = require('dgram'); const s = dgram.createSocket('udp4'); let said = false;
const say = (err) => { if (!said) { said = true; console.log(JSON.stringify({ code: err && err.code })); } };
s.on('error', say);  // no UDP socket at all (seccomp): the send's bind fails here
s.send(Buffer.from('x'), 53, '8.8.8.8', (err) => { say(err); s.close(); });
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    assert outcome["code"] in ("ENETUNREACH", "EHOSTUNREACH", "EPERM", "EACCES")


async def test_a_listener_in_one_sandbox_cannot_be_reached_from_another(arena: Arena) -> None:
    # The listener first proves it can be reached from inside its own sandbox and says so; while it listens, the
    # bystander tries the same addresses; then the listener's run is cancelled.
    listener = (
        CONNECT
        + """
const server = net.createServer(s => { s.on('error', () => {}); s.end('hello'); });
server.on('error', (e) => console.log(`refused: ${e.code}`));
server.listen(8080, '0.0.0.0', async () => {
  const self = await attempt('127.0.0.1', 8080);
  console.log(self.outcome === 'CONNECTED' ? 'listening' : `unreachable from itself: ${self.outcome}`);
});
"""
    )
    await write_files(arena.manager, arena.victim.id, [("listen.js", listener)], overwrite=True)
    probe = (
        CONNECT
        + "Promise.all([attempt('127.0.0.1', 8080), attempt('sandbox', 8080)]).then(r => console.log(JSON.stringify(r)));"
    )
    await write_files(arena.manager, arena.bystander.id, [("probe-net.js", probe)], overwrite=True)
    listening = anyio.Event()
    listener_output = bytearray()
    listener_ended = False

    async def on_output(_stream: str, data: bytes) -> None:
        listener_output.extend(data)
        if b"listening" in listener_output or b"refused" in listener_output:  # refused: no TCP socket (seccomp)
            listening.set()

    async def run_listener() -> None:
        nonlocal listener_ended
        await run_entrypoint(arena.manager, arena.victim.id, "listen.js", [], timeout_seconds=30, output=on_output)
        listener_ended = True

    probe_result: list[RunResult] = []
    async with anyio.create_task_group() as group:
        group.start_soon(run_listener)
        with anyio.fail_after(20):
            await listening.wait()
        probe_result.append(
            await run_entrypoint(arena.manager, arena.bystander.id, "probe-net.js", [], timeout_seconds=10)
        )
        group.cancel_scope.cancel()
    outcomes = json.loads(probe_result[0].stdout)
    assert [outcome["host"] for outcome in outcomes] == ["127.0.0.1", "sandbox"]
    for outcome in outcomes:
        assert outcome["outcome"] != "CONNECTED", outcome
    if bytes(listener_output) == b"refused: EPERM\n":  # our seccomp profile: neither sandbox has an IP socket
        assert outcomes[0]["outcome"] == "EPERM"  # 'sandbox' is not even looked up
    else:  # a runtime that ignores the profile (gVisor): a listener works at home and nowhere else
        assert not listener_ended, "the listener stopped before the bystander's probe was done"
        assert bytes(listener_output) == b"listening\n"
    await arena.assert_bystander_unaffected()


async def test_the_sandbox_has_no_network_interface_but_loopback(shared: SharedSandbox) -> None:
    # /proc/net/dev lists the namespace's interfaces; asking the kernel over netlink (os.networkInterfaces) is refused
    # by the seccomp profile, whose socket() allows AF_UNIX alone (gVisor, which ignores it, answers with "lo").
    source = """
const names = require('fs').readFileSync('/proc/net/dev', 'utf8').split('\\n').slice(2).filter(Boolean)
  .map((line) => line.split(':')[0].trim());
let asked; try { asked = Object.keys(require('os').networkInterfaces()); } catch (e) { asked = e.message; }
console.log(JSON.stringify({ names, asked }));
"""
    outcome = json.loads((await shared.probe(source)).stdout)
    assert outcome["names"] in ([], ["lo"])
    refused = "A system error occurred: uv_interface_addresses returned Unknown system error 1"
    assert outcome["asked"] in ([], ["lo"]) or outcome["asked"].startswith(refused), outcome
    inspect = inspect_container(shared.manager.provisioner.engine, shared.session.container_id)
    assert inspect["HostConfig"]["NetworkMode"] == "none"
