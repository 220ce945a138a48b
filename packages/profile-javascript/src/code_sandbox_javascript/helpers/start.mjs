// The next run of a sandbox, started ahead of it: the runner's channel spawns this as the sandbox uid, with the argv,
// environment, working directory and process group a program gets, once the previous run's leftovers are gone. It
// boots Node and blocks on fd 3, where the channel writes one frame when a run request names a program: the
// entrypoint's path and its arguments (4-byte big-endian length, then JSON). It answers one byte (taken), then fd 3 is
// closed and the program runs
// as Node runs a main script (`module.runMain`: CommonJS or ESM, TypeScript stripped), with `process.argv` as a fresh
// `node <flags> <entrypoint> <args...>` has it. Nothing of ours is left for the program but what Node itself loaded.
// It never ran user code before that frame: a process is used for one run only. End of fd 3 first: exit quietly.
import fs from 'node:fs';
import { runMain } from 'node:module';

const MAX_FRAME = 20 * 1024 * 1024; // the runner's argv bound: 256 arguments of 64 Ki characters, as UTF-8 JSON

function readExactly(length) {
  const buf = Buffer.alloc(length);
  let got = 0;
  while (got < length) {
    const n = fs.readSync(3, buf, got, length - got, null); // fd 3 is a blocking socket
    if (n === 0) return null;
    got += n;
  }
  return buf;
}

// The program to run; null at the end of fd 3 (the channel ended: nobody waits for this process). Anything else
// that is not a well-formed frame throws.
function program() {
  const head = readExactly(4);
  if (head === null) return null;
  const length = head.readUInt32BE(0);
  const body = length <= MAX_FRAME ? readExactly(length) : null;
  const { entrypoint, args } = JSON.parse(body.toString('utf8'));
  const valid = typeof entrypoint === 'string' && entrypoint.startsWith('/workspace/') && Array.isArray(args) &&
    args.every((a) => typeof a === 'string');
  if (!valid) throw new Error('malformed');
  return { entrypoint, args };
}

let next;
try {
  next = program();
} catch {
  process.exit(70); // EX_SOFTWARE: the channel wrote what it never writes
}
if (next === null) process.exit(0);
fs.writeSync(3, '+'); // taken: from here on the channel reports this process's end as the program's
fs.closeSync(3);
process.argv = [process.argv[0], next.entrypoint, ...next.args];
// From a tick of its own, so that no frame of this file is on the program's stack (its errors read as Node's own).
process.nextTick(runMain, next.entrypoint);
