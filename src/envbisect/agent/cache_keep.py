"""A compile cache's content kept in the blob store, and made again from it (stdlib only,
Python 3.8 syntax: the collector and the actuation agent run it inside the target).

A kept cache is content-addressed twice over: every file is a blob named by its sha256, and
the *tree* (the list of ``[relpath, sha256, mode]``, sorted) is one more blob, whose sha256
is what the manifest records (``caches.<name>.kept.tree``). Two snapshots of the same cache
store nothing twice, and a tree is rebuilt byte for byte, wherever the files' blobs are.

Symlinks and anything but regular files are not kept (a cache holds files); a cache over
the cap is not kept at all, said as an error of the snapshot with the cap and how to raise
it, so that the rest of the snapshot is still written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat

TREE_SCHEMA = "envbisect/cache-tree@1"
_CHUNK = 1 << 20


def _sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _files(root):
    """(relpath, path, st) of every regular file below ``root``, no symlink followed."""
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            name = rel + entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                stack.append((name + "/", entry.path))
            elif stat.S_ISREG(st.st_mode):
                yield name, entry.path, st


def too_big(total, cap):
    """Why a cache of ``total`` bytes is not kept under ``cap`` bytes, or None."""
    if total <= cap:
        return None
    word = _size_word(total)
    return (
        f"content {_size(total)} is over the {_size(cap)} cap for kept caches; not kept "
        f"(raise it with keep_caches: {word} in envbisect.yaml or snapshot --keep-caches {word})"
    )


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n} B"  # pragma: no cover


def _size_word(n):
    """A cap that holds ``n`` bytes, written as a user would: ``2GiB``, ``600MiB``."""
    mib = -(-n // (1 << 20))
    if mib >= 1024:
        return f"{-(-mib // 1024)}GiB"
    return f"{mib}MiB"


def keep(root, cap, put, withhold=None):
    """Keep the content of the cache dir ``root`` (at most ``cap`` bytes): ``put(sha256,
    path or bytes, mode)`` stores one blob; ``withhold(path, st)`` says why a file must not
    be stored (a secret), or None. Returns ``{tree, files, bytes}`` (and ``withheld``:
    ``[relpath, why]`` of each file left out), or a str saying why nothing was kept."""
    listing = list(_files(root))
    total = sum(st.st_size for _rel, _path, st in listing)
    why = too_big(total, cap)
    if why is not None:
        return why
    tree = []
    withheld = []
    for rel, path, st in listing:
        why = withhold(path, st) if withhold is not None else None
        if why:
            withheld.append([rel, why])
            continue
        sha = _sha_file(path)
        put(sha, path, stat.S_IMODE(st.st_mode))
        tree.append([rel, sha, stat.S_IMODE(st.st_mode)])
    tree.sort()
    body = json.dumps({"schema": TREE_SCHEMA, "files": tree}, sort_keys=True).encode("utf-8")
    sha = hashlib.sha256(body).hexdigest()
    put(sha, body, 0o600)
    out = {"tree": sha, "files": len(tree), "bytes": total}
    if withheld:
        out["withheld"] = withheld
    return out


def put_into_dir(blob_dir):
    """A ``put`` that writes each blob into ``blob_dir`` (atomically; present ones kept)."""

    def put(sha, source, mode=0o600):
        target = os.path.join(blob_dir, sha)
        if os.path.exists(target):
            return
        os.makedirs(blob_dir, exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            if isinstance(source, bytes):
                fh.write(source)
            else:
                with open(source, "rb") as src:
                    for block in iter(lambda: src.read(_CHUNK), b""):
                        fh.write(block)
            # Never wider than the source's own mode, never executable: a 0600 file stays 0600.
            os.fchmod(fh.fileno(), mode & 0o644)
        os.replace(tmp, target)

    return put


def put_into_map(blobs, have=()):
    """A ``put`` that adds each blob to ``blobs`` (sha256 → base64), to travel back; one
    the caller's blob store already holds (``have``) is not read or sent again."""

    def put(sha, source, mode=0o600):
        if sha in blobs or sha in have:
            return
        if not isinstance(source, bytes) and hasattr(blobs, "send_file"):
            blobs.send_file(sha, source)  # streamed: never read whole
            return
        if not isinstance(source, bytes):
            with open(source, "rb") as fh:
                source = fh.read()
        blobs[sha] = base64.b64encode(source).decode("ascii")

    return put


def read_tree(body):
    """The ``[relpath, sha256, mode]`` entries of a tree blob's bytes (ValueError if it is
    not one)."""
    doc = json.loads(body.decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("schema") != TREE_SCHEMA:
        raise ValueError("not a cache tree")
    out = []
    for item in doc.get("files") or ():
        rel, sha, mode = item
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"unsafe path in cache tree: {rel!r}")
        out.append((rel, sha, int(mode)))
    return out


def materialize(tree, dest, fetch):
    """Make ``dest`` hold exactly the files of ``tree`` (read_tree's entries); ``fetch(sha)``
    gives a blob's bytes or None. Returns the missing blobs' count (0: complete)."""
    missing = 0
    os.makedirs(dest, mode=0o700, exist_ok=True)
    for rel, sha, mode in tree:
        data = fetch(sha)
        if data is None:
            missing += 1
            continue
        path = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(path, owner_mode(mode))
    return missing


def owner_mode(mode):
    """The mode a rebuilt file gets: the owner's alone, 0700 when the tree said executable,
    else 0600. A tree's recorded mode is never applied as it is (no setuid, setgid, sticky,
    group or world bits: a tree may come from anyone)."""
    return 0o700 if int(mode or 0) & 0o100 else 0o600
