"""Output paths (snapshot -o, run --json/--report, probe --json): written atomically over a
regular file or a new name only; a device, FIFO, socket, directory or symlink is refused in
one line, and left as it was."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envbisect.model.paths import atomic_write_text
from tests.helpers_run import manifest
from tests.helpers_user_repo import envbisect


def _nodes(tmp_path: Path) -> dict[str, tuple[Path, Callable[[int], bool]]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    (tmp_path / "real").write_text("keep\n")
    link.symlink_to(tmp_path / "real")
    out = {"a FIFO": (fifo, stat.S_ISFIFO), "a symlink": (link, stat.S_ISLNK)}
    if os.geteuid() == 0:
        null = tmp_path / "null"  # the machine's /dev/null, made again beside the test
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        out["a device"] = (null, stat.S_ISCHR)
    return out


RUN = ["run", "--bad", "bad.yaml", "--good", "good.yaml", "--until-ktoks", "1k"]


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "-o", "{node}"],
        [*RUN, "--json", "{node}", "--", "true"],
        [*RUN, "--report", "{node}", "--", "true"],
        ["probe", "--json", "{node}", "--", sys.executable, "-c", "pass"],
    ],
    ids=["snapshot-o", "run-json", "run-report", "probe-json"],
)
def test_an_output_over_a_node_is_refused_and_the_node_left(
    tmp_path: Path, argv: list[str]
) -> None:
    manifest(tmp_path / "good.yaml", env={"OMP_NUM_THREADS": "2"})
    manifest(tmp_path / "bad.yaml", env={"OMP_NUM_THREADS": "1"})
    for kind, (node, is_kind) in _nodes(tmp_path).items():
        proc = envbisect(tmp_path, *[a.replace("{node}", str(node)) for a in argv])
        assert proc.returncode == 2, (kind, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert lines[-1] == (
            f"envbisect: error: {argv[argv.index('{node}') - 1]} {node}: is {kind}; envbisect "
            "writes only over a regular file or a new name (use - for stdout)"
        ), proc.stderr
        assert "Traceback" not in proc.stderr
        assert is_kind(os.lstat(node).st_mode), kind
    assert (tmp_path / "real").read_text() == "keep\n"


def test_the_atomic_writer_itself_refuses_a_node(tmp_path: Path) -> None:
    from envbisect.model.errors import UsageError

    for kind, (node, is_kind) in _nodes(tmp_path).items():
        with pytest.raises(UsageError, match=f"is {kind}"):
            atomic_write_text(node, "x")
        assert is_kind(os.lstat(node).st_mode)
    atomic_write_text(tmp_path / "new" / "file.json", "x")  # a new name: written
    atomic_write_text(tmp_path / "new" / "file.json", "y")  # a regular file: replaced
    assert (tmp_path / "new" / "file.json").read_text() == "y"
