"""Packs trained side by side (hydra.launcher.n_jobs > 1): each pack in its own process, with its share of the CPU
cores as torch threads and, on a GPU machine, its own GPU (pack slot k -> GPU k mod the number of GPUs).

On a CPU the workers are forked from a forkserver that imported torch and Lightning once: those imports (seconds of
CPU) run once instead of once a pack, and a later worker starts in milliseconds. It takes the launcher's environment.
With GPUs each starts fresh (spawn): nothing may have touched CUDA in a process that forks.

The parent keeps every job's record: a worker sends back each member's results.json fields or error and the
parent closes the jobs. A worker that dies without answering (killed, out of memory) fails its own pack only.
"""

import logging
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait

from headlab.launch import console

log = logging.getLogger("headlab")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, as the parent logs
PRELOAD = ["headlab.launch.forkserver_preload"]  # what the forkserver imports once: torch, Lightning, the training


class RemoteTraceback(Exception):
    """Where a worker's error was raised, shown as its cause (concurrent.futures does the same)."""

    def __str__(self) -> str:
        return self.args[0]


def gpu_for_slot(slot: int, n_gpus: int, visible: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES of pack slot `slot`: GPU slot mod n_gpus, among the GPUs this process may see."""
    ids = visible.split(",") if visible else [str(i) for i in range(n_gpus)]
    return ids[slot % len(ids)]


def _portable(result):
    """A result that survives the pipe: fields as they are; an error as (error, its traceback's text), or as a
    RuntimeError naming it when it cannot be pickled."""
    if not isinstance(result, BaseException):
        return result
    text = "".join(traceback.format_exception(result))
    try:
        pickle.loads(pickle.dumps(result))
    except Exception:
        result = RuntimeError(f"{type(result).__name__}: {result}")
    return (result, text)


def _restore(result):
    if isinstance(result, tuple):
        error, text = result
        error.__cause__ = RemoteTraceback(text)
        return error
    return result


def _stop_with(launcher: int) -> None:
    """SIGTERM to this worker once the launcher has ended, also by SIGKILL (Linux's pidfd, watched by a thread): it
    saves its members' last.ckpt and exits instead of training on with nobody to record it."""
    try:
        ended = os.pidfd_open(launcher)
    except ProcessLookupError:  # ended already
        os.kill(os.getpid(), signal.SIGTERM)
        return
    except (OSError, AttributeError):  # not Linux: the launcher's finally stops its workers when it can
        return

    def watch() -> None:
        select.select([ended], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _work(
    conn, train: Callable, members: list, pack_id: str, threads: int, gpu: str | None, environ: dict, launcher: int
) -> None:
    """A worker: train one pack and send each member's result."""
    os.environ.clear()  # the launcher's now, not the forkserver's when it started
    os.environ.update(environ)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu  # before CUDA starts in this process
    console.to_stderr(LOG_FORMAT)  # the parent's Hydra logging is not inherited: headlab's lines as it logs them
    from headlab.launch.job import stop_on_sigterm

    signal.signal(signal.SIGTERM, stop_on_sigterm)  # outside Lightning's loops too: an interrupt, recorded
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the launcher stops us
    _stop_with(launcher)
    import torch

    torch.set_num_threads(threads)
    try:
        results = train(members, pack_id, progress=False)
    except BaseException as error:  # an interrupt before or after the fit
        results = [error] * len(members)
    conn.send([_portable(r) for r in results])


def run_parallel(
    packs: list, train: Callable, n_jobs: int, threads: int, n_gpus: int, start: Callable, done: Callable
) -> None:
    """Train packs [(pack id, members)] n_jobs at a time; start(k) as each pack k starts and done(k, results) as it
    ends, in the parent.
    An interrupt of the parent (or an error raised by done) stops every worker with SIGTERM, each saving its
    members' last.ckpt, and is raised once they have exited."""
    context = multiprocessing.get_context("spawn" if n_gpus else "forkserver")
    if not n_gpus:
        context.set_forkserver_preload(PRELOAD)
    pending, running = list(enumerate(packs)), {}  # connection -> (k, process)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while pending or running:
            while pending and len(running) < n_jobs:
                k, (pack_id, members) = pending.pop(0)
                start(k)
                slot = min(set(range(n_jobs)) - {s for _, _, s in running.values()})  # a free one
                gpu = gpu_for_slot(slot, n_gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if n_gpus else None
                receive, send = context.Pipe(duplex=False)
                args = (send, train, members, pack_id, threads, gpu, dict(os.environ), os.getpid())
                process = context.Process(target=_work, args=args)
                process.start()
                send.close()
                running[receive] = (k, process, slot)
            for receive in wait(list(running)):
                k, process, _ = running.pop(receive)
                try:
                    results = [_restore(r) for r in receive.recv()]
                except EOFError:
                    process.join()
                    why = f"the process training pack {packs[k][0]} ended with exit code {process.exitcode} "
                    results = [RuntimeError(why + "before reporting (killed? out of memory?)")] * len(packs[k][1])
                process.join()
                done(k, results)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for _, process, _ in running.values():
            process.terminate()  # SIGTERM: Lightning stops at its next step, last.ckpt is saved
        _stopped(running, packs, done)


def _stopped(running: dict, packs: list, done: Callable, patience: float = 300) -> None:
    """The stopped workers' results, read as they send them (a pack's results may be more than a pipe holds: a
    worker blocked in its send would never exit) and recorded by done; a worker still alive after `patience`
    seconds is killed."""
    deadline = time.monotonic() + patience
    while running and (left := deadline - time.monotonic()) > 0:
        for receive in wait(list(running), timeout=left):
            k, process, _ = running.pop(receive)
            try:
                results = [_restore(r) for r in receive.recv()]
            except EOFError:  # it ended without a word (killed): its members keep the records they have
                results = None
            process.join()
            if results is not None:
                try:
                    done(k, results)
                except Exception as error:  # recording one pack must not hide the interrupt being raised
                    log.warning("pack %s: its results could not be recorded: %s", packs[k][0], error)
    for _, process, _ in running.values():
        process.kill()
        process.join()


def _raise_interrupt(signum, frame) -> None:
    raise SystemExit(128 + signum)
