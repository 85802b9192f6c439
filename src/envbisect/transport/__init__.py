"""Every subprocess envbisect starts goes through here.

A Transport is a chain of layers (outermost first) in front of a target command. A layer is
an argv prefix plus a kind: an ``argv`` layer (pct, docker exec, kubectl exec, srun, sudo,
env, any custom prefix) puts its words in front of the command; a ``shell`` layer (ssh,
``sh -c``, ``bash -lc``, ``su -c``) takes the rest of the command as **one** quoted string,
because that is what those tools hand to a shell on the far side. Composition folds from the
innermost layer outwards and the result is run with no local shell, so no word is ever
quoted by hand.

``parse_layer`` turns one ``--via`` value into a Layer: it is split with ``shlex.split`` (never
by a shell), its kind is inferred from the first word (``argv:`` / ``shell:`` override it),
and known tools are checked and fixed up before anything runs:

- ssh gets ``-T -o BatchMode=yes``; ``-t``/``-n``/``-N``/``-f`` and words after the
  destination are errors (a tty mangles bytes, ``-n`` eats the program on stdin);
- docker/podman/kubectl exec get ``-i`` and must not have ``-t``;
- pct exec / kubectl exec / lxc-attach end with ``--`` (added when absent; words after it are
  an error, as are words after the VMID/pod, which would be ambiguous);
- srun gets ``-n1`` (another task count would run the program several times);
- ``lxc exec`` / ``incus exec`` end with ``--`` like pct; ``sudo -i``/``-s`` are refused
  (sudo re-joins the words for a shell and leaves ``$`` unescaped);
- ``sh -c`` / ``bash -lc`` / ``su -c`` must end with their ``-c`` option.

Quoting for shell layers is POSIX single-quoting, stricter than ``shlex.quote`` (a bare
``=word`` is quoted too, since zsh expands it), so the far shell may be sh, dash, bash, ksh or
zsh (not csh or fish). Tests replace ``Transport`` or point layers at faithful fakes on PATH.
"""

from __future__ import annotations

from envbisect.transport.layers import Layer, LayerKind, parse_layer, shell_join, shell_quote
from envbisect.transport.process import MAX_ARG_BYTES, ProcessResult, Transport, kill_running
from envbisect.transport.reaper import RUN_TAG_ENV

__all__ = [
    "MAX_ARG_BYTES",
    "RUN_TAG_ENV",
    "Layer",
    "LayerKind",
    "ProcessResult",
    "Transport",
    "kill_running",
    "parse_layer",
    "shell_join",
    "shell_quote",
]
