"""A pack on several devices (DDP; headlab-train's run with trainer.devices > 1 is such a pack of one): each rank
trains its share of every batch, the members' metrics are summed over the ranks (PackedModule.epoch_metrics), and
rank 0 writes. Where Lightning trains the ranks in processes of their own (ddp_fork, ddp_spawn: cores.rank_start),
what rank 0 learned of its members comes back to the job's process through a file (Handover), from which that
process tests, analyses and records them as it would members it trained itself.

Shapes: E members.
"""

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch

from headlab.training import cores
from headlab.training.build import configure_torch
from headlab.training.callbacks import ThroughputMeter
from headlab.training.checkpoints import model_state
from headlab.training.pack.member import Member


class ProcessGroupRelease(pl.Callback):
    """Each process of a run on several devices destroys its process group as it exits, before Python and C++ tear
    down what is left (atexit, registered as the rank sets up): a gloo group alive at a process's exit aborts the
    process now and then ("terminate called without an active exception", SIGABRT; a spawned rank that aborts fails
    the run). Lightning's teardown has let go of the DDP wrapper that holds it by then."""

    def setup(self, trainer, pl_module, stage):
        if trainer.world_size > 1:
            _release_at_exit()


@functools.cache
def _release_at_exit() -> None:
    atexit.register(_release_process_group)


def _release_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Handover(pl.Callback):
    """Rank 0, at the end of a fit, a validation or a test in the ranks' own processes, writes what its members and
    the pack learned there: each member's metrics, best checkpoint, callbacks' state (learning curve, checkpoint
    tracking, early stopping) and where it stopped; the pack's frozen members, test metrics, throughput and
    position. `take_back` puts them into the job process's members, module and meter."""

    def __init__(self, members: list[Member], meter: ThroughputMeter, threads: int):
        self.members, self.meter, self.threads = members, meter, threads
        self.folder = Path(tempfile.mkdtemp(prefix="headlab-ranks-"))
        self.path = self.folder / "rank0.pt"

    def on_fit_end(self, trainer, pl_module):
        self._write(trainer, pl_module)

    def on_validation_end(self, trainer, pl_module):
        if trainer.state.fn == "validate":
            self._write(trainer, pl_module)

    def on_test_end(self, trainer, pl_module):
        self._write(trainer, pl_module)

    def _write(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        members = [
            {
                "metrics": m.metrics,
                "best": {"score": m.best["score"], "path": None if m.best["path"] is None else str(m.best["path"])},
                "stopped": m.stopped,
                "callbacks": {c.state_key: c.state_dict() for c in m.callbacks if c.state_dict()},
            }
            for m in self.members
        ]
        pack = {k: getattr(pl_module, k).cpu() for k in ("alive", "diverged_at", "diverged_in_loss")}
        state = {
            "members": members,
            "pack": {**pack, "tested": pl_module.tested, "last_losses": getattr(pl_module, "last_losses", None)},
            "meter": {"tokens": int(self.meter.tokens), "seconds": self.meter.seconds},
            "position": (trainer.current_epoch, trainer.global_step) if trainer.state.fn == "fit" else None,
        }
        torch.save(state, self.path)  # plain types and tensors: read back with weights_only=True

    def take_back(self, pl_module) -> None:
        """What rank 0 wrote last, into this process's members, module and meter; nothing where it wrote nothing."""
        if not self.path.is_file():
            return
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        for member, saved in zip(self.members, state["members"], strict=True):
            member.metrics, member.stopped = saved["metrics"], saved["stopped"] and tuple(saved["stopped"])
            for callback in member.callbacks:
                if callback.state_key in saved["callbacks"]:
                    callback.load_state_dict(saved["callbacks"][callback.state_key])
            path = saved["best"]["path"] and Path(saved["best"]["path"])
            if path != member.best["path"]:
                member.best = {"score": saved["best"]["score"], "path": path, "state": path and model_state(path)}
            if state["position"] is not None:  # a test's ranks start from the job process's trainer, at step 0
                member.ended = tuple(state["position"])
        pack = state["pack"]
        for key in ("alive", "diverged_at", "diverged_in_loss"):
            getattr(pl_module, key).copy_(pack[key])
        pl_module.tested, pl_module.last_losses = pack["tested"], pack["last_losses"]
        self.meter.tokens, self.meter.seconds = state["meter"]["tokens"], state["meter"]["seconds"]

    def analyse_here(self, pl_module, trainer) -> None:
        """The ranks are done: this process analyses the heads, on the run's device (a GPU's, with ddp_spawn) and,
        where its ranks were spawned, on their threads (forked ranks leave it on one: a process forked after torch
        ran on several threads hangs, cores.rank_threads, and a later job of a sweep forks again)."""
        pl_module.to(trainer.strategy.root_device)
        cfg = self.members[0].cfg
        if cores.rank_start(cfg.trainer) == "spawn":
            configure_torch(cfg, self.threads)  # which notes the threads for the forks of later jobs

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
