"""Network attacks: with networking off, nothing leaves the sandbox and sandboxes cannot reach each other."""

from __future__ import annotations

import json

import anyio
import pytest
from code_sandbox.execution import run_entrypoint
from code_sandbox.workspace import write_files

from tests.security.conftest import Arena

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


async def test_dns_lookups_fail_fast(arena: Arena) -> None:
    source = """
const dns = require('dns'); const started = Date.now();
dns.lookup('example.com', (err) => console.log(JSON.stringify({ code: err && err.code, ms: Date.now() - started })));
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert outcome["code"] in ("ENOTFOUND", "EAI_AGAIN") and outcome["ms"] < 2000
    await arena.assert_bystander_unaffected()


async def test_no_address_is_reachable_public_metadata_gateway_host_or_loopback(arena: Arena) -> None:
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
    results = json.loads((await arena.attack(source, timeout=20)).stdout)
    assert len(results) == len(targets)
    for result in results:
        assert result["outcome"] in ("ENETUNREACH", "ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EADDRNOTAVAIL"), result
    await arena.assert_bystander_unaffected()


async def test_udp_to_a_public_resolver_fails(arena: Arena) -> None:
    source = """
const dgram = require('dgram'); const s = dgram.createSocket('udp4');
s.send(Buffer.from('x'), 53, '8.8.8.8', (err) => { console.log(JSON.stringify({ code: err && err.code })); s.close(); });
"""
    outcome = json.loads((await arena.attack(source)).stdout)
    assert outcome["code"] in ("ENETUNREACH", "EPERM", "EACCES")
    await arena.assert_bystander_unaffected()


async def _run_listener(arena: Arena) -> None:
    await run_entrypoint(arena.manager, arena.victim.id, "listen.js", [], timeout_seconds=10)


async def test_a_listener_in_one_sandbox_cannot_be_reached_from_another(arena: Arena) -> None:
    listener = """
const net = require('net');
net.createServer(s => s.end('hello')).listen(8080, '0.0.0.0', () => console.log('listening'));
setTimeout(() => process.exit(0), 4000);
"""
    await write_files(arena.manager, arena.victim.id, [("listen.js", listener)], overwrite=True)
    probe = (
        CONNECT
        + "Promise.all([attempt('127.0.0.1', 8080), attempt('sandbox', 8080)]).then(r => console.log(JSON.stringify(r)));"
    )
    await write_files(arena.manager, arena.bystander.id, [("probe-net.js", probe)], overwrite=True)
    outcomes: list[object] = []
    async with anyio.create_task_group() as group:
        group.start_soon(_run_listener, arena)
        await anyio.sleep(1.5)
        result = await run_entrypoint(arena.manager, arena.bystander.id, "probe-net.js", [], timeout_seconds=10)
        outcomes = json.loads(result.stdout)
    for outcome in outcomes:
        assert isinstance(outcome, dict)
        assert outcome["outcome"] != "CONNECTED", outcome
    await arena.assert_bystander_unaffected()


async def test_the_sandbox_has_no_network_interface_but_loopback(arena: Arena) -> None:
    source = "console.log(JSON.stringify(Object.keys(require('os').networkInterfaces())))"
    assert json.loads((await arena.attack(source)).stdout) in ([], ["lo"])
    inspect = arena.manager.engine.inspect_container_raw(arena.victim.container_id)
    assert inspect["HostConfig"]["NetworkMode"] == "none"
    await arena.assert_bystander_unaffected()
