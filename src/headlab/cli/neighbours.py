"""Other headlab-train runs or sweeps on this process's cores. Each takes every usable core as its torch threads,
so two on the same cores contend: two unpinned sweeps on a 2-core machine ran their packs about 30 times slower
than pinned ones. Read from /proc (Linux); elsewhere there are none to find.

A run's own processes (a sweep's workers, DDP's ranks) descend from the same headlab-train and are not
neighbours: what counts is each process's topmost headlab-train ancestor."""

import os
from pathlib import Path

PROC = Path("/proc")


def is_trainer(cmdline: list[str]) -> bool:
    """A headlab-train process: the console script (run by its interpreter or itself) or its module."""
    return any(Path(arg).name == "headlab-train" for arg in cmdline[:2]) or cmdline[1:3] == ["-m", "headlab.cli.train"]


def sharing_cores() -> list[tuple[int, list[int]]]:
    """The other headlab-train runs whose cores overlap this process's: (pid of each one's topmost headlab-train,
    the cores they share), by pid."""
    if not PROC.is_dir() or not hasattr(os, "sched_getaffinity"):
        return []
    parent, trainers = {}, set()
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (found := _read(int(entry.name))):
            parent[int(entry.name)] = found[0]
            if is_trainer(found[1]):
                trainers.add(int(entry.name))

    def root(pid: int) -> int:  # the topmost headlab-train at or above pid (pid itself if none)
        top, seen = pid, set()
        while pid in parent and pid not in seen:
            seen.add(pid)
            top = pid if pid in trainers else top
            pid = parent[pid]
        return top

    mine, cores = root(os.getpid()), os.sched_getaffinity(0)
    shared = {}
    for pid in trainers:
        if (top := root(pid)) != mine:
            try:
                overlap = cores & os.sched_getaffinity(pid)
            except OSError:  # ended meanwhile, or another user's
                continue
            shared.setdefault(top, set()).update(overlap)
    return sorted((pid, sorted(overlap)) for pid, overlap in shared.items() if overlap)


def warning() -> str | None:
    """One line for the console when other headlab-train runs share this one's cores, else None (always None with
    HEADLAB_NEIGHBOURS=ignore)."""
    if os.environ.get("HEADLAB_NEIGHBOURS") == "ignore" or not (others := sharing_cores()):
        return None
    pids = ", ".join(str(pid) for pid, _ in others)
    cores = _ranges(sorted({core for _, overlap in others for core in overlap}))
    who = (
        f"another headlab-train (pid {pids}) trains"
        if len(others) == 1
        else f"{len(others)} other headlab-train runs (pids {pids}) train"
    )
    return (
        f"{who} on cores {cores} too: each takes every core it may use as torch threads, so they contend and slow "
        "down (up to 30x measured with two on 2 cores); give each its own cores: taskset -c 0 headlab-train ..., "
        "taskset -c 1 headlab-train ..."
    )


def _read(pid: int) -> tuple[int, list[str]] | None:
    """A process's parent and command line, None once it has ended."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command's name, which may hold spaces: state, ppid
    return ppid, [arg.decode(errors="replace") for arg in cmdline if arg]


def _ranges(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5", as taskset writes them."""
    spans = []
    for core in cores:
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
