// File helper of the code-sandbox image: the only way the host reads or changes /workspace.
// Usage: node /opt/sandbox/files.mjs <write|list|read|delete|inventory|digest|pack|unpack> <request-json | ->
// The runner's --channel mode imports fileOperation() and serves the same operations over a held stdin, but for
// pack (snapshot.mjs), which only a program of its own serves: its answer line is followed by the files' bytes.
// Answers exactly one JSON line on stdout and exits 0 (refusals included); a nonzero exit is a bug.
// User code owns the workspace between calls, so nothing found there is trusted: every op first checks
// that the tree holds only plain directories and single-link regular files, and never follows a symlink.
import crypto from 'node:crypto';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';

const ROOT = '/workspace';
const C = fs.constants;
// O_NONBLOCK so that a FIFO swapped in at the last moment fails or returns at once instead of hanging us.
export const DIR_FLAGS = C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW | C.O_NONBLOCK;
export const READ_FLAGS = C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK;
const INVENTORY_LIMIT = 5000;
const MAX_HEADER_BYTES = 4 * 1024 * 1024;
const MESSAGES = {
  INVALID_REQUEST: 'the request is malformed',
  INVALID_PATH: 'a path is invalid or does not fit the workspace',
  PATH_TRAVERSAL: 'a path contains a parent-directory component',
  FILE_TOO_LARGE: 'a file exceeds the size limit',
  WORKSPACE_LIMIT_EXCEEDED: 'the workspace entry or byte limit would be exceeded',
  WORKSPACE_INTEGRITY: 'the workspace contains a symbolic link, hard link or special file',
  NOT_FOUND: 'the path does not exist',
  NOT_A_DIRECTORY: 'the path is not a directory',
  NOT_A_FILE: 'the path is not a regular file',
  BINARY_FILE: 'the file is not UTF-8 text',
  PERMISSION_DENIED: 'the workspace permissions do not allow this operation',
  TRANSFER_FAILED: 'the file transfer ended early',
  INTERNAL_ERROR: 'the file helper failed',
};

export class Refusal extends Error {
  constructor(code, extra = {}, message = MESSAGES[code]) {
    super(code);
    this.answer = { ok: false, code, message, ...extra };
  }
}
const UNVERIFIABLE = 'the workspace could not be verified';
const integrity = (message) => new Refusal('WORKSPACE_INTEGRITY', {}, message);

// Node has no openat(); resolving "<name>" under /proc/self/fd/<dirfd> gives the same semantics: the
// directory is the one we hold open, so a parent swapped for a symlink after we checked it cannot redirect us.
export function at(dirFd, name) {
  const base = `/proc/self/fd/${dirFd}/`;
  return typeof name === 'string' ? base + name : Buffer.concat([Buffer.from(base), name]);
}
export const lstatAt = (dirFd, name) => fs.lstatSync(at(dirFd, name), { throwIfNoEntry: false }) ?? null;
const isSpecial = (st) => !st.isDirectory() && !(st.isFile() && st.nlink === 1);

// Same rules as the host (defence in depth); the only message is fixed, the path is never echoed.
export function checkPath(path) {
  if (typeof path !== 'string') throw new Refusal('INVALID_REQUEST');
  const parts = path.split('/');
  if (parts.includes('..')) throw new Refusal('PATH_TRAVERSAL');
  const bad =
    path.length === 0 || !path.isWellFormed() || Buffer.byteLength(path) > 1024 || parts.length > 20 ||
    path.startsWith('/') || path.startsWith('-') || path.includes('\\') ||
    /[\u0000-\u001f\u007f-\u009f]/.test(path) ||
    parts.some((p) => p === '' || p === '.' || Buffer.byteLength(p) > 255);
  if (bad) throw new Refusal('INVALID_PATH');
  return parts;
}

// Opens the directory named by `parts` one component at a time. With `onMissing`, absent components are
// created (mode 0700) after calling it, so the caller knows the workspace is being changed.
export function openDirChain(parts, onMissing) {
  let fd = fs.openSync(ROOT, DIR_FLAGS);
  try {
    for (const name of parts) {
      let next;
      try {
        next = fs.openSync(at(fd, name), DIR_FLAGS);
      } catch (err) {
        if (err.code !== 'ENOENT' || !onMissing) throw err;
        onMissing();
        fs.mkdirSync(at(fd, name), 0o700);
        next = fs.openSync(at(fd, name), DIR_FLAGS);
      }
      fs.closeSync(fd);
      fd = next;
    }
    return fd;
  } catch (err) {
    fs.closeSync(fd);
    throw err;
  }
}

// Iterative depth-first walk, bounded by `limit` entries; false when the limit stopped it. Directories are
// reopened by path later, so each must still have the dev/ino its lstat showed: a swap meanwhile is a race.
// `onEntry(rel, st, dirFd, name)`: the entry's path and lstat, and the directory held open that holds it.
export function walk(start, maxDepth, limit, onEntry) {
  const stack = [{ ...start, depth: 0 }];
  let count = 0;
  try {
    while (stack.length > 0) {
      const dir = stack.pop();
      const fd = fs.openSync(dir.abs, DIR_FLAGS);
      try {
        const st = fs.fstatSync(fd);
        if (st.dev !== dir.dev || st.ino !== dir.ino) throw integrity();
        for (const name of fs.readdirSync(`/proc/self/fd/${fd}`, { encoding: 'buffer' })) {
          const child = lstatAt(fd, name);
          if (child === null) continue; // removed while we walked; nothing left to check
          if (++count > limit) return false;
          const rel = dir.rel.length > 0 ? Buffer.concat([dir.rel, Buffer.from('/'), name]) : name;
          onEntry(rel, child, fd, name);
          if (child.isDirectory() && dir.depth < maxDepth) {
            const abs = Buffer.concat([dir.abs, Buffer.from('/'), name]);
            stack.push({ abs, rel, depth: dir.depth + 1, dev: child.dev, ino: child.ino });
          }
        }
      } finally {
        fs.closeSync(fd);
      }
    }
  } catch (err) {
    // A directory we may not read, or one nested past PATH_MAX, cannot be checked: fail closed.
    if (err.code === 'EACCES' || err.code === 'ENAMETOOLONG') throw integrity(UNVERIFIABLE);
    throw err;
  }
  return true;
}

export function rootStart() {
  const st = fs.lstatSync(ROOT);
  if (!st.isDirectory()) throw integrity();
  return { abs: Buffer.from(ROOT), rel: Buffer.alloc(0), dev: st.dev, ino: st.ino };
}

// Runs before every op: refuses a workspace that holds anything but directories and single-link files.
export function takeInventory() {
  let entries = 0;
  let bytes = 0;
  const complete = walk(rootStart(), Infinity, INVENTORY_LIMIT, (_rel, st) => {
    if (isSpecial(st)) throw integrity();
    entries += 1;
    if (st.isFile()) bytes += st.size;
  });
  return { entries, bytes, overflow: !complete };
}

// Opens the parent directory of `parts` and lstats the last component. Null when a component is absent or a
// file stands where a directory is needed; otherwise the caller closes `dirFd`.
function lookup(parts) {
  let dirFd;
  try {
    dirFd = openDirChain(parts.slice(0, -1));
  } catch (err) {
    if (err.code === 'ENOENT' || err.code === 'ENOTDIR') return null;
    throw err;
  }
  const st = lstatAt(dirFd, parts.at(-1));
  if (st === null) fs.closeSync(dirFd);
  return st === null ? null : { dirFd, st, name: at(dirFd, parts.at(-1)) };
}

// Opens a regular file for reading; the fstat must match the lstat we judged the name by.
function openRegularFile(parts) {
  const found = lookup(parts);
  if (found === null) throw new Refusal('NOT_FOUND');
  const { dirFd, st, name } = found;
  try {
    if (!st.isFile()) throw new Refusal('NOT_A_FILE');
    const fd = fs.openSync(name, READ_FLAGS);
    const fst = fs.fstatSync(fd);
    if (fst.isFile() && fst.nlink === 1 && fst.dev === st.dev && fst.ino === st.ino) return { fd, size: fst.size };
    fs.closeSync(fd);
    throw integrity();
  } finally {
    fs.closeSync(dirFd);
  }
}

function readUpTo(fd, limit) {
  const buf = Buffer.allocUnsafe(limit);
  let got = 0;
  while (got < limit) {
    const n = fs.readSync(fd, buf, got, limit - got, null);
    if (n === 0) break;
    got += n;
  }
  return buf.subarray(0, got);
}

function opRead(req) {
  const parts = checkPath(req.path);
  if (!Number.isSafeInteger(req.max_bytes) || req.max_bytes < 1) throw new Refusal('INVALID_REQUEST');
  if (req.encoding !== 'utf-8' && req.encoding !== 'base64') throw new Refusal('INVALID_REQUEST');
  const { fd, size } = openRegularFile(parts);
  // One byte past max_bytes is enough to tell whether the cut falls inside a character. Bounding the buffer by
  // the file size too keeps a generous max_bytes from costing memory.
  const limit = Math.min(req.max_bytes, size) + 1;
  const buf = (() => { try { return readUpTo(fd, limit); } finally { fs.closeSync(fd); } })();
  let end = buf.length;
  const truncated = end > req.max_bytes;
  // base64: the first max_bytes bytes as they are, whatever they hold.
  if (req.encoding === 'base64') {
    return { content: buf.subarray(0, Math.min(end, req.max_bytes)).toString('base64'), size, truncated };
  }
  if (truncated) {
    end = req.max_bytes;
    // Back off over continuation bytes (10xxxxxx) so no character is split; valid UTF-8 needs at most 3.
    for (let i = 0; i < 3 && end > 0 && (buf[end] & 0xc0) === 0x80; i += 1) end -= 1;
  }
  const text = buf.subarray(0, end);
  if (text.includes(0)) throw new Refusal('BINARY_FILE');
  let content;
  try {
    content = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(text); // ignoreBOM keeps it
  } catch {
    throw new Refusal('BINARY_FILE');
  }
  return { content, size, truncated };
}

function opDigest(req) {
  const { fd } = openRegularFile(checkPath(req.path));
  const hash = crypto.createHash('sha256');
  const buf = Buffer.allocUnsafe(1 << 16);
  let size = 0;
  try {
    for (let n; (n = fs.readSync(fd, buf, 0, buf.length, null)) > 0; size += n) hash.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return { sha256: hash.digest('hex'), size };
}

function opList(req) {
  const { max_depth: maxDepth, max_entries: maxEntries } = req;
  if (typeof req.recursive !== 'boolean' || !Number.isSafeInteger(maxDepth) || maxDepth < 0 || maxDepth > 10 ||
      !Number.isSafeInteger(maxEntries) || maxEntries < 1) throw new Refusal('INVALID_REQUEST');
  let start = rootStart();
  if (req.path !== '.') {
    const found = lookup(checkPath(req.path));
    if (found === null) throw new Refusal('NOT_FOUND');
    fs.closeSync(found.dirFd);
    if (!found.st.isDirectory()) throw new Refusal('NOT_A_DIRECTORY');
    const { dev, ino } = found.st;
    start = { abs: Buffer.from(`${ROOT}/${req.path}`), rel: Buffer.from(req.path), dev, ino };
  }
  const found = [];
  // Collect a bounded superset, sort by raw bytes, then cut: the kept entries do not depend on readdir order.
  const complete = walk(start, req.recursive ? maxDepth : 0, INVENTORY_LIMIT, (rel, st) => {
    if (isSpecial(st)) throw integrity();
    found.push({ rel, type: st.isDirectory() ? 'directory' : 'file', size: st.isFile() ? st.size : 0 });
  });
  found.sort((a, b) => Buffer.compare(a.rel, b.rel));
  const kept = found.slice(0, maxEntries);
  // Names that are not UTF-8 can only come from user code; they are shown with U+FFFD, never refused.
  const entries = kept.map((e) => ({ path: e.rel.toString('utf8'), type: e.type, size: e.size }));
  return { entries, truncated: !complete || found.length > maxEntries };
}

function opDelete(req) {
  if (!Array.isArray(req.paths) || req.paths.length === 0) throw new Refusal('INVALID_REQUEST');
  const all = req.paths.map(checkPath); // refuse the whole request before deleting anything
  const results = all.map((parts) => {
    const found = lookup(parts);
    if (found === null) return 'missing';
    try {
      if (!found.st.isFile()) return 'not_a_file';
      fs.unlinkSync(found.name); // relative to the held directory, so it cannot reach outside it
      mutated = true; // a later path failing leaves this one deleted: that refusal is partial
      return 'deleted';
    } finally {
      fs.closeSync(found.dirFd);
    }
  });
  return { results };
}

// Reads exactly `n` bytes of stdin, handing each piece to `sink`; false if stdin ended first. The stream API
// copes with short reads and a non-blocking fd 0, and we stop at the count, never waiting for EOF.
export function stdinTaker() {
  const chunks = process.stdin[Symbol.asyncIterator]();
  let spare = null;
  return async (n, sink) => {
    for (let left = n; left > 0; ) {
      let chunk = spare;
      spare = null;
      if (chunk === null) {
        const next = await chunks.next().catch(() => ({ done: true }));
        if (next.done) return false;
        chunk = next.value;
      }
      if (chunk.length > left) [chunk, spare] = [chunk.subarray(0, left), chunk.subarray(left)];
      sink(chunk);
      left -= chunk.length;
    }
    return true;
  };
}

export async function readExact(take, n) {
  const buf = Buffer.allocUnsafe(n);
  let off = 0;
  if (!(await take(n, (c) => { off += c.copy(buf, off); }))) throw new Refusal('TRANSFER_FAILED');
  return buf;
}

async function readFrame(take) {
  const length = (await readExact(take, 4)).readUInt32BE(0);
  if (length > MAX_HEADER_BYTES) throw new Refusal('INVALID_REQUEST');
  return new TextDecoder('utf-8', { fatal: true }).decode(await readExact(take, length));
}

const isPlainObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
export const hasExactKeys = (v, keys) =>
  isPlainObject(v) && Object.keys(v).length === keys.length && keys.every((k) => Object.hasOwn(v, k));

// A frame's JSON; anything that is not UTF-8 JSON is INVALID_REQUEST.
export function parsedFrame(buf) {
  try {
    return JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(buf));
  } catch {
    throw new Refusal('INVALID_REQUEST');
  }
}

function parseHeader(buf) {
  const header = parsedFrame(buf);
  const files = header?.files;
  const good = hasExactKeys(header, ['files']) && Array.isArray(files) && files.length > 0 && files.length <= 10000 &&
    files.every((f) => hasExactKeys(f, ['path', 'size']) && Number.isSafeInteger(f.size) && f.size >= 0);
  if (!good) throw new Refusal('INVALID_REQUEST');
  return files;
}

// Read-only look at where a write would land: the first missing parent (or -1), the deepest existing
// directory's stat, and the target's lstat (null when absent). `parents` holds each parent directory's look (and
// descriptor) for the files of one write that share it; the caller closes them.
function probe(parts, parents) {
  const { missingFrom, dirStat, fd } = heldParent(parts, parents, probeDirectory);
  return { missingFrom, dirStat, leaf: fd === null ? null : lstatAt(fd, parts.at(-1)) };
}

// What `open(directory)` gave for the parent directory of `parts` ({fd, ...}), kept in `held` by its path for the
// other files of one write; `closeHeld` closes every descriptor kept.
function heldParent(parts, held, open) {
  const key = parts.slice(0, -1).join('/');
  if (!held.has(key)) held.set(key, open(parts.slice(0, -1)));
  return held.get(key);
}

// The first missing component of the directory `parts` (or -1), the deepest existing directory's stat, and, when
// none is missing, that directory held open.
function probeDirectory(parts) {
  let fd = fs.openSync(ROOT, DIR_FLAGS);
  try {
    for (let i = 0; i < parts.length; i += 1) {
      const st = lstatAt(fd, parts[i]);
      if (st === null) {
        const dirStat = fs.fstatSync(fd);
        fs.closeSync(fd);
        return { missingFrom: i, dirStat, fd: null };
      }
      if (isSpecial(st)) throw integrity(); // the inventory passed, so this is a race
      if (!st.isDirectory()) throw new Refusal('INVALID_PATH'); // a file where a directory is needed
      const next = fs.openSync(at(fd, parts[i]), DIR_FLAGS);
      fs.closeSync(fd);
      fd = next;
    }
    return { missingFrom: -1, dirStat: fs.fstatSync(fd), fd };
  } catch (err) {
    fs.closeSync(fd);
    throw err;
  }
}

// Closes every descriptor a map of held directories holds (`heldParent`'s).
function closeHeld(held) {
  for (const { fd } of held.values()) {
    if (fd !== null) fs.closeSync(fd);
  }
  held.clear();
}

// User code may chmod its own tree; refusing up front beats failing half-way through a write.
function needOwnerBits(st, bits) {
  if (st.uid === process.geteuid() && (st.mode & bits) !== bits) throw new Refusal('PERMISSION_DENIED');
}

// Checks every file before anything is written and returns the entry and byte totals after the write.
function planWrite(allParts, sizes, overwrite, inventory) {
  const prefixes = new Set(allParts.flatMap((parts) => parts.slice(1).map((_, i) => parts.slice(0, i + 1).join('/'))));
  if (allParts.some((parts) => prefixes.has(parts.join('/')))) throw new Refusal('INVALID_PATH'); // file and dir
  const newDirs = new Set();
  let newFiles = 0;
  let bytes = inventory.bytes;
  const parents = new Map();
  try {
    allParts.forEach((parts, i) => {
      const { missingFrom, dirStat, leaf } = probe(parts, parents);
      if (leaf === null) {
        needOwnerBits(dirStat, 0o300);
        // Every missing parent is one new entry, counted once however many files share it.
        for (let j = missingFrom + 1; missingFrom >= 0 && j < parts.length; j += 1) {
          newDirs.add(parts.slice(0, j).join('/'));
        }
        newFiles += 1;
        bytes += sizes[i];
      } else if (isSpecial(leaf)) {
        throw integrity();
      } else if (leaf.isDirectory()) {
        throw new Refusal('INVALID_PATH');
      } else if (overwrite) {
        needOwnerBits(leaf, 0o200);
        bytes += sizes[i] - leaf.size;
      } // else: an existing file that is kept; it changes nothing
    });
  } finally {
    closeHeld(parents);
  }
  return { entries: inventory.entries + newDirs.size + newFiles, bytes };
}

let mutated = false; // once true, a failure leaves a partly written workspace: answers carry "partial"

// Writes one file; `dirs` holds each parent directory opened for this write by its path, for the files after it.
function writeOne(parts, body, overwrite, dirs) {
  const { fd: dirFd } = heldParent(parts, dirs, (dir) => ({ fd: openDirChain(dir, () => { mutated = true; }) }));
  const st = lstatAt(dirFd, parts.at(-1));
  if (st !== null && (isSpecial(st) || st.isDirectory())) throw integrity(); // the plan saw otherwise: a race
  if (st !== null && !overwrite) return 'exists';
  mutated = true;
  const fd = st === null
    ? fs.openSync(at(dirFd, parts.at(-1)), C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW | C.O_NONBLOCK, 0o600)
    : fs.openSync(at(dirFd, parts.at(-1)), C.O_WRONLY | C.O_NOFOLLOW | C.O_NONBLOCK);
  try {
    const fst = fs.fstatSync(fd);
    if (!fst.isFile() || fst.nlink !== 1 || (st !== null && (fst.dev !== st.dev || fst.ino !== st.ino))) {
      throw integrity();
    }
    // Truncate only now (not with O_TRUNC): the fstat proved this is the file we judged, not one swapped in.
    if (st !== null) fs.ftruncateSync(fd, 0);
    for (let off = 0; off < body.length; ) off += fs.writeSync(fd, body, off, body.length - off);
  } finally {
    fs.closeSync(fd);
  }
  return st === null ? 'written' : 'overwritten';
}

async function opWrite(req, take) {
  const limits = [req.max_file_bytes, req.max_entries, req.max_total_bytes];
  if (typeof req.overwrite !== 'boolean' || !limits.every((n) => Number.isSafeInteger(n) && n >= 0)) {
    throw new Refusal('INVALID_REQUEST');
  }
  const length = (await readExact(take, 4)).readUInt32BE(0);
  if (length > MAX_HEADER_BYTES) throw new Refusal('INVALID_REQUEST');
  const files = parseHeader(await readExact(take, length));
  // Header-only checks first, but the refusal waits until the body is consumed, so the host's write of the
  // stream never meets a closed pipe.
  let refusal = null;
  let allParts = [];
  try {
    allParts = files.map((f) => checkPath(f.path));
    if (new Set(files.map((f) => f.path)).size !== files.length) throw new Refusal('INVALID_PATH');
    if (files.some((f) => f.size > req.max_file_bytes)) throw new Refusal('FILE_TOO_LARGE');
  } catch (err) {
    refusal = err;
  }
  // The body is buffered whole before any change, so a transfer that ends early leaves the workspace untouched.
  // Its size is bounded by max_total_bytes so that memory is bounded too.
  const declared = files.reduce((sum, f) => sum + f.size, 0);
  if (refusal === null && declared > req.max_total_bytes) refusal = new Refusal('WORKSPACE_LIMIT_EXCEEDED');
  if (refusal !== null) {
    if (!(await take(declared, () => {}))) throw new Refusal('TRANSFER_FAILED');
    throw refusal;
  }
  const bodies = [];
  for (const f of files) bodies.push(await readExact(take, f.size));
  const inventory = takeInventory();
  if (inventory.overflow) throw new Refusal('WORKSPACE_LIMIT_EXCEEDED');
  const after = planWrite(allParts, files.map((f) => f.size), req.overwrite, inventory);
  if (after.entries > req.max_entries || after.bytes > req.max_total_bytes) {
    throw new Refusal('WORKSPACE_LIMIT_EXCEEDED');
  }
  const dirs = new Map();
  try {
    const results = allParts.map((parts, i) => writeOne(parts, bodies[i], req.overwrite, dirs));
    return { results, entries: after.entries, bytes: after.bytes };
  } finally {
    closeHeld(dirs);
  }
}

// A snapshot's content made in an empty workspace (snapshot.mjs, loaded only then).
async function opUnpack(req, take) {
  const { unpackSnapshot } = await import('./snapshot.mjs');
  return unpackSnapshot(req, take, () => { mutated = true; });
}

const OPS = {
  read: opRead, digest: opDigest, list: opList, delete: opDelete, write: opWrite, unpack: opUnpack,
  inventory: () => ({}),
};
const REQUEST_KEYS = {
  read: ['path', 'max_bytes', 'encoding'], digest: ['path'], list: ['path', 'recursive', 'max_depth', 'max_entries'],
  delete: ['paths'], inventory: [], write: ['overwrite', 'max_file_bytes', 'max_entries', 'max_total_bytes'],
  unpack: ['max_entries', 'max_total_bytes'],
};

// Maps an fs error that escaped an op. After the inventory passed, a name changing type under us can only be
// user code racing the helper, so those errors mean the workspace is no longer trustworthy.
function answerForError(err) {
  if (err instanceof Refusal) return err.answer;
  if (['ELOOP', 'ENOTDIR', 'EEXIST', 'ENOENT', 'EISDIR', 'ENXIO'].includes(err?.code)) return integrity().answer;
  if (err?.code === 'ENOSPC') return new Refusal('WORKSPACE_LIMIT_EXCEEDED').answer;
  if (err?.code === 'EACCES' || err?.code === 'EPERM') return new Refusal('PERMISSION_DENIED').answer;
  return null;
}

export const FILE_OPERATIONS = Object.freeze(Object.keys(OPS));

// One operation on the workspace, as an answer object; it never throws. `take` reads the request's payload from
// stdin (a write's header and bytes). Each call starts afresh: the "partial" flag is this operation's.
export async function fileOperation(op, req, take) {
  const umask = process.umask(0o077); // ours only: a program the channel runs next keeps the default
  mutated = false;
  try {
    if (!Object.hasOwn(OPS, op) || !hasExactKeys(req, REQUEST_KEYS[op])) throw new Refusal('INVALID_REQUEST');
    // write and unpack consume stdin and take their own inventory
    if (op === 'write' || op === 'unpack') return { ok: true, ...(await OPS[op](req, take)) };
    const inventory = takeInventory();
    if (op === 'inventory') {
      return { ok: true, entries: inventory.entries, bytes: inventory.bytes, overflow: inventory.overflow };
    }
    return { ok: true, ...OPS[op](req) };
  } catch (err) {
    const known = answerForError(err);
    if (known !== null && mutated) known.partial = true;
    return known ?? { ok: false, code: 'INTERNAL_ERROR', message: MESSAGES.INTERNAL_ERROR };
  } finally {
    process.umask(umask);
  }
}

// pack (snapshot.mjs), as fileOperation() runs the others: its answer, and the bytes that follow the answer line.
async function packOperation(req) {
  const umask = process.umask(0o077);
  try {
    const { packWorkspace } = await import('./snapshot.mjs');
    return packWorkspace(req);
  } catch (err) {
    return { answer: answerForError(err) ?? { ok: false, code: 'INTERNAL_ERROR', message: MESSAGES.INTERNAL_ERROR } };
  } finally {
    process.umask(umask);
  }
}

async function main() {
  const [op, text, ...rest] = process.argv.slice(2);
  if (!(Object.hasOwn(OPS, op) || op === 'pack') || typeof text !== 'string' || rest.length > 0) {
    return { answer: new Refusal('INVALID_REQUEST').answer };
  }
  const take = stdinTaker();
  let req;
  try {
    // "-": the request is the first frame on stdin (4-byte big-endian length, then JSON), which has no argv
    // size limit; a single argv string is capped at 128 KiB by the kernel.
    req = JSON.parse(text === '-' ? await readFrame(take) : text);
  } catch (err) {
    return { answer: err instanceof Refusal ? err.answer : new Refusal('INVALID_REQUEST').answer };
  }
  if (op === 'pack') return packOperation(req);
  return { answer: await fileOperation(op, req, take) };
}

// Run as a program (not imported by the runner): answer once, exit 0 for every well-formed answer.
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  main().then(
    ({ answer, body }) => {
      const failed = answer.ok === false && answer.code === 'INTERNAL_ERROR';
      const line = Buffer.from(`${JSON.stringify(answer)}\n`);
      const out = answer.ok && body !== undefined ? Buffer.concat([line, body]) : line;
      process.stdout.write(out, () => process.exit(failed ? 1 : 0));
    },
    () => {
      const result = { ok: false, code: 'INTERNAL_ERROR', message: MESSAGES.INTERNAL_ERROR };
      process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(1));
    },
  );
}
