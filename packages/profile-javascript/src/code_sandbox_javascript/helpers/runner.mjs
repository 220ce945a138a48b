// Runner of the code-sandbox image: runs one user command in its own process group with byte caps on stdout
// and stderr and a timeout, then kills every process the sandbox user has left behind.
// Usage: node --disable-sigusr1 /opt/sandbox/runner.mjs <request-json | - | --channel | --kill-all | --watchdog-ready |
//        --survey | --supervise>
// stdout carries exactly one JSON answer line; stderr carries one JSON progress line per second of the run.
// --channel serves one request after another over a held stdin (runs and file operations), one answer line each.
// Exit 0 for every well-formed answer (refusals included); a nonzero exit is a bug.
//
// User code runs under the runner's own uid, so the runner protects itself the way the kernel allows: node is
// installed unreadable (mode 0711), which makes every process that execs it non-dumpable from its first instruction,
// and as a second layer the runner loads the seal (/usr/local/lib/code-sandbox/seal.so, written by core: prctl), so user code cannot open our /proc/<pid>/fd or mem, nor ptrace us; --disable-sigusr1 keeps our
// inspector shut. The runner refuses to run unless it sees that protection in force, except where the host said the
// kernel cannot give it (gVisor: CODE_SANDBOX_SEAL=optional in the container's environment). What user code can still do to us (kill or stop us) only ends the run
// without an answer, which the host treats as a failure and destroys the sandbox.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { FILE_OPERATIONS, fileOperation, stdinTaker } from './files.mjs';
import {
  JAILED_PATH, adoptSandboxUid, asSandboxUser, enterJail, jailArgv, jailedUid, killChannelsAndJails, programOf,
} from './jail.mjs';

// Nothing is inherited: the host's environment must never reach user code.
const CHILD_ENV = Object.freeze({ PATH: '/usr/local/bin', HOME: '/workspace', TMPDIR: '/tmp', LANG: 'C.UTF-8' });
const childEnv = () => (jailedUid() === null ? CHILD_ENV : { ...CHILD_ENV, PATH: JAILED_PATH });
// How a program's process is started: directly, or (jailed, under gVisor) through the jail, which enters /workspace.
const startArgv = (argv) => (jailedUid() === null ? argv : jailArgv(argv));
const startCwd = () => (jailedUid() === null ? '/workspace' : '/');
const SEAL_PATH = '/usr/local/lib/code-sandbox/seal.so';
// The next run's process (start.mjs), started ahead of it by the channel. It serves a request whose argv is the
// runtime (this node), RUN_FLAGS and a script in /workspace: what the profile's run argv always is.
const START_PATH = new URL('./start.mjs', import.meta.url).pathname;
const RUN_FLAGS = ['--disable-proto=throw'];
const CLEANUP_GRACE_MS = 450; // the documented grace: after it, a process still alive means "cleanup failed"
// Jailed, each process is stopped and killed on its own, each step through gVisor's kernel: a longer grace.
const JAILED_CLEANUP_GRACE_MS = 2000;
const cleanupGrace = () => (jailedUid() === null ? CLEANUP_GRACE_MS : JAILED_CLEANUP_GRACE_MS);
const CLEANUP_PAUSE_MS = 20;
const DRAIN_MS = 100;
// The next run's process is started this long after a run's answer: the host asks the supervisor's survey right after
// the answer, and a runtime booting beside the scan slows both.
const PREPARE_DELAY_MS = 5;
const PROGRESS_MS = 1000;
const MAX_CAP = 64 * 1024 * 1024;
const MAX_TIMEOUT_MS = 86_400_000;
const OOM_COUNTERS = ['/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control']; // v2, v1
// The sandbox cgroup's usage counters (v1, then v2, then gVisor's where `jail bind` mounted them: no high-water mark
// there), which user code can read but not change: CPU time in nanoseconds, memory in bytes now and at its highest
// since the container started.
const GVISOR_COUNTERS = '/usr/local/gvisor/counters/cgroup'; // code_sandbox.image.jail.JAIL_COUNTERS
const CPU_COUNTERS = [
  ['/sys/fs/cgroup/cpuacct/cpuacct.usage', /^(\d+)$/, 1],
  ['/sys/fs/cgroup/cpu.stat', /^usage_usec (\d+)$/m, 1000],
  [`${GVISOR_COUNTERS}/cpuacct.usage`, /^(\d+)$/, 1],
];
const MEMORY_NOW = [
  ['/sys/fs/cgroup/memory/memory.usage_in_bytes', /^(\d+)$/, 1],
  ['/sys/fs/cgroup/memory.current', /^(\d+)$/, 1],
  [`${GVISOR_COUNTERS}/memory.usage_in_bytes`, /^(\d+)$/, 1],
];
const MEMORY_PEAK = [
  ['/sys/fs/cgroup/memory/memory.max_usage_in_bytes', /^(\d+)$/, 1],
  ['/sys/fs/cgroup/memory.peak', /^(\d+)$/, 1],
];
const MEMORY_SAMPLE_MS = 20;

const MESSAGES = {
  INVALID_REQUEST: 'the run request is malformed',
  SPAWN_FAILED: 'the command could not be started',
  RUNNING_AS_ROOT: 'the runner refuses to run as root',
  NOT_SEALED: 'the runner refuses to run while other processes of its uid could read its memory',
  NOT_JAILED: 'the runner cannot jail programs here',
  INTERNAL_ERROR: 'the runner failed',
};
const refusal = (code) => ({ ok: false, code, message: MESSAGES[code] });

function answer(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`, () => process.exit(0));
}

const MAX_REQUEST_BYTES = 4 * 1024 * 1024;

// Reads one length-prefixed frame from stdin, never waiting for EOF; null when it is cut short or too large.
async function readFrame() {
  const chunks = [];
  let have = 0;
  let need = 4;
  let length = null;
  for await (const chunk of process.stdin) {
    chunks.push(chunk);
    have += chunk.length;
    if (length === null && have >= 4) {
      length = Buffer.concat(chunks).readUInt32BE(0);
      if (length > MAX_REQUEST_BYTES) return null;
      need = 4 + length;
    }
    if (length !== null && have >= need) break;
  }
  if (length === null || have < need) return null;
  process.stdin.pause();
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks).subarray(4, need));
  } catch {
    return null;
  }
}

function parseRequest(text) {
  let req;
  try {
    req = JSON.parse(text);
  } catch {
    return null;
  }
  return validRequest(req);
}

function validRequest(req) {
  const keys = ['argv', 'timeout_ms', 'stdout_cap', 'stderr_cap'];
  const isObject = req !== null && typeof req === 'object' && !Array.isArray(req);
  // "stream" is optional: when true, kept output is also sent as it arrives (see capture()).
  const extra = isObject ? Object.keys(req).filter((k) => !keys.includes(k)) : [];
  if (!isObject || !keys.every((k) => Object.hasOwn(req, k)) || extra.some((k) => k !== 'stream')) return null;
  if (Object.hasOwn(req, 'stream') && typeof req.stream !== 'boolean') return null;
  const { argv } = req;
  const argvOk = Array.isArray(argv) && argv.length >= 1 && argv.length <= 256 && argv[0] !== '' &&
    argv.every((a) => typeof a === 'string' && a.length <= 65536 && !a.includes('\0'));
  const intIn = (n, lo, hi) => Number.isSafeInteger(n) && n >= lo && n <= hi;
  const ok = argvOk && intIn(req.timeout_ms, 1, MAX_TIMEOUT_MS) && intIn(req.stdout_cap, 0, MAX_CAP) &&
    intIn(req.stderr_cap, 0, MAX_CAP);
  return ok ? req : null;
}

// A counter file's text read as `pattern` says, scaled; null when it does not match.
function counterValue(text, pattern, scale) {
  const match = pattern.exec(text.trim());
  return match ? Number(match[1]) * scale : null;
}

// The first of `counters` this cgroup layout has, scaled; null when none can be read.
function readCounter(counters) {
  for (const [file, pattern, scale] of counters) {
    try {
      const value = counterValue(fs.readFileSync(file, 'latin1'), pattern, scale);
      if (value !== null) return value;
    } catch {
      // not this layout
    }
  }
  return null;
}

// The sandbox cgroup's memory use now, for the sampler: read every MEMORY_SAMPLE_MS during a call through a
// descriptor held open (and read again from offset 0), since an open allocates a file structure charged to the
// sandbox's memory. When user code runs the sandbox out of memory, the kernel kills it, and there is a moment before
// its memory is uncharged when the cgroup is still full while the killed process no longer counts as the victim:
// a charge then picks the next largest process, which is this runner, and ends the sandbox. null: not readable here.
let memoryNow = null;
function sampleMemory() {
  memoryNow ??= heldCounter(MEMORY_NOW); // none readable yet: tried again at the next sample
  return memoryNow === null ? null : memoryNow();
}

// A reader of the first of `counters` that can be read, through a descriptor it keeps; null when none can be read.
function heldCounter(counters) {
  for (const [file, pattern, scale] of counters) {
    let fd;
    try {
      fd = fs.openSync(file, 'r');
    } catch {
      continue; // not this layout
    }
    const buf = Buffer.alloc(64);
    const read = () => {
      try {
        return counterValue(buf.toString('latin1', 0, fs.readSync(fd, buf, 0, buf.length, 0)), pattern, scale);
      } catch {
        return null;
      }
    };
    if (read() !== null) return read;
    fs.closeSync(fd);
  }
  return null;
}

// The cgroup's OOM-kill counter, or null when this kernel/cgroup layout does not expose one.
function readOomKills() {
  for (const file of OOM_COUNTERS) {
    try {
      const match = /^oom_kill (\d+)$/m.exec(fs.readFileSync(file, 'latin1'));
      if (match) return Number(match[1]);
    } catch {
      // try the other cgroup version
    }
  }
  return null;
}

// A process's (or with `tid`, one of its threads') state letter, thread count, fault counts, CPU ticks and start time
// (clock ticks after boot: with the pid, it names one process for good), or null when it is gone.
function procStat(pid, tid = null) {
  try {
    const stat = fs.readFileSync(tid === null ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`, 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return {
      state: fields[0], ppid: Number(fields[1]), threads: Number(fields[17]), started: Number(fields[19]),
      ran: [fields[7], fields[9], fields[11], fields[12]].join(' '), // minflt majflt utime stime
    };
  } catch {
    return null;
  }
}

// Whether a process lives, from its leader's state letter and its thread count. A zombie leader is dead only when it
// is the last of its group: one that called pthread_exit (SYS_exit) while other threads run shows 'Z' as well, and
// the process lives on in them (and in /proc/<pid>/task only: /proc lists leaders). A count that cannot be read
// counts as more than one.
const livesOn = (state, threads) => (state !== 'Z' && state !== 'X') || !(threads <= 1);

// The one value of a field of a /proc/<pid>/status, or undefined unless it is there exactly once. The first line
// is the process's name, which the process chooses: gVisor's kernel does not escape a newline in it, so a name like
// "\nUid:\t0" would put a line of its own above the real ones. A field seen twice is not believed.
function statusField(status, name, pattern) {
  const found = [...status.matchAll(new RegExp(`^${name}:\\s+(${pattern})`, 'gm'))];
  return found.length === 1 ? found[0][1] : undefined;
}

// The real uid of the process whose /proc/<pid>/status this is (NaN when unreadable or ambiguous), or null when it
// no longer lives (livesOn).
function liveUid(status) {
  const state = statusField(status, 'State', '\\S');
  const threads = Number(statusField(status, 'Threads', '\\d+'));
  return livesOn(state, threads) ? Number(statusField(status, 'Uid', '\\d+')) : null;
}

// Live processes with the sandbox uid (ours, unless jailed), except ourselves. Dead zombies are gone for our purposes;
// init reaps them.
function sameUidPids() {
  const uid = jailedUid() ?? process.getuid();
  const pids = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) continue;
    let status;
    try {
      status = fs.readFileSync(`/proc/${name}/status`, 'latin1');
    } catch {
      continue; // exited while we scanned
    }
    const owner = liveUid(status);
    // Jailed, a process whose uid cannot be read (a name that forges a Uid: line) is the sandbox's too: nothing else
    // here can rename itself. Under runc kill(-1) reaches it anyway, and the survey counts it.
    if (owner === uid || (jailedUid() !== null && Number.isNaN(owner))) pids.push(Number(name));
  }
  return pids;
}

// Whether every thread of a process is stopped: a group stop reaches its threads one by one, and a leader seen
// stopped says nothing about the others.
function allStopped(pid) {
  try {
    const tids = fs.readdirSync(`/proc/${pid}/task`);
    return tids.length > 0 && tids.every((tid) => procStat(pid, tid)?.state === 'T');
  } catch {
    return false;
  }
}

// What a stopped process's threads have done so far. A stopped thread changes none of it; one that ran even for a
// moment changes it. null when the process is gone.
function footprint(pid) {
  let tids;
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`).sort();
  } catch {
    return null;
  }
  // schedstat's run time (ns) and count of runs change whenever a thread runs at all: one read a thread, which keeps
  // the check cheap on every request. Without it (a kernel without schedstat), the thread's state, faults and ticks.
  return tids.map((tid) => {
    let schedstat = '';
    try {
      schedstat = fs.readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1').trim();
    } catch {
      // none: the fallback below
    }
    // A kernel without schedstats (and delay accounting off) shows zeros that never move.
    if (/^[1-9]/.test(schedstat)) return `${tid} ${schedstat}`;
    const stat = procStat(pid, tid);
    return `${tid} ${stat?.state} ${stat?.ran}`;
  }).join('\n');
}

// The footprint once it holds still: a thread shows 'T' a moment before it has stopped (it still tells its parent
// and enters the freezer), so its counters may move just after allStopped. Two equal reads, a turn of the event loop
// apart at first and then a millisecond, or null when they never agree (the context is then not kept).
async function settledFootprint(pid) {
  let last = footprint(pid);
  for (let tries = 0; tries < 20 && last !== null; tries++) {
    await (tries < 3 ? new Promise((resolve) => setImmediate(resolve)) : sleep(1));
    const next = footprint(pid);
    if (next === last) return next;
    last = next;
  }
  return null;
}

// kill(-1) signals every process we may signal (all of our uid; never init, never the caller) in one step that
// a concurrent fork cannot escape. Jailed, as root, kill(-1) would reach every process of the container: each
// process of the sandbox uid is signalled instead, and the scans of killLeftovers catch what forked meanwhile.
function signalAll(signal) {
  const pids = jailedUid() === null ? [-1] : sameUidPids();
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // ESRCH: nobody else is there
    }
  }
}

// Kills every other process of the sandbox user and proves it with /proc scans. Everyone is stopped first: a
// stopped process can neither fork nor compete for the CPU, so the count stays exact and the scan quick even
// right after a fork storm. Then they are killed, and we wait (re-killing anything seen) until a scan is clean.
// With `spared` (a paused evaluation context) that one process is stopped with the rest but not killed.
// A killed process may have continued the spared one (SIGCONT) while it was being killed: once nobody else of the uid
// is left to do that again, the spared one is stopped again and must be seen stopped; `sparedGone` says it died.
async function killLeftovers(spared = null) {
  signalAll('SIGSTOP');
  const others = () => sameUidPids().filter((pid) => pid !== spared);
  const seen = new Set(others());
  if (spared === null) signalAll('SIGKILL');
  const deadline = performance.now() + cleanupGrace();
  for (;;) {
    const alive = others();
    if (alive.length === 0) {
      const stat = spared === null ? null : procStat(spared);
      const gone = stat === null || !livesOn(stat.state, stat.threads);
      if (spared === null || gone || allStopped(spared)) {
        return { cleanup: 'ok', killed: seen.size, sparedGone: spared !== null && gone };
      }
      try {
        process.kill(spared, 'SIGSTOP'); // seen stopped at the next pass, with nobody else started meanwhile
      } catch {
        // gone: the next pass says so
      }
    }
    if (performance.now() >= deadline) return { cleanup: 'failed', killed: seen.size, sparedGone: false };
    for (const pid of alive) {
      seen.add(pid);
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await sleep(CLEANUP_PAUSE_MS);
  }
}

// Counts every byte but keeps only `cap`; crossing the cap calls onOverflow once. We keep reading (and
// discarding) until the kill lands, so a flooding child can never stall the runner or fill the pipe. With
// `name` set, kept output is also written to our stderr as {"stream": name, "b64": ...}, coalesced to one line per
// STREAM_FLUSH_MS (or per STREAM_PIECE_BYTES), so the host can show output while the program runs at a cost that
// does not grow with the number of writes; the final answer still carries all of it.
const STREAM_FLUSH_MS = 250;
const STREAM_PIECE_BYTES = 64 * 1024;
function capture(stream, cap, onOverflow, name) {
  const c = collector(cap, onOverflow, name);
  stream.on('data', c.feed);
  stream.on('error', () => {}); // a broken pipe only ends the capture
  return c;
}

function collector(cap, onOverflow, name) {
  const c = { chunks: [], kept: 0, total: 0, truncated: false, flush: () => {}, feed: () => {} };
  let pending = [];
  let pendingBytes = 0;
  let timer = null;
  c.flush = () => {
    clearTimeout(timer);
    timer = null;
    if (pendingBytes === 0) return;
    const b64 = Buffer.concat(pending).toString('base64');
    pending = [];
    pendingBytes = 0;
    process.stderr.write(`${JSON.stringify({ stream: name, b64 })}\n`);
  };
  c.feed = (chunk) => {
    c.total += chunk.length;
    if (c.kept < cap) {
      const part = chunk.subarray(0, cap - c.kept);
      c.chunks.push(part);
      c.kept += part.length;
      if (name) {
        pending.push(part);
        pendingBytes += part.length;
        if (pendingBytes >= STREAM_PIECE_BYTES) c.flush();
        else if (timer === null) timer = setTimeout(c.flush, STREAM_FLUSH_MS);
      }
    }
    if (c.total > cap && !c.truncated) {
      c.truncated = true;
      onOverflow();
    }
  };
  return c;
}

const closed = (stream) => (stream.closed ? Promise.resolve() : new Promise((done) => stream.once('close', done)));

// Only SIGCONT resumes a stopped process, and the process sees it: user code that stops us (and so our memory sampler)
// must continue us for its call to end in an answer, and every such continuation is counted here.
let continuations = 0;
let countingContinuations = false;

// What a supervised call of user code used, from the sandbox cgroup's counters before, during and after it; and
// its progress lines on stderr, once a second, once `watch` has its output.
function meter() {
  if (!countingContinuations) {
    process.on('SIGCONT', () => { continuations += 1; });
    countingContinuations = true;
  }
  const oomBefore = readOomKills();
  const cpuBefore = readCounter(CPU_COUNTERS);
  const peakBefore = readCounter(MEMORY_PEAK);
  const memoryBefore = sampleMemory();
  const continuedBefore = continuations;
  const stateBefore = ownState();
  let sampledPeak = memoryBefore;
  let progress = null;
  const started = performance.now();
  const sampler = setInterval(() => {
    const now = sampleMemory();
    if (now !== null && sampledPeak !== null) sampledPeak = Math.max(sampledPeak, now);
  }, MEMORY_SAMPLE_MS);
  return {
    started,
    watch(out, err) {
      progress = setInterval(() => {
        const line = { elapsed_ms: Math.round(performance.now() - started), stdout_bytes: out.total };
        process.stderr.write(`${JSON.stringify({ ...line, stderr_bytes: err.total })}\n`);
      }, PROGRESS_MS);
    },
    stop() {
      clearInterval(sampler);
      clearInterval(progress);
      return Math.round(performance.now() - started);
    },
    // After the cleanup: the CPU time from before the start to now (the code, its children, and the little that the
    // runner and the idle watchdog used meanwhile), and the most the cgroup used during the call above what it used
    // just before (the helpers' own memory). The counters are read while no user code runs (before it starts, after
    // the cleanup). A new high-water mark set meanwhile is exact; otherwise the highest sample (every 20 ms) is as
    // near as it gets, unless user code kept the sampler from looking: it stopped us (we were continued) or changed
    // our priority, CPUs or limits. Then the high-water mark stands in, which the call cannot have exceeded.
    async usage() {
      // A continuation that came with the run's exit is handled in a later callback than the exit's: let it run.
      await new Promise((resolve) => setImmediate(resolve));
      const cpuAfter = readCounter(CPU_COUNTERS);
      const peakAfter = readCounter(MEMORY_PEAK);
      const newMark = peakBefore !== null && peakAfter !== null && peakAfter > peakBefore;
      const blind = continuations !== continuedBefore || ownState() !== stateBefore;
      const peak = newMark || blind ? peakAfter : sampledPeak;
      return {
        cpu_ms: cpuBefore !== null && cpuAfter !== null ? Math.round(Math.max(0, cpuAfter - cpuBefore) / 1e6) : null,
        peak_memory_bytes: memoryBefore === null || peak === null ? null : Math.max(0, peak - memoryBefore),
      };
    },
    // Only the kernel's counter says "OOM": a SIGKILL alone could be ours or anyone's. null: not detectable here.
    oomKilled() {
      const oomAfter = readOomKills();
      return oomBefore !== null && oomAfter !== null ? oomAfter > oomBefore : null;
    },
  };
}

// Jailed, at most one jail lives at a time: every jail mounts its namespace's proc at the one place the jails share
// (gVisor of 2022 has no mount namespaces), so a second live jail would see the first one's processes, and two jails
// taking stale procs off at once could take the bind of the root off instead. Each jail's group (the jail and its
// init) and end, while it lives.
const liveJails = new Set();
const JAIL_END_MS = 5000;

function trackJail(child, exited) {
  if (jailedUid() === null) return;
  const jail = { group: child.pid, exited };
  liveJails.add(jail);
  exited.then(() => liveJails.delete(jail));
}

// Before a jail starts: every other jail (the waiting process's, a context's) ended, and no process of the sandbox uid
// left. False when that could not be done in time: the caller fails, and the host destroys the sandbox.
async function clearForJail() {
  if (jailedUid() === null) return true;
  discardNext();
  if (context !== null) {
    paused = null;
    context = null;
  }
  for (const jail of liveJails) {
    try {
      process.kill(-jail.group, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  const ended = Promise.all([...liveJails].map((jail) => jail.exited)).then(() => true);
  if (!(await Promise.race([ended, sleep(JAIL_END_MS).then(() => false)]))) return false;
  return (await killLeftovers()).cleanup === 'ok';
}

// Spawns a program's process: detached, so that it leads a new process group (and session), and one kill reaches
// its whole group and never the runner. Resolves to {child, exited} once it runs, or null when it could not start.
async function spawnProgram(argv, extraStdio = []) {
  let child;
  try {
    const [file, ...rest] = startArgv(argv);
    child = spawn(file, rest, {
      cwd: startCwd(), env: childEnv(), stdio: ['ignore', 'pipe', 'pipe', ...extraStdio], detached: true,
    });
  } catch {
    return null;
  }
  // Listen for the exit before anything can await, so it cannot be missed.
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  trackJail(child, exited);
  const spawned = await new Promise((resolve) => {
    child.once('spawn', () => resolve(true));
    child.once('error', () => resolve(false));
  });
  child.on('error', () => {}); // later errors (a failed kill) must not crash the runner
  return spawned ? { child, exited } : null;
}

// The next run's process while it waits: {child, exited, pid, started}. The channel starts one when it opens and
// shortly after answering each run (never while user code of this sandbox lives: the run's leftovers are gone by then),
// and ends it before an evaluation, whose context must not share the sandbox with it. So that the spawn is not paid
// before the answer, the channel announces it ahead (ChannelHello.next_after, RunAnswer.next_after): the clock tick
// before which it cannot have started, read once the run's leftovers were gone. The survey spares one child of the
// channel started since then, and nothing else.
let nextRun = null;

// Clock ticks since boot (USER_HZ, 100 a second, as /proc/<pid>/stat counts a process's start): /proc/uptime's
// centiseconds, read as a whole number.
function bootTicks() {
  const match = /^([0-9]+)\.([0-9]{2}) /.exec(fs.readFileSync('/proc/uptime', 'latin1'));
  return match === null ? null : Number(match[1]) * 100 + Number(match[2]);
}

async function prepareNext() {
  discardNext();
  if (!(await clearForJail())) return;
  const started = await spawnProgram([process.execPath, ...RUN_FLAGS, START_PATH], ['pipe']);
  if (started === null) return;
  const stat = procStat(started.child.pid);
  const prepared = { ...started, pid: started.child.pid, started: stat?.started };
  started.exited.then(() => {
    if (nextRun === prepared) nextRun = null;
  });
  started.child.stdio[3].on('error', () => {});
  nextRun = prepared;
  if (stat === null) discardNext();
}

function discardNext() {
  const old = nextRun;
  nextRun = null;
  if (old === null) return;
  try {
    process.kill(-old.pid, 'SIGKILL');
  } catch {
    // already gone
  }
  old.child.stdio[3].destroy();
}

// The waiting process, handed the program if `argv` is one it can run and it still lives as the process that was
// started (running or asleep, never stopped); null otherwise, when it is ended and the program gets a process of its
// own. `took` says, by the time the process has ended, whether it took the program (one byte back on fd 3, before it
// closes fd 3 and runs it): one that ended without taking it (a bug, or the OOM killer) never has its end reported as
// the program's; the program is run again in a fresh process.
function takeNext(argv, { fresh = false } = {}) {
  const waiting = nextRun;
  nextRun = null;
  const fits = argv[0] === process.execPath && RUN_FLAGS.every((flag, i) => argv[i + 1] === flag) &&
    typeof argv[RUN_FLAGS.length + 1] === 'string' && argv[RUN_FLAGS.length + 1].startsWith('/workspace/');
  const stat = waiting === null ? null : procStat(waiting.pid);
  // A process started just now for this run (`fresh`) ran nothing yet: whatever state a loaded kernel shows it in
  // (gVisor may show a jail busy in a system call as D), it is the one that was started.
  const usable = stat !== null && stat.started === waiting.started && (fresh || ['R', 'S'].includes(stat.state));
  if (waiting === null || !fits || !usable) {
    nextRun = waiting;
    discardNext();
    return null;
  }
  const program = { entrypoint: argv[RUN_FLAGS.length + 1], args: argv.slice(RUN_FLAGS.length + 2) };
  const body = Buffer.from(JSON.stringify(program), 'utf8');
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length, 0);
  const socket = waiting.child.stdio[3];
  // The byte comes before the end of fd 3 (the process closes it, or dies), in that order on the socket.
  const took = new Promise((resolve) => {
    socket.once('data', () => resolve(true));
    socket.once('end', () => resolve(false));
    socket.once('close', () => resolve(false));
  });
  took.then(() => socket.destroy());
  socket.write(Buffer.concat([head, body]));
  return { ...waiting, took };
}

// A run's process when no waiting one could take it: a fresh one, or jailed a fresh waiting process that must take
// it (its byte back on fd 3 is what proves that the program started: a jail that failed before it would otherwise
// end with a code the program never chose).
async function startRun(argv) {
  if (jailedUid() === null) return spawnProgram(argv);
  if (!(await clearForJail())) return null;
  await prepareNext();
  return takeNext(argv, { fresh: true });
}

// `again`: the program's second start, after a waiting process that ended without taking it; a second such end is
// SPAWN_FAILED, never a third start.
async function run(req, again = false) {
  paused = null; // the cleanup kills the context with the rest
  const metered = meter();
  const started = (again ? null : takeNext(req.argv)) ?? await startRun(req.argv);
  if (started === null) {
    metered.stop();
    return refusal('SPAWN_FAILED');
  }
  const { child, exited } = started;

  const killGroup = () => {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      // the group is already empty
    }
  };
  const out = capture(child.stdout, req.stdout_cap, killGroup, req.stream ? 'stdout' : null);
  const err = capture(child.stderr, req.stderr_cap, killGroup, req.stream ? 'stderr' : null);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    killGroup();
  }, req.timeout_ms);
  metered.watch(out, err);

  // Wait for the child's exit, not for its pipes: a grandchild that escaped the group may hold them open forever.
  const { code, signal } = await exited;
  const durationMs = metered.stop();
  clearTimeout(timer);
  if (started.took !== undefined && !(await started.took)) {
    // The waiting process ended without taking the program: nothing of it ran. Run it in a fresh process, once.
    for (const stream of [child.stdout, child.stderr]) stream.destroy();
    if (!again) return run(req, true);
    await killLeftovers();
    return refusal('SPAWN_FAILED');
  }
  const leftovers = await killLeftovers();
  if (context !== null) {
    await Promise.race([context.exited, sleep(DRAIN_MS)]); // killed with the rest: the run reset it
    context = null;
  }
  const usage = await metered.usage();
  // Every writer is dead now, so what is still buffered in the pipes arrives at once; bound the wait anyway.
  await Promise.race([Promise.all([closed(child.stdout), closed(child.stderr)]), sleep(DRAIN_MS)]);
  child.stdout.destroy();
  child.stderr.destroy();
  child.stdio[3]?.destroy(); // the waiting process's: it closed its end before the program ran
  const oomKilled = metered.oomKilled();
  return {
    ...supervised(out, err, durationMs, leftovers, usage),
    exit_code: code,
    signal,
    timed_out: timedOut,
    oom_killed: oomKilled === true && signal === 'SIGKILL',
    oom_detectable: oomKilled !== null,
  };
}

// The fields of every supervised call's answer (protocol.Supervised), once its cleanup is done.
function supervised(out, err, durationMs, leftovers, usage) {
  out.flush();
  err.flush();
  return {
    ok: true,
    stdout_b64: Buffer.concat(out.chunks).toString('base64'),
    stderr_b64: Buffer.concat(err.chunks).toString('base64'),
    stdout_bytes: out.total,
    stderr_bytes: err.total,
    stdout_truncated: out.truncated,
    stderr_truncated: err.truncated,
    duration_ms: durationMs,
    cleanup: leftovers.cleanup,
    leftover_killed: leftovers.killed,
    ...usage,
  };
}

// Load the seal: its initialiser runs prctl(PR_SET_DUMPABLE, 0). It defines no module, so Node reports an error
// after loading it, which says nothing about the seal: sealed() does.
function seal() {
  try {
    process.dlopen({ exports: {} }, SEAL_PATH);
  } catch {
    // checked by sealed()
  }
}

// Whether this process is non-dumpable: the kernel then makes its /proc/<pid>/fd directory root's, and only such a
// process is out of reach of user code under the same uid.
function sealed() {
  try {
    return fs.statSync(`/proc/${process.pid}/fd`).uid === 0;
  } catch {
    return false;
  }
}

// Live processes of every unprivileged uid but ours (we run as the supervisor here, which user code cannot signal
// or read): after a run, any such process outlived it. A status that cannot be read counts as alive; a process that
// vanished between listing and reading means the process table changed under us, so we look again, and a table
// that keeps changing (something still forks and exits) counts as alive too.
// `spared` are the session's channel (a runner of the sandbox uid that lives on between runs), by pid, its
// evaluation context if one is paused between calls, by pid and start time, and the next run's waiting process (which
// the channel starts once a run's leftovers are gone) as one child of the channel started at or after a tick, all of
// which the host learned from the channel's answers; they are the only processes not counted, the context only while
// it is stopped and is that process.
const SURVEY_SCANS = 5;
function survey(spared) {
  const own = process.getuid();
  const channelPid = spared.find((entry) => entry.started === null && entry.after === undefined)?.pid ?? null;
  const waitingAfter = channelPid === null ? null : spared.find((entry) => entry.after !== undefined)?.after ?? null;
  for (let scan = 0; scan < SURVEY_SCANS; scan += 1) {
    let alive = 0;
    let vanished = 0;
    let waitingSeen = false;
    for (const name of fs.readdirSync('/proc')) {
      if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) continue;
      const exempt = spared.find((entry) => entry.pid === Number(name));
      if (exempt !== undefined && exempt.started === null) continue;
      let status;
      try {
        status = fs.readFileSync(`/proc/${name}/status`, 'latin1');
      } catch (err) {
        if (err.code === 'ENOENT' || err.code === 'ESRCH') vanished += 1;
        else alive += 1;
        continue;
      }
      const uid = liveUid(status);
      if (uid === null || uid === 0 || uid === own) continue; // gone, or not of a sandbox uid (an unreadable uid is NaN)
      if (exempt === undefined && waitingAfter !== null && !waitingSeen) {
        // One process of the sandbox uid that the channel started since the tick it announced (after the run's
        // leftovers were gone): its next run's process. No leftover of a run is that: a run's processes all started
        // before that tick. (Jailed, the jail that started it is root's, and is never what is spared.)
        const stat = procStat(Number(name));
        if (stat !== null && startedBy(stat, channelPid) && stat.started >= waitingAfter) {
          waitingSeen = true;
          continue;
        }
      }
      if (exempt !== undefined) {
        const stat = procStat(exempt.pid);
        if (stat !== null && stat.state === 'T' && stat.started === exempt.started && allStopped(exempt.pid)) continue;
      }
      alive += 1;
    }
    if (alive > 0 || vanished === 0) return alive;
  }
  return 1;
}

// Whether the channel started this process: its child, or (jailed) the program of a jail it started, whose parent is
// the jail's init and whose grandparent the jail, both root's. No process of a sandbox uid is root's under runc.
function startedBy(stat, channelPid) {
  if (stat.ppid === channelPid) return true;
  const init = procStat(stat.ppid);
  const jail = init === null ? null : procStat(init.ppid);
  return jail !== null && jail.ppid === channelPid && rootOwned(stat.ppid) && rootOwned(init.ppid);
}

function rootOwned(pid) {
  try {
    return liveUid(fs.readFileSync(`/proc/${pid}/status`, 'latin1')) === 0;
  } catch {
    return false;
  }
}

// A survey line: empty, or what to spare: the channel's pid, then its paused context's as pid:start-time, then the
// next run's waiting process as >tick (one child of the channel started at or after that tick).
const SPARED_LINE = /^(|[1-9][0-9]{0,9}( [1-9][0-9]{0,9}:[0-9]{1,15})?( >[0-9]{1,15})?)$/;
const MAX_SPARED_LINE = 80;
const sparedPids = (line) => (line === '' ? [] : line.split(' ').map((item) => {
  if (item.startsWith('>')) return { pid: null, started: null, after: Number(item.slice(1)) };
  const [pid, started] = item.split(':');
  return { pid: Number(pid), started: started === undefined ? null : Number(started) };
}));

// Waits for one line on stdin, which releases the survey. Returns {spared}, or null when stdin ends first (the
// survey is not wanted) or the line is malformed.
async function released() {
  let text = '';
  for await (const chunk of process.stdin) {
    text += chunk.toString('latin1');
    const end = text.indexOf('\n');
    if (end === -1) {
      if (text.length > MAX_SPARED_LINE) return null;
      continue;
    }
    const line = text.slice(0, end);
    return SPARED_LINE.test(line) ? { spared: sparedPids(line) } : null;
  }
  return null;
}

// The supervisor's channel (--supervise, run as the supervisor uid): a survey per line on a held stdin, each line as
// for --survey, one answer line each, so a run's proof of cleanup costs no docker exec. Ends with stdin; a
// malformed line is answered once and ends it.
async function supervise() {
  const send = (obj) => new Promise((done) => process.stdout.write(`${JSON.stringify(obj)}\n`, done));
  let text = '';
  for await (const chunk of process.stdin) {
    text += chunk.toString('latin1');
    for (let end = text.indexOf('\n'); end !== -1; end = text.indexOf('\n')) {
      const line = text.slice(0, end);
      text = text.slice(end + 1);
      if (!SPARED_LINE.test(line)) return refusal('INVALID_REQUEST');
      await send({ ok: true, alive: survey(sparedPids(line)) });
    }
    if (text.length > MAX_SPARED_LINE) return refusal('INVALID_REQUEST');
  }
  return null;
}

// -- evaluation contexts ------------------------------------------------------------------------------------------
// A session's evaluation context: one node process that the channel starts on the first evaluate and pauses
// (SIGSTOP) between calls, in which code runs as Node's REPL runs it: top-level await, declarations that persist.
// It is user code: what it answers is checked here like anything a program prints, and it can only make its own
// answer wrong. A run's cleanup kills it with every other leftover, so a run resets the context.
const VALUE_MAX = 64 * 1024;
const NAME_MAX = 256;
const MESSAGE_MAX = 4096;
const STACK_MAX = 16 * 1024;
const CONTEXT_LINE_MAX = 256 * 1024;
const MARKER_WAIT_MS = 1000;
const MAX_CODE = 2 * 512 * 1024; // the host allows 512 Ki characters: at most twice as many UTF-16 units
const CONTEXT_ARGV = ['--disable-proto=throw', new URL(import.meta.url).pathname, '--context'];
// A jailed context is told so: it is user code in a namespace of its own, which no seal would add to.
const contextArgv = () => (jailedUid() === null ? CONTEXT_ARGV : [...CONTEXT_ARGV, '--jailed']);
let context = null;
// The context as the last call paused it, and its footprint then: {ctx, mark}.
let paused = null;

// Whether the paused context has not run since its call ended, checked before and after every request. Between
// calls nothing of our uid runs but us, and the survey proved it; but a signal the context arranged to come later
// (a POSIX timer, say) would continue it, and it would run unsupervised, beside a file operation too. Its threads'
// counters tell, even if it stopped itself again. Any change ends it, its death included (nothing tells a context
// that ran and died from one the OOM killer ended while paused), and the channel fails the request, so the host
// destroys the sandbox: a context that ran between calls never yields a result.
function stillPaused() {
  if (paused === null || footprint(paused.ctx.pid) === paused.mark) return true;
  try {
    process.kill(-paused.ctx.group, 'SIGKILL');
  } catch {
    // already gone
  }
  paused = null;
  return false;
}

function validEvaluation(req) {
  const keys = ['code', 'timeout_ms', 'stdout_cap', 'stderr_cap', 'reset', 'stream'];
  const isObject = req !== null && typeof req === 'object' && !Array.isArray(req);
  if (!isObject || Object.keys(req).length !== keys.length || !keys.every((k) => Object.hasOwn(req, k))) return null;
  const intIn = (n, lo, hi) => Number.isSafeInteger(n) && n >= lo && n <= hi;
  const ok = typeof req.code === 'string' && req.code.length <= MAX_CODE && intIn(req.timeout_ms, 1, MAX_TIMEOUT_MS) &&
    intIn(req.stdout_cap, 0, MAX_CAP) && intIn(req.stderr_cap, 0, MAX_CAP) && typeof req.reset === 'boolean' &&
    typeof req.stream === 'boolean';
  return ok ? req : null;
}

// Whether a process is alive: not gone and not a dead zombie that node has yet to reap.
function isAlive(pid) {
  const stat = procStat(pid);
  return stat !== null && livesOn(stat.state, stat.threads);
}

// The context: {child, group, pid, ...}. `group` is the process group of what was started (jailed: the jail's, whose
// end ends the context's namespace); `pid` the context's own process, signalled, paused and watched between calls.
async function startContext() {
  let child;
  try {
    const [file, ...rest] = startArgv([process.execPath, ...contextArgv()]);
    child = spawn(file, rest, {
      cwd: startCwd(), env: childEnv(), stdio: ['pipe', 'pipe', 'pipe', 'pipe'], detached: true,
    });
  } catch {
    return null;
  }
  const ctx = { child, group: child.pid, pid: child.pid, on: { stdout: null, stderr: null, answer: null } };
  ctx.exited = new Promise((resolve) => child.once('exit', (code, signal) => {
    if (context === ctx) context = null;
    resolve({ code, signal });
  }));
  trackJail(child, ctx.exited);
  const spawned = await new Promise((resolve) => {
    child.once('spawn', () => resolve(true));
    child.once('error', () => resolve(false));
  });
  child.on('error', () => {});
  for (const [name, stream] of [['stdout', child.stdout], ['stderr', child.stderr], ['answer', child.stdio[3]]]) {
    stream.on('data', (chunk) => ctx.on[name]?.(chunk));
    stream.on('error', () => {});
  }
  child.stdin.on('error', () => {});
  if (spawned && jailedUid() !== null) {
    const program = await programOf(child.pid);
    if (program === null) {
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
      return null;
    }
    ctx.pid = program;
  }
  return spawned ? ctx : null;
}

// Feeds a stream's bytes to `take` until `marker`, which ends this call's share of the stream; bytes that might be
// the start of the marker are held back until the next chunk tells.
function markedStream(marker, take) {
  const m = { seen: false, held: Buffer.alloc(0) };
  m.done = new Promise((resolve) => { m.resolve = resolve; });
  m.feed = (chunk) => {
    if (m.seen) return;
    const data = Buffer.concat([m.held, chunk]);
    const at = data.indexOf(marker);
    if (at !== -1) {
      if (at > 0) take(data.subarray(0, at));
      m.seen = true;
      m.resolve();
      return;
    }
    const keep = Math.min(data.length, marker.length - 1);
    if (data.length > keep) take(data.subarray(0, data.length - keep));
    m.held = Buffer.from(data.subarray(data.length - keep));
  };
  return m;
}

const isText = (v, max) => typeof v === 'string' && v.length <= max;

// The context's answer line, checked: exactly one of a value or an error, each bounded, for this call's nonce.
function contextAnswer(line, nonce) {
  let answer;
  try {
    answer = JSON.parse(line);
  } catch {
    return null;
  }
  const isObject = answer !== null && typeof answer === 'object' && !Array.isArray(answer);
  if (!isObject || Object.keys(answer).length !== 3 || answer.nonce !== nonce) return null;
  const { value, error } = answer;
  // Lone surrogates (a string cut mid-pair, or made so) become U+FFFD: the host accepts only well-formed text.
  if (value !== null && error === null && isText(value, VALUE_MAX + 1)) return { value: value.toWellFormed(), error: null };
  const errorOk = error !== null && typeof error === 'object' && !Array.isArray(error) &&
    Object.keys(error).length === 3 && isText(error.name, NAME_MAX) && isText(error.message, MESSAGE_MAX) &&
    isText(error.stack, STACK_MAX);
  if (value !== null || !errorOk) return null;
  const { name, message, stack } = error;
  return { value: null, error: { name: name.toWellFormed(), message: message.toWellFormed(), stack: stack.toWellFormed() } };
}

async function evaluate(req) {
  paused = null; // resumed below, or ended
  discardNext(); // a context is user code that lives on: nothing of a later run may share the sandbox with it
  const metered = meter();
  if (jailedUid() !== null && !(context !== null && !req.reset && isAlive(context.pid)) && !(await clearForJail())) {
    metered.stop();
    return refusal('INTERNAL_ERROR');
  }
  if (context !== null && (req.reset || !isAlive(context.pid))) {
    const old = context;
    try {
      process.kill(-old.group, 'SIGKILL');
    } catch {
      // already gone
    }
    await Promise.race([old.exited, sleep(CLEANUP_GRACE_MS)]);
    context = null;
  }
  const reset = context === null;
  if (reset) {
    context = await startContext();
    if (context === null) {
      metered.stop();
      return refusal('SPAWN_FAILED');
    }
  }
  const ctx = context;
  let ended = null;
  const kill = (why) => {
    ended ??= why;
    try {
      process.kill(-ctx.group, 'SIGKILL');
    } catch {
      // the group is already empty
    }
  };
  const nonce = Buffer.from(crypto.getRandomValues(new Uint8Array(16))).toString('hex');
  const marker = Buffer.from(nonce);
  const out = collector(req.stdout_cap, () => kill('OUTPUT_LIMIT_EXCEEDED'), req.stream ? 'stdout' : null);
  const err = collector(req.stderr_cap, () => kill('OUTPUT_LIMIT_EXCEEDED'), req.stream ? 'stderr' : null);
  const outMark = markedStream(marker, out.feed);
  const errMark = markedStream(marker, err.feed);
  ctx.on.stdout = outMark.feed;
  ctx.on.stderr = errMark.feed;
  // The first line on fd 3, decoded once it is whole; what follows it is ignored.
  const pieces = [];
  let held = 0;
  const line = new Promise((resolve) => {
    ctx.on.answer = (chunk) => {
      const end = chunk.indexOf(0x0a);
      pieces.push(end === -1 ? chunk : chunk.subarray(0, end));
      held += end === -1 ? chunk.length : end;
      if (held > CONTEXT_LINE_MAX) {
        ctx.on.answer = null;
        kill('crashed');
      } else if (end !== -1) {
        ctx.on.answer = null;
        try {
          resolve(new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(pieces)));
        } catch {
          resolve('');
        }
      }
    };
  });
  const timer = setTimeout(() => kill('timed_out'), req.timeout_ms);
  metered.watch(out, err);
  try {
    process.kill(ctx.pid, 'SIGCONT');
  } catch {
    // it died: the exit below says so
  }
  ctx.child.stdin.write(`${JSON.stringify({ nonce, code: req.code })}\n`);
  const outcome = await Promise.race([line.then((l) => ({ line: l })), ctx.exited.then(() => ({ line: null }))]);
  let answer = null;
  if (outcome.line !== null && ended === null) {
    // The markers were written before the answer: they are in the pipes already, if not read yet.
    await Promise.race([Promise.all([outMark.done, errMark.done]), sleep(MARKER_WAIT_MS)]);
    answer = outMark.seen && errMark.seen ? contextAnswer(outcome.line, nonce) : null;
    if (answer === null) kill('crashed');
  }
  const durationMs = metered.stop();
  clearTimeout(timer);
  const alive = answer !== null && ended === null && context === ctx;
  if (!alive) {
    kill('crashed');
    await Promise.race([ctx.exited, sleep(CLEANUP_GRACE_MS)]);
    if (context === ctx) context = null;
  }
  for (const name of ['stdout', 'stderr', 'answer']) ctx.on[name] = null;
  // Everything else that the code started is killed; a living context is paused until the next call.
  const leftovers = await killLeftovers(alive ? ctx.pid : null);
  const started = alive && !leftovers.sparedGone ? procStat(ctx.pid)?.started ?? null : null;
  // Every thread is stopped now; what they have done so far must not change before the next call (stillPaused).
  const mark = started !== null && leftovers.cleanup === 'ok' ? await settledFootprint(ctx.pid) : null;
  const lives = mark !== null;
  if (!lives && alive) {
    ended = 'crashed'; // it died, or could not be seen stopped, after it answered
    kill('crashed');
    await Promise.race([ctx.exited, sleep(CLEANUP_GRACE_MS)]);
    if (context === ctx) context = null;
  }
  paused = lives ? { ctx, mark } : null;
  const usage = await metered.usage();
  const oomKilled = !lives && ended === 'crashed' && metered.oomKilled() === true;
  return {
    ...supervised(out, err, durationMs, leftovers, usage),
    value: lives ? answer.value : null,
    error: lives ? answer.error : null,
    context_reset: reset,
    context_pid: lives ? ctx.pid : null,
    context_started: lives ? started : null,
    context_ended: lives ? null : (oomKilled ? 'oom_killed' : ended),
  };
}

// The context process itself (--context): reads {"nonce", "code"} lines on stdin, evaluates each in this process's
// main context with the REPL's evaluator, writes the nonce to stdout and stderr (the end of the call's output),
// then one answer line on fd 3.
const USER_FRAME = /(\bevaluation:\d+:\d+|\/workspace\/|\/node_modules\/)/;
async function contextMain() {
  const [{ default: repl }, { PassThrough }, { default: util }, { createInterface }] = await Promise.all([
    import('node:repl'), import('node:stream'), import('node:util'), import('node:readline'),
  ]);
  const cut = (text, max) => (text.length > max ? text.slice(0, max) : text);
  const show = (value) => {
    try {
      return cut(util.inspect(value, { depth: 4, maxArrayLength: 100, maxStringLength: 10_000, breakLength: 100 }), VALUE_MAX);
    } catch {
      return '[a value that cannot be shown]';
    }
  };
  const describe = (thrown) => {
    try {
      const error = thrown?.constructor?.name === 'Recoverable' && thrown.err ? thrown.err : thrown; // incomplete code
      if (!(error instanceof Error)) return { name: 'Uncaught', message: cut(show(error), MESSAGE_MAX), stack: '' };
      const frames = String(error.stack ?? '').split('\n').filter((l) => /^\s+at /.test(l) && USER_FRAME.test(l));
      return {
        name: cut(String(error.name), NAME_MAX), message: cut(String(error.message), MESSAGE_MAX),
        stack: cut(frames.join('\n'), STACK_MAX),
      };
    } catch {
      return { name: 'Error', message: 'an error that cannot be shown', stack: '' };
    }
  };
  const server = repl.start({
    input: new PassThrough(), output: new PassThrough(), terminal: false, useGlobal: true, prompt: '', preview: false,
  });
  let current = null;
  // The REPL reports a thrown error (synchronous or from awaited code) to its domain, not to the eval callback.
  server._domain.removeAllListeners('error');
  server._domain.on('error', (error) => current?.({ error }));
  for await (const text of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    const { nonce, code } = JSON.parse(text);
    const outcome = await new Promise((resolve) => {
      const settle = (result) => {
        if (current === settle) {
          current = null;
          resolve(result);
        }
      };
      current = settle;
      try {
        server.eval(code, server.context, 'evaluation', (error, value) => settle(error ? { error } : { value }));
      } catch (error) {
        settle({ error });
      }
    });
    const answer = 'error' in outcome ? { value: null, error: describe(outcome.error) } : { value: show(outcome.value), error: null };
    fs.writeSync(1, nonce);
    fs.writeSync(2, nonce);
    fs.writeSync(3, `${JSON.stringify({ nonce, ...answer })}\n`);
  }
  return null;
}

// Whether the watchdog (another uid's process, under init) has installed its SIGUSR2 handler: a warm container
// is claimed with SIGUSR2, whose default action would kill a watchdog that has not finished starting.
// gVisor's /proc has no SigCgt: there the watchdog holds its own file open once its handler is in place, and gVisor
// lets any uid read another process's descriptors (which under runc only the watchdog's own uid could).
const WATCHDOG_PATH = new URL('./watchdog.mjs', import.meta.url).pathname;
function watchdogReady() {
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p) && p !== '1')) {
    try {
      if (!fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('watchdog.mjs')) continue;
      const caught = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/SigCgt:\s*([0-9a-f]+)/);
      if (caught !== null) return (BigInt(`0x${caught[1]}`) & (1n << 11n)) !== 0n; // bit 11: signal 12, SIGUSR2
      return fs.existsSync('/proc/sentry-meminfo') && fs.readdirSync(`/proc/${pid}/fd`)
        .some((fd) => fs.readlinkSync(`/proc/${pid}/fd/${fd}`) === WATCHDOG_PATH);
    } catch {
      // the process went away while we looked
    }
  }
  return false;
}

// The channel: frames on a held stdin, each {"op": <a file operation, "run" or "execute">, "request": {...}}, one
// answer line on stdout each. A write's (and an execute's) header and bytes follow its frame. It saves the host a
// docker exec and a node start per call. End of stdin at a frame boundary ends it quietly; anything malformed is answered once and ends it.
const ENVELOPE_OPS = new Set([...FILE_OPERATIONS, 'run', 'execute', 'evaluate']);

// A one-shot's single request: {"write": <a write request>, "run": <a run request>}, the write's header and bytes
// after the frame. The program runs only once every file is written; the answer carries both results, or the first
// refusal (and the channel then ends: the host discards a one-shot sandbox whatever went wrong).
async function execute(request, take) {
  const isObject = request !== null && typeof request === 'object' && !Array.isArray(request);
  const keys = isObject ? Object.keys(request) : [];
  if (keys.length !== 2 || !keys.includes('write') || !keys.includes('run')) return refusal('INVALID_REQUEST');
  const req = validRequest(request.run);
  if (req === null) return refusal('INVALID_REQUEST');
  const written = await asSandboxUser(() => fileOperation('write', request.write, take));
  if (written.ok === false) return written;
  const ran = await run(req);
  return ran.ok === false ? ran : { ok: true, written, run: ran };
}

// What a program could change about us from outside: resource limits, scheduling (priority, nice, real-time
// priority, policy) and allowed CPUs. null when it cannot be read.
// gVisor's /proc has no limits file (and no Cpus_allowed_list): there a changed limit goes unseen (SECURITY.md).
function absentAs(placeholder, read) {
  try {
    return read();
  } catch (err) {
    if (err.code === 'ENOENT') return placeholder;
    throw err;
  }
}
function ownState() {
  try {
    const stat = fs.readFileSync('/proc/self/stat', 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const cpus = /^Cpus_allowed_list:\s*(\S+)/m.exec(fs.readFileSync('/proc/self/status', 'latin1'))?.[1];
    return [absentAs('-', () => fs.readFileSync('/proc/self/limits', 'latin1')), fields[15], fields[16], fields[37],
      fields[38], cpus].join('|');
  } catch {
    return null;
  }
}
const STDERR_END = '{"end":true}';

async function channel() {
  const take = stdinTaker();
  const exact = async (n) => {
    const buf = Buffer.alloc(n);
    let got = 0;
    const complete = await take(n, (chunk) => { got += chunk.copy(buf, got); });
    return { buf, got, complete };
  };
  const send = (obj) => new Promise((done) => process.stdout.write(`${JSON.stringify(obj)}\n`, done));
  // The first line names this process and the next run's, so that the supervisor's survey can spare them (and only
  // them) after a run.
  const after = bootTicks();
  if (after !== null) await prepareNext();
  await send({ ok: true, pid: process.pid, ...(after === null ? {} : { next_after: after }) });
  const initial = ownState();
  for (;;) {
    const head = await exact(4);
    if (!head.complete) return head.got === 0 ? null : refusal('INVALID_REQUEST');
    const length = head.buf.readUInt32BE(0);
    if (length > MAX_REQUEST_BYTES) return refusal('INVALID_REQUEST');
    const body = await exact(length);
    if (!body.complete) return refusal('INVALID_REQUEST');
    let envelope;
    try {
      envelope = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body.buf));
    } catch {
      return refusal('INVALID_REQUEST');
    }
    const isObject = envelope !== null && typeof envelope === 'object' && !Array.isArray(envelope);
    const keys = isObject ? Object.keys(envelope) : [];
    if (keys.length !== 2 || !keys.includes('op') || !keys.includes('request') || !ENVELOPE_OPS.has(envelope.op)) {
      return refusal('INVALID_REQUEST');
    }
    // A program may lower our limits, priority or CPUs (prlimit, setpriority: the kernel checks only the uid), and
    // every later program would inherit them: a channel whose state changed answers this request (never out of
    // turn) with a failure and ends, and the host destroys the sandbox. So does one whose paused context ran.
    if (initial === null || ownState() !== initial || !stillPaused()) return refusal('INTERNAL_ERROR');
    let result;
    let prepare = false;
    if (envelope.op === 'run') {
      const req = validRequest(envelope.request);
      result = req === null ? refusal('INVALID_REQUEST') : await run(req);
      const after = result.ok !== false && result.cleanup === 'ok' ? bootTicks() : null;
      if (after !== null) result.next_after = after; // started shortly after this answer
      prepare = after !== null;
    } else if (envelope.op === 'execute') {
      result = await execute(envelope.request, take);
    } else if (envelope.op === 'evaluate') {
      const req = validEvaluation(envelope.request);
      result = req === null ? refusal('INVALID_REQUEST') : await evaluate(req);
    } else {
      result = await asSandboxUser(() => fileOperation(envelope.op, envelope.request, take));
    }
    if (result.ok === false && result.code === 'INTERNAL_ERROR') return result;
    // A paused context that ran meanwhile ran beside this request (a file operation): its answer is not given.
    if (!stillPaused()) return refusal('INTERNAL_ERROR');
    // stderr and stdout reach the host by separate copies and may arrive out of order: this line, after every
    // stderr line of the request, tells the host that none of them is still on its way.
    await new Promise((done) => process.stderr.write(`${STDERR_END}\n`, done));
    await send(result);
    if (prepare) {
      await sleep(PREPARE_DELAY_MS);
      await prepareNext();
    }
    // A write refused before its payload was read leaves stdin off a frame boundary: file bytes must never be read
    // as a request, so the channel ends (the host destroys the sandbox for such an answer anyway).
    if (envelope.op === 'write' && result.ok === false && ['INVALID_REQUEST', 'TRANSFER_FAILED'].includes(result.code)) {
      return null;
    }
    if (envelope.op === 'execute' && result.ok === false) return null;
    if (envelope.op === 'unpack' && result.ok === false) return null; // the same, and its sandbox goes anyway
  }
}

async function main() {
  const args = process.argv.slice(2);
  // Jailed (gVisor): root, out of the sandbox uid's reach, starting each program through the jail (jail.mjs).
  if (args.length === 2 && args[0] === '--channel' && args[1] === '--jailed') {
    const refused = enterJail();
    return refused === null ? channel() : refusal(refused);
  }
  if (args.length === 2 && args[0] === '--kill-all' && args[1] === '--jailed') {
    const refused = adoptSandboxUid();
    if (refused !== null) return refusal(refused);
    killChannelsAndJails();
    const { cleanup, killed } = await killLeftovers();
    return { ok: true, killed, cleanup };
  }
  // As root, kill(-1) and the uid scan would reach every process in sight (on a host: the whole machine).
  if (process.getuid() === 0) return refusal('RUNNING_AS_ROOT');
  // A jailed context (user code, which nothing believes) runs unsealed: gVisor's kernel would not honour the seal.
  if (args.length === 2 && args[0] === '--context' && args[1] === '--jailed') return contextMain();
  seal();
  if (!sealed() && process.env.CODE_SANDBOX_SEAL !== 'optional') return refusal('NOT_SEALED');
  // One survey: it waits for one line on stdin (what to spare, as for --supervise), then counts.
  if (args.length === 1 && args[0] === '--survey') {
    const release = await released();
    return release !== null ? { ok: true, alive: survey(release.spared) } : refusal('INVALID_REQUEST');
  }
  if (args.length === 1 && args[0] === '--watchdog-ready') return { ok: true, ready: watchdogReady() };
  if (args.length === 1 && args[0] === '--channel') return channel();
  if (args.length === 1 && args[0] === '--context') return contextMain();
  if (args.length === 1 && args[0] === '--supervise') return supervise();
  if (args.length === 1 && args[0] === '--kill-all') {
    const { cleanup, killed } = await killLeftovers();
    return { ok: true, killed, cleanup };
  }
  if (args.length !== 1) return refusal('INVALID_REQUEST');
  // "-": the request is one frame on stdin (4-byte big-endian length, then JSON), which has no argv size limit;
  // the kernel caps a single argv string at 128 KiB, less than 32 arguments of 4 KiB in JSON.
  const text = args[0] === '-' ? await readFrame() : args[0];
  const req = text === null ? null : parseRequest(text);
  return req === null ? refusal('INVALID_REQUEST') : run(req);
}

main().then((result) => (result === null ? process.exit(0) : answer(result)), () => {
  process.stdout.write(`${JSON.stringify(refusal('INTERNAL_ERROR'))}\n`, () => process.exit(1));
});
