"""A trivial agent: returns its parameters and where it ran. Used to probe a layer chain."""

from __future__ import annotations

import os
import sys


def main(params):
    return {
        "params": params,
        "python": sys.executable,
        "version": list(sys.version_info[:3]),
        "cwd": os.getcwd(),
        "pid": os.getpid(),
    }
