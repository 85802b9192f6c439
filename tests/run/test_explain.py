"""explain.py: what a culprit changed, shown (content diffs, commits, versions)."""

from __future__ import annotations

from envbisect.diff import Change, ChangeKind, Unit
from envbisect.run.explain import file_diff, package_lines


def test_file_diff_is_unified_and_truncated_sensibly() -> None:
    old = "".join(f"line {i}\n" for i in range(200)).encode()
    new = "".join(f"line {i}{'!' if i % 2 else ''}\n" for i in range(200)).encode()
    lines = file_diff("/x.py", old, new, limit=10)
    assert lines[:2] == ["--- /x.py (good)", "+++ /x.py (bad)"]
    assert (
        len(lines) == 11 and lines[-1].startswith("… ") and lines[-1].endswith(" more diff lines")
    )


def test_file_diff_of_binary_or_unstored_content_says_so() -> None:
    assert file_diff("/b", b"\xff\x00", b"\xfe") == ["(binary content: 2 → 1 bytes)"]
    assert file_diff("/b", None, b"x") == [
        "(the good content of /b is not in the blob store: no diff to show)"
    ]


def test_package_lines_show_the_version_change_and_what_it_pulled_in() -> None:
    changes = (
        Change("packages", "torch", "2.10.0", "2.11.0", ChangeKind.UPGRADED),
        Change("packages", "nvidia-nccl-cu13", None, "2.28.9", ChangeKind.ADDED),
        Change("packages", "nvidia-nccl-cu12", "2.27.5", None, ChangeKind.REMOVED),
    )
    unit = Unit("torch-stack", "torch-stack", "torch stack", changes, True)
    assert package_lines(unit) == [
        "torch 2.10.0 → 2.11.0",
        "pulled in: nvidia-nccl-cu13 2.28.9",
        "removed: nvidia-nccl-cu12 2.27.5",
    ]
