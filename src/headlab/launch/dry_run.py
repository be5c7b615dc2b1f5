"""headlab-train -m ... --dry-run (sweep.dry_run=true; --dry-run --json: sweep.dry_run=json): what a sweep would run,
said before anything starts: its jobs, the packs they form (jobs that differ only in their seeds and per-member
optimizer settings), each run's training steps, and about how long the sweep takes here. Each pack's model is built
and timed on this machine, with the threads a pack gets: its training steps (R-Drop's and SAM's second pass
included), a validation and a test batch, the head analysis (importance, pruning curves, ablations and patching, as
the run makes them) and the attention maps drawn for W&B or TensorBoard; the data's preparation and this process's
own start-up are measured too. Nothing trains and nothing is written but the prepared data's cache. On a CPU a pack's
step costs about its members' steps together (on a GPU, a pack trains many times faster than its members one by one:
BENCHMARKS.md)."""

import contextlib
import json
import logging
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from headlab.launch import estimates, planning, schedule
from headlab.launch.plan import PER_MEMBER
from headlab.printing import duration

WARM_UP, TIMED = 2, 5  # untimed then timed repetitions of each measured step
SANITY_BATCHES = 2  # Lightning's validation batches before training (trainer.num_sanity_val_steps; -1: all)


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


@dataclass
class Cost:
    """What one run of a config costs here, in seconds (a pack of E members: about E times as much on a CPU)."""

    steps: int  # optimizer steps
    epochs: int
    validations: int  # as Lightning schedules them (validations), the sanity check aside
    step_s: float  # one training step
    evaluation_s: float  # every validation (validations, and Lightning's sanity check) and the test
    analysis_s: float  # the head analysis after training
    prepare_s: float  # the data and the model built
    figures: int  # the attention maps drawn for W&B or TensorBoard (figure_draws)
    figures_s: float  # drawing them
    importance_figures_s: float  # the head analysis' figures for W&B or TensorBoard (importance, pruning, causal)

    @property
    def seconds(self) -> float:
        drawn = self.figures_s + self.importance_figures_s
        return self.steps * self.step_s + self.evaluation_s + self.analysis_s + self.prepare_s + drawn


def _figure_seconds(logger, model, datamodule) -> float:
    """One drawing of the attention maps of the run's probe batch, as its head logger draws them (the first, which
    loads matplotlib's fonts, untimed)."""
    from headlab.heads import figures, probe

    batch = datamodule.probe_batch(logger.n_probe, logger.sentences)

    def draw():
        seen = probe.attention(model, datamodule, batch)
        figures.render_heads(probe.snapshot(model, datamodule, batch, seen, 0, figures.EXAMPLES))

    return _median_seconds(draw, repeats=1, warm_up=1)


def _median_seconds(action, repeats: int = TIMED, warm_up: int = WARM_UP) -> float:
    """The median time of action() after warm_up untimed calls (a noisy machine's outliers aside)."""
    for _ in range(warm_up):
        action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(cfg: DictConfig, threads: int) -> Cost:
    """Build cfg's data and model here and time what a run of it does, on `threads` threads: with several CPU
    ranks (DDP) what one rank does on its share of them, its share of the steps and batches (the ranks' all-reduce
    of gradients is not priced), and the head analysis as the job's process makes it (on one thread where the
    ranks were forked: pack.ranks.Handover.analyse_here)."""
    import torch

    from headlab.training import cores
    from headlab.training.run import build, compile_in_place

    world, threads = schedule.ranks(cfg), cores.rank_share(cfg.trainer, threads)
    torch.set_num_threads(threads)
    started = time.perf_counter()
    datamodule, model = build(cfg)
    compile_in_place(cfg, model)  # timed as the run computes (its compilation in the untimed warm-up)
    prepare_s = time.perf_counter() - started

    def forward(split: str):
        """A validation (or test) batch's forward pass, as Lightning runs it: in eval mode, without gradients."""
        evaluated = next(iter(datamodule.ordered_dataloader(split)))
        model.eval()
        return torch.no_grad()(lambda: model(evaluated["tokens"], evaluated["padding_mask"]))

    step_s = lightning_step_seconds(cfg, datamodule, model)
    trainer = cfg.trainer
    evaluation_s = 0.0
    checks = schedule.validations(cfg, datamodule)
    if n := schedule.batches(datamodule, "val", trainer.get("limit_val_batches"), world):
        sanity = trainer.get("num_sanity_val_steps", SANITY_BATCHES)
        batches = checks * n + (n if sanity == -1 else min(sanity, n))
        evaluation_s += batches * _median_seconds(forward("val"))
    if n := schedule.batches(datamodule, "test", trainer.get("limit_test_batches"), world):
        evaluation_s += n * _median_seconds(forward("test"))
    analysis_s, draws, figures_s, importance_figures_s, logger = 0.0, 0, 0.0, 0.0, _head_logger(cfg)
    drawing = logger is not None and schedule.draws_figures(cfg)
    if logger is not None and logger.importance:  # the run's own analysis, on the untrained model: its cost alike
        torch.set_num_threads(1 if cores.rank_start(trainer) == "fork" else threads)
        analysis_s, importance_figures_s = _analysis_seconds(logger, model, datamodule, drawing)
        torch.set_num_threads(threads)
    if drawing:
        draws = schedule.figure_draws(checks, logger.figures_every)
        figures_s = draws * _figure_seconds(logger, model, datamodule)
    steps, epochs = schedule.run_steps(cfg, datamodule), schedule.epochs_of(cfg, datamodule)
    return Cost(
        steps, epochs, checks, step_s, evaluation_s, analysis_s, prepare_s, draws, figures_s, importance_figures_s
    )


def _analysis_seconds(analyst, model, datamodule, drawing: bool) -> tuple[float, float]:
    """The head analysis a run makes after training: importance and pruning curves (analyse), then heads.json with
    the ablations and patching beside them and the head view (publish, into a folder removed after, no logger);
    and, where the run draws figures (drawing: W&B or TensorBoard), its figures (the first drawing, which loads
    matplotlib's fonts, untimed). Returns (the analysis' seconds, its figures' seconds)."""
    import torch

    from headlab.heads.figures import render_importance

    cpu, drawn = torch.device("cpu"), []

    def analyse_and_publish():
        with tempfile.TemporaryDirectory() as folder:
            analyst.out_dir = Path(folder)
            analysis = analyst.analyse(model, datamodule, cpu)
            analyst.publish(model, datamodule, [], cpu, 0, None, analysis)
            rows = json.loads((Path(folder) / "heads.json").read_text())["rows"]
            drawn[:] = [analyst.importance_figures(rows, analysis.scores, analysis.curves)]

    seconds = _median_seconds(analyse_and_publish, repeats=1)
    if not drawing:
        return seconds, 0.0
    return seconds, _median_seconds(lambda: render_importance(**drawn[0]), repeats=1, warm_up=1)


def lightning_step_seconds(cfg: DictConfig, datamodule, model) -> float:
    """The median time from one training step's start to the next's in a real Trainer.fit of the run's module
    (loading the batch, the forward and backward passes, R-Drop's and SAM's second pass, AdamW, the schedule, the
    metrics and Lightning's hooks), WARM_UP steps untimed; no logger, checkpoint or validation."""
    import lightning.pytorch as pl

    from headlab.training.module import HeadLabModule

    starts: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            starts.append(time.perf_counter())

    steps = WARM_UP + TIMED + 1
    module = HeadLabModule(model, datamodule.n_classes, **OmegaConf.to_container(cfg.optim))
    with _quiet():
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()],
        )  # fmt: skip
        trainer.fit(module, datamodule=datamodule)
    return statistics.median(b - a for a, b in zip(starts[WARM_UP:], starts[WARM_UP + 1 :], strict=False))


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


@contextlib.contextmanager
def _quiet():
    """Lightning's lines and warnings about a Trainer the user never asked for left unsaid (stdout stays the dry
    run's: --json prints one object there)."""
    logging.disable(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _head_logger(cfg: DictConfig):
    """The run's head logger (callbacks.attention) with the settings that decide its cost, or None without it."""
    from headlab.training.attention_logging import AttentionLogger

    if OmegaConf.select(cfg, "callbacks.attention") is None:
        return None
    keys = ("importance", "pruning_step", "analysis_batches", "importance_split", "pruning_split", "pruning_baselines",
            "seed", "causal_batches", "n_probe", "sentences", "figures_every_n_val_epochs")  # fmt: skip
    settings = {k: OmegaConf.select(cfg, f"callbacks.attention.{k}") for k in keys}  # not out_dir: no run dir yet
    return AttentionLogger(out_dir=".", **{k: v for k, v in settings.items() if v is not None})


def costs(configs: list[DictConfig], threads: int) -> list[Cost]:
    """Each config's Cost, measured once for configs of one shape (_shape)."""
    measured: dict[str, Cost] = {}
    for cfg in configs:
        if (key := _shape(cfg)) not in measured:
            measured[key] = measure(cfg, threads)
    return [measured[_shape(cfg)] for cfg in configs]


def estimate(members: list[int], configs: list[DictConfig], n_jobs: int) -> float:
    """About how many seconds packs (or jobs) of these many members and these configs take here, n_jobs at a time,
    each on its share of the cores: what a packed sweep says it will take when it starts."""
    return _total(members, costs(configs, _threads(n_jobs)), n_jobs)


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
        for idx, overrides in enumerate(jobs):
            cfg = loader.load_sweep_config(config, list(overrides))
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
    Hydra's config loader composes each pack's config. Returns the sweep's (empty) list of returns."""
    from headlab.config.check import check_config

    as_object = str(OmegaConf.select(config, "sweep.dry_run")) == "json"
    with _said_on_stderr() if as_object else contextlib.nullcontext():  # stdout: the JSON object alone
        startup = estimates.process_seconds() or 0.0  # this process's start-up, before anything is measured here
        done = len(jobs) - len(jobs := not_done(jobs, config, loader))
        if jobs:
            launcher = config.hydra.launcher
            max_pack = max_pack or int(launcher.get("max_pack") or 1)
            groups = pack_groups(jobs, packed, max_pack)
            configs = [loader.load_sweep_config(config, group[0]) for group in groups]
            for cfg in configs:  # what each job would refuse, before any data is prepared to time it
                check_config(cfg)
            n_jobs = int(launcher.get("n_jobs") or 1)
            measured = costs(configs, _threads(n_jobs))
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


def _first_look_json(first: float | None) -> dict:
    return {} if first is None else {"seconds_first_look": round(first, 1)}


def as_json(groups: list[list[list[str]]], measured: list[Cost], n_jobs: int, packed: bool, startup: float) -> dict:
    """The dry run as one object: jobs (each its overrides, pack, steps and seconds), packs, seconds (the
    expected wall time of the whole sweep), and what it was measured with."""
    jobs = [
        {
            "overrides": [o for o in job if not o.startswith(("sweep.dry_run=", "sweep.plan."))],
            "pack": k if packed else None,
            "steps": cost.steps,
            "validations": cost.validations,
            "figures": cost.figures,
            "figures_seconds": round(cost.figures_s, 1),
            "importance_figures_seconds": round(cost.importance_figures_s, 1),
            "seconds": round(cost.seconds, 1),
        }
        for k, (group, cost) in enumerate(zip(groups, measured, strict=True))
        for job in group
    ]
    total = startup + _total([len(g) for g in groups], measured, n_jobs)
    return {"jobs": jobs, "packs": len(groups) if packed else 0, "seconds": round(total, 1),
            "at_a_time": min(n_jobs, len(groups)), "threads": _threads(n_jobs)}  # fmt: skip


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
        lines.append(
            f"  {what} {k}: {len(group)} run(s) of {named}, {cost.steps:,} steps and {cost.validations:,} validations "
            f"each at {cost.step_s * 1000:.0f} ms a step here; with validation, test{drawn} and head analysis"
            f"{analysed} about {duration(len(group) * cost.seconds)}"
        )
    total = startup + _total([len(group) for group in groups], measured, n_jobs)
    lines.append(
        f"about {duration(total)} on this machine ({min(n_jobs, len(groups))} at a time, {_threads(n_jobs)} "
        f"thread(s) each; training {duration(_training(groups, measured, n_jobs))} of it)"
    )
    return lines


def _total(members: list[int], measured: list[Cost], n_jobs: int) -> float:
    """Seconds of packs of these many members, n_jobs at a time (the sweep's process start-up aside)."""
    return sum(n * c.seconds for n, c in zip(members, measured, strict=True)) / max(1, min(n_jobs, len(measured)))


def _training(groups: list, measured: list[Cost], n_jobs: int) -> float:
    return sum(len(g) * c.steps * c.step_s for g, c in zip(groups, measured, strict=True)) / min(n_jobs, len(groups))


def _shape(cfg: DictConfig) -> str:
    """What a run's cost depends on: the model, the data but for its fold and seed (folds differ by a row or two),
    R-Drop's and SAM's passes, the trainer's limits and devices, the budget that max_epochs=auto follows, the head
    analysis and whether a logger gets figures."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    data.pop("seed", None)
    (data.get("cv") or {}).pop("fold", None)
    keys = ("optim.rdrop", "optim.sam_rho", "auto_epochs", "callbacks.attention")
    rest = {k: OmegaConf.select(cfg, k) for k in keys}
    rest["figures"] = schedule.draws_figures(cfg)
    limits = ("max_epochs", "max_steps", "limit_train_batches", "limit_val_batches", "limit_test_batches",
              "val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps", "devices", "num_nodes",
              "strategy")  # fmt: skip
    trainer = {k: OmegaConf.select(cfg, f"trainer.{k}") for k in limits}  # not its directories: no run yet
    return repr((OmegaConf.to_container(cfg.model, resolve=True), data, trainer, repr(rest)))


def _threads(n_jobs: int) -> int:
    from headlab.training.cores import usable_cores

    return max(1, usable_cores() // n_jobs)
