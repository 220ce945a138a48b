// Lifetime watchdog of the code-sandbox image: the container's main process (under docker-init). It idles
// until the session's hard lifetime has passed, then exits, so the container stops and Docker removes it
// even when the host process that created it is gone.
//
// Usage: node /opt/sandbox/watchdog.mjs <lifetime_seconds> [<claimed_lifetime_seconds>]   (ASCII digits, 1..86400)
//
// With one argument the deadline is fixed. With two, the container waits in a warm pool: it lives
// <lifetime_seconds> unless it is claimed, and the first SIGUSR2 (sent by the host through `docker kill`,
// forwarded by docker-init) moves the deadline to <claimed_lifetime_seconds> from that moment, once. User code
// runs as another uid and cannot send that signal. (Not SIGUSR1: Node reserves it to open the inspector.)
const MAX_LIFETIME_S = 86_400;
// Short wakes also keep every delay far below setTimeout's 2^31-1 ms cap (beyond it, timers fire at once).
const CHECK_EVERY_MS = 30_000;

const args = process.argv.slice(2);
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

// docker stop sends SIGTERM (docker-init forwards it): leave at once and cleanly. SIGHUP and SIGPIPE must not
// end the session early, since nothing here has a terminal or a reader.
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
process.on('SIGHUP', () => {});
process.on('SIGPIPE', () => {});

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
