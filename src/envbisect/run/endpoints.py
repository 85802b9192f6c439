"""A run's endpoint states: the good and bad manifests (the bad one a fresh snapshot
saved in the session by default), the actuator that realizes states between them, and
``run --print-command``'s command line of the good state."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from envbisect.model import manifest as mf
from envbisect.model.errors import UsageError
from envbisect.model.session import Session
from envbisect.model.sources import Sources
from envbisect.realize.actuate import Actuator
from envbisect.run.options import RunOptions
from envbisect.run.progress import Progress, quiet
from envbisect.run.triallog import env_diff

if TYPE_CHECKING:
    from envbisect.diff import DiffResult


def load_states(
    options: RunOptions, session_root: Path, progress: Progress
) -> tuple[mf.Manifest, mf.Manifest, Path]:
    """The good manifest, and the bad one (a fresh snapshot saved in the session by default)."""
    good = mf.load(options.good)
    if options.bad is not None:
        return good, mf.load(options.bad), options.bad
    saved = session_root / "bad.yaml"
    if saved.exists():
        return good, mf.load(saved), saved
    from envbisect.snapshot import take_snapshot

    progress("taking a snapshot of the current state (the bad side) …")
    config = options.config
    if config is None:
        from envbisect.model.config import Config

        config = Config.load(cwd=options.cwd)
    snap = take_snapshot(config, options.transport, options.python, label="bad")
    session_root.mkdir(parents=True, exist_ok=True)
    from envbisect.model.trust import sign

    mf.save(sign(snap), saved)
    return good, mf.load(saved), saved


def make_actuator(
    options: RunOptions,
    good: mf.Manifest,
    bad: mf.Manifest,
    diff: DiffResult,
    session: Session,
    progress: Progress,
) -> Actuator:
    """The actuator that realizes this run's states, as envbisect.yaml configures it."""
    config = options.config
    return Actuator(
        good=good,
        bad=bad,
        units=diff.units,
        session=session,
        python=options.python,
        transport=options.transport,
        sources=Sources.from_config(config),
        data_map=dict(getattr(config, "data_map", {}) or {}),
        blob_dirs=(config.blobs_dir,) if config is not None else (),
        cwd=options.cwd,
        on_note=lambda line: progress(f"note: {line}"),
    )


def good_command_line(options: RunOptions) -> str:
    """``run --print-command``: the whole command the good state runs — its cwd, how its
    environment differs from this one, its interpreter and argv as mapped into the state
    (worktree paths are where the run makes them). Nothing is realized."""
    import shlex

    from envbisect.diff import diff_manifests

    good = mf.load(options.good)
    saved = options.session_dir / "bad.yaml"
    bad_path = options.bad or (saved if saved.exists() else None)
    bad = mf.load(bad_path) if bad_path is not None else good
    data_map = dict(getattr(options.config, "data_map", {}) or {})
    diff = diff_manifests(good, bad, data_map=data_map)
    act = make_actuator(options, good, bad, diff, Session(options.session_dir), quiet)
    plan = act.preview(frozenset(), options.session_dir / "trials" / "001")
    if plan.failure:
        raise UsageError(f"the good state cannot be realized: {plan.failure}")
    changed = env_diff(plan.env)
    words = ["env", *(w for k in changed["unset"] for w in ("-u", k))]
    words += [f"{k}={v}" for k, v in changed["set"].items()]
    command = shlex.join([*words, *plan.command_argv(options.smoke.argv)])
    cwd = plan.cwd or options.cwd or Path.cwd()
    return f"cd {shlex.quote(str(cwd))} && {command}"
