// Runner of the code-sandbox image: runs one user command in its own process group with byte caps on stdout
// and stderr and a timeout, then kills every process the sandbox user has left behind.
// Usage: node --disable-sigusr1 /opt/sandbox/runner.mjs <request-json | - | --channel | --kill-all | --watchdog-ready |
//        --survey | --supervise>
// stdout carries exactly one JSON answer line; stderr carries one JSON progress line per second of the run.
// --channel serves one request after another over a held stdin (runs and file operations), one answer line each.
// Exit 0 for every well-formed answer (refusals included); a nonzero exit is a bug.
//
// User code runs under the runner's own uid, so the runner protects itself the way the kernel allows: node is
// installed unreadable (mode 0711), which makes every process that execs it non-dumpable, so user code cannot open
// our /proc/<pid>/fd or mem, nor ptrace us; --disable-sigusr1 keeps our inspector shut. The runner refuses to run
// unless it sees that protection in force. What user code can still do to us (kill or stop us) only ends the run
// without an answer, which the host treats as a failure and destroys the sandbox.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { FILE_OPERATIONS, fileOperation, stdinTaker } from './files.mjs';

// Nothing is inherited: the host's environment must never reach user code.
const CHILD_ENV = Object.freeze({ PATH: '/usr/local/bin', HOME: '/workspace', TMPDIR: '/tmp', LANG: 'C.UTF-8' });
const CLEANUP_GRACE_MS = 450; // the documented grace: after it, a process still alive means "cleanup failed"
const CLEANUP_PAUSE_MS = 20;
const DRAIN_MS = 100;
const PROGRESS_MS = 1000;
const MAX_CAP = 64 * 1024 * 1024;
const MAX_TIMEOUT_MS = 86_400_000;
const OOM_COUNTERS = ['/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control']; // v2, v1
// The sandbox cgroup's usage counters (v1, then v2), which user code can read but not change: CPU time in
// nanoseconds, memory in bytes now and at its highest since the container started.
const CPU_COUNTERS = [
  ['/sys/fs/cgroup/cpuacct/cpuacct.usage', /^(\d+)$/, 1],
  ['/sys/fs/cgroup/cpu.stat', /^usage_usec (\d+)$/m, 1000],
];
const MEMORY_NOW = [
  ['/sys/fs/cgroup/memory/memory.usage_in_bytes', /^(\d+)$/, 1],
  ['/sys/fs/cgroup/memory.current', /^(\d+)$/, 1],
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

// The first of `counters` this cgroup layout has, scaled; null when none can be read.
function readCounter(counters) {
  for (const [file, pattern, scale] of counters) {
    try {
      const match = pattern.exec(fs.readFileSync(file, 'latin1').trim());
      if (match) return Number(match[1]) * scale;
    } catch {
      // not this layout
    }
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

// Live processes with our real uid, except ourselves. Zombies are already dead; init reaps them.
function sameUidPids() {
  const uid = process.getuid();
  const pids = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^[0-9]+$/.test(name) || Number(name) === process.pid) continue;
    let status;
    try {
      status = fs.readFileSync(`/proc/${name}/status`, 'latin1');
    } catch {
      continue; // exited while we scanned
    }
    const state = /^State:\s+(\S)/m.exec(status)?.[1];
    if (Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]) === uid && state !== 'Z' && state !== 'X') pids.push(Number(name));
  }
  return pids;
}

// kill(-1) signals every process we may signal (all of our uid; never init, never the caller) in one step that
// a concurrent fork cannot escape.
function signalAll(signal) {
  try {
    process.kill(-1, signal);
  } catch {
    // ESRCH: nobody else is there
  }
}

// Kills every other process of the sandbox user and proves it with /proc scans. Everyone is stopped first: a
// stopped process can neither fork nor compete for the CPU, so the count stays exact and the scan quick even
// right after a fork storm. Then they are killed, and we wait (re-killing anything seen) until a scan is clean.
async function killLeftovers() {
  signalAll('SIGSTOP');
  const seen = new Set(sameUidPids());
  signalAll('SIGKILL');
  const deadline = performance.now() + CLEANUP_GRACE_MS;
  for (;;) {
    const alive = sameUidPids();
    if (alive.length === 0) return { cleanup: 'ok', killed: seen.size };
    if (performance.now() >= deadline) return { cleanup: 'failed', killed: seen.size };
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
  const c = { chunks: [], kept: 0, total: 0, truncated: false, flush: () => {} };
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
  stream.on('data', (chunk) => {
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
  });
  stream.on('error', () => {}); // a broken pipe only ends the capture
  return c;
}

const closed = (stream) => (stream.closed ? Promise.resolve() : new Promise((done) => stream.once('close', done)));

async function run(req) {
  const oomBefore = readOomKills();
  const cpuBefore = readCounter(CPU_COUNTERS);
  const peakBefore = readCounter(MEMORY_PEAK);
  const memoryBefore = readCounter(MEMORY_NOW);
  let sampledPeak = memoryBefore;
  const started = performance.now();
  let child;
  try {
    // detached: the child leads a new process group (and session), so one kill reaches its whole group and
    // never the runner.
    child = spawn(req.argv[0], req.argv.slice(1), {
      cwd: '/workspace', env: CHILD_ENV, stdio: ['ignore', 'pipe', 'pipe'], detached: true,
    });
  } catch {
    return refusal('SPAWN_FAILED');
  }
  // Listen for the exit before anything can await, so it cannot be missed.
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const spawned = await new Promise((resolve) => {
    child.once('spawn', () => resolve(true));
    child.once('error', () => resolve(false));
  });
  child.on('error', () => {}); // later errors (a failed kill) must not crash the runner
  if (!spawned) return refusal('SPAWN_FAILED');

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
  const progress = setInterval(() => {
    const line = { elapsed_ms: Math.round(performance.now() - started), stdout_bytes: out.total };
    process.stderr.write(`${JSON.stringify({ ...line, stderr_bytes: err.total })}\n`);
  }, PROGRESS_MS);
  const sampler = setInterval(() => {
    const now = readCounter(MEMORY_NOW);
    if (now !== null && sampledPeak !== null) sampledPeak = Math.max(sampledPeak, now);
  }, MEMORY_SAMPLE_MS);

  // Wait for the child's exit, not for its pipes: a grandchild that escaped the group may hold them open forever.
  const { code, signal } = await exited;
  const durationMs = Math.round(performance.now() - started);
  clearTimeout(timer);
  clearInterval(progress);
  clearInterval(sampler);
  const leftovers = await killLeftovers();
  const cpuAfter = readCounter(CPU_COUNTERS);
  const peakAfter = readCounter(MEMORY_PEAK);
  // Every writer is dead now, so what is still buffered in the pipes arrives at once; bound the wait anyway.
  await Promise.race([Promise.all([closed(child.stdout), closed(child.stderr)]), sleep(DRAIN_MS)]);
  child.stdout.destroy();
  child.stderr.destroy();
  out.flush();
  err.flush();
  const oomAfter = readOomKills();
  const oomDetectable = oomBefore !== null && oomAfter !== null;
  return {
    ok: true,
    exit_code: code,
    signal,
    timed_out: timedOut,
    stdout_b64: Buffer.concat(out.chunks).toString('base64'),
    stderr_b64: Buffer.concat(err.chunks).toString('base64'),
    stdout_bytes: out.total,
    stderr_bytes: err.total,
    stdout_truncated: out.truncated,
    stderr_truncated: err.truncated,
    // Only the kernel's counter says "OOM": a SIGKILL alone could be ours or anyone's.
    oom_killed: oomDetectable && oomAfter > oomBefore && signal === 'SIGKILL',
    oom_detectable: oomDetectable,
    duration_ms: durationMs,
    cleanup: leftovers.cleanup,
    leftover_killed: leftovers.killed,
    // The cgroup's CPU time from before the spawn to after the cleanup: the program, its children, and the
    // little that the runner and the idle watchdog used meanwhile.
    cpu_ms: cpuBefore !== null && cpuAfter !== null ? Math.round(Math.max(0, cpuAfter - cpuBefore) / 1e6) : null,
    // The most the cgroup used during the run above what it used just before (the helpers' own memory): a new
    // high-water mark set during the run is exact; otherwise the highest sample (every 20 ms) is as near as it gets.
    peak_memory_bytes: memoryBefore === null ? null : Math.max(0, (peakBefore !== null && peakAfter !== null &&
      peakAfter > peakBefore ? peakAfter : sampledPeak) - memoryBefore),
  };
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
// `spared` is the pid of the session's channel (a runner of the sandbox uid that lives on between runs), which the
// host learned from the channel itself when it opened it; it is the one process not counted.
const SURVEY_SCANS = 5;
function survey(spared) {
  const own = process.getuid();
  for (let scan = 0; scan < SURVEY_SCANS; scan += 1) {
    let alive = 0;
    let vanished = 0;
    for (const name of fs.readdirSync('/proc')) {
      if (!/^[0-9]+$/.test(name) || Number(name) === process.pid || Number(name) === spared) continue;
      let status;
      try {
        status = fs.readFileSync(`/proc/${name}/status`, 'latin1');
      } catch (err) {
        if (err.code === 'ENOENT' || err.code === 'ESRCH') vanished += 1;
        else alive += 1;
        continue;
      }
      const uid = Number(/^Uid:\s+(\d+)/m.exec(status)?.[1]);
      const state = /^State:\s+(\S)/m.exec(status)?.[1];
      if (uid !== 0 && uid !== own && state !== 'Z' && state !== 'X') alive += 1;
    }
    if (alive > 0 || vanished === 0) return alive;
  }
  return 1;
}

// Waits for one line on stdin, which releases the survey: empty, or the pid to spare (the channel's). Returns
// {spared} (null for none), or null when stdin ends first (the survey is not wanted) or the line is malformed.
async function released() {
  let text = '';
  for await (const chunk of process.stdin) {
    text += chunk.toString('latin1');
    const end = text.indexOf('\n');
    if (end === -1) {
      if (text.length > 16) return null;
      continue;
    }
    const line = text.slice(0, end);
    if (line === '') return { spared: null };
    return /^[1-9][0-9]{0,9}$/.test(line) ? { spared: Number(line) } : null;
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
      if (line !== '' && !/^[1-9][0-9]{0,9}$/.test(line)) return refusal('INVALID_REQUEST');
      await send({ ok: true, alive: survey(line === '' ? null : Number(line)) });
    }
    if (text.length > 16) return refusal('INVALID_REQUEST');
  }
  return null;
}

// Whether the watchdog (another uid's process, under init) has installed its SIGUSR2 handler: a warm container
// is claimed with SIGUSR2, whose default action would kill a watchdog that has not finished starting.
function watchdogReady() {
  for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p) && p !== '1')) {
    try {
      if (!fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('watchdog.mjs')) continue;
      const caught = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/SigCgt:\s*([0-9a-f]+)/);
      return caught !== null && (BigInt(`0x${caught[1]}`) & (1n << 11n)) !== 0n; // bit 11: signal 12, SIGUSR2
    } catch {
      // the process went away while we looked
    }
  }
  return false;
}

// The channel: frames on a held stdin, each {"op": <a file operation, "run" or "execute">, "request": {...}}, one
// answer line on stdout each. A write's (and an execute's) header and bytes follow its frame. It saves the host a
// docker exec and a node start per call. End of stdin at a frame boundary ends it quietly; anything malformed is answered once and ends it.
const ENVELOPE_OPS = new Set([...FILE_OPERATIONS, 'run', 'execute']);

// A one-shot's single request: {"write": <a write request>, "run": <a run request>}, the write's header and bytes
// after the frame. The program runs only once every file is written; the answer carries both results, or the first
// refusal (and the channel then ends: the host discards a one-shot sandbox whatever went wrong).
async function execute(request, take) {
  const isObject = request !== null && typeof request === 'object' && !Array.isArray(request);
  const keys = isObject ? Object.keys(request) : [];
  if (keys.length !== 2 || !keys.includes('write') || !keys.includes('run')) return refusal('INVALID_REQUEST');
  const req = validRequest(request.run);
  if (req === null) return refusal('INVALID_REQUEST');
  const written = await fileOperation('write', request.write, take);
  if (written.ok === false) return written;
  const ran = await run(req);
  return ran.ok === false ? ran : { ok: true, written, run: ran };
}

// What a program could change about us from outside: resource limits, scheduling (priority, nice, real-time
// priority, policy) and allowed CPUs. null when it cannot be read.
function ownState() {
  try {
    const stat = fs.readFileSync('/proc/self/stat', 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const cpus = /^Cpus_allowed_list:\s*(\S+)/m.exec(fs.readFileSync('/proc/self/status', 'latin1'))?.[1];
    return [fs.readFileSync('/proc/self/limits', 'latin1'), fields[15], fields[16], fields[37], fields[38], cpus].join('|');
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
  // The first line names this process, so that the supervisor's survey can spare it (and only it) after a run.
  await send({ ok: true, pid: process.pid });
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
    // turn) with a failure and ends, and the host destroys the sandbox.
    if (initial === null || ownState() !== initial) return refusal('INTERNAL_ERROR');
    let result;
    if (envelope.op === 'run') {
      const req = validRequest(envelope.request);
      result = req === null ? refusal('INVALID_REQUEST') : await run(req);
    } else if (envelope.op === 'execute') {
      result = await execute(envelope.request, take);
    } else {
      result = await fileOperation(envelope.op, envelope.request, take);
    }
    if (result.ok === false && result.code === 'INTERNAL_ERROR') return result;
    // stderr and stdout reach the host by separate copies and may arrive out of order: this line, after every
    // stderr line of the request, tells the host that none of them is still on its way.
    await new Promise((done) => process.stderr.write(`${STDERR_END}\n`, done));
    await send(result);
    // A write refused before its payload was read leaves stdin off a frame boundary: file bytes must never be read
    // as a request, so the channel ends (the host destroys the sandbox for such an answer anyway).
    if (envelope.op === 'write' && result.ok === false && ['INVALID_REQUEST', 'TRANSFER_FAILED'].includes(result.code)) {
      return null;
    }
    if (envelope.op === 'execute' && result.ok === false) return null;
  }
}

async function main() {
  const args = process.argv.slice(2);
  // As root, kill(-1) and the uid scan would reach every process in sight (on a host: the whole machine).
  if (process.getuid() === 0) return refusal('RUNNING_AS_ROOT');
  if (!sealed()) return refusal('NOT_SEALED');
  // The survey is started beside a run and waits for one byte on stdin, sent when the run is over.
  if (args.length === 1 && args[0] === '--survey') {
    const release = await released();
    return release !== null ? { ok: true, alive: survey(release.spared) } : refusal('INVALID_REQUEST');
  }
  if (args.length === 1 && args[0] === '--watchdog-ready') return { ok: true, ready: watchdogReady() };
  if (args.length === 1 && args[0] === '--channel') return channel();
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
