"""The plan of one state, built from every section's realizer (``envbisect.model.plan``
says what a realizer does and what a plan holds).

The plan is the same for a local and a remote target; only its executor differs (see
``envbisect.realize.execute``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from envbisect import sections
from envbisect.model.manifest import Manifest
from envbisect.model.plan import Context, Plan, Realizer, Sandbox


def realizers() -> dict[str, Realizer]:
    """Section name → its realizer, in plan order (``sections.PLAN_ORDER``)."""
    found = [s.realizer for s in sections.known() if s.realizer is not None]
    return {r.section: r for r in sorted(found, key=lambda r: sections.plan_position(r.section))}


def make_plan(
    ctx: Context,
    sandbox: Sandbox,
    values: Mapping[tuple[str, str], tuple[Manifest, Any]],
    env: Mapping[str, str],
) -> Plan:
    """The plan of one state: every realizer's part, in :func:`realizers` order, on top of
    the environment ``env`` trials start from."""
    origin = str(sandbox.origin) if sandbox.local else None
    plan = Plan(python=ctx.python, env=dict(env), cwd=sandbox.cwd, origin=origin)
    for section, realizer in realizers().items():
        mine = {key: v for (s, key), v in values.items() if s == section}
        plan = realizer.plan(ctx, sandbox, mine, plan)
        if plan.failure:
            return plan
    # Longest prefixes first, so a dataset inside a repo wins over the repo.
    plan = replace(plan, path_map=tuple(sorted(plan.path_map, key=lambda p: -len(p[0]))))
    # PYTHONPATH names the state's packages too (``python -m pkg.mod`` from elsewhere).
    pinned = tuple(sorted(str(key) for (section, key) in values if section == "env"))
    return replace(plan, env=plan.mapper.env(plan.env), pinned_env=pinned)


def local_sandbox(
    root: Path, trial_dir: Path, origin: Path, cwd: Path | None, python: str, env: Mapping[str, str]
) -> Sandbox:
    """Where a trial's state goes on this machine: under the session dir ``root``."""
    prefix = Path(python).parent.parent
    return Sandbox(
        root=str(root),
        trial=str(trial_dir),
        origin=origin,
        cwd=cwd,
        path=env.get("PATH", ""),
        in_venv=os.path.isabs(python) and (prefix / "pyvenv.cfg").exists(),
    )


def remote_sandbox(root: str, trial: str, origin: Path, path: str) -> Sandbox:
    """Where a trial's state goes on a remote target: under the remote session dir ``root``
    (``path``: the far process's PATH)."""
    return Sandbox(
        root=root,
        trial=f"{root}/trials/{trial}",
        origin=origin,
        cwd=None,  # a cwd of this machine means nothing there; a worktree sets one
        path=path,
        in_venv=False,
        local=False,
    )
