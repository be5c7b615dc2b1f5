"""Training a pack: its members (built as their single runs build them) grouped by shape and by what fits in
memory, each group trained as one vectorized model by one Lightning Trainer, tested on each member's best
checkpoint, and analysed; each member gets the results.json fields of its single run, or the error that ended it.

On a CPU each member draws its dropout masks from its own random stream, the one its single run draws from; on a
GPU (one batched computation) the members draw theirs in one batched draw from the pack's stream.
Shapes: E members, B batch, L layers, H heads.
"""

import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import OmegaConf, open_dict

from headlab.config import memory
from headlab.errors import TrainingError
from headlab.record import VAL_ACC_BEST
from headlab.training import cores, epochs, objective, records
from headlab.training import loggers as loggers_
from headlab.training import progress as progress_
from headlab.training.attention_logging import AttentionLogger
from headlab.training.build import configure_torch, existing, instantiate_all, instantiate_node
from headlab.training.callbacks import ExactResume, LearningCurve, RankThreads, ThroughputMeter
from headlab.training.pack import analysis, compute, resume
from headlab.training.pack.data import PackedData, stack_split
from headlab.training.pack.member import Member, build_member, shape_key
from headlab.training.pack.module import PackedModule
from headlab.training.pack.progress import PackBar, PackProgress
from headlab.training.pack.ranks import Handover, ProcessGroupRelease
from headlab.training.pack.stopping import MembersStopping
from headlab.training.pack.writer import MemberWriter
from headlab.training.progress_record import ProgressRecord

log = logging.getLogger("headlab")


def measure_heads(module: PackedModule, members: list[Member]) -> list[dict | None]:
    """Each member's head importance and pruning curves (AttentionLogger.analyse), measured for all members at
    once where their analysis batches stack (pack.analysis), else one member after another; None where its run
    measures no importance."""
    analysts = [m.callback(AttentionLogger) for m in members]
    if not all(a and a.importance for a in analysts):
        return [None] * len(members)
    device = module.device
    batches = [a.analysis_batches(m.datamodule, device) for a, m in zip(analysts, members, strict=True)]
    stacked = [stack_split([b[i] for b in batches]) for i in (0, 1)]
    if None in stacked:
        return [
            a.analyse(MemberWriter.member_model(m, module), m.datamodule, device)
            for a, m in zip(analysts, members, strict=True)
        ]
    return analysis.analyse_members(module.stack, analysts, batches, stacked)


def pack_fields(
    member: Member, rate: float | None, trainer, fit_seconds: float, size: int, pack_id: str | None, predictions,
    threads: int, computed: dict,
) -> dict:  # fmt: skip
    """The results.json fields a member's single run would own (records.run_fields), plus where it was packed and
    how the pack computed (rate: the pack's training tokens/s over every rank; predictions: the member's test
    predictions; computed: pack.compute.record); a run of headlab-train (no pack_id) is a run, not a member."""
    packed, (epochs_trained, step) = pack_id is not None, member.position(trainer)
    return records.run_fields(
        metrics=member.metrics,
        model_facts=records.model_fields(member.module.model, member.datamodule),
        throughput={
            "train_tokens_per_s": rate / size if rate else None,  # the member's share of the pack's rate
            **({"pack_train_tokens_per_s": rate} if packed else {}),
            "fit_s": round(fit_seconds, 3),
        },
        resources={
            "threads": threads,
            "devices": trainer.num_devices,
            "accelerator": member.cfg.trainer.accelerator,
        },
        checkpoints={
            "best": str(member.best["path"]) if member.best["path"] else None,
            "last": existing(member.run_dir / "checkpoints" / "last.ckpt"),
        },
        progress={
            "epochs": epochs_trained,
            "global_step": step,
            "curve": member.callback(LearningCurve).points,
        },
        wandb=member.wandb,
        predictions=predictions,
        pack={"id": pack_id, "size": size, "index": member.index, **computed} if packed else None,
    )


def member_config(member: Member, pack_id: str | None, size: int) -> dict:
    """What the member's loggers get as its config: its single run's, and the pack it trained in (if any)."""
    facts = loggers_.run_facts(records.model_fields(member.module.model, member.datamodule), member.flat_config)
    packed = {"pack.id": pack_id, "pack.size": size} if pack_id is not None else {}
    return {**member.flat_config, **facts, **packed}


def members_that_fit(members: list[Member]) -> int:
    """How many members of this architecture fit in the memory of the device they train on: memory.SHARE of what
    is free, over each member's estimate (memory.model_bytes)."""
    first = members[0]
    per_member = memory.model_bytes(first.cfg, first.datamodule)
    free = memory.free_bytes(str(first.cfg.trainer.get("accelerator")))
    return max(1, int(memory.SHARE * free // per_member))


def pack_progress(members: list[Member], pack_id: str | None, alone: bool) -> list[pl.callbacks.ProgressBar]:
    """The pack's progress: on a terminal when the pack trains alone, the configured bar (headlab's rich bar showing
    the members' metrics: PackBar); plain lines named by the pack (by nothing: the run of headlab-train) where output
    is a file or packs train side by side (alone=False); none with callbacks.progress_bar=null."""
    configured = [c for c in members[0].callbacks if isinstance(c, pl.callbacks.ProgressBar)]
    if not configured:
        return configured
    if alone and isinstance(configured[0], progress_.ProgressBar):  # headlab's rich bar, showing the members'
        return [PackBar(members, configured[0].every_n_steps)]
    if alone and not isinstance(configured[0], progress_.PlainProgress):  # another bar: as configured
        return configured
    every_s = getattr(configured[0], "every_s", None) or OmegaConf.select(
        members[0].cfg, "callbacks.progress_bar.every_s", default=30.0
    )  # a rich bar's (on a terminal, with packs side by side): the config's
    return [PackProgress(members, float(every_s), "" if pack_id is None else f"pack {pack_id}")]


def progress_record(members: list[Member], pack_id: str | None) -> ProgressRecord:
    """Each member's progress.json: the pack's step, the member's own curve, and whether it still trains."""
    runs = [(m.run_dir, m.callback(LearningCurve)) for m in members]
    return ProgressRecord(runs, pack=pack_id, alive=members_alive)


def members_alive(module: PackedModule) -> list[bool]:
    """Which members still train (a function of its own: spawned ranks take the callbacks pickled)."""
    return module.alive.tolist()


def start_loggers(members: list[Member], pack_id: str | None) -> list[dict]:
    """Each member's loggers, started with its config (member_config) and, where it continues, from its step (the
    rows before it are kept); returns the configs. W&B runs start slowly, mostly waiting on its service: in
    parallel."""
    for member in members:  # none in a fast_dev_run (debug=fast), as Lightning leaves a single run's out
        quiet = member.cfg.trainer.get("fast_dev_run")
        member.loggers = [] if quiet else instantiate_all(member.cfg.get("logger"), "logger")
    configs = [member_config(m, pack_id, len(members)) for m in members]
    with ThreadPoolExecutor(8) as pool:
        resumed = [m.start_step if m.checkpoint is not None else None for m in members]
        starts = [
            pool.submit(loggers_.start, m.loggers, c, step)
            for m, c, step in zip(members, configs, resumed, strict=True)
        ]
        for started in starts:
            started.result()
    return configs


def test_best(module: PackedModule, trainer, members: list[Member], handover: Handover | None) -> tuple[dict, list]:
    """Each member's best checkpoint tested, as its single run's: the test metrics ({metric: a value per member})
    and each member's kept predictions (none with several devices, where each rank tests a share); none without a
    test split."""
    for member in members:
        if member.best["state"] is not None:
            module.stack.load_member(member.index, member.best["state"])
    if not all(m.datamodule.splits.get("test") for m in members):
        return {}, [None] * len(members)
    trainer.test(module, datamodule=PackedData([m.datamodule for m in members]), verbose=False)
    if handover:
        handover.take_back(module)
    return module.tested, module.kept.fields() if trainer.world_size == 1 else [None] * len(members)


def debug_limits(trainer_cfg) -> dict:
    """Lightning's overfit_batches=k (debug=overfit) as a pack takes it: k training batches in their stored order,
    validated on k batches, as Lightning does it with a sequential sampler, which it cannot put in a pack's loader
    (PackedData keeps the order itself); the Trainer's keyword arguments."""
    k = trainer_cfg.get("overfit_batches") or 0
    return {"overfit_batches": 0, "limit_train_batches": k, "limit_val_batches": k} if k else {}


def diverged(member: Member, module: PackedModule, size: int) -> TrainingError:
    """The error of a member frozen at a non-finite training objective: its step, the suspect settings, and what
    its last.ckpt holds (objective.non_finite_loss)."""
    last = member.run_dir / "checkpoints" / "last.ckpt"
    settings = {f"optim.{k}": v for k, v in member.cfg.optim.items()}
    settings["trainer.gradient_clip_val"] = member.cfg.trainer.get("gradient_clip_val")
    step, in_loss = int(module.diverged_at[member.index]), bool(module.diverged_in_loss[member.index])
    message = objective.non_finite_loss(step, last if last.is_file() else None, in_loss, settings)
    return TrainingError(message + (" (the other members of its pack went on)" if size > 1 else ""))


def own_callbacks(members: list[Member]) -> list[pl.Callback]:
    """A run's own callbacks (+callbacks.<name>=...: anything a pack does not do itself), which a pack of one runs
    in its Trainer as a single run would; packs of several are refused them (headlab.config.callbacks.pack_refusal)."""
    if len(members) != 1:
        return []
    done = (ModelCheckpoint, EarlyStopping, pl.callbacks.ProgressBar, AttentionLogger, LearningCurve)
    return [c for c in members[0].callbacks if not isinstance(c, done)]


def pack_trainer(members: list[Member], callbacks: list[pl.Callback], own: list[pl.Callback]) -> pl.Trainer:
    """The pack's Trainer, from its members' trainer config: its callbacks, then a run's own (own_callbacks), with
    the run's loggers where it has some (what such a callback logs goes where a single run's would), else none of
    Lightning's; no checkpoints (MemberWriter writes each member's), its epochs resolved from the data its members
    share (pack_key), Lightning's debug runs as a pack takes them (debug_limits)."""
    cfg = members[0].cfg
    loggers = members[0].loggers if own else []
    trainer = instantiate_node(
        cfg.trainer, "trainer", callbacks=[*callbacks, *own], logger=loggers or False, enable_checkpointing=False,
        **progress_.none_without_a_bar(callbacks, cfg.trainer), **epochs.placeholder(cfg), **debug_limits(cfg.trainer),
        **cores.rank_environment(cfg.trainer),
    )  # fmt: skip
    epochs.resolve(trainer, cfg, members[0].datamodule)
    return trainer


def fit_pack(trainer, module: PackedModule, members: list[Member], handover: Handover | None) -> float:
    """Fit the pack, continuing its members where they continue (resume.pack_checkpoint), and validate once more a
    pack continued after its training ended; with ranks in processes of their own, take back what rank 0 learned
    (Handover) and teach the loggers the rows it wrote; a SIGTERM the fit took note of stops the pack here. Returns the
    fit's seconds."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:  # the pack's checkpoint, when its members continue
        ckpt_path = resume.pack_checkpoint(members, module, Path(folder) / "pack.ckpt")
        data = PackedData([m.datamodule for m in members], shuffle=not members[0].cfg.trainer.get("overfit_batches"))
        trainer.fit(module, datamodule=data, ckpt_path=ckpt_path, weights_only=True)
    if trainer.received_sigterm:  # in the fit's last moments (its last hooks): Lightning stops at a next step or
        raise SIGTERMException  # batch, which never came; the test and the head analysis are not begun
    fit_seconds = time.perf_counter() - started
    if handover:
        handover.take_back(module)
        for member in members:
            loggers_.resync_csv(member.loggers)
    if ckpt_path and not all("val/acc" in m.metrics for m in members):  # continued after training ended:
        trainer.validate(module, datamodule=PackedData([m.datamodule for m in members]), verbose=False)
        if handover:
            handover.take_back(module)
    return fit_seconds


def pack_module(members: list[Member], pack_id: str | None) -> tuple[PackedModule, compute.ComputeChoice | None]:
    """The members as one model, seeded as a single run is before training; and where pack.compute=auto times its
    ways (compute.to_measure), the callback that does."""
    cfg = members[0].cfg  # compile and pack.compute: one value for the pack (pack_key)
    pl.seed_everything(cfg.seed, workers=True)
    models, streams = [m.module.model for m in members], [m.stream for m in members]
    hparams = [m.module.hparams for m in members]
    module = PackedModule(models, hparams, streams, bool(cfg.model.get("compile")), compute.asked(cfg))
    return module, compute.ComputeChoice(pack_id, cfg) if compute.to_measure(cfg, len(members)) else None


def train_pack(
    members: list[Member], pack_id: str | None, progress: bool = True, threads: int | None = None
) -> list[dict | BaseException]:
    """Train built members (build_member) of one shape as one model; return each member's results.json fields,
    or the error that ended it. progress=False: packs side by side share a console (plain lines, pack_progress).
    pack_id None: the one run of headlab-train. threads: each rank's torch threads where ranks run in processes of
    their own (cores.rank_share), else this process's."""
    configure_torch(members[0].cfg, torch.get_num_threads())
    threads = threads or torch.get_num_threads()
    line = records.model_line(records.model_fields(members[0].module.model, members[0].datamodule))
    log.info(line if pack_id is None else f"pack {pack_id}: {line}")
    for index, member in enumerate(members):
        member.index = index
    size = len(members)
    writes = cores.process_rank() == 0  # the other ranks of a run that re-runs its command write nothing
    module, choice = pack_module(members, pack_id)
    configs = start_loggers(members, pack_id)
    meter = ThroughputMeter()
    outputs = MemberWriter(members, pack_id, meter)
    stopping, bars = MembersStopping(members, pack_id), pack_progress(members, pack_id, progress)
    elsewhere = cores.rank_start(members[0].cfg.trainer) is not None
    handover = Handover(members, meter, threads) if elsewhere else None
    ranks = [ProcessGroupRelease(), *([handover, RankThreads(threads)] if elsewhere else [])]
    callbacks = [meter, outputs, *bars, stopping, ExactResume(), progress_record(members, pack_id), *ranks]
    callbacks += [choice] if choice else []
    trainer = pack_trainer(members, callbacks, own_callbacks(members))  # the bars before the stopping: a
    # validation's line still counts the members that stop at it
    failed = True
    try:
        fit_seconds = fit_pack(trainer, module, members, handover)
        test, kept = test_best(module, trainer, members, handover)
        if handover:
            handover.analyse_here(module, trainer)
        rate = meter.rate * trainer.world_size if meter.rate else None  # over every rank
        computed = compute.record(module, choice)
        analysed, jobs, results = measure_heads(module, members) if writes else [None] * size, [], []
        for member in members:
            if module.diverged_at[member.index] >= 0:
                results.append(diverged(member, module, size))
                continue
            if member.best["score"] is not None:
                member.metrics[VAL_ACC_BEST] = member.best["score"]
            member.metrics.update({k: v[member.index] for k, v in test.items()})
            attention = member.callback(AttentionLogger)
            if attention and writes:  # on the weights its test evaluated, as a single run's
                model = outputs.member_model(member, module)
                checkpoint = member.best["path"] if member.best["state"] is not None else None
                job = attention.publish(
                    model, member.datamodule, member.loggers, module.device, member.position(trainer)[1], checkpoint,
                    analysed[member.index], media=False,
                )  # fmt: skip
                if job:
                    jobs.append((member, job))
            for logger in member.loggers:  # after the head analysis, as a single run's test comes after its fit
                tested = {k: v[member.index] for k, v in test.items()}
                epoch, step = member.position(trainer)
                logger.log_metrics({**tested, "epoch": epoch}, step=step)
            fields = pack_fields(
                member, rate, trainer, fit_seconds, size, pack_id, kept[member.index], threads, computed
            )
            results.append(fields)
        outputs.render_importance(jobs)
        failed = False
    finally:
        outputs.close()
        if handover:
            handover.close()
        with ThreadPoolExecutor(8) as pool:  # W&B runs finish while they flush: in parallel
            identities = list(
                pool.map(
                    lambda m: loggers_.finish(m.loggers, failed, m.metrics, configs[m.index], m.position(trainer)[1]),
                    members,
                )
            )
        for member, identity in zip(members, identities, strict=True):
            member.wandb = identity
    for member, result in zip(members, results, strict=True):
        if isinstance(result, dict):
            result["wandb"] = member.wandb
    return results


def train_run(cfg, flat_config: dict, threads: int, run_dir: Path) -> dict:
    """The run of headlab-train: a pack of one, on one device or several (DDP: pack.ranks), with its own callbacks
    (own_callbacks) if it has some; its results.json fields.

    threads: torch CPU threads for this job (the machine's cores shared among the jobs of a parallel sweep)."""
    if cfg.trainer.get("accelerator") == "gpu" and cores.parallel_jobs() > 1:  # one GPU per job of a local sweep
        with open_dict(cfg):
            cfg.trainer.devices = [cores.gpu_for_job(torch.cuda.device_count())]
    threads = cores.rank_share(cfg.trainer, threads)  # CPU ranks share this job's cores
    elsewhere = cores.rank_start(cfg.trainer) is not None
    configure_torch(cfg, 1 if elsewhere else threads)  # before the data and model are built; a job that starts its
    # ranks only prepares and waits
    (result,) = train_members([Member(cfg=cfg, run_dir=run_dir, flat_config=flat_config)], None, threads=threads)
    if isinstance(result, BaseException):
        raise result
    return result


def train_members(given: list[Member], pack_id: str | None, progress: bool = True, threads: int | None = None) -> list:
    """Build the members of a pack (each a config, a run directory and a flat config: Job.member), split them by
    shape and by what fits in memory, and train each part; each member's results.json fields, or the error that
    ended it. Runs where the pack trains: in the launcher's process, or in a worker of its own
    (headlab.launch.workers); pack_id None: the one run of headlab-train (train_run)."""
    results: list = [None] * len(given)
    members = {}
    for i, member in enumerate(given):
        try:
            build_member(member)
            if member.cfg.get("resume"):
                resume.load(member)
        except Exception as error:
            results[i] = error
            continue
        members[i] = member
    by_shape: dict[tuple, list] = {}  # members train together with one shape, from one step
    for i, member in members.items():
        by_shape.setdefault((shape_key(member), member.start_step), []).append(i)
    parts = []
    for indices in by_shape.values():
        step = members_that_fit([members[i] for i in indices])
        parts += [indices[i : i + step] for i in range(0, len(indices), step)]
    for p, part in enumerate(parts):
        part_id = pack_id if len(parts) == 1 or pack_id is None else f"{pack_id}.{p}"
        if part_id is not None:
            log.info("pack %s: %d members", part_id, len(part))
        try:
            trained = train_pack([members[i] for i in part], part_id, progress, threads)
        except Exception as error:  # the pack itself failed: each member records it; the sweep goes on
            trained = [error] * len(part)
        for i, result in zip(part, trained, strict=True):
            results[i] = result
    return results
