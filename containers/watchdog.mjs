// Lifetime watchdog of the code-sandbox image: the container's main process (under docker-init). It idles
// until the session's hard lifetime has passed, then exits, so the container stops and Docker removes it
// even when the host process that created it is gone.
// Usage: node /opt/sandbox/watchdog.mjs <lifetime_seconds>   (ASCII digits, 1..86400)
const MAX_LIFETIME_S = 86_400;
// Short wakes also keep every delay far below setTimeout's 2^31-1 ms cap (beyond it, timers fire at once).
const CHECK_EVERY_MS = 30_000;

const arg = process.argv[2];
if (process.argv.length !== 3 || !/^[0-9]{1,5}$/.test(arg) || Number(arg) < 1 || Number(arg) > MAX_LIFETIME_S) {
  const refusal = { ok: false, code: 'INVALID_LIFETIME', message: 'the lifetime must be 1 to 86400 seconds' };
  process.stderr.write(`${JSON.stringify(refusal)}\n`);
  process.exit(2);
}

const lifetimeMs = Number(arg) * 1000;
// Two clocks: the monotonic one cannot be moved by anyone inside the container, and the wall clock keeps
// counting while a laptop (and the Docker Desktop VM) sleeps, when the monotonic clock stands still.
// Whichever says "expired" first wins, so a clock quirk can only shorten the session, never extend it.
const monotonicDeadline = performance.now() + lifetimeMs;
const wallDeadline = Date.now() + lifetimeMs;

// docker stop sends SIGTERM (docker-init forwards it): leave at once and cleanly. SIGHUP and SIGPIPE must not
// end the session early, since nothing here has a terminal or a reader.
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
process.on('SIGHUP', () => {});
process.on('SIGPIPE', () => {});

// One timer at a time keeps the event loop alive and the process idle; it wakes every CHECK_EVERY_MS at most
// so that a wall-clock jump (resume from sleep) is noticed within that interval.
function check() {
  const left = Math.min(monotonicDeadline - performance.now(), wallDeadline - Date.now());
  if (left <= 0) process.exit(0);
  setTimeout(check, Math.min(left, CHECK_EVERY_MS));
}
check();
