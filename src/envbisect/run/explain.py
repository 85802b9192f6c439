"""What a culprit changed, shown rather than hashed: for a report worth pasting into an issue.

- a file: the unified diff of its two contents from the blob store (truncated sensibly);
- a git repo: the commit range and the subjects of its commits (the first bad one marked);
- packages: each version change, and what the change pulled in or dropped;
- env: the value change (the culprit sentence already says it; nothing more here).

Pure functions over a unit and a way to read blobs and commits; nothing prints.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envbisect.model import gitcli
from envbisect.sections.files import FileEntry
from envbisect.sections.git import GitEntry
from envbisect.sections.packages import PackageEntry

DIFF_LINES = 80  # lines of a content diff shown before "… N more lines"
COMMITS = 20  # commit subjects shown before "… N more commits"


def file_diff(
    path: str, old: bytes | None, new: bytes | None, limit: int = DIFF_LINES
) -> list[str]:
    """A unified diff of two contents of ``path``; a note when one is unknown or binary."""
    if old is None or new is None:
        side = "good" if old is None else "bad"
        return [f"(the {side} content of {path} is not in the blob store: no diff to show)"]
    try:
        a, b = old.decode("utf-8"), new.decode("utf-8")
    except UnicodeDecodeError:
        return [f"(binary content: {len(old):,} → {len(new):,} bytes)"]
    lines = list(
        difflib.unified_diff(
            a.splitlines(), b.splitlines(), f"{path} (good)", f"{path} (bad)", lineterm=""
        )
    )
    if len(lines) > limit:
        more = len(lines) - limit
        lines = [*lines[:limit], f"… {more} more diff lines"]
    return lines


def commit_lines(
    repo: str,
    old: str,
    new: str,
    first_bad: str | None,
    limit: int = COMMITS,
    via: gitcli.Exec | None = None,
) -> list[str]:
    """``old..new`` with one line per commit (oldest first, the first bad one marked), read
    from the repo where it is (``via``: on the target); a note when it cannot be read."""
    proc = gitcli.log_subjects(repo, old, new, via)
    head = f"commits {old[:12]}..{new[:12]} in {repo}"
    if proc.returncode != 0:
        return [f"{head}: cannot be listed here ({proc.stderr.strip()[:120] or 'git failed'})"]
    commits = [line.split(" ", 1) for line in proc.stdout.splitlines() if line.strip()]
    out = [f"{head} ({len(commits)}):"]
    for sha, *subject in commits[:limit]:
        mark = "  ← first bad commit" if first_bad and sha == first_bad else ""
        out.append(f"{sha[:12]} {subject[0] if subject else ''}{mark}")
    if len(commits) > limit:
        out.append(f"… {len(commits) - limit} more commits")
    return out


def package_lines(unit: Any) -> list[str]:
    """``ebwork 1.0 → 3.0`` per package change, then what came or went with it."""
    changed, added, removed = [], [], []
    for c in unit.changes:
        if c.section != "packages":
            continue
        old, new = _version(c.old), _version(c.new)
        if old is None:
            added.append(f"{c.key} {new}")
        elif new is None:
            removed.append(f"{c.key} {old}")
        else:
            changed.append(f"{c.key} {old} → {new}")
    out = list(changed)
    if added:
        out.append(("pulled in: " if changed else "added: ") + ", ".join(added))
    if removed:
        out.append("removed: " + ", ".join(removed))
    return out


def _version(value: Any) -> str | None:
    entry = PackageEntry.of(value)
    return None if entry is None else str(entry.version)


def details(
    unit: Any,
    commit: str | None,
    *,
    good: Any,
    bad: Any,
    blob: Callable[[Any, dict[str, Any]], Path | None],
    via: gitcli.Exec | None = None,
) -> tuple[str, ...]:
    """The lines that show what ``unit`` changed (see the module docstring)."""
    out: list[str] = []
    if unit.section in ("packages", "torch-stack"):
        out += package_lines(unit)
    for c in unit.changes:
        if c.section == "files":
            old = _content(good, good.section("files").get(c.key), blob)
            new = _content(bad, bad.section("files").get(c.key), blob)
            out += file_diff(str(c.key), old, new)
        elif c.section == "git":
            g = GitEntry.of(good.section("git").get(c.key)).head
            b = GitEntry.of(bad.section("git").get(c.key)).head
            if g and b:
                out += commit_lines(str(c.key), str(g), str(b), commit, via=via)
    return tuple(out)


def _content(
    manifest: Any, entry: Any, blob: Callable[[Any, dict[str, Any]], Path | None]
) -> bytes | None:
    file = FileEntry.of(entry)
    if file is None or file.sha256 is None:
        return b"" if entry is None else None  # absent on that side: empty
    path = blob(manifest, entry)
    try:
        return path.read_bytes() if path is not None else None
    except OSError:
        return None
