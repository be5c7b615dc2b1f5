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

from omegaconf import DictConfig, OmegaConf

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
    """The optimizer steps one run of cfg trains: its epochs (auto: from the data's size) x the steps an epoch, at
    most trainer.max_steps where that is set (as Lightning stops at whichever comes first)."""
    from headlab.training import epochs

    batches = math.ceil(len(datamodule.splits["train"]) / datamodule.batch_size)
    per_epoch = epochs.steps_per_epoch(batches, 1, cfg.trainer.get("limit_train_batches"))
    if cfg.trainer.get("max_epochs") == epochs.AUTO:
        steps = per_epoch * epochs.auto_epochs(per_epoch, *epochs.budget(cfg))
    else:
        steps = per_epoch * int(cfg.trainer.max_epochs)
    max_steps = cfg.trainer.get("max_steps")
    return min(steps, int(max_steps)) if isinstance(max_steps, int) and max_steps >= 0 else steps


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


def timings(configs: list[DictConfig], threads: int) -> list[tuple[int, float]]:
    """Each config's (training steps of a run, seconds a step here on `threads` threads), built and timed once for
    configs of one shape (headlab.launch.dry_run._shape)."""
    from headlab.training.run import build

    timed: dict[str, tuple[int, float]] = {}
    for cfg in configs:
        if (key := _shape(cfg)) not in timed:
            datamodule, model = build(cfg)
            timed[key] = run_steps(cfg, datamodule), seconds_a_step(cfg, datamodule, model, threads)
    return [timed[_shape(cfg)] for cfg in configs]


def estimate(members: list[int], configs: list[DictConfig], n_jobs: int) -> str:
    """About how long packs (or jobs) of these many members and these configs train here, n_jobs at a time, each on
    its share of the cores: the line a packed sweep starts with."""
    return f"about {duration(_total(members, timings(configs, _threads(n_jobs)), n_jobs))} of training here"


def report(groups: list[list[list[str]]], configs: list[DictConfig], n_jobs: int) -> list[str]:
    """The dry run's lines: each pack (or job) with its runs' steps and time, and the sweep's total."""
    threads = _threads(n_jobs)
    times = timings(configs, threads)
    lines = []
    given = [dict(o.split("=", 1) for o in group[0] if "=" in o) for group in groups]
    varied = [k for k in given[0] if len({g.get(k) for g in given}) > 1]  # what tells the packs (or jobs) apart
    for k, (group, (steps, seconds)) in enumerate(zip(groups, times, strict=True)):
        named = " ".join(f"{key}={given[k][key]}" for key in varied) or "the configuration as given"
        lines.append(
            f"  {'pack' if len(group) > 1 else 'job'} {k}: {len(group)} run(s) of {named}, {steps:,} steps each at "
            f"{seconds * 1000:.0f} ms a step here: about {duration(len(group) * steps * seconds)}"
        )
    total = _total([len(group) for group in groups], times, n_jobs)
    lines.append(
        f"about {duration(total)} of training on this machine ({min(n_jobs, len(groups))} at a time, {threads} "
        "thread(s) each; start-up, validation and the head analysis not counted)"
    )
    return lines


def say(jobs: list[list[str]], config: DictConfig, loader, packed: bool, what: str = "jobs",
        max_pack: int | None = None) -> list:  # fmt: skip
    """Print the dry run of these jobs (each its overrides) as the sweep's launcher would run them (packs of at
    most max_pack, the launcher's by default); Hydra's config loader composes each pack's config. Returns the
    sweep's (empty) list of returns."""
    from headlab.training.config_check import check_config

    launcher = config.hydra.launcher
    max_pack = max_pack or int(launcher.get("max_pack") or 1)
    groups = pack_groups(jobs, packed, max_pack)
    configs = [loader.load_sweep_config(config, group[0]) for group in groups]
    for cfg in configs:  # what each job would refuse, before any data is prepared to time it
        check_config(cfg)
    runs = f" in {len(groups)} pack(s) of at most {max_pack}" if packed else ""
    print(f"headlab-train --dry-run: {len(jobs)} {what}{runs}; nothing is started")
    print("\n".join(report(groups, configs, int(launcher.get("n_jobs") or 1))))
    return []


def _total(members: list[int], times: list[tuple[int, float]], n_jobs: int) -> float:
    """Seconds of training of packs of these many members, n_jobs at a time."""
    return sum(n * steps * seconds for n, (steps, seconds) in zip(members, times, strict=True)) / min(
        n_jobs, len(times)
    )


def duration(seconds: float) -> str:
    """A rough duration: minutes, or hours from 90 minutes."""
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min"


def _shape(cfg: DictConfig) -> str:
    """What a run's steps and a step's time depend on: the model, the data but for its fold and seed (folds differ
    by a row or two), and R-Drop's second pass."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("seed", None)
    (data.get("cv") or {}).pop("fold", None)
    return repr((OmegaConf.to_container(cfg.model, resolve=True), data, cfg.optim.get("rdrop")))


def _threads(n_jobs: int) -> int:
    from headlab.training.cores import usable_cores

    return max(1, usable_cores() // n_jobs)
