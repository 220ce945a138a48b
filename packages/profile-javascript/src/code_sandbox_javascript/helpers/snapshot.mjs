// The two snapshot operations of the file helper. `pack` (only as a program of its own, never over a channel)
// answers one JSON line (every entry of /workspace) followed by the files' bytes in that order; `unpack` (an
// operation like the others) takes such a header (as a frame) and the bytes, and makes them in an empty workspace.
// Nothing here follows a symbolic link: pack reads a link's target, unpack makes the link, neither looks through it.
import fs from 'node:fs';
import {
  READ_FLAGS, Refusal, at, checkPath, hasExactKeys, openDirChain, parsedFrame, readExact, rootStart, takeInventory,
  walk,
} from './files.mjs';

const C = fs.constants;
const MAX_TARGET_BYTES = 4095;
const MAX_HEADER_BYTES = 32 * 1024 * 1024;
const MAX_LISTING_BYTES = 8 * 1024 * 1024; // a pack's answer line: its listing of every entry
const UNKEPT = 'a name in the workspace cannot be kept in a snapshot';
const KEYS = { directory: ['type', 'path', 'mode'], file: ['type', 'path', 'mode', 'size'], symlink: ['type', 'path', 'target'] };
const strictText = (buf) => {
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(buf);
  } catch {
    throw new Refusal('INVALID_PATH', {}, UNKEPT);
  }
};
const checkLimits = (req) => ['max_entries', 'max_total_bytes'].every((k) => Number.isSafeInteger(req[k]) && req[k] >= 0);

function keptPath(rel) {
  const path = strictText(rel);
  try {
    checkPath(path);
  } catch {
    throw new Refusal('INVALID_PATH', {}, UNKEPT);
  }
  return path;
}

// Reads exactly `size` bytes of the regular file `where`, which must still be the file `st` described.
function readWhole(where, st) {
  let fd;
  try {
    fd = fs.openSync(where, READ_FLAGS);
  } catch (err) {
    if (err.code === 'EACCES') throw new Refusal('PERMISSION_DENIED');
    throw err;
  }
  try {
    const fst = fs.fstatSync(fd);
    if (!fst.isFile() || fst.dev !== st.dev || fst.ino !== st.ino || fst.size !== st.size) {
      throw new Refusal('WORKSPACE_INTEGRITY', {}, 'the workspace changed while it was read');
    }
    const buf = Buffer.allocUnsafe(st.size + 1);
    let got = 0;
    for (let n; got <= st.size && (n = fs.readSync(fd, buf, got, buf.length - got, null)) > 0; ) got += n;
    if (got !== st.size) throw new Refusal('WORKSPACE_INTEGRITY', {}, 'the workspace changed while it was read');
    return buf.subarray(0, got);
  } finally {
    fs.closeSync(fd);
  }
}

// Every directory, file and symbolic link of the workspace, sorted by path, with the files' bytes in that order.
// Special files (FIFOs, sockets) are skipped and counted; a file with several links is kept as a file each time. A
// directory it may not read fails closed, as for every file operation (walk); a file it may not read is refused.
export function packWorkspace(req) {
  if (!hasExactKeys(req, ['max_entries', 'max_total_bytes']) || !checkLimits(req)) throw new Refusal('INVALID_REQUEST');
  const tooLarge = () => new Refusal('SNAPSHOT_TOO_LARGE', {}, 'the workspace is larger than a snapshot may be');
  const found = [];
  let bytes = 0;
  let skipped = 0;
  // Each entry is read relative to the directory the walk holds open, never by a path that could pass a link.
  const complete = walk(rootStart(), Infinity, req.max_entries, (rel, st, dirFd, name) => {
    const where = at(dirFd, name);
    if (st.isDirectory()) {
      found.push({ rel, entry: { type: 'directory', path: keptPath(rel), mode: st.mode & 0o777 } });
    } else if (st.isFile()) {
      bytes += st.size;
      if (bytes > req.max_total_bytes) throw tooLarge();
      const entry = { type: 'file', path: keptPath(rel), mode: st.mode & 0o777, size: st.size };
      found.push({ rel, entry, body: readWhole(where, st) });
    } else if (st.isSymbolicLink()) {
      const target = fs.readlinkSync(where, { encoding: 'buffer' });
      if (target.length > MAX_TARGET_BYTES) throw new Refusal('INVALID_PATH', {}, UNKEPT);
      found.push({ rel, entry: { type: 'symlink', path: keptPath(rel), target: strictText(target) } });
    } else {
      skipped += 1;
    }
  });
  if (!complete) throw tooLarge();
  found.sort((a, b) => Buffer.compare(a.rel, b.rel));
  const answer = { ok: true, entries: found.map((f) => f.entry), skipped, bytes };
  if (Buffer.byteLength(JSON.stringify(answer)) > MAX_LISTING_BYTES) throw tooLarge();
  return { answer, body: Buffer.concat(found.flatMap((f) => (f.body ? [f.body] : []))) };
}

function parseEntries(buf, req) {
  const header = parsedFrame(buf);
  const entries = header?.entries;
  if (!hasExactKeys(header, ['entries']) || !Array.isArray(entries) || entries.length > req.max_entries) {
    throw new Refusal('INVALID_REQUEST');
  }
  const dirs = new Set(['']);
  const seen = new Set();
  let total = 0;
  for (const e of entries) {
    const keys = KEYS[e?.type];
    if (keys === undefined || !hasExactKeys(e, keys)) throw new Refusal('INVALID_REQUEST');
    const parts = checkPath(e.path);
    if (seen.has(e.path) || !dirs.has(parts.slice(0, -1).join('/'))) throw new Refusal('INVALID_REQUEST');
    seen.add(e.path);
    if (e.type !== 'symlink' && !(Number.isInteger(e.mode) && e.mode >= 0 && e.mode <= 0o777)) {
      throw new Refusal('INVALID_REQUEST');
    }
    if (e.type === 'directory') dirs.add(e.path);
    if (e.type === 'file') {
      if (!Number.isSafeInteger(e.size) || e.size < 0) throw new Refusal('INVALID_REQUEST');
      total += e.size;
    }
    if (e.type === 'symlink') {
      const good = typeof e.target === 'string' && e.target.length > 0 && e.target.isWellFormed() &&
        !e.target.includes('\u0000') && Buffer.byteLength(e.target) <= MAX_TARGET_BYTES;
      if (!good) throw new Refusal('INVALID_REQUEST');
    }
  }
  if (total > req.max_total_bytes) throw new Refusal('INVALID_REQUEST');
  return { entries, total };
}

// The directory that holds `parts`' last component, from `held` (path -> fd) or opened now.
function parentOf(parts, held) {
  const key = parts.slice(0, -1).join('/');
  let fd = held.get(key);
  if (fd === undefined) {
    if (held.size >= 64) closeAll(held);
    fd = openDirChain(parts.slice(0, -1));
    held.set(key, fd);
  }
  return fd;
}

function closeAll(held) {
  for (const fd of held.values()) fs.closeSync(fd);
  held.clear();
}

// Makes a snapshot's entries in an empty workspace: directories as 0700, each file created (never opened if it
// exists) and written as its bytes arrive, then every mode as the snapshot has it, deepest directory first. A
// transfer that ends early leaves part of the snapshot made (the answer says "partial"): the host destroys a sandbox
// whose unpack failed, and names it to no client before the whole snapshot is in place.
export async function unpackSnapshot(req, take, onChange) {
  if (!hasExactKeys(req, ['max_entries', 'max_total_bytes']) || !checkLimits(req)) throw new Refusal('INVALID_REQUEST');
  const length = (await readExact(take, 4)).readUInt32BE(0);
  if (length > MAX_HEADER_BYTES) throw new Refusal('INVALID_REQUEST');
  const { entries, total } = parseEntries(await readExact(take, length), req);
  if (takeInventory().entries !== 0) throw new Refusal('INVALID_REQUEST', {}, 'the workspace is not empty');
  onChange();
  const held = new Map();
  try {
    for (const e of entries) {
      const parts = e.path.split('/');
      const where = at(parentOf(parts, held), parts.at(-1));
      if (e.type === 'directory') {
        fs.mkdirSync(where, 0o700);
      } else if (e.type === 'symlink') {
        fs.symlinkSync(e.target, where);
      } else {
        const fd = fs.openSync(where, C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW | C.O_NONBLOCK, 0o600);
        try {
          const write = (chunk) => {
            for (let off = 0; off < chunk.length; ) off += fs.writeSync(fd, chunk, off, chunk.length - off);
          };
          if (!(await take(e.size, write))) throw new Refusal('TRANSFER_FAILED');
          fs.fchmodSync(fd, e.mode);
        } finally {
          fs.closeSync(fd);
        }
      }
    }
    closeAll(held);
    for (const e of entries.filter((entry) => entry.type === 'directory').reverse()) {
      const fd = openDirChain(e.path.split('/'));
      try {
        fs.fchmodSync(fd, e.mode);
      } finally {
        fs.closeSync(fd);
      }
    }
  } finally {
    closeAll(held);
  }
  return { entries: entries.length, bytes: total };
}
