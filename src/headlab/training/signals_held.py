"""Signals held while a group of files is written, so that an interrupt cannot land between two of them.

A pack writes each member's last.ckpt in turn. Where SLURM warns its job (USR2: submitit requeues it and exits
at once) or stops it between two of those writes, the members would continue from different steps, and a
continued pack trains only members at one step together: it would split into packs of one. Held here, the signal
is handled once the last file is written.
"""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@contextmanager
def held() -> Iterator[None]:
    """Run the block with the Python handlers of SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 (Lightning's, submitit's,
    headlab's) held: a signal that arrives meanwhile is handled, by the handler it would have reached, once the
    block ends. Signals without a Python handler (default, ignored) are left as they are; outside the main thread,
    where Python cannot set handlers, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    handlers = {s: h for s in HELD if callable(h := signal.getsignal(s))}
    for number in handlers:
        signal.signal(number, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        for signum, frame in caught:
            handlers[signum](signum, frame)
