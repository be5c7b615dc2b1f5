"""headlab-train -m ... --dry-run (sweep.dry_run=true; --dry-run --json: sweep.dry_run=json): what a sweep would run,
said before anything starts: its jobs, the packs they form (jobs that differ only in their seeds and per-member
optimizer settings), each run's training steps, and about how long the sweep takes here. Each pack's model is built
and timed on this machine with the threads a pack gets (headlab.launch.cost); this process's own start-up is measured
too. Nothing trains and nothing is written but the prepared data's cache (and how a pack computes, where it times
that: headlab.training.pack.compute, which the pack then keeps). A pack's step is timed as the pack takes it, its
members stacked; a pack bound for GPUs is timed here on the CPU, far above what it takes there (BENCHMARKS.md)."""

import contextlib
import json
import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from headlab.launch import estimates, plan, planning
from headlab.launch.compose import compose_jobs
from headlab.launch.cost import Cost, costs, shape
from headlab.printing import duration


def pack_groups(jobs: list[list[str]], packed: bool, max_pack: int, at_least: int = 1) -> list[list[list[str]]]:
    """The jobs as the packed launcher groups them (by their overrides other than plan.PER_MEMBER keys, then split as
    plan.split splits them: at most max_pack a pack, at least at_least packs where the jobs allow), or one job a
    group for the other launchers."""
    if not packed:
        return [[job] for job in jobs]
    groups: dict[tuple, list] = {}
    for job in jobs:
        shared = tuple(o for o in job if o.split("=", 1)[0].lstrip("+~") not in plan.PER_MEMBER)
        groups.setdefault(shared, []).append(job)
    return plan.split(list(groups.values()), max_pack, at_least)


@contextlib.contextmanager
def _said_on_stderr():
    """What preparing and timing the runs says (the data's preparation, a print) on stderr, where stdout is kept
    for --json's one object: stdout redirected, and each log handler writing to it pointed at stderr."""
    moved = [
        h
        for h in logging.root.handlers + logging.getLogger("HYDRA").handlers
        if getattr(h, "stream", None) is sys.stdout
    ]
    for handler in moved:
        handler.setStream(sys.stderr)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for handler in moved:
            handler.setStream(sys.stdout)


TIMING_SHARE = 0.1  # the packed launcher's estimate times shapes while timing costs at most this share of their packs


def estimate(members: list[int], configs: list[DictConfig], n_jobs: int) -> tuple[float, int, int]:
    """About how many seconds packs (or jobs) of these many members and these configs take here, n_jobs at a time,
    each on its share of the cores: what a packed sweep says it will take when it starts (a run's own step is not
    timed where its pack's is). Its shapes are timed in turn while the timing has cost at most TIMING_SHARE of what
    the packs timed so far take; the packs of the shapes left are priced as those, member for member (a sweep of
    many short shapes starts training instead of timing each). Returns (seconds, shapes timed, shapes)."""
    by_shape: dict[str, list[int]] = {}
    for i, cfg in enumerate(configs):
        by_shape.setdefault(shape(cfg), []).append(i)
    priced, spent, threads = {}, 0.0, _threads(n_jobs)  # config index -> its pack's seconds; seconds spent timing
    for indices in by_shape.values():
        started = time.perf_counter()
        measured = costs([configs[i] for i in indices], threads, [members[i] for i in indices], alone=False)
        spent += time.perf_counter() - started
        priced |= {i: cost.pack_seconds(members[i]) for i, cost in zip(indices, measured, strict=True)}
        if spent > TIMING_SHARE * sum(priced.values()):
            break
    per_member = sum(priced.values()) / sum(members[i] for i in priced)
    seconds = sum(priced.get(i, per_member * n) for i, n in enumerate(members))
    timed = sum(indices[0] in priced for indices in by_shape.values())
    return _at_a_time(seconds, len(configs), n_jobs), timed, len(by_shape)


def not_done(jobs: list[list[str]], config: DictConfig, loader) -> list[list[str]]:
    """The jobs the launcher would run: with sweep.resume=true, those that did not complete before with the same
    config (Job.skipped's rule, each job composed in its own directory as Hydra would run it); all without it."""
    if not OmegaConf.select(config, "sweep.resume"):
        return jobs
    from hydra.core.hydra_config import HydraConfig

    from headlab.config.run_config import flat_config
    from headlab.launch.rundir import completed_before

    sweeps, left = HydraConfig.instance().cfg, []
    try:
        for idx, (overrides, cfg) in enumerate(zip(jobs, compose_jobs(loader, config, jobs), strict=True)):
            with open_dict(cfg):
                cfg.hydra.job.id = cfg.hydra.job.num = idx
                cfg.hydra.runtime.output_dir = str(Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir))
            HydraConfig.instance().set_config(cfg)  # the job's own ${hydra:...} (its directory) while it resolves
            task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            flat = flat_config(task, dict(cfg.hydra.runtime.choices))
            if not completed_before(Path(cfg.hydra.runtime.output_dir), flat):
                left.append(overrides)
    finally:
        HydraConfig.instance().cfg = sweeps
    return left


def say(jobs: list[list[str]], config: DictConfig, loader, packed: bool, what: str = "jobs",
        max_pack: int | None = None) -> list:  # fmt: skip
    """Print the dry run of these jobs (each its overrides) as the sweep's launcher would run them (packs of at
    most max_pack, the launcher's by default): lines for a person, or with sweep.dry_run=json one JSON object.
    Each pack's (or job's) config is composed as Hydra composes it, once for those that differ only in per-member
    values (headlab.launch.compose). Returns the sweep's (empty) list of returns."""
    from headlab.config.check import check_config

    as_object = str(OmegaConf.select(config, "sweep.dry_run")) == "json"
    with _said_on_stderr() if as_object else contextlib.nullcontext():  # stdout: the JSON object alone
        startup = estimates.process_seconds() or 0.0  # this process's start-up, before anything is measured here
        done = len(jobs) - len(jobs := not_done(jobs, config, loader))
        if jobs:
            launcher = config.hydra.launcher
            max_pack = max_pack or (plan.max_pack(config) if packed else 1)  # each checked as the launcher checks it
            n_jobs = plan.at_once(config) if packed else int(launcher.get("n_jobs") or 1)
            groups = pack_groups(jobs, packed, max_pack, n_jobs)
            configs = compose_jobs(loader, config, [group[0] for group in groups])
            for cfg in configs:  # what each job would refuse, before any data is prepared to time it
                check_config(cfg)
            if packed:  # the packed launcher's packs at once
                needs = [plan.pack_gb(cfg, len(group)) for cfg, group in zip(configs, groups, strict=True)]
                n_jobs = plan.trained_at_once(config, needs, n_jobs)
            measured = costs(configs, _threads(n_jobs), [len(g) for g in groups])
            packs_seconds = _total([len(g) for g in groups], measured, n_jobs)
            total = startup + packs_seconds
            planned = planning.plan(config.sweep.plan, groups, configs, measured, total, startup)
            first = first_look_seconds(config, groups, measured, n_jobs, startup)
            estimates.keep(config, total, packs_seconds)  # said again beside what the command takes, when it is run
    skipped = f"; {done} completed before with the same config, skipped (sweep.resume=true)" if done else ""
    if as_object:
        found = (
            as_json(groups, measured, n_jobs, packed, startup) | planned.as_json() | _first_look_json(first)
            if jobs
            else as_json([], [], 1, packed, 0)
        )
        print(json.dumps(found | {"skipped": done}))
        return []
    if not jobs:
        print(f"headlab-train --dry-run: 0 {what} to run{skipped}; nothing is started")
        return []
    runs = f" in {len(groups)} pack(s) of at most {max_pack}" if packed else ""
    print(f"headlab-train --dry-run: {len(jobs)} {what}{runs}{skipped}; nothing is started")
    rounds = [] if first is None else [f"in rounds: about {duration(first)} if every arm is decided at the first look"]
    print("\n".join(report(groups, measured, n_jobs, startup) + rounds + planned.lines()))
    return []


def first_look_seconds(
    config: DictConfig, groups: list, measured: list[Cost], n_jobs: int, startup: float
) -> float | None:
    """A sweep in rounds (sweep.sequential): its seconds if every arm is decided at the first look, when only its
    first round's jobs run (the sweep's seconds price every round); None for a sweep run at once."""
    looks = OmegaConf.select(config, "sweep.sequential.looks")
    if not looks:
        return None
    from headlab.launch.grid import sequential_rounds

    _, ranks, sizes = sequential_rounds([job for group in groups for job in group], int(looks))
    in_first = iter(rank < sizes[0] for rank in ranks)
    return startup + _total([sum(next(in_first) for _ in group) for group in groups], measured, n_jobs)


def _seconds(seconds: float) -> float:
    """Seconds as the JSON object says them: to the millisecond (a tiny run's few hundredths are not 0)."""
    return round(seconds, 3)


def _first_look_json(first: float | None) -> dict:
    return {} if first is None else {"seconds_first_look": _seconds(first)}


def as_json(groups: list[list[list[str]]], measured: list[Cost], n_jobs: int, packed: bool, startup: float) -> dict:
    """The dry run as one object: jobs (each its overrides, pack, steps, seconds alone and the evaluation's and
    head analysis' share of them), packs, pack_steps (each pack whose step was timed: its members, step, way and
    seconds), seconds (the expected wall time of the whole sweep), and what it was measured with."""
    jobs = [
        {
            "overrides": [o for o in job if not o.startswith(("sweep.dry_run=", "sweep.plan."))],
            "pack": k if packed else None,
            "steps": cost.steps,
            "validations": cost.validations,
            "figures": cost.figures,
            "figures_seconds": _seconds(cost.figures_s),
            "importance_figures_seconds": _seconds(cost.importance_figures_s),
            "evaluation_seconds": _seconds(cost.evaluation_s),
            "analysis_seconds": _seconds(cost.analysis_s),
            "seconds": _seconds(cost.seconds),
        }
        for k, (group, cost) in enumerate(zip(groups, measured, strict=True))
        for job in group
    ]
    total = startup + _total([len(g) for g in groups], measured, n_jobs)
    pack_steps = [
        {"pack": k, "members": len(g), "step_seconds": round(c.packs[len(g)][0], 4), "compute": c.packs[len(g)][1],
         "seconds": _seconds(c.pack_seconds(len(g)))}
        for k, (g, c) in enumerate(zip(groups, measured, strict=True))
        if len(g) in c.packs
    ]  # fmt: skip
    return {"jobs": jobs, "packs": len(groups) if packed else 0, "pack_steps": pack_steps,
            "seconds": _seconds(total), "at_a_time": min(n_jobs, len(groups)), "threads": _threads(n_jobs)}  # fmt: skip


def report(groups: list[list[list[str]]], measured: list[Cost], n_jobs: int, startup: float) -> list[str]:
    """The dry run's lines: each pack (or job) with its runs' steps and time, and the sweep's total."""
    lines = []
    given = [dict(o.split("=", 1) for o in group[0] if "=" in o) for group in groups]
    varied = [k for k in given[0] if len({g.get(k) for g in given}) > 1]  # what tells the packs (or jobs) apart
    for k, (group, cost) in enumerate(zip(groups, measured, strict=True)):
        named = " ".join(f"{key}={given[k][key]}" for key in varied) or "the configuration as given"
        what = "pack" if len(group) > 1 else "job"
        drawn = f", {cost.figures} drawing{'s' * (cost.figures > 1)} of the attention maps" if cost.figures else ""
        analysed = " with its figures" if cost.importance_figures_s else ""
        n = len(group)
        together = (
            f" (the pack's {cost.packs[n][0] * 1000:.0f} ms, its members computed {cost.packs[n][1]})"
            if n in cost.packs
            else ""
        )
        lines.append(
            f"  {what} {k}: {n} run(s) of {named}, {cost.steps:,} steps and {cost.validations:,} validations "
            f"each at {cost.step_s * 1000:.0f} ms a step here{together}; with validation, test{drawn} and head "
            f"analysis{analysed} about {duration(cost.pack_seconds(n))}"
        )
    total = startup + _total([len(group) for group in groups], measured, n_jobs)
    training = _summed(groups, measured, n_jobs, lambda n, c: c.steps * c.pack_step(n))
    analysis = _summed(groups, measured, n_jobs, lambda n, c: n * c.analysis_s)
    analysed = f" and head analysis {duration(analysis)}" if analysis else ""
    lines.append(
        f"about {duration(total)} on this machine ({min(n_jobs, len(groups))} at a time, {_threads(n_jobs)} "
        f"thread(s) each; training {duration(training)}{analysed} of it)"
    )
    return lines


def _at_a_time(seconds: float, packs: int, n_jobs: int) -> float:
    """Seconds of packs that take `seconds` one after another, run n_jobs at a time."""
    return seconds / max(1, min(n_jobs, packs))


def _total(members: list[int], measured: list[Cost], n_jobs: int) -> float:
    """Seconds of packs of these many members, n_jobs at a time (the sweep's process start-up aside)."""
    return _at_a_time(sum(c.pack_seconds(n) for n, c in zip(members, measured, strict=True)), len(measured), n_jobs)


def _summed(groups: list, measured: list[Cost], n_jobs: int, part) -> float:
    """Seconds of one part of every pack, part(members, cost), n_jobs packs at a time."""
    return _at_a_time(sum(part(len(g), c) for g, c in zip(groups, measured, strict=True)), len(groups), n_jobs)


def _threads(n_jobs: int) -> int:
    from headlab.training.cores import usable_cores

    return max(1, usable_cores() // n_jobs)
