"""What each profile in the repository runs for the conformance suite: the same behaviours, in its language."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Programs:
    """Sources of small programs, each doing one thing the suite checks. Every entrypoint has the profile's suffix.

    :param arguments: prints its arguments joined by ``|`` on stdout, ``err`` on stderr, and exits with code 3.
    :param make_file: writes ``made by the program`` to ``out/result.txt`` under the workspace.
    :param flood: writes 2 MiB of ``x`` to stdout.
    :param forever: prints ``ready``, then sleeps for a minute (a run the suite stops).
    :param detach: starts a child in a new session that sleeps for a minute, and exits 0 at once.
    :param renice: lowers the priority of its parent (the runner that started it) to nice 19.
    :param nice: prints its own nice value.
    :param lock: makes ``locked/b.txt`` and then takes write permission off ``locked`` (mode 0500).
    :param busy: uses one second of CPU time from its start (not the runtime's boot before it), then exits 0.
    :param hold: holds 200 MB of memory that it has written to for half a second, then exits 0.
    :param probe: prints one JSON object: ``interfaces`` (network interface names), ``connect`` (whether a TCP
        connection to 192.0.2.1:80 succeeded), ``root_write`` (whether writing ``/etc/probe`` succeeded),
        ``cap_eff`` (``CapEff`` of /proc/self/status) and ``kill_watchdog`` (the error name, or ``"sent"``, of
        SIGKILL sent to the process whose command line names the watchdog; ``"unseen"`` when none can be seen).
    :param tree: makes a workspace of every kind a snapshot keeps: directories of modes 0700, 0750 and 0500 (one
        empty), files of modes 0600, 0640, 0400 and 0755 with every byte value, a second hard link of one, a link to
        a file and one to nowhere; and a special file (a FIFO or a socket), which a snapshot skips.
    :param listing: prints one JSON list, sorted by path, of every entry of the workspace but the programs
        themselves (whose names start with ``program`` or ``tree``/``listing``): ``[path, kind, mode, sha256 or
        target]``, where kind is ``directory``, ``file``, ``symlink`` or ``other``.
    """

    suffix: str
    arguments: str
    make_file: str
    flood: str
    forever: str
    detach: str
    renice: str
    nice: str
    lock: str
    busy: str
    hold: str
    probe: str
    tree: str
    listing: str


JAVASCRIPT = Programs(
    suffix=".js",
    arguments="console.log(process.argv.slice(2).join('|')); console.error('err'); process.exit(3);",
    make_file="""
const fs = require('fs');
fs.mkdirSync('out', { recursive: true });
fs.writeFileSync('out/result.txt', 'made by the program');
""",
    flood="process.stdout.write('x'.repeat(2 * 1024 * 1024));",
    forever="console.log('ready'); setTimeout(() => {}, 60000);",
    busy="const s = process.cpuUsage(); const cpu = () => { const u = process.cpuUsage(s); return u.user + u.system; };"
    " while (cpu() < 1e6);",
    hold="const held = Buffer.alloc(200e6, 1); setTimeout(() => console.log(held.length), 500);",
    detach="""
const { spawn } = require('child_process');
spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60000)'], { detached: true, stdio: 'ignore' }).unref();
""",
    renice="require('os').setPriority(process.ppid, 19);",
    nice="console.log(require('os').getPriority());",
    lock="""
const fs = require('fs');
fs.mkdirSync('locked');
fs.writeFileSync('locked/b.txt', 'b');
fs.chmodSync('locked', 0o500);
""",
    probe="""
const fs = require('fs'), net = require('net');
const result = { interfaces: fs.readFileSync('/proc/net/dev', 'utf8').split('\\n').slice(2).filter(Boolean)
  .map((line) => line.split(':')[0].trim()) };
try { fs.writeFileSync('/etc/probe', 'x'); result.root_write = true; } catch { result.root_write = false; }
result.cap_eff = fs.readFileSync('/proc/self/status', 'latin1').match(/CapEff:\\s*(\\w+)/)[1];
const watchdog = fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)).find((p) => {
  try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').includes('watchdog'); } catch { return false; }
});
if (watchdog === undefined) result.kill_watchdog = 'unseen';
else try { process.kill(Number(watchdog), 'SIGKILL'); result.kill_watchdog = 'sent'; }
catch (error) { result.kill_watchdog = error.code; }
const socket = net.connect({ host: '192.0.2.1', port: 80, timeout: 2000 });
const done = (connected) => { result.connect = connected; socket.destroy(); console.log(JSON.stringify(result)); };
socket.on('connect', () => done(true)).on('error', () => done(false)).on('timeout', () => done(false));
""",
    tree="""
const fs = require('fs'), net = require('net');
fs.mkdirSync('keep/inner', { recursive: true });
fs.mkdirSync('empty');
fs.mkdirSync('locked');
fs.writeFileSync('keep/bytes.bin', Buffer.from([...Array(256).keys()]));
fs.writeFileSync('keep/inner/text.txt', 'snapshot ✓\\n');
fs.writeFileSync('ro.txt', 'read only');
fs.writeFileSync('run.sh', '#!/bin/sh\\n');
fs.writeFileSync('locked/in.txt', 'behind 0500');
fs.linkSync('keep/bytes.bin', 'keep/hard.bin');
fs.symlinkSync('../ro.txt', 'keep/link');
fs.symlinkSync('/nowhere/at/all', 'dangling');
fs.chmodSync('keep/bytes.bin', 0o640);
fs.chmodSync('ro.txt', 0o400);
fs.chmodSync('run.sh', 0o755);
fs.chmodSync('keep/inner', 0o750);
fs.chmodSync('locked', 0o500);
const server = net.createServer().listen('special', () => process.exit(0));
""",
    listing="""
const fs = require('fs'), crypto = require('crypto');
const seen = [];
const walk = (dir) => {
  for (const name of fs.readdirSync(dir || '.')) {
    const path = dir ? `${dir}/${name}` : name;
    if (/^(program|tree|listing)/.test(path)) continue;
    const st = fs.lstatSync(path);
    const kind = st.isDirectory() ? 'directory' : st.isFile() ? 'file' : st.isSymbolicLink() ? 'symlink' : 'other';
    const what = kind === 'file' ? crypto.createHash('sha256').update(fs.readFileSync(path)).digest('hex')
      : kind === 'symlink' ? fs.readlinkSync(path) : '';
    seen.push([path, kind, st.mode & 0o777, what]);
    if (kind === 'directory') walk(path);
  }
};
walk('');
seen.sort((a, b) => Buffer.compare(Buffer.from(a[0]), Buffer.from(b[0])));
console.log(JSON.stringify(seen));
""",
)

PYTHON = Programs(
    suffix=".py",
    arguments="import sys\nprint('|'.join(sys.argv[1:]))\nprint('err', file=sys.stderr)\nsys.exit(3)\n",
    make_file="""
import os
os.makedirs('out', exist_ok=True)
with open('out/result.txt', 'w') as f:
    f.write('made by the program')
""",
    flood="import sys\nsys.stdout.write('x' * (2 * 1024 * 1024))\n",
    forever="import time\nprint('ready', flush=True)\ntime.sleep(60)\n",
    busy="import time\nstart = time.process_time()\nwhile time.process_time() - start < 1:\n    pass\n",
    hold=(
        "import time\nheld = bytearray(200_000_000)\nfor i in range(0, len(held), 4096):\n    held[i] = 1\n"
        "time.sleep(0.5)\nprint(len(held))\n"
    ),
    detach="""
import subprocess, sys
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
""",
    renice="import os\nos.setpriority(os.PRIO_PROCESS, os.getppid(), 19)\n",
    nice="import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))\n",
    lock="""
import os
os.mkdir('locked')
with open('locked/b.txt', 'w') as f:
    f.write('b')
os.chmod('locked', 0o500)
""",
    probe="""
import json, os, re, signal, socket
with open('/proc/net/dev') as f:
    result = {'interfaces': [line.split(':')[0].strip() for line in f.read().splitlines()[2:] if line.strip()]}
try:
    open('/etc/probe', 'w').close()
    result['root_write'] = True
except OSError:
    result['root_write'] = False
with open('/proc/self/status') as f:
    result['cap_eff'] = re.search(r'CapEff:\\s*(\\w+)', f.read()).group(1)
watchdog = None
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            if b'watchdog' in f.read():
                watchdog = int(pid)
    except OSError:
        pass
try:
    os.kill(watchdog, signal.SIGKILL)
    result['kill_watchdog'] = 'sent'
except PermissionError:
    result['kill_watchdog'] = 'EPERM'
except OSError as error:
    result['kill_watchdog'] = type(error).__name__
try:
    socket.create_connection(('192.0.2.1', 80), timeout=2).close()
    result['connect'] = True
except OSError:
    result['connect'] = False
print(json.dumps(result))
""",
    tree="""
import os
os.makedirs('keep/inner')
os.mkdir('empty')
os.mkdir('locked')
for path, data in [('keep/bytes.bin', bytes(range(256))), ('keep/inner/text.txt', 'snapshot ✓\\n'.encode()),
                   ('ro.txt', b'read only'), ('run.sh', b'#!/bin/sh\\n'), ('locked/in.txt', b'behind 0500')]:
    with open(path, 'wb') as f:
        f.write(data)
os.link('keep/bytes.bin', 'keep/hard.bin')
os.symlink('../ro.txt', 'keep/link')
os.symlink('/nowhere/at/all', 'dangling')
for path, mode in [('keep/bytes.bin', 0o640), ('ro.txt', 0o400), ('run.sh', 0o755), ('keep/inner', 0o750),
                   ('locked', 0o500)]:
    os.chmod(path, mode)
os.mkfifo('special')
""",
    listing="""
import hashlib, json, os, re, stat
seen = []
def walk(top):
    for name in os.listdir(top or '.'):
        path = f'{top}/{name}' if top else name
        if re.match('(program|tree|listing)', path):
            continue
        st = os.lstat(path)
        kind = ('directory' if stat.S_ISDIR(st.st_mode) else 'file' if stat.S_ISREG(st.st_mode)
                else 'symlink' if stat.S_ISLNK(st.st_mode) else 'other')
        if kind == 'file':
            with open(path, 'rb') as f:
                what = hashlib.sha256(f.read()).hexdigest()
        else:
            what = os.readlink(path) if kind == 'symlink' else ''
        seen.append([path, kind, st.st_mode & 0o777, what])
        if kind == 'directory':
            walk(path)
walk('')
seen.sort(key=lambda row: row[0].encode())
print(json.dumps(seen, ensure_ascii=False))
""",
)

PROGRAMS = {"javascript-offline": JAVASCRIPT, "python-offline": PYTHON}
