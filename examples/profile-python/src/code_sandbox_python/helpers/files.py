# File helper of the code-sandbox image: the only way the host reads or changes /workspace.
# Usage: python3 -I -S -B /opt/sandbox/files.py <write|list|read|delete|inventory|digest|unpack|pack> <request | ->
# The runner's --channel mode loads this file and serves the same operations (file_operation) over a held stdin,
# but for pack, which only a program of its own serves: its answer line is followed by the files' bytes.
# Answers exactly one JSON line on stdout and exits 0 (refusals included); a nonzero exit is a bug.
# User code owns the workspace between calls, so nothing found there is trusted: every op first checks
# that the tree holds only plain directories and single-link regular files, and never follows a symlink.
# Standard library only, and started with -I: neither /workspace nor the environment can shadow what it imports.
import base64
import errno
import hashlib
import json
import os
import re
import select
import signal
import stat
import sys

ROOT = "/workspace"
# O_NONBLOCK so that a FIFO swapped in at the last moment fails or returns at once instead of hanging us.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
INVENTORY_LIMIT = 5000
MAX_HEADER_BYTES = 4 * 1024 * 1024
MAX_SAFE_INTEGER = 2**53 - 1
MESSAGES = {
    "INVALID_REQUEST": "the request is malformed",
    "INVALID_PATH": "a path is invalid or does not fit the workspace",
    "PATH_TRAVERSAL": "a path contains a parent-directory component",
    "FILE_TOO_LARGE": "a file exceeds the size limit",
    "WORKSPACE_LIMIT_EXCEEDED": "the workspace entry or byte limit would be exceeded",
    "WORKSPACE_INTEGRITY": "the workspace contains a symbolic link, hard link or special file",
    "NOT_FOUND": "the path does not exist",
    "NOT_A_DIRECTORY": "the path is not a directory",
    "NOT_A_FILE": "the path is not a regular file",
    "BINARY_FILE": "the file is not UTF-8 text",
    "PERMISSION_DENIED": "the workspace permissions do not allow this operation",
    "TRANSFER_FAILED": "the file transfer ended early",
    "INTERNAL_ERROR": "the file helper failed",
}


class Refusal(Exception):
    def __init__(self, code, message=None):
        super().__init__(code)
        self.answer = {"ok": False, "code": code, "message": MESSAGES[code] if message is None else message}


UNVERIFIABLE = "the workspace could not be verified"


def integrity(message=None):
    return Refusal("WORKSPACE_INTEGRITY", message)


def error_code(err):
    return errno.errorcode.get(err.errno) if isinstance(err, OSError) else None


# Python has openat() and its relatives (dir_fd=): "<name>" is resolved in the directory we hold open, so a parent
# swapped for a symlink after we checked it cannot redirect us. Names are single components, never "." or "..".
def lstat_at(dir_fd, name):
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def is_dir(st):
    return stat.S_ISDIR(st.st_mode)


def is_file(st):
    return stat.S_ISREG(st.st_mode)


def is_special(st):
    return not is_dir(st) and not (is_file(st) and st.st_nlink == 1)


def safe_int(value):
    """The integer of a JSON number that Number.isSafeInteger accepts, else None. Numbers are parsed as doubles,
    as in JavaScript, so 1.0 and 1e3 are integers and 2**53 is not safe."""
    if type(value) is not float or not value.is_integer() or abs(value) > MAX_SAFE_INTEGER:
        return None
    return int(value)


def reject_constant(_name):
    raise ValueError("not JSON")  # NaN and Infinity are Python extensions; JSON.parse refuses them


def parse_json(text):
    return json.loads(text, parse_int=float, parse_constant=reject_constant)


def utf8_length(text):
    return len(text.encode())


# Same rules as the host (defence in depth); the only message is fixed, the path is never echoed.
def check_path(path):
    if type(path) is not str:
        raise Refusal("INVALID_REQUEST")
    parts = path.split("/")
    if ".." in parts:
        raise Refusal("PATH_TRAVERSAL")
    bad = (
        len(path) == 0
        or re.search("[\ud800-\udfff]", path) is not None  # a lone surrogate: not well-formed
        or utf8_length(path) > 1024
        or len(parts) > 20
        or path.startswith("/")
        or path.startswith("-")
        or "\\" in path
        or re.search("[\x00-\x1f\x7f-\x9f]", path) is not None
        or any(p == "" or p == "." or utf8_length(p) > 255 for p in parts)
    )
    if bad:
        raise Refusal("INVALID_PATH")
    return parts


def close(fd):
    os.close(fd)


# Opens the directory named by `parts` one component at a time. With `on_missing`, absent components are
# created (mode 0700) after calling it, so the caller knows the workspace is being changed.
def open_dir_chain(parts, on_missing=None):
    fd = os.open(ROOT, DIR_FLAGS)
    try:
        for name in parts:
            try:
                following = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                if err.errno != errno.ENOENT or on_missing is None:
                    raise
                on_missing()
                os.mkdir(name, 0o700, dir_fd=fd)
                following = os.open(name, DIR_FLAGS, dir_fd=fd)
            close(fd)
            fd = following
        return fd
    except BaseException:
        close(fd)
        raise


# Iterative depth-first walk, bounded by `limit` entries; False when the limit stopped it. Directories are
# reopened by path later, so each must still have the dev/ino its lstat showed: a swap meanwhile is a race.
# Names are raw bytes, visited in byte order (Node.js's readdir sorts them), so the walk never depends on the
# order the file system returns them in. `on_entry(rel, st, dir_fd, name)`: the entry's path and lstat, and the
# directory held open that holds it.
def walk(start, max_depth, limit, on_entry):
    stack = [{**start, "depth": 0}]
    count = 0
    try:
        while stack:
            directory = stack.pop()
            fd = os.open(directory["abs"], DIR_FLAGS)
            try:
                st = os.fstat(fd)
                if st.st_dev != directory["dev"] or st.st_ino != directory["ino"]:
                    raise integrity()
                for name in sorted(os.fsencode(n) for n in os.listdir(fd)):
                    child = lstat_at(fd, name)
                    if child is None:
                        continue  # removed while we walked; nothing left to check
                    count += 1
                    if count > limit:
                        return False
                    rel = directory["rel"] + b"/" + name if directory["rel"] else name
                    on_entry(rel, child, fd, name)
                    if is_dir(child) and directory["depth"] < max_depth:
                        stack.append(
                            {
                                "abs": directory["abs"] + b"/" + name,
                                "rel": rel,
                                "depth": directory["depth"] + 1,
                                "dev": child.st_dev,
                                "ino": child.st_ino,
                            }
                        )
            finally:
                close(fd)
    except OSError as err:
        # A directory we may not read, or one nested past PATH_MAX, cannot be checked: fail closed.
        if err.errno in (errno.EACCES, errno.ENAMETOOLONG):
            raise integrity(UNVERIFIABLE) from None
        raise
    return True


def root_start():
    st = os.lstat(ROOT)
    if not is_dir(st):
        raise integrity()
    return {"abs": ROOT.encode(), "rel": b"", "dev": st.st_dev, "ino": st.st_ino}


# Runs before every op: refuses a workspace that holds anything but directories and single-link files.
def take_inventory():
    totals = {"entries": 0, "bytes": 0}

    def count(_rel, st, *_held):
        if is_special(st):
            raise integrity()
        totals["entries"] += 1
        if is_file(st):
            totals["bytes"] += st.st_size

    complete = walk(root_start(), float("inf"), INVENTORY_LIMIT, count)
    return {"entries": totals["entries"], "bytes": totals["bytes"], "overflow": not complete}


# Opens the parent directory of `parts` and lstats the last component. None when a component is absent or a
# file stands where a directory is needed; otherwise the caller closes "dir_fd".
def lookup(parts):
    try:
        dir_fd = open_dir_chain(parts[:-1])
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    st = lstat_at(dir_fd, parts[-1])
    if st is None:
        close(dir_fd)
        return None
    return {"dir_fd": dir_fd, "st": st, "name": parts[-1]}


# Opens a regular file for reading; the fstat must match the lstat we judged the name by.
def open_regular_file(parts):
    found = lookup(parts)
    if found is None:
        raise Refusal("NOT_FOUND")
    st = found["st"]
    try:
        if not is_file(st):
            raise Refusal("NOT_A_FILE")
        fd = os.open(found["name"], READ_FLAGS, dir_fd=found["dir_fd"])
        fst = os.fstat(fd)
        if is_file(fst) and fst.st_nlink == 1 and fst.st_dev == st.st_dev and fst.st_ino == st.st_ino:
            return fd, fst.st_size
        close(fd)
        raise integrity()
    finally:
        close(found["dir_fd"])


def read_up_to(fd, limit):
    buf = bytearray()
    while len(buf) < limit:
        chunk = os.read(fd, limit - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def op_read(req):
    parts = check_path(req["path"])
    max_bytes = safe_int(req["max_bytes"])
    if max_bytes is None or max_bytes < 1 or req["encoding"] not in ("utf-8", "base64"):
        raise Refusal("INVALID_REQUEST")
    fd, size = open_regular_file(parts)
    # One byte past max_bytes is enough to tell whether the cut falls inside a character. Bounding the buffer by
    # the file size too keeps a generous max_bytes from costing memory.
    limit = min(max_bytes, size) + 1
    try:
        buf = read_up_to(fd, limit)
    finally:
        close(fd)
    end = len(buf)
    truncated = end > max_bytes
    if req["encoding"] == "base64":  # the first max_bytes bytes as they are, whatever they hold
        return {"content": base64.b64encode(buf[:max_bytes]).decode(), "size": size, "truncated": truncated}
    if truncated:
        end = max_bytes
        # Back off over continuation bytes (10xxxxxx) so no character is split; valid UTF-8 needs at most 3.
        i = 0
        while i < 3 and end > 0 and (buf[end] & 0xC0) == 0x80:
            end -= 1
            i += 1
    text = buf[:end]
    if 0 in text:
        raise Refusal("BINARY_FILE")
    try:
        content = text.decode("utf-8")  # strict, and a leading BOM is kept
    except UnicodeDecodeError:
        raise Refusal("BINARY_FILE") from None
    return {"content": content, "size": size, "truncated": truncated}


def op_digest(req):
    fd, _size = open_regular_file(check_path(req["path"]))
    digest = hashlib.sha256()
    size = 0
    try:
        while chunk := os.read(fd, 1 << 16):
            digest.update(chunk)
            size += len(chunk)
    finally:
        close(fd)
    return {"sha256": digest.hexdigest(), "size": size}


def op_list(req):
    max_depth = safe_int(req["max_depth"])
    max_entries = safe_int(req["max_entries"])
    if (
        type(req["recursive"]) is not bool
        or max_depth is None
        or not 0 <= max_depth <= 10
        or max_entries is None
        or max_entries < 1
    ):
        raise Refusal("INVALID_REQUEST")
    start = root_start()
    if req["path"] != ".":
        found = lookup(check_path(req["path"]))
        if found is None:
            raise Refusal("NOT_FOUND")
        close(found["dir_fd"])
        if not is_dir(found["st"]):
            raise Refusal("NOT_A_DIRECTORY")
        st = found["st"]
        path = req["path"].encode()
        start = {"abs": ROOT.encode() + b"/" + path, "rel": path, "dev": st.st_dev, "ino": st.st_ino}
    found_entries = []

    def collect(rel, st, *_held):
        if is_special(st):
            raise integrity()
        kind = "directory" if is_dir(st) else "file"
        found_entries.append({"rel": rel, "type": kind, "size": st.st_size if is_file(st) else 0})

    # Collect a bounded superset, sort by raw bytes, then cut: the kept entries do not depend on readdir order.
    complete = walk(start, max_depth if req["recursive"] else 0, INVENTORY_LIMIT, collect)
    found_entries.sort(key=lambda e: e["rel"])
    kept = found_entries[:max_entries]
    # Names that are not UTF-8 can only come from user code; they are shown with U+FFFD, never refused.
    entries = [{"path": e["rel"].decode("utf-8", "replace"), "type": e["type"], "size": e["size"]} for e in kept]
    return {"entries": entries, "truncated": not complete or len(found_entries) > max_entries}


def op_delete(req):
    paths = req["paths"]
    if type(paths) is not list or len(paths) == 0:
        raise Refusal("INVALID_REQUEST")
    every = [check_path(p) for p in paths]  # refuse the whole request before deleting anything
    results = []
    for parts in every:
        found = lookup(parts)
        if found is None:
            results.append("missing")
            continue
        try:
            if not is_file(found["st"]):
                results.append("not_a_file")
                continue
            os.unlink(found["name"], dir_fd=found["dir_fd"])  # relative to the held directory: cannot reach outside
            mark_mutated()  # a later path failing leaves this one deleted: that refusal is partial
            results.append("deleted")
        finally:
            close(found["dir_fd"])
    return {"results": results}


# Reads exactly `n` bytes of stdin, handing each piece to `sink`; False if stdin ended first. It copes with short
# reads and a non-blocking fd 0, and stops at the count, never waiting for EOF. It never asks for more than it was
# asked for, so nothing is read ahead: the runner's channel uses it for its frames and for a write's payload alike.
def take(n, sink):
    left = n
    while left > 0:
        try:
            chunk = os.read(0, min(left, 1 << 16))
        except BlockingIOError:
            select.select([0], [], [])
            continue
        except OSError:
            return False
        if not chunk:
            return False
        sink(chunk)
        left -= len(chunk)
    return True


def read_exact(take, n):
    pieces = []
    if not take(n, pieces.append):
        raise Refusal("TRANSFER_FAILED")
    return b"".join(pieces)


def read_frame(take):
    length = int.from_bytes(read_exact(take, 4), "big")
    if length > MAX_HEADER_BYTES:
        raise Refusal("INVALID_REQUEST")
    return read_exact(take, length).decode("utf-8-sig")  # TextDecoder drops a leading BOM too


def has_exact_keys(value, keys):
    return type(value) is dict and len(value) == len(keys) and all(k in value for k in keys)


def parse_header(buf):
    try:
        header = parse_json(buf.decode("utf-8-sig"))
    except (ValueError, RecursionError):
        raise Refusal("INVALID_REQUEST") from None
    files = header.get("files") if type(header) is dict else None
    good = (
        has_exact_keys(header, ["files"])
        and type(files) is list
        and 0 < len(files) <= 10000
        and all(
            has_exact_keys(f, ["path", "size"]) and safe_int(f["size"]) is not None and f["size"] >= 0 for f in files
        )
    )
    if not good:
        raise Refusal("INVALID_REQUEST")
    return [{"path": f["path"], "size": safe_int(f["size"])} for f in files]


# Read-only look at where a write would land: the first missing parent (or -1), the deepest existing
# directory's stat, and the target's lstat (None when absent).
def probe(parts):
    fd = os.open(ROOT, DIR_FLAGS)
    try:
        for i in range(len(parts) - 1):
            st = lstat_at(fd, parts[i])
            if st is None:
                return {"missing_from": i, "dir_stat": os.fstat(fd), "leaf": None}
            if is_special(st):
                raise integrity()  # the inventory passed, so this is a race
            if not is_dir(st):
                raise Refusal("INVALID_PATH")  # a file where a directory is needed
            following = os.open(parts[i], DIR_FLAGS, dir_fd=fd)
            close(fd)
            fd = following
        return {"missing_from": -1, "dir_stat": os.fstat(fd), "leaf": lstat_at(fd, parts[-1])}
    finally:
        close(fd)


# User code may chmod its own tree; refusing up front beats failing half-way through a write.
def need_owner_bits(st, bits):
    if st.st_uid == os.getuid() and (st.st_mode & bits) != bits:
        raise Refusal("PERMISSION_DENIED")


# Checks every file before anything is written and returns the entry and byte totals after the write.
def plan_write(all_parts, sizes, overwrite, inventory):
    prefixes = {"/".join(parts[: i + 1]) for parts in all_parts for i in range(len(parts) - 1)}
    if any("/".join(parts) in prefixes for parts in all_parts):
        raise Refusal("INVALID_PATH")  # one path is a file and a directory
    new_dirs = set()
    new_files = 0
    total = inventory["bytes"]
    for parts, size in zip(all_parts, sizes, strict=True):
        found = probe(parts)
        leaf = found["leaf"]
        if leaf is None:
            need_owner_bits(found["dir_stat"], 0o300)
            # Every missing parent is one new entry, counted once however many files share it.
            if found["missing_from"] >= 0:
                for j in range(found["missing_from"] + 1, len(parts)):
                    new_dirs.add("/".join(parts[:j]))
            new_files += 1
            total += size
        elif is_special(leaf):
            raise integrity()
        elif is_dir(leaf):
            raise Refusal("INVALID_PATH")
        elif overwrite:
            need_owner_bits(leaf, 0o200)
            total += size - leaf.st_size
        # else: an existing file that is kept; it changes nothing
    return {"entries": inventory["entries"] + len(new_dirs) + new_files, "bytes": total}


mutated = False  # once True, a failure leaves a partly written workspace: answers carry "partial"
# True from the start of a write until its payload has been read whole: a write that stops earlier (a malformed
# request or header, or a payload cut short) leaves stdin at no known frame boundary, so a channel must end.
payload_pending = False


def mark_mutated():
    global mutated
    mutated = True


def write_one(parts, body, overwrite):
    dir_fd = open_dir_chain(parts[:-1], mark_mutated)
    try:
        name = parts[-1]
        st = lstat_at(dir_fd, name)
        if st is not None and (is_special(st) or is_dir(st)):
            raise integrity()  # the plan saw otherwise: a race
        if st is not None and not overwrite:
            return "exists"
        mark_mutated()
        if st is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        else:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
        try:
            fst = os.fstat(fd)
            if (
                not is_file(fst)
                or fst.st_nlink != 1
                or (st is not None and (fst.st_dev != st.st_dev or fst.st_ino != st.st_ino))
            ):
                raise integrity()
            # Truncate only now (not with O_TRUNC): the fstat proved this is the file we judged, not one swapped in.
            if st is not None:
                os.ftruncate(fd, 0)
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            close(fd)
        return "written" if st is None else "overwritten"
    finally:
        close(dir_fd)


def payload_read():
    global payload_pending
    payload_pending = False


def op_write(req, take):
    limits = [safe_int(req[k]) for k in ("max_file_bytes", "max_entries", "max_total_bytes")]
    if type(req["overwrite"]) is not bool or not all(n is not None and n >= 0 for n in limits):
        raise Refusal("INVALID_REQUEST")
    max_file_bytes, max_entries, max_total_bytes = limits
    length = int.from_bytes(read_exact(take, 4), "big")
    if length > MAX_HEADER_BYTES:
        raise Refusal("INVALID_REQUEST")
    files = parse_header(read_exact(take, length))
    # Header-only checks first, but the refusal waits until the body is consumed, so the host's write of the
    # stream never meets a closed pipe.
    refusal = None
    all_parts = []
    try:
        all_parts = [check_path(f["path"]) for f in files]
        if len({f["path"] for f in files}) != len(files):
            raise Refusal("INVALID_PATH")
        if any(f["size"] > max_file_bytes for f in files):
            raise Refusal("FILE_TOO_LARGE")
    except Refusal as err:
        refusal = err
    # The body is buffered whole before any change, so a transfer that ends early leaves the workspace untouched.
    # Its size is bounded by max_total_bytes so that memory is bounded too.
    declared = sum(f["size"] for f in files)
    if refusal is None and declared > max_total_bytes:
        refusal = Refusal("WORKSPACE_LIMIT_EXCEEDED")
    if refusal is not None:
        if not take(declared, lambda _chunk: None):
            raise Refusal("TRANSFER_FAILED")
        payload_read()
        raise refusal
    bodies = [read_exact(take, f["size"]) for f in files]
    payload_read()
    inventory = take_inventory()
    if inventory["overflow"]:
        raise Refusal("WORKSPACE_LIMIT_EXCEEDED")
    after = plan_write(all_parts, [f["size"] for f in files], req["overwrite"], inventory)
    if after["entries"] > max_entries or after["bytes"] > max_total_bytes:
        raise Refusal("WORKSPACE_LIMIT_EXCEEDED")
    results = [write_one(parts, body, req["overwrite"]) for parts, body in zip(all_parts, bodies, strict=True)]
    return {"results": results, "entries": after["entries"], "bytes": after["bytes"]}


# -- snapshots: pack (a program of its own) and unpack (an operation like the others) ------------------------

MAX_TARGET_BYTES = 4095
MAX_SNAPSHOT_HEADER_BYTES = 32 * 1024 * 1024
MAX_LISTING_BYTES = 8 * 1024 * 1024  # a pack's answer line: its listing of every entry
UNKEPT = "a name in the workspace cannot be kept in a snapshot"
SNAPSHOT_KEYS = {
    "directory": ["type", "path", "mode"],
    "file": ["type", "path", "mode", "size"],
    "symlink": ["type", "path", "target"],
}


def snapshot_limits(req):
    limits = [safe_int(req[k]) for k in ("max_entries", "max_total_bytes")]
    if not all(n is not None and n >= 0 for n in limits):
        raise Refusal("INVALID_REQUEST")
    return limits


def kept_name(raw):
    try:
        text = raw.decode("utf-8")
        check_path(text)
    except (UnicodeDecodeError, Refusal):
        raise Refusal("INVALID_PATH", UNKEPT) from None
    return text


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_whole(fd, st):
    fst = os.fstat(fd)
    if not is_file(fst) or (fst.st_dev, fst.st_ino, fst.st_size) != (st.st_dev, st.st_ino, st.st_size):
        raise integrity("the workspace changed while it was read")
    data = read_up_to(fd, st.st_size + 1)
    if len(data) != st.st_size:
        raise integrity("the workspace changed while it was read")
    return data


# Every directory, file and symbolic link of the workspace, sorted by path, and the files' bytes in that order.
# Special files are skipped and counted; a file with several links is kept as a file each time. Never follows a link.
# A directory it may not read fails closed, as for every operation (walk); a file it may not read is refused.
def op_pack(req):
    if not has_exact_keys(req, ["max_entries", "max_total_bytes"]):
        raise Refusal("INVALID_REQUEST")
    max_entries, max_total_bytes = snapshot_limits(req)
    too_large = Refusal("SNAPSHOT_TOO_LARGE", "the workspace is larger than a snapshot may be")
    found, totals = [], {"bytes": 0, "skipped": 0}

    # Each entry is read relative to the directory the walk holds open, never by a path that could pass a link.
    def keep(rel, st, dir_fd, name):
        if is_dir(st):
            found.append((rel, {"type": "directory", "path": kept_name(rel), "mode": st.st_mode & 0o777}, None))
        elif is_file(st):
            totals["bytes"] += st.st_size
            if totals["bytes"] > max_total_bytes:
                raise too_large
            entry = {"type": "file", "path": kept_name(rel), "mode": st.st_mode & 0o777, "size": st.st_size}
            try:
                fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
            except PermissionError:
                raise Refusal("PERMISSION_DENIED") from None
            try:
                found.append((rel, entry, read_whole(fd, st)))
            finally:
                close(fd)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
            try:
                text = target.decode("utf-8") if len(target) <= MAX_TARGET_BYTES else None
            except UnicodeDecodeError:
                text = None
            if text is None:
                raise Refusal("INVALID_PATH", UNKEPT)
            found.append((rel, {"type": "symlink", "path": kept_name(rel), "target": text}, None))
        else:
            totals["skipped"] += 1

    if not walk(root_start(), float("inf"), max_entries, keep):
        raise too_large
    found.sort(key=lambda item: item[0])
    answer = {"ok": True, "entries": [e for _p, e, _b in found], "skipped": totals["skipped"], "bytes": totals["bytes"]}
    if len(json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()) > MAX_LISTING_BYTES:
        raise too_large
    return answer, b"".join(body for _p, _e, body in found if body is not None)


def snapshot_entries(buf, max_entries, max_total_bytes):
    try:
        header = parse_json(buf.decode("utf-8"))
    except (ValueError, RecursionError):
        raise Refusal("INVALID_REQUEST") from None
    entries = header.get("entries") if type(header) is dict else None
    if not has_exact_keys(header, ["entries"]) or type(entries) is not list or len(entries) > max_entries:
        raise Refusal("INVALID_REQUEST")
    directories, seen, total = {""}, set(), 0
    for e in entries:
        keys = SNAPSHOT_KEYS.get(e.get("type")) if type(e) is dict else None
        if keys is None or not has_exact_keys(e, keys):
            raise Refusal("INVALID_REQUEST")
        parts = check_path(e["path"])
        if e["path"] in seen or "/".join(parts[:-1]) not in directories:
            raise Refusal("INVALID_REQUEST")
        seen.add(e["path"])
        if e["type"] != "symlink":
            e["mode"] = safe_int(e["mode"])
            if e["mode"] is None or not 0 <= e["mode"] <= 0o777:
                raise Refusal("INVALID_REQUEST")
        if e["type"] == "directory":
            directories.add(e["path"])
        elif e["type"] == "file":
            e["size"] = safe_int(e["size"])
            if e["size"] is None or e["size"] < 0:
                raise Refusal("INVALID_REQUEST")
            total += e["size"]
        else:
            target = e["target"]
            if type(target) is not str or not target or "\x00" in target or re.search("[\ud800-\udfff]", target):
                raise Refusal("INVALID_REQUEST")
            if utf8_length(target) > MAX_TARGET_BYTES:
                raise Refusal("INVALID_REQUEST")
    if total > max_total_bytes:
        raise Refusal("INVALID_REQUEST")
    return entries, total


# A snapshot's content made in an empty workspace: directories as 0700, each file created (never opened if it
# exists) and written as its bytes arrive, then every mode as the snapshot has it, deepest directory first. A transfer
# that ends early leaves part of it made ("partial"): the host destroys such a sandbox before naming it to anyone.
def op_unpack(req, take):
    max_entries, max_total_bytes = snapshot_limits(req)
    length = int.from_bytes(read_exact(take, 4), "big")
    if length > MAX_SNAPSHOT_HEADER_BYTES:
        raise Refusal("INVALID_REQUEST")
    entries, total = snapshot_entries(read_exact(take, length), max_entries, max_total_bytes)
    if take_inventory()["entries"] != 0:
        raise Refusal("INVALID_REQUEST", "the workspace is not empty")
    mark_mutated()
    for e in entries:
        parts = e["path"].split("/")
        dir_fd = open_dir_chain(parts[:-1])
        try:
            if e["type"] == "directory":
                os.mkdir(parts[-1], 0o700, dir_fd=dir_fd)
            elif e["type"] == "symlink":
                os.symlink(e["target"], parts[-1], dir_fd=dir_fd)
            else:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK
                fd = os.open(parts[-1], flags, 0o600, dir_fd=dir_fd)
                try:
                    if not take(e["size"], lambda chunk, fd=fd: write_all(fd, chunk)):
                        raise Refusal("TRANSFER_FAILED")
                    os.fchmod(fd, e["mode"])
                finally:
                    close(fd)
        finally:
            close(dir_fd)
    payload_read()
    for e in reversed([e for e in entries if e["type"] == "directory"]):
        fd = open_dir_chain(e["path"].split("/"))
        try:
            os.fchmod(fd, e["mode"])
        finally:
            close(fd)
    return {"entries": len(entries), "bytes": total}


OPS = {
    "read": op_read,
    "digest": op_digest,
    "list": op_list,
    "delete": op_delete,
    "write": op_write,
    "unpack": op_unpack,
    "inventory": lambda _req: {},
}
REQUEST_KEYS = {
    "read": ["path", "max_bytes", "encoding"],
    "digest": ["path"],
    "list": ["path", "recursive", "max_depth", "max_entries"],
    "delete": ["paths"],
    "inventory": [],
    "write": ["overwrite", "max_file_bytes", "max_entries", "max_total_bytes"],
    "unpack": ["max_entries", "max_total_bytes"],
}


# Maps an OSError that escaped an op. After the inventory passed, a name changing type under us can only be
# user code racing the helper, so those errors mean the workspace is no longer trustworthy.
def answer_for_error(err):
    if isinstance(err, Refusal):
        return err.answer
    code = error_code(err)
    if code in ("ELOOP", "ENOTDIR", "EEXIST", "ENOENT", "EISDIR", "ENXIO"):
        return integrity().answer
    if code == "ENOSPC":
        return Refusal("WORKSPACE_LIMIT_EXCEEDED").answer
    if code in ("EACCES", "EPERM"):
        return Refusal("PERMISSION_DENIED").answer
    return None


INTERNAL_ERROR = {"ok": False, "code": "INTERNAL_ERROR", "message": MESSAGES["INTERNAL_ERROR"]}


# One operation on the workspace, as an answer object; it never raises. `take` reads the operation's payload from
# stdin (a write's header and bytes). Each call starts afresh: the "partial" flag and the umask are this call's,
# and the umask is put back afterwards, so a runner that serves files and runs in one process hands its programs
# the umask it started with.
def file_operation(op, req, take):
    global mutated, payload_pending
    mutated = False
    payload_pending = op in ("write", "unpack")
    umask = os.umask(0o077)
    try:
        if op not in OPS or not has_exact_keys(req, REQUEST_KEYS[op]):
            raise Refusal("INVALID_REQUEST")
        if op in ("write", "unpack"):
            return {"ok": True, **OPS[op](req, take)}  # consumes stdin first; takes its inventory itself
        inventory = take_inventory()
        if op == "inventory":
            return {"ok": True, **inventory}  # exactly entries, bytes, overflow
        return {"ok": True, **OPS[op](req)}
    except BaseException as err:  # every failure becomes one answer
        known = answer_for_error(err)
        if known is None:
            return dict(INTERNAL_ERROR)
        if mutated:
            known["partial"] = True
        return known
    finally:
        os.umask(umask)


def answer(obj, exit_code=0):
    # The bytes JSON.stringify writes (no spaces, non-ASCII as UTF-8, the same escapes), written whole on the raw
    # fd before we exit, so no buffer is left for the interpreter to flush.
    line = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    view = memoryview(line + pack_body if obj.get("ok") else line)
    while view:
        view = view[os.write(1, view) :]
    os._exit(exit_code)


def main():
    # SIGINT ends us, as it ends Node.js, rather than raising KeyboardInterrupt into an op.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # Arguments as Node.js sees them: undecodable bytes become U+FFFD rather than surrogate escapes.
    args = [os.fsencode(arg).decode("utf-8", "replace") for arg in sys.argv[1:]]
    if len(args) != 2 or (args[0] not in OPS and args[0] != "pack"):
        return Refusal("INVALID_REQUEST").answer
    op, text = args
    try:
        # "-": the request is the first frame on stdin (4-byte big-endian length, then JSON), which has no argv
        # size limit; a single argv string is capped at 128 KiB by the kernel.
        req = parse_json(read_frame(take) if text == "-" else text)
    except Refusal as err:
        return err.answer
    except Exception:
        return Refusal("INVALID_REQUEST").answer
    if op == "pack":
        return pack_operation(req)
    return file_operation(op, req, take)


# pack, as file_operation runs the others: its answer, with the bytes that follow the answer line (answer() writes
# them after it).
def pack_operation(req):
    global pack_body
    umask = os.umask(0o077)
    try:
        result, pack_body = op_pack(req)
        return result
    except BaseException as err:
        known = answer_for_error(err)
        return dict(INTERNAL_ERROR) if known is None else known
    finally:
        os.umask(umask)


pack_body = b""


# Run as a program (the runner loads this file without running this): answer once, exit 0 for every well-formed
# answer, 1 after INTERNAL_ERROR.
if __name__ == "__main__":
    try:
        result = main()
    except BaseException:
        result = INTERNAL_ERROR
    answer(result, 1 if result.get("code") == "INTERNAL_ERROR" else 0)
