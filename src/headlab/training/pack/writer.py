"""What each member of a pack writes, as its single run would: its metrics to its own loggers, its best and last
checkpoints in the single run's format (resume= and headlab-heads load them), its attention logging, and on an
interrupt its last checkpoint where training stopped.

Shapes: E members.
"""

import logging
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from headlab.heads.figures import render_heads, render_importance
from headlab.record import TRAIN_METRICS
from headlab.training import optim, signals_held
from headlab.training.attention_logging import AttentionLogger
from headlab.training.callbacks import LearningCurve, ThroughputMeter
from headlab.training.checkpoints import save_checkpoint_atomic
from headlab.training.cores import usable_cores
from headlab.training.pack.member import Member
from headlab.training.pack.module import PackedModule

log = logging.getLogger("headlab")


class MemberWriter(pl.Callback):
    """Writes what each member's single run would: its metrics to its own loggers, best and last checkpoints in
    the single run's format (loadable by resume= and headlab-heads), attention logging, and on an interrupt its
    last checkpoint where training stopped."""

    def __init__(self, members: list[Member], pack_id: str, meter: ThroughputMeter):
        self.members, self.pack_id, self.meter = members, pack_id, meter
        self._pool = None

    def _alive(self, pl_module) -> list[bool]:
        return pl_module.alive.tolist()

    def _show(self, trainer, values: dict) -> None:
        """A pack of one's metrics in trainer.callback_metrics, where a single run's are: what a run's own callbacks
        read (Optuna's pruning, a callback of one's own); a pack of several has no one value of a metric."""
        if len(self.members) == 1:
            trainer.callback_metrics.update({k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()})

    def on_train_epoch_end(self, trainer, pl_module):
        self._log_train_epoch(trainer, pl_module)  # where no validation ended the epoch (on_validation_end)

    def _log_train_epoch(self, trainer, pl_module):
        """The epoch's training means, a row each member's loggers write out with the checkpoint that ends the
        epoch (a kill after it loses no row: a resume continues after that checkpoint)."""
        metrics = {k: v.tolist() for k, v in pl_module.epoch_metrics("train").items()}
        if not metrics:  # logged at the validation, or continued from this epoch's end: no step of it trained here
            return
        metrics["train/loss_epoch"] = metrics.pop("train/loss")  # logged on step and epoch, as Lightning names it
        rate = self.meter.rate
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            if alive:
                values = {k: v[member.index] for k, v in metrics.items()}
                member.metrics.update({k: v for k, v in values.items() if k in TRAIN_METRICS})
                batch = member.datamodule.batch_size * trainer.accumulate_grad_batches * trainer.world_size
                values["data/global_batch_size"] = float(batch)
                if rate:  # this member's share of the pack's rate, over every rank
                    values["perf/train_tokens_per_s"] = rate * trainer.world_size / len(self.members)
                for logger in member.loggers:
                    logger.log_metrics({**values, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)
                self._show(trainer, values)

    def on_train_start(self, trainer, pl_module):
        counted = [m.callback(LearningCurve).tokens for m in self.members]  # a member continued: where it was
        self.tokens = torch.tensor(counted, device=pl_module.device)  # (E,) real training tokens of each member

    def _count_tokens(self, member: Member) -> LearningCurve:
        """The member's learning curve, its token count brought up to this step."""
        curve = member.callback(LearningCurve)
        curve.tokens = int(self.tokens[member.index])
        return curve

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tokens += (~batch["padding_mask"]).sum((1, 2)) * trainer.world_size  # (E, B, n) -> (E,): each
        # member's own batch, its share on this rank times the ranks (as LearningCurve counts a run's)
        if trainer.global_step % trainer.log_every_n_steps or not any(m.loggers for m in self.members):
            return
        losses = pl_module.last_losses.tolist()
        lrs = (pl_module.optimizers().optimizer.lr * pl_module.optimizers().optimizer.scale).tolist()
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            values = {"train/loss_step": losses[member.index], "train/lr": lrs[member.index]}
            self._show(trainer, values)
            for logger in member.loggers if alive else ():  # a member stopped or diverged logs no more steps
                values["epoch"] = trainer.current_epoch  # as Lightning adds it to every row a run logs
                logger.log_metrics(values, step=trainer.global_step - 1)

    def on_validation_epoch_end(self, trainer, pl_module):
        metrics = {k: v.tolist() for k, v in pl_module.epoch_metrics("val").items()}
        if trainer.sanity_checking:
            return
        snapshots = []
        for member, alive in zip(self.members, self._alive(pl_module), strict=True):
            if not alive:
                continue
            values = {k: v[member.index] for k, v in metrics.items()}
            member.metrics.update(values)
            self._show(trainer, values)
            if trainer.state.fn != "fit":  # a pack continued after its training ended: its last epoch's numbers
                continue  # again, which its curve, its loggers and its head analysis already hold
            self._count_tokens(member).add(trainer.current_epoch, trainer.global_step, values)
            attention = member.callback(AttentionLogger)
            statistics_due, figures_due = (
                attention.due(trainer.current_epoch, trainer.max_epochs) if attention else (0, 0)
            )
            if statistics_due and trainer.is_global_zero:
                model = self.member_model(member, pl_module)
                step, device = trainer.global_step - 1, pl_module.device  # the step of the epoch's metrics
                snapshot = attention.log_heads(
                    model, member.datamodule, member.loggers, step, device, figures_due, media=False
                )
                if snapshot is not None:
                    snapshots.append((member, snapshot))
            for logger in member.loggers:  # after the heads' statistics, as a single run's rows come
                logger.log_metrics({**values, "epoch": trainer.current_epoch}, step=trainer.global_step - 1)
        if snapshots:  # matplotlib is most of the logging: the members' figures are drawn in parallel
            started = time.perf_counter()
            for (member, snapshot), pngs in zip(
                snapshots, self.rendered(render_heads, [{"snapshot": s} for _, s in snapshots]), strict=True
            ):
                AttentionLogger.log_media(member.loggers, snapshot, pngs)
            self._drew("figures", len(snapshots), started)

    def on_test_end(self, trainer, pl_module):
        self._show(trainer, {k: v[0] for k, v in pl_module.tested.items()})

    def rendered(self, render, jobs: list[dict]) -> list:
        """render(**job) of each job: in worker processes where two or more can draw at once beside this one (which
        waits for them), else in this process: one worker would draw them one after another, as this process does,
        and add its start and the snapshots' pickling (a single run, a pack on two cores or on a core of its own)."""
        if min(len(jobs), usable_cores() - 1) < 2:
            return [render(**job) for job in jobs]
        return [future.result() for future in [self.render_pool().submit(render, **job) for job in jobs]]

    def render_pool(self):
        """Worker processes for figures, started once per pack (forkserver: clean children, matplotlib preloaded)."""
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["headlab.heads.figures"])
            workers = min(len(self.members), usable_cores() - 1)
            self._pool = ProcessPoolExecutor(workers, mp_context=context)
        return self._pool

    def render_importance(self, jobs: list[tuple[Member, dict]]) -> None:
        """The members' importance figures (AttentionLogger.publish's jobs), rendered in parallel, then logged."""
        if not jobs:
            return
        started = time.perf_counter()
        rendered = self.rendered(render_importance, [job["figures"] for _, job in jobs])
        for (member, job), pngs in zip(jobs, rendered, strict=True):
            AttentionLogger.log_importance_media(member.loggers, job, pngs)
        self._drew("importance figures", len(jobs), started)

    def _drew(self, what: str, members: int, started: float) -> None:
        """'pack P: figures of 8 members in 11.4 s'; for the run of headlab-train (no pack id) 'figures in 1.6 s'."""
        seconds = time.perf_counter() - started
        if self.pack_id is None:
            log.info("%s in %.1f s", what, seconds)
        else:
            log.info("pack %s: %s of %d members in %.1f s", self.pack_id, what, members, seconds)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        if trainer.state.fn == "fit" and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._log_train_epoch(trainer, pl_module)  # before the checkpoints, and saved with them
        if trainer.fast_dev_run or not trainer.is_global_zero:  # debug=fast writes no checkpoint, as Lightning's
            return  # fast_dev_run in a single run; with several devices rank 0 writes
        pack_checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        with signals_held.held():  # every member's last.ckpt at this step, or none: a requeue continues them as one
            for member, alive in zip(self.members, self._alive(pl_module), strict=True):
                if alive:
                    self.save(member, pl_module, trainer, pack_checkpoint)
                for logger in member.loggers:
                    logger.save()

    def on_exception(self, trainer, pl_module, exception):
        """SIGTERM between two training steps (how SLURM preempts; Lightning stops at the next step): every member's
        last.ckpt where training stopped (a resume continues from that step). Anywhere else, and after Ctrl-C (which
        can land inside an optimizer step), last.ckpt stays the one of the last validation. Either way each
        member's logged rows are written out (a resume keeps those before its checkpoint's step)."""
        between_steps = trainer.training and trainer.world_size == 1  # with DDP the ranks may stop at other steps
        if isinstance(exception, SIGTERMException) and between_steps and not trainer.fast_dev_run:
            pack_checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            with signals_held.held():
                for member, alive in zip(self.members, self._alive(pl_module), strict=True):
                    if alive:
                        self.save(member, pl_module, trainer, pack_checkpoint, best=False)
        for member in self.members:
            for logger in member.loggers:
                logger.save()

    @staticmethod
    def member_model(member: Member, pl_module: PackedModule):
        """The member's own Encoder holding its current weights (from the stack)."""
        model = member.module.model
        model.load_state_dict(pl_module.stack.member_state(member.index))
        return model.to(pl_module.device)

    def save(self, member: Member, pl_module, trainer, pack_checkpoint: dict, best: bool = True) -> None:
        """checkpoints/last.ckpt, and best-epoch{E}-step{S}.ckpt when val/acc improved (the previous best goes). The
        member's weights are those the pack's checkpoint holds for it: a pack of one's own callback may put others
        there (Lightning's weight averaging puts the average, and the trained ones beside it), as in a single run's."""
        state = pl_module.stack.member_state(member.index, pack_checkpoint["state_dict"]["stack.flat"])
        directory = member.run_dir / "checkpoints"
        score = member.metrics.get("val/acc")
        improved = best and score is not None and (member.best["score"] is None or score > member.best["score"])
        if improved:
            old = member.best["path"]
            path = directory / f"best-epoch{trainer.current_epoch}-step{trainer.global_step}.ckpt"
            member.best = {"score": score, "path": path, "state": {k: v.cpu() for k, v in state.items()}}
        self._update_checkpoint_callbacks(member, directory)
        self._count_tokens(member)  # its checkpoint keeps the count where training stopped
        checkpoint = member_checkpoint(member, pl_module, trainer, pack_checkpoint, state)
        if improved:
            save_checkpoint_atomic(checkpoint, member.best["path"])
            if old is not None and old != member.best["path"]:
                old.unlink(missing_ok=True)
        save_checkpoint_atomic(checkpoint, directory / "last.ckpt")

    @staticmethod
    def _update_checkpoint_callbacks(member: Member, directory: Path) -> None:
        """Set the member's ModelCheckpoint callbacks as if they had saved these files: their state goes into the
        checkpoint, so that a resumed single run keeps tracking its best."""
        from lightning.pytorch.callbacks import ModelCheckpoint

        for callback in member.callbacks:
            if not isinstance(callback, ModelCheckpoint):
                continue
            callback.dirpath = str(directory)
            if callback.monitor is None:
                callback.best_model_path = callback.last_model_path = str(directory / "last.ckpt")
            elif member.best["path"] is not None:
                score = torch.tensor(member.best["score"])
                callback.best_model_path = callback.kth_best_model_path = str(member.best["path"])
                callback.best_model_score = callback.kth_value = score
                callback.best_k_models = {str(member.best["path"]): score}
                callback.current_score = torch.tensor(member.metrics["val/acc"])


def member_checkpoint(member: Member, pl_module: PackedModule, trainer, pack_checkpoint: dict, state: dict) -> dict:
    """The checkpoint the member's single run would have written at this point: the pack's loop state, the
    member's weights, its AdamW state and learning-rate schedule, its callbacks' state."""
    e, step = member.index, pack_checkpoint["global_step"]
    skip = ("state_dict", "optimizer_states", "lr_schedulers", "callbacks", "hyper_parameters", "hparams_name")
    checkpoint = {k: v for k, v in pack_checkpoint.items() if k not in skip}
    if "random_state" in checkpoint and pl_module.stack.streams is not None:  # its own stream, where it is now
        checkpoint["random_state"] = {**checkpoint["random_state"], "torch": pl_module.stack.streams[e].clone()}
    checkpoint["state_dict"] = {f"model.{name}": tensor.cpu() for name, tensor in state.items()}
    checkpoint["hyper_parameters"] = dict(member.module.hparams)
    module, hparams = member.module, member.module.hparams
    groups = optim.parameter_groups(module, hparams.weight_decay)
    optimizer = optim.adamw(groups, hparams.lr, hparams.betas, optim.fused(trainer))
    scale = float(pl_module.lr_scale(step)[e])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: scale)
    solo = optimizer.state_dict()
    moments = pl_module.optimizers().optimizer.state.get(pl_module.stack.flat)
    if moments:
        exp_avg, exp_avg_sq = (pl_module.stack.member_state(e, moments[k]) for k in ("exp_avg", "exp_avg_sq"))
        decayed, plain = optim.named_groups(module.model)  # the single run's AdamW state is in this order
        for i, name in enumerate(decayed + plain):
            solo["state"][i] = {
                "step": torch.tensor(float(moments["step"])),
                "exp_avg": exp_avg[name].cpu(),
                "exp_avg_sq": exp_avg_sq[name].cpu(),
            }
    schedule_state = schedule.state_dict()
    schedule_state.update(last_epoch=step, _step_count=step + 1)
    checkpoint["optimizer_states"] = [solo]
    checkpoint["lr_schedulers"] = [schedule_state]
    checkpoint["callbacks"] = {c.state_key: c.state_dict() for c in member.callbacks if c.state_dict()}
    return checkpoint
