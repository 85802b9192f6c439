"""Ctrl-C, SIGTERM and SIGHUP during ``run``, latched.

Each raises ``KeyboardInterrupt`` in the main thread (files restored, session saved, exit
130), and also sets :data:`LATCH`. The exception alone can be lost: Python raises it at the
main thread's next bytecode, and when that bytecode is a finalizer's (a ``__del__`` run by the
garbage collector) it is printed as "Exception ignored" and the run goes on. A trial asks
:func:`pending` before each process it starts and after it is done, so a run stops anyway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

LATCH = threading.Event()
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    LATCH.set()
    raise KeyboardInterrupt(f"signal {signum}")


def pending() -> bool:
    """True once a signal came during this run, whether or not its exception was seen."""
    return LATCH.is_set()


@contextmanager
def latched() -> Iterator[None]:
    """The signals latched for the block (main thread only; elsewhere nothing changes); the
    latch clear at its start and at its end, the previous handlers back at its end."""
    LATCH.clear()
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS} if main else {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        LATCH.clear()
