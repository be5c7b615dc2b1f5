"""headlab-train -m ... --dry-run (sweep.dry_run=true): what a sweep would run, said before anything starts: its
jobs, the packs they form (jobs that differ only in their seeds and per-member optimizer settings), each run's
training steps, and about how long they take here, from a few timed training steps of each pack's model on this
machine, with the threads a pack gets. Nothing trains and nothing is written but the prepared data's cache (text
data is prepared to know its size, as its runs would prepare it); the estimate leaves out start-up,
validation and the head analysis, and on a CPU a pack's step costs about its members' steps together (on a GPU, a
pack trains many times faster than its members one by one: BENCHMARKS.md)."""

import math
import statistics
import time

from omegaconf import DictConfig

from headlab.launch.plan import PER_MEMBER

TIMED_STEPS = 3  # after one untimed step


def pack_groups(jobs: list[list[str]], packed: bool, max_pack: int) -> list[list[list[str]]]:
    """The jobs as the packed launcher groups them (by their overrides other than PER_MEMBER keys, at most max_pack
    a pack), or one job a group for the other launchers."""
    if not packed:
        return [[job] for job in jobs]
    groups: dict[tuple, list] = {}
    for job in jobs:
        shared = tuple(o for o in job if o.split("=", 1)[0].lstrip("+~") not in PER_MEMBER)
        groups.setdefault(shared, []).append(job)
    return [g[i : i + max_pack] for g in groups.values() for i in range(0, len(g), max_pack)]


def run_steps(cfg: DictConfig, datamodule) -> int:
    """The optimizer steps one run of cfg trains: its epochs (auto: from the data's size) x the steps an epoch."""
    from headlab.training import epochs

    batches = math.ceil(len(datamodule.splits["train"]) / datamodule.batch_size)
    per_epoch = epochs.steps_per_epoch(batches, 1, cfg.trainer.get("limit_train_batches"))
    if cfg.trainer.get("max_epochs") == epochs.AUTO:
        return per_epoch * epochs.auto_epochs(per_epoch, *epochs.budget(cfg))
    return per_epoch * int(cfg.trainer.max_epochs)


def seconds_a_step(cfg: DictConfig, datamodule, model, threads: int) -> float:
    """The median time of a training step of the model on its first training batch (forward, cross-entropy,
    backward, AdamW), here, on `threads` threads."""
    import torch

    from headlab.training.objective import training_step

    torch.set_num_threads(threads)
    batch = next(iter(datamodule.train_dataloader()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rdrop = float(cfg.optim.get("rdrop") or 0)
    model.train()
    times = []
    for _ in range(TIMED_STEPS + 1):
        started = time.perf_counter()
        forward = lambda: model(batch["tokens"], batch["padding_mask"])[0][None]  # noqa: E731 (1, B, [n,] C)
        step = training_step(forward, batch["labels"][None], rdrop)
        optimizer.zero_grad()
        step.objective.sum().backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def report(groups: list[list[list[str]]], configs: list[DictConfig], n_jobs: int) -> list[str]:
    """The dry run's lines: each pack (or job) with its runs' steps and time, and the sweep's total, n_jobs packs at
    a time, each on its share of the cores."""
    from headlab.training.cores import usable_cores
    from headlab.training.run import build

    threads = max(1, usable_cores() // n_jobs)
    lines, total = [], 0.0
    given = [dict(o.split("=", 1) for o in group[0] if "=" in o) for group in groups]
    varied = [k for k in given[0] if len({g.get(k) for g in given}) > 1]  # what tells the packs (or jobs) apart
    for k, (group, cfg) in enumerate(zip(groups, configs, strict=True)):
        datamodule, model = build(cfg)
        steps, seconds = run_steps(cfg, datamodule), seconds_a_step(cfg, datamodule, model, threads)
        took = len(group) * steps * seconds
        total += took
        named = " ".join(f"{key}={given[k][key]}" for key in varied) or "the configuration as given"
        lines.append(
            f"  {'pack' if len(group) > 1 else 'job'} {k}: {len(group)} run(s) of {named}, {steps:,} steps each at "
            f"{seconds * 1000:.0f} ms a step here: about {_duration(took)}"
        )
    at_once = min(n_jobs, len(groups))
    lines.append(
        f"about {_duration(total / at_once)} of training on this machine ({at_once} at a time, {threads} thread(s) "
        "each; start-up, validation and the head analysis not counted)"
    )
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"
