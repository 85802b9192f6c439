"""Agent: what the target still holds about its state at an earlier time (``--as-of``).

Runs inside the target Python like the collector, so it is stdlib-only and keeps 3.8
syntax. It only *reads* evidence and returns it; the host
(``envbisect.snapshot.reconstruct``) weighs it into a manifest with a confidence per fact.
Times are POSIX seconds (UTC).

- git: HEAD at the time from the reflog (the newest entry at or before it), else the last
  commit before it on today's HEAD; the repo's first commit time; requirement files at
  that commit; files under ``files:`` inside the repo, as they were at that commit.
- packages: when each distribution was installed (its dist-info's newest of directory,
  INSTALLER and RECORD mtimes: an installer writes those at install time).
- older builds the machine keeps: uv's unpacked archives, pip's built wheels, find-links
  directories, venvs beside the target's; each with the time it landed there.
- loose files and datasets: their mtime; a ``data_map`` copy's facts.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import sys

from envbisect.agent.channel import blob_store, keep_bytes
from envbisect.agent.collect_common import (
    Collector,
    Timeout,
    data_dir,
    data_file,
    named_distributions,
    normalise,
    walk,
)

AGENT_REQUIRES = ("envbisect.agent.redact", "envbisect.agent.collect_common")

REQUIREMENT_FILES = ("requirements.txt", "pyproject.toml")
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-.*\.whl$")
_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)\.dist-info$")


def _git_env():
    env = dict(os.environ)
    env["GIT_OPTIONAL_LOCKS"] = "0"
    env["LC_ALL"] = "C"
    return env


def _git(c, repo, *args):
    rc, out, err = c.run(["git", "-C", repo] + list(args), env=_git_env())
    return rc, out, err


def head_from_reflog(c, repo, when):
    """(sha, evidence) of the newest HEAD reflog entry at or before ``when``; (None, why)."""
    rc, out, err = _git(c, repo, "log", "-g", "--date=unix", "--format=%H%x09%gd%x09%gs", "HEAD")
    if rc != 0:
        return None, "no reflog (" + (err[-120:] or "git log -g failed") + ")"
    oldest = None
    for line in out.decode("utf-8", "replace").splitlines():
        parts = line.split("\t", 2)
        if len(parts) < 3:
            continue
        sha, selector, subject = parts
        found = re.search(r"@\{(\d+)\}", selector)
        if not found:
            continue
        stamp = int(found.group(1))
        oldest = stamp
        if stamp <= when:
            if _git(c, repo, "cat-file", "-e", sha + "^{commit}")[0] != 0:
                return None, f"the reflog names {sha[:12]}, which is no longer in the repo"
            return sha, {"reflog_time": stamp, "reflog_entry": subject}
    if oldest is None:
        return None, "the reflog is empty (a fresh clone, or reflogs disabled)"
    return None, f"the reflog starts at {oldest}, after the time"


def _commit_time(c, repo, rev):
    rc, out, _ = _git(c, repo, "log", "-1", "--format=%ct%x09%s", rev)
    if rc != 0 or not out.strip():
        return None, None
    stamp, _, subject = out.decode("utf-8", "replace").strip().partition("\t")
    return int(stamp), subject


def repo_at(c, repo, when, files, keep_blobs, blobs):
    """Everything about ``repo`` at ``when`` (see the module docstring)."""
    rc, out, err = _git(c, repo, "rev-parse", "--show-toplevel")
    if rc != 0:
        return {"error": "not a git repository" if "not a git" in err else err[-200:]}
    top = out.decode().strip()
    rc, out, _ = _git(c, repo, "rev-list", "--max-parents=0", "HEAD")
    roots = out.decode().split()
    first = min((_commit_time(c, repo, r)[0] or 0) for r in roots) if roots else None
    sha, how = head_from_reflog(c, repo, when)
    result = {"first_commit_time": first, "toplevel": top}
    if sha is not None:
        result.update(how)
        result["method"] = "reflog"
    else:
        result["reflog"] = how
        rc, out, _ = _git(c, repo, "rev-list", "-1", f"--min-age={int(when)}", "HEAD")
        sha = out.decode().strip() or None
        result["method"] = "last-commit-before" if sha else "none"
    if sha is None:
        return result
    stamp, subject = _commit_time(c, repo, sha)
    result.update({"head": sha, "commit_time": stamp, "subject": subject})
    result["requirements"] = _requirements(c, repo, sha)
    result["files"] = _files_at(c, repo, top, sha, files, keep_blobs, blobs)
    return result


def _show(c, repo, sha, rel):
    rc, out, _ = _git(c, repo, "cat-file", "blob", f"{sha}:{rel}")
    return out if rc == 0 else None


def _requirements(c, repo, sha):
    out = {}
    for name in REQUIREMENT_FILES:
        data = _show(c, repo, sha, name)
        if data is not None:
            out[name] = data.decode("utf-8", "replace")
    return out


def _files_at(c, repo, top, sha, files, keep_blobs, blobs):
    """path -> its facts at commit ``sha``, for the ``files`` inside ``top``."""
    out = {}
    real_top = os.path.realpath(top)
    for path in files:
        real = os.path.realpath(path)
        if not real.startswith(real_top + os.sep):
            continue
        rel = os.path.relpath(real, real_top)
        data = _show(c, repo, sha, rel)
        if data is None:
            out[path] = {"exists": False}
            continue
        digest = hashlib.sha256(data).hexdigest()
        blob = None
        if keep_blobs and len(data) <= keep_blobs:
            keep_bytes(blobs, digest, data)
            blob = digest
        out[path] = {"sha256": digest, "size": len(data), "blob": blob}
    return out


def _installed_time(info_dir):
    stamps = []
    for path in (info_dir, os.path.join(info_dir, "INSTALLER"), os.path.join(info_dir, "RECORD")):
        with contextlib.suppress(OSError):
            stamps.append(os.stat(path).st_mtime)
    return max(stamps) if stamps else None


def installed_packages():
    """name -> {version, installed (time), dist_info}; the first of a name wins."""
    out = {}
    for entry in sys.path:
        entry = entry or os.getcwd()
        if not os.path.isdir(entry):
            continue
        for name, version, meta_file, info_dir in named_distributions(entry):
            if normalise(name) in out:
                continue
            out[normalise(name)] = {
                "version": version,
                "installed": _installed_time(info_dir or meta_file),
                "dist_info": info_dir or meta_file,
            }
    return out


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def previous_envs():
    """Other venvs beside this one (``.venv-old``, ``venv.bak``): a user who rebuilt an
    environment often kept the old one."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix):
        return []
    here = os.path.realpath(sys.prefix)
    parent = os.path.dirname(here)
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(parent, name)
        if os.path.realpath(path) != here and os.path.isfile(os.path.join(path, "pyvenv.cfg")):
            out.append(path)
    return out


def kept_wheels(uv_cache, pip_cache, find_links, envs=()):
    """name -> [{version, source, path, time}] of every older build the machine keeps."""
    found = []
    for env in envs:
        for info in glob.glob(os.path.join(env, "lib", "python*", "site-packages", "*.dist-info")):
            found.append(
                (
                    "previous venv",
                    info,
                    _DIST_INFO.match(os.path.basename(info)),
                    _installed_time(info),
                )
            )
    if uv_cache:
        # uv unpacks each wheel it fetched once, into archive-v<N>/<id>/: the directory's
        # mtime is when that happened.
        for info in glob.glob(os.path.join(uv_cache, "archive-v*", "*", "*.dist-info")):
            found.append(
                (
                    "uv cache",
                    info,
                    _DIST_INFO.match(os.path.basename(info)),
                    _mtime(os.path.dirname(info)),
                )
            )
    if pip_cache:
        for whl in glob.glob(os.path.join(pip_cache, "wheels", "**", "*.whl"), recursive=True):
            found.append(("pip cache", whl, _WHEEL.match(os.path.basename(whl)), _mtime(whl)))
    for links in find_links:
        for whl in glob.glob(os.path.join(links, "*.whl")):
            found.append(("find-links", whl, _WHEEL.match(os.path.basename(whl)), _mtime(whl)))
    out = {}
    for source, path, match, stamp in found:
        if match is None or stamp is None:
            continue
        out.setdefault(normalise(match.group("name")), []).append(
            {"version": match.group("version"), "source": source, "path": path, "time": stamp}
        )
    return {k: sorted(v, key=lambda e: (e["time"], e["path"])) for k, v in sorted(out.items())}


def _tree_mtime(path):
    if os.path.isdir(path):
        stamps = [_mtime(path) or 0.0]
        for _rel, _size, stamp_ns in walk(path):
            stamps.append(stamp_ns / 1e9)
        return max(stamps)
    return _mtime(path)


def loose_paths(c, paths, data_map):
    """path -> {mtime, exists} (directories: their newest entry); a data_map copy's facts."""
    out = {}
    for path in paths:
        entry = {"exists": os.path.exists(path), "mtime": _tree_mtime(path)}
        copy = data_map.get(path)
        if copy and os.path.exists(copy):
            try:
                facts = data_dir(copy) if os.path.isdir(copy) else data_file(c, copy)
                entry["copy"] = {"path": copy, "mtime": _tree_mtime(copy), "facts": facts}
            except OSError as exc:
                c.error("data", f"{copy}: {exc.strerror or exc}")
        out[path] = entry
    return out


def main(params):
    c = Collector(params)
    when = float(params["as_of"])
    blobs = blob_store(())  # streamed back as found (agent.channel.BlobStream)
    repos = {}
    files = list(params.get("files") or [])
    for repo in params.get("repos") or []:
        try:
            repos[repo] = repo_at(c, repo, when, files, params.get("keep_blobs"), blobs)
        except (OSError, Timeout) as exc:
            repos[repo] = {"error": str(exc)}
    home_cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    uv_cache = os.environ.get("UV_CACHE_DIR") or os.path.join(home_cache, "uv")
    pip_cache = os.environ.get("PIP_CACHE_DIR") or os.path.join(home_cache, "pip")
    return {
        "repos": repos,
        "packages": installed_packages(),
        "kept_wheels": kept_wheels(
            params.get("uv_cache") or uv_cache,
            params.get("pip_cache") or pip_cache,
            params.get("find_links") or [],
            previous_envs(),
        ),
        "loose": loose_paths(
            c, files + list(params.get("data") or []), params.get("data_map") or {}
        ),
        "blobs": blobs if isinstance(blobs, dict) else {},
        "errors": c.errors,
    }
