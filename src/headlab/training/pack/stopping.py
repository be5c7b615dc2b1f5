"""Early stopping in a pack, member by member: each member's own EarlyStopping (callbacks=early_stopping) decides on
its own validation metrics by Lightning's rule, and a member that stops is frozen where its single run would stop,
its last checkpoint written first; the pack ends when no member trains.

Shapes: E members.
"""

import logging

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping

from headlab.training.pack.member import Member

log = logging.getLogger("headlab")


class MembersStopping(pl.Callback):
    """After the members' metrics of a validation (MemberWriter.on_validation_epoch_end, before it in the callbacks'
    order) each of a member's EarlyStopping callbacks decides as Lightning's would on its metrics; after the checkpoints
    of that validation (MemberWriter.on_validation_end) the members that stop are frozen (PackedModule.alive), their
    epochs and step kept (Member.stopped) for their records."""

    def __init__(self, members: list[Member], pack_id: str | None):
        self.members, self.pack_id = members, pack_id
        self.stopping: list[tuple[Member, str]] = []  # the members that stop at this validation, and why

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        for member, alive in zip(self.members, pl_module.alive.tolist(), strict=True):
            logs, reasons = {k: torch.tensor(v) for k, v in member.metrics.items()}, []
            for stopper in [c for c in member.callbacks if isinstance(c, EarlyStopping)] if alive else []:
                if not stopper._validate_condition_metric(logs):  # Lightning's own checks and rule (the private
                    continue  # methods its callback calls on a single run's metrics); each callback decides
                should_stop, reason = stopper._evaluate_stopping_criteria(logs[stopper.monitor])
                if should_stop:
                    stopper.stopped_epoch, stopper.stopping_reason_message = trainer.current_epoch, reason
                    reasons.append(reason)
            if reasons:  # any of them stops the member, as any stops a single run's Trainer
                self.stopping.append((member, "; ".join(reasons)))

    def on_validation_end(self, trainer, pl_module):
        for member, reason in self.stopping:
            pl_module.alive[member.index] = False
            member.stopped = (trainer.current_epoch + 1, trainer.global_step)  # the epochs it trained, its step
            where = "" if self.pack_id is None else f"pack {self.pack_id}: member {member.index} "
            log.info("%searly stopping after epoch %d: %s", where, trainer.current_epoch + 1, reason)
        self.stopping = []
        if not pl_module.alive.any():  # every member stopped (or diverged): the pack ends with this epoch
            trainer.should_stop = True
