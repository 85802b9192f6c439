"""``run --profile``: the culprit's evidence, good state and culprit state, run once each
with a few training steps under torch.profiler (``agent/kernel_profile.py``), and the two tables
compared kernel by kernel (``model.kernels``).

The states are the ones that proved the culprit (the first culprit's evidence: a repo's
first bad commit against the commit before it, else good vs the culprit alone on top of
good), realized as their trials were; the runs' logs, facts and Chrome traces are kept in
the session's ``profile/good`` and ``profile/culprit``.
"""

from __future__ import annotations

from pathlib import Path

from envbisect.model.kernels import KernelDiff, ProfileRequest, ProfileTable, diff
from envbisect.run import probed
from envbisect.run.progress import Progress
from envbisect.run.trial import TrialRunner
from envbisect.search import SearchResult, State


def evidence_states(result: SearchResult) -> tuple[State, State] | None:
    """(good, bad) of the first culprit's evidence, or None when no culprit was found."""
    if not result.culprits:
        return None
    found = result.culprits[0]
    evidence = next((n.evidence for n in found.narrowed if n.evidence is not None), found.alone)
    return evidence.good.state, evidence.bad.state


def profile_culprit(
    result: SearchResult,
    tester: TrialRunner,
    request: ProfileRequest | None,
    progress: Progress,
) -> tuple[KernelDiff | None, str | None]:
    """The kernel diff of the culprit's evidence, or None and why there is none (nothing
    at all when no profile was asked for)."""
    if request is None:
        return None, None
    states = evidence_states(result)
    if states is None:
        return None, "--profile: no culprit, nothing profiled"
    tables = []
    for label, state in zip(("good", "culprit"), states, strict=True):
        progress(f"profiling the {label} state: {request.steps} steps after {request.skip} warm-up")
        log_dir = tester.profile(state, label, request)
        table, why = _table(log_dir)
        if table is None:
            return None, f"--profile: the {label} state: {why} (logs in {log_dir})"
        tables.append(table)
    return diff(tables[0], tables[1]), None


def _table(log_dir: Path) -> tuple[ProfileTable | None, str]:
    facts = probed.read_facts(log_dir / f"profile{probed.FACTS_SUFFIX}")
    if facts is None:
        return None, "no facts came back"
    try:
        return ProfileTable.from_facts(facts), ""
    except ValueError as exc:
        return None, str(exc)
