// Lifetime watchdog of the code-sandbox image: the container's main process (under docker-init). It idles
// until the session's hard lifetime has passed, then exits, so the container stops and Docker removes it
// even when the host process that created it is gone.
//
// Usage: node /opt/sandbox/watchdog.mjs [--lifeline] <lifetime_seconds> [<claimed_lifetime_seconds>]
//        (lifetimes in ASCII digits, 1..86400)
//
// With --lifeline it also exits when its stdin reaches end-of-file: the server holds the container's stdin open
// from before the start (the engine closes it when the server's connection goes, however the server ended), so a
// sandbox whose server is gone ends itself at once. Nothing is ever read from it.
//
// With one argument the deadline is fixed. With two, the container waits in a warm pool: it lives
// <lifetime_seconds> unless it is claimed, and the first SIGUSR2 (sent by the host through `docker kill`,
// forwarded by docker-init) moves the deadline to <claimed_lifetime_seconds> from that moment, once. User code
// runs as another uid and cannot send that signal. (Not SIGUSR1: Node reserves it to open the inspector.)
//
// It also ends the sandbox once the kernel has killed OOM_KILLS_ALLOWED of its processes for running it out of
// memory: on every such kill the engine rewrites the container's configuration on its host's disk (dockerd
// checkpoints it for each OOM event), so a program that fills the memory again and again would make the host write
// without end. The counter is the cgroup's own, which no process of the sandbox can change.
import fs from 'node:fs';

const MAX_LIFETIME_S = 86_400;
const OOM_KILLS_ALLOWED = 16;
const OOM_CHECK_MS = 500;
const OOM_BUDGET_SPENT = 3; // the exit status, for the operator's eyes: the container and its processes end with it
const OOM_COUNTERS = ['/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control']; // v2, v1
// Short wakes also keep every delay far below setTimeout's 2^31-1 ms cap (beyond it, timers fire at once).
const CHECK_EVERY_MS = 30_000;

const LIFELINE = '--lifeline';
const lifeline = process.argv[2] === LIFELINE;
const args = process.argv.slice(lifeline ? 3 : 2);
const valid = (arg) => /^[0-9]{1,5}$/.test(arg) && Number(arg) >= 1 && Number(arg) <= MAX_LIFETIME_S;
if (args.length < 1 || args.length > 2 || !args.every(valid)) {
  const refusal = { ok: false, code: 'INVALID_LIFETIME', message: 'the lifetime must be 1 to 86400 seconds' };
  process.stderr.write(`${JSON.stringify(refusal)}\n`);
  process.exit(2);
}

// Two clocks: the monotonic one cannot be moved by anyone inside the container, and the wall clock keeps
// counting while a laptop (and the Docker Desktop VM) sleeps, when the monotonic clock stands still.
// Whichever says "expired" first wins, so a clock quirk can only shorten the session, never extend it.
let monotonicDeadline = 0;
let wallDeadline = 0;
function setLifetime(seconds) {
  monotonicDeadline = performance.now() + seconds * 1000;
  wallDeadline = Date.now() + seconds * 1000;
}
setLifetime(Number(args[0]));

if (args.length === 2) {
  process.once('SIGUSR2', () => {
    setLifetime(Number(args[1]));
    process.on('SIGUSR2', () => {}); // claimed once; later signals change nothing
  });
} else {
  process.on('SIGUSR2', () => {});
}
// Ready for a claim: the handler is in place. gVisor's /proc shows no signal mask (SigCgt), so the watchdog also says
// so by holding its own file open, which /proc/<pid>/fd shows there (runner --watchdog-ready reads either).
fs.openSync(new URL(import.meta.url).pathname, 'r'); // never closed: the mark lasts as long as the watchdog

// docker stop sends SIGTERM (docker-init forwards it): leave at once and cleanly. SIGHUP and SIGPIPE must not
// end the session early, since nothing here has a terminal or a reader.
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
process.on('SIGHUP', () => {});
process.on('SIGPIPE', () => {});

if (lifeline) {
  process.stdin.on('data', () => {}); // the server never writes; anything that came would be dropped
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
}

// One timer at a time keeps the event loop alive and the process idle; it wakes every CHECK_EVERY_MS at most
// so that a wall-clock jump (resume from sleep) is noticed within that interval. A claim re-arms it at once.
let timer = null;
function check() {
  const left = Math.min(monotonicDeadline - performance.now(), wallDeadline - Date.now());
  if (left <= 0) process.exit(0);
  timer = setTimeout(check, Math.min(left, CHECK_EVERY_MS));
}
check();
process.on('SIGUSR2', () => {
  clearTimeout(timer);
  check();
});

// The cgroup's OOM-kill counter, read through a descriptor held open (an open would charge a file to the sandbox's
// memory at the moment it has none); none under gVisor, which shows no cgroup files and whose kernel dies with the
// first OOM anyway.
function oomCounter() {
  const buffer = Buffer.alloc(4096);
  for (const file of OOM_COUNTERS) {
    let fd;
    try {
      fd = fs.openSync(file, 'r');
    } catch {
      continue;
    }
    const read = () => {
      try {
        const match = /^oom_kill (\d+)$/m.exec(buffer.toString('latin1', 0, fs.readSync(fd, buffer, 0, buffer.length, 0)));
        return match ? Number(match[1]) : null;
      } catch {
        return null;
      }
    };
    if (read() !== null) return read;
    fs.closeSync(fd);
  }
  return null;
}
const readOomKills = oomCounter();
if (readOomKills !== null) {
  const start = readOomKills();
  setInterval(() => {
    const now = readOomKills();
    if (now !== null && now - start >= OOM_KILLS_ALLOWED) process.exit(OOM_BUDGET_SPENT);
  }, OOM_CHECK_MS);
}
