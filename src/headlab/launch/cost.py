"""What one run of a config costs on this machine, built and timed here with the threads it gets (a dry run's
figures: headlab.launch.dry_run): its training steps in a real Trainer.fit (R-Drop's and SAM's second pass
included), a validation and a test batch, the head analysis as the run makes it, and the figures drawn for W&B or
TensorBoard; on several CPU ranks (DDP), one rank's share. A pack's step is timed as the pack takes it: its members
stacked, computing as pack.compute has them (auto: the faster way, timed and kept as the pack keeps it,
headlab.training.pack.compute). Nothing trains and nothing is written but the prepared data's cache and such a kept
choice."""

import contextlib
import copy
import json
import logging
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headlab.launch import console, runtime, schedule
from headlab.training import allocator

WARM_UP, TIMED = 2, 5  # untimed then timed repetitions of each measured step
_WARMED: set[str] = set()  # what has run once in this process (warm_up_once)
SANITY_BATCHES = 2  # Lightning's validation batches before training (trainer.num_sanity_val_steps; -1: all)


@dataclass
class Cost:
    """What one run of a config costs here, in seconds (a pack of E members: about E times as much on a CPU)."""

    steps: int  # optimizer steps
    epochs: int
    validations: int  # as Lightning schedules them (validations), the sanity check aside
    step_s: float | None  # one training step of a run alone (None: not timed, where only its packs were priced)
    evaluation_s: float  # every validation (validations, and Lightning's sanity check) and the test
    analysis_s: float  # the head analysis after training
    prepare_s: float  # the data and the model built
    figures: int  # the attention maps drawn for W&B or TensorBoard (figure_draws)
    figures_s: float  # drawing them
    importance_figures_s: float  # the head analysis' figures for W&B or TensorBoard (importance, pruning, causal)
    packs: dict[int, tuple[float, str]] = field(default_factory=dict)  # members -> (a pack's step, "each" or
    # "batched": how it computes them), where timed

    @property
    def seconds(self) -> float:
        return self.steps * self.step_s + self._besides_steps

    @property
    def _besides_steps(self) -> float:
        """What one run costs besides its training steps: evaluation, head analysis, preparation and figures."""
        drawn = self.figures_s + self.importance_figures_s
        return self.evaluation_s + self.analysis_s + self.prepare_s + drawn

    def pack_step(self, members: int) -> float:
        """A training step of a pack of these many members: as timed (packs), else its members' together."""
        return self.packs[members][0] if members in self.packs else members * self.step_s

    def pack_seconds(self, members: int) -> float:
        """A pack of these many members: its steps, and each member's evaluation, head analysis and figures."""
        return members * self._besides_steps + self.steps * self.pack_step(members)


def _figure_seconds(logger, model, datamodule) -> float:
    """One drawing of the attention maps of the run's probe batch, as its head logger draws them (the first, which
    loads matplotlib's fonts, untimed)."""
    from headlab.heads import figures, probe

    batch = datamodule.probe_batch(logger.n_probe, logger.sentences)

    def draw():
        seen = probe.attention(model, datamodule, batch)
        figures.render_heads(probe.snapshot(model, datamodule, batch, seen, 0, figures.EXAMPLES))

    return median_seconds(draw, repeats=1, warm_up=warm_up_once("figures"))


def warm_up_once(what: str) -> int:
    """1 the first time a process times `what` (the head analysis, a figure), 0 after: its one-off costs
    (imports, templates, matplotlib's fonts) come once a process, as in the runs, whatever the shape, and each
    shape after the first is timed on its first call (a new design's first analysis takes what its repeats do)."""
    first = what not in _WARMED
    _WARMED.add(what)
    return int(first)


def median_seconds(action, repeats: int = TIMED, warm_up: int = WARM_UP) -> float:
    """The median time of action() after warm_up untimed calls (a noisy machine's outliers aside)."""
    for _ in range(warm_up):
        action()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(cfg: DictConfig, threads: int, pack_sizes: tuple[int, ...] = (), alone: bool = True) -> Cost:
    """Build cfg's data and model here and time what a run of it does, on `threads` threads: with several CPU
    ranks (DDP) what one rank does on its share of them, its share of the steps and batches (the ranks' all-reduce
    of gradients is not priced), and the head analysis as the job's process makes it (on one thread where the
    ranks were forked: pack.ranks.Handover.analyse_here). pack_sizes: the sizes of the packs it trains in, each of
    whose step is timed (one rank, not compiled: else its members' steps together); alone=False: a run's own step
    is timed only where a pack's is not (what the packed launcher's estimate needs)."""
    import torch

    from headlab.training import cores
    from headlab.training.build import build, compile_in_place

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

    timed_packs = [n for n in pack_sizes if n > 1 and world == 1 and not cfg.model.get("compile")]
    needed = alone or bool(set(pack_sizes) - set(timed_packs))
    step_s = lightning_step_seconds(cfg, datamodule, model)[0] if needed else None
    packs = {n: lightning_step_seconds(cfg, datamodule, model, n) for n in timed_packs}
    trainer = cfg.trainer
    evaluation_s = 0.0
    checks = schedule.validations(cfg, datamodule)
    if n := schedule.batches(datamodule, "val", trainer.get("limit_val_batches"), world):
        sanity = trainer.get("num_sanity_val_steps", SANITY_BATCHES)
        batches = checks * n + (n if sanity == -1 else min(sanity, n))
        evaluation_s += batches * median_seconds(forward("val"))
    if n := schedule.batches(datamodule, "test", trainer.get("limit_test_batches"), world):
        evaluation_s += n * median_seconds(forward("test"))
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
        steps, epochs, checks, step_s, evaluation_s, analysis_s, prepare_s, draws, figures_s, importance_figures_s,
        packs,
    )  # fmt: skip


def _analysis_seconds(analyst, model, datamodule, drawing: bool) -> tuple[float, float]:
    """The head analysis a run makes after training: importance and pruning curves (analyse), then heads.json with
    the ablations and patching beside them and the head view (publish, into a folder removed after, no logger);
    and, where the run draws figures (drawing: W&B or TensorBoard), its figures (the first drawing, which loads
    matplotlib's fonts, untimed). The first analysis a process times is warmed up on one batch of each kind: its
    one-off costs come once, as in a run, and the warm-up is not a whole analysis again. Returns (the analysis'
    seconds, its figures' seconds)."""
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

    if warm_up_once("analysis"):
        batches = analyst.n_analysis_batches, analyst.causal_batches
        analyst.n_analysis_batches, analyst.causal_batches = 1, min(1, analyst.causal_batches)
        try:
            analyse_and_publish()
        finally:
            analyst.n_analysis_batches, analyst.causal_batches = batches
    seconds = median_seconds(analyse_and_publish, repeats=1, warm_up=0)
    if not drawing:
        return seconds, 0.0
    once = warm_up_once("importance")
    return seconds, median_seconds(lambda: render_importance(**drawn[0]), repeats=1, warm_up=once)


def lightning_step_seconds(cfg: DictConfig, datamodule, model, members: int = 1) -> tuple[float, str]:
    """The median time from one training step's start to the next's in a real Trainer.fit of the run as it trains
    (loading the batch, the forward and backward passes, R-Drop's and SAM's second pass, the gradients' clipping,
    AdamW, the schedule, the metrics and Lightning's hooks; its precision), WARM_UP steps untimed; no logger,
    checkpoint or validation. members: a pack of that many copies of the model (1: the run alone), computing as its
    pack would (pack.compute; auto times both ways first and keeps the faster, as the pack then finds it). Returns
    (seconds, "each" or "batched")."""
    import lightning.pytorch as pl

    from headlab.training.pack import compute
    from headlab.training.pack.data import PackedData
    from headlab.training.pack.module import PackedModule

    starts: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            starts.append(time.perf_counter())

    steps = WARM_UP + TIMED + 1
    models = [model] if members == 1 else [copy.deepcopy(model) for _ in range(members)]
    optim = [OmegaConf.to_container(cfg.optim)] * members
    module = PackedModule(models, optim, compile=bool(cfg.model.get("compile")), compute=compute.asked(cfg))
    choice = [compute.ComputeChoice(None, cfg)] if compute.to_measure(cfg, members) else []
    with _quiet():
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, precision=cfg.trainer.get("precision", "32-true"), max_steps=steps,
            gradient_clip_val=cfg.trainer.get("gradient_clip_val"), limit_val_batches=0, num_sanity_val_steps=0,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[*choice, Clock()],
        )  # fmt: skip
        trainer.fit(module, datamodule=PackedData([datamodule] * members))
    seconds = statistics.median(b - a for a, b in zip(starts[WARM_UP:], starts[WARM_UP + 1 :], strict=False))
    return seconds, compute.record(module, choice[0] if choice else None)["compute"]


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


def costs(configs: list[DictConfig], threads: int, members: list[int] | None = None, alone: bool = True) -> list[Cost]:
    """Each config's Cost, measured once for configs of one shape (shape); members: how many each config's pack
    trains (its step timed once for each shape and size); alone=False: a run's own step not timed where its packs'
    are (Cost.step_s None). The process is first set as a run's: what timing says goes where a run's notes go
    (matplotlib's and Lightning's to the log file only: console.quiet), and malloc keeps freed memory (allocator:
    else a step's large buffers, a batched pack's most, are faulted in again at every timed step, and a pack's way
    is timed unlike it then runs), with torch and Lightning imported as a run imports them (runtime.heavy_imports)."""
    console.quiet()
    allocator.keep_freed_memory()
    with runtime.heavy_imports():
        import headlab.training.pack.train  # noqa: F401  (what measure imports: torch, Lightning, the pack's modules)
    sizes: dict[str, set[int]] = {}
    for cfg, n in zip(configs, members or [1] * len(configs), strict=True):
        sizes.setdefault(shape(cfg), set()).add(n)
    measured: dict[str, Cost] = {}
    for cfg in configs:
        if (key := shape(cfg)) not in measured:
            measured[key] = measure(cfg, threads, tuple(sorted(sizes[key])), alone)
    return [measured[shape(cfg)] for cfg in configs]


def shape(cfg: DictConfig) -> str:
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
