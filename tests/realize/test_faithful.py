"""bisect/faithful.py: what a realized state should be, and how it differs."""

from __future__ import annotations

import sys
from pathlib import Path

from envbisect.model.manifest import Manifest
from envbisect.realize.faithful import check_state, compare, expected_facts
from envbisect.transport import Transport


def _m(**sections: object) -> Manifest:
    return Manifest(sections=dict(sections))


def test_expected_is_good_plus_applied_and_the_rest_as_the_target_is() -> None:
    good = _m(packages={"ebwork": {"version": "1.0"}, "same": {"version": "2"}})
    bad = _m(
        packages={
            "ebwork": {"version": "3.0"},
            "same": {"version": "2"},
            "New_Pkg": {"version": "1"},
        },
        python={"version": "3.11.7", "implementation": "cpython"},
    )
    values = {
        ("packages", "ebwork"): (good, {"version": "1.0"}),  # not applied: the good value
        ("packages", "New_Pkg"): (good, None),  # not applied: absent
        ("files", "/r/a.py"): (bad, {"sha256": "f" * 64}),
        ("env", "EB_SLOW"): (bad, "8"),
        ("git", "/r"): (good, {"head": "a" * 40}),
    }
    expected = expected_facts(good, bad, values, {"/r/a.py": "/wt/a.py", "/r": "/wt"})
    assert expected == {
        ("python", "version"): "3.11.7",
        ("python", "implementation"): "cpython",
        ("packages", "ebwork"): "1.0",
        ("packages", "new-pkg"): None,
        ("packages", "same"): "2",
        ("files", "/wt/a.py"): "f" * 64,
        ("env", "EB_SLOW"): "8",
        ("git", "/wt"): "a" * 40,
    }
    realized = {
        "python": {"version": "3.11.7", "implementation": "cpython"},
        "packages": {"ebwork": {"version": "3.0"}, "same": {"version": "2"}},
        "files": {"/wt/a.py": {"sha256": "e" * 64}},
        "env": {},
        "git": {"/wt": {"head": "a" * 40}},
    }
    assert compare(expected, realized) == [
        "packages ebwork 3.0, expected 1.0 (a copy outside the state's venv shadows it?)",
        "env EB_SLOW unset, expected '8'",
        f"files /wt/a.py {'e' * 12}, expected {'f' * 12}",
    ]


def test_check_state_snapshots_the_real_interpreter(tmp_path: Path) -> None:
    f = tmp_path / "knob.txt"
    f.write_text("1\n")
    import hashlib

    sha = hashlib.sha256(b"1\n").hexdigest()
    expected = {("files", str(f)): sha, ("env", "EB_X"): "1", ("packages", "no-such-pkg"): None}
    ok = check_state(
        transport=Transport(),
        python=sys.executable,
        env={"EB_X": "1", "PATH": "/usr/bin:/bin"},
        expected=expected,
        log_dir=tmp_path / "log",
    )
    assert ok.faithful and ok.checked == 3, ok.differences
    bad = check_state(
        transport=Transport(),
        python=sys.executable,
        env={"PATH": "/usr/bin:/bin"},
        expected={**expected, ("packages", "pytest"): None},
        log_dir=tmp_path / "log",
    )
    assert not bad.faithful
    assert bad.differences[0] == "env EB_X unset, expected '1'"
    assert (
        bad.differences[1].startswith("packages pytest ")
        and "expected absent" in bad.differences[1]
    )
    assert bad.summary().startswith(
        "state not faithful: env EB_X unset, expected '1'; packages pytest"
    )
