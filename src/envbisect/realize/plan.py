"""The plan of one state, built from every section's realizer (``envbisect.model.plan``
says what a realizer does and what a plan holds).

The plan is the same for a local and a remote target; only its executor differs (see
``envbisect.realize.execute``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from envbisect import sections
from envbisect.model.manifest import Manifest
from envbisect.model.plan import Context, Plan, Realizer, Sandbox


def realizers() -> dict[str, Realizer]:
    """Section name → its realizer, in plan order: packages, git (worktrees), files (into
    them), env (overrides what packages set), caches, data."""
    found = [s.realizer for s in sections.known() if s.realizer is not None]
    return {r.section: r for r in sorted(found, key=lambda r: r.order)}


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
    return replace(plan, env=plan.mapper.env(plan.env))
