// The runner's jailed mode, under gVisor only (runner --channel --jailed): the channel runs as root, which gVisor's
// kernel keeps out of reach of the sandbox uid (no signal, no ptrace, no /proc/<pid>/mem), and starts every program
// through the jail (/usr/local/gvisor/jail, written by core: code_sandbox.image.jail), which runs it as the sandbox uid
// in a PID namespace of its own with a proc of that namespace: user code sees its own run's processes and nothing
// else, so nothing of ours (this channel, the supervisor's survey, the watchdog) has a pid it can name. File
// operations run with the sandbox uid as the effective uid and gid, which takes every capability away until they end.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

export const JAIL_PATH = '/usr/local/gvisor/jail';
const JAIL_ROOT = '/usr/local/gvisor/root';
const BINDS = ['/', '/dev', '/dev/pts', '/dev/mqueue', '/workspace', '/tmp']; // code_sandbox.image.jail.JAIL_BINDS
const GVISOR_MARK = '/proc/sentry-meminfo'; // a file only gVisor's kernel has
const FIRST_SANDBOX_UID = 0x7000_0000; // code_sandbox.hardening.SANDBOX_UIDS
const LAST_SANDBOX_UID = 0x7000_0000 + 2 ** 20; // inclusive: the probes' uid (PROBE_UID) comes right after the range
const PROGRAM_WAIT_MS = 5000;
const PROGRAM_PAUSE_MS = 5;
const KILL_SCANS = 8; // the kill-all's scans at most, each after one that killed something
// What user code runs with: the readable runtime first (gVisor cannot run the unreadable one).
export const JAILED_PATH = '/usr/local/gvisor:/usr/local/bin';

let uid = null;

// The sandbox uid when the channel jails its programs; null otherwise.
export const jailedUid = () => uid;

const same = (a, b) => a.dev === b.dev && a.ino === b.ino;

// Whether the jail's root holds the binds of `jail bind`: each target is the very directory of its source.
function bound() {
  try {
    return BINDS.every((source) => same(fs.statSync(source), fs.statSync(JAIL_ROOT + (source === '/' ? '' : source))));
  } catch {
    return false;
  }
}

// Takes the sandbox uid as its own: root under gVisor, in a sandbox whose workspace a sandbox uid owns. Returns null,
// or the refusal's code.
export function adoptSandboxUid() {
  if (process.getuid() !== 0 || !fs.existsSync(GVISOR_MARK)) return 'NOT_JAILED';
  const owner = fs.statSync('/workspace').uid;
  if (!(owner >= FIRST_SANDBOX_UID && owner <= LAST_SANDBOX_UID)) return 'NOT_JAILED';
  process.setgroups([]);
  uid = owner;
  return null;
}

// Enters the jailed mode (adoptSandboxUid), the jail's binds in place (made now if they are not).
export function enterJail() {
  const refused = adoptSandboxUid();
  if (refused !== null) return refused;
  if (!bound()) spawnSync(JAIL_PATH, ['bind'], { stdio: 'ignore', env: {}, cwd: '/' });
  if (!bound()) {
    uid = null;
    return 'NOT_JAILED';
  }
  return null;
}

// The host's kill-all, jailed: every channel (root's, which a sandbox uid's kill could not reach) and every jail, by
// pid, scan after scan until one finds none (a channel killed mid-scan may have started a jail the scan had passed);
// the caller then kills what is left of the sandbox uid. How many it killed.
export function killChannelsAndJails() {
  let killed = 0;
  for (let scan = 0; scan < KILL_SCANS; scan += 1) {
    const found = killScan();
    killed += found;
    if (found === 0) break;
  }
  return killed;
}

function killScan() {
  let killed = 0;
  for (const name of fs.readdirSync('/proc').filter((n) => /^[0-9]+$/.test(n) && Number(n) !== process.pid)) {
    let cmdline;
    try {
      cmdline = fs.readFileSync(`/proc/${name}/cmdline`, 'latin1');
    } catch {
      continue;
    }
    if (parentAndUid(name)?.uid !== 0) continue; // ours are root's: nothing of the sandbox uid is named here
    if (cmdline.startsWith(`${JAIL_PATH}\0`) || cmdline.includes('/runner.mjs\0--channel\0--jailed\0')) {
      try {
        process.kill(Number(name), 'SIGKILL');
        killed += 1;
      } catch {
        // gone
      }
    }
  }
  return killed;
}

// The argv that starts `argv` through the jail.
export const jailArgv = (argv) => [JAIL_PATH, 'run', String(uid), ...argv];

// Runs `work` with the sandbox uid as the effective uid and gid (file operations act as the sandbox would), then
// becomes root again. Outside the jailed mode it just runs `work`.
export async function asSandboxUser(work) {
  if (uid === null) return work();
  process.setegid(uid);
  process.seteuid(uid);
  try {
    return await work();
  } finally {
    process.seteuid(0);
    process.setegid(0);
  }
}

// A process's parent pid and real uid, from /proc; null when it is gone.
function parentAndUid(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    // The first line is a name the process chose, which gVisor does not escape: a Uid line seen twice is not believed.
    const uids = [...fs.readFileSync(`/proc/${pid}/status`, 'latin1').matchAll(/^Uid:\t([0-9]+)\t/gm)];
    return uids.length === 1 ? { ppid, uid: Number(uids[0][1]) } : null;
  } catch {
    return null;
  }
}

const childrenOf = (parent) => fs.readdirSync('/proc').filter((name) => /^[0-9]+$/.test(name)).map(Number)
  .filter((pid) => parentAndUid(pid)?.ppid === parent);

// The jailed program of the jail `jailPid` (the child of the jail's init), once it runs as the sandbox uid, by its pid
// in our namespace; null when it has not come to be within PROGRAM_WAIT_MS (or the jail ended).
export async function programOf(jailPid) {
  const deadline = performance.now() + PROGRAM_WAIT_MS;
  while (performance.now() < deadline) {
    const [init] = childrenOf(jailPid);
    const program = init === undefined ? undefined : childrenOf(init).find((pid) => parentAndUid(pid)?.uid === uid);
    if (program !== undefined) return program;
    if (parentAndUid(jailPid) === null) return null;
    await sleep(PROGRAM_PAUSE_MS);
  }
  return null;
}
