"""Lightning callbacks of every run: training throughput, the learning curve, and what a run needs to resume exactly,
stop cleanly and use its share of the CPU. (Per-head attention logging: headlab.training.attention_logging.)"""

import random
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

CURVE_METRICS = ("val/acc", "val/loss")


class ThroughputMeter(pl.Callback):
    """Real (non-padding) training tokens per second of training.

    Timed from the second training step of each epoch to its last, with validation left out, and with one device
    synchronisation at each end of a timed stretch and none per step: the tokens are counted on the device.
    Logged as perf/train_tokens_per_s at each epoch's end: rank 0's rate times the number of ranks, so that it also
    reaches the main process of a forked or spawned DDP run.
    """

    def __init__(self):
        self.tokens, self.seconds, self._start = 0, 0.0, None

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def _pause(self, pl_module) -> None:
        if self._start is not None:
            self.seconds += self._now(pl_module) - self._start
            self._start = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:  # the first step of an epoch pays one-off costs (and the DataLoader's start)
            self._start = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._start is not None:
            self.tokens = self.tokens + (~batch["padding_mask"]).sum()
        if batch_idx + 1 >= trainer.num_training_batches:
            self._pause(pl_module)

    def on_validation_start(self, trainer, pl_module):
        self._pause(pl_module)

    def on_validation_end(self, trainer, pl_module):
        if trainer.training and not trainer.sanity_checking:
            self._start = self._now(pl_module)

    @property
    def rate(self) -> float | None:
        return float(self.tokens) / self.seconds if self.seconds else None

    def on_train_epoch_end(self, trainer, pl_module):
        if self.rate:
            pl_module.log("perf/train_tokens_per_s", self.rate * trainer.world_size, rank_zero_only=True)


class LearningCurve(pl.Callback):
    """The validation metrics of every validation and the real (non-padding) training tokens seen by then, for
    results.json's `curve`: [{epoch, step, tokens, val/acc, val/loss}] (tokens: over all ranks, each rank's count
    times the ranks). Kept in checkpoints, so that a resumed run's curve and count start where they were left.
    A pack counts its members' tokens itself (headlab.training.pack.writer) and sets `tokens`."""

    def __init__(self):
        self.points: list[dict] = []
        self.tokens = 0  # real training tokens so far: a device tensor while training (no sync a step)

    def add(self, epoch: int, step: int, metrics: dict) -> None:
        point = {"epoch": epoch, "step": step, "tokens": int(self.tokens)}
        point.update({k: float(v) for k, v in metrics.items() if k in CURVE_METRICS})
        self.points = [p for p in self.points if p["step"] < step] + [point]  # a validation repeated on resume

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tokens = self.tokens + (~batch["padding_mask"]).sum() * trainer.world_size

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.add(trainer.current_epoch, trainer.global_step, trainer.callback_metrics)

    def state_dict(self) -> dict:
        return {"points": self.points, "tokens": int(self.tokens)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.points = list(state_dict.get("points", []))
        self.tokens = int(state_dict.get("tokens", 0))  # a checkpoint from before tokens were counted: 0


class ExactResume(pl.Callback):
    """What a resumed run needs to go on as the run left alone would have: the random generators' states
    (torch's CPU and CUDA generators, numpy, python), kept in every checkpoint and restored, so that it draws the
    same dropout masks; and the training loader's position in its epoch (EpochLoader), handed to the datamodule
    before the loader is built."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        checkpoint["random_state"] = {  # plain types and tensors only: loadable with weights_only=True
            "torch": torch.get_rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            checkpoint["random_state"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        loaders = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
        if loaders and hasattr(trainer.datamodule, "train_loader_state"):
            trainer.datamodule.train_loader_state = loaders[0]
        if "random_state" in checkpoint:
            state = checkpoint["random_state"]
            torch.set_rng_state(state["torch"])
            kind, keys, pos, has_gauss, gauss = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
            random.setstate(tuple(state["python"]))
            if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(state["cuda"])


class RankThreads(pl.Callback):
    """Each rank's torch CPU threads, set in the rank itself: ranks forked or spawned by Lightning start with
    Lightning's choice (all the machine's cores over the ranks), not this job's share of a parallel sweep."""

    def __init__(self, threads: int):
        self.threads = threads

    def setup(self, trainer, pl_module, stage):
        torch.set_num_threads(self.threads)


class SaveOnInterrupt(pl.Callback):
    """SIGTERM (how SLURM preempts) while training: save checkpoints/last.ckpt at the step where Lightning stopped,
    so that `resume=<run dir>` (or the requeued SLURM job) continues from there, as the run left alone would have
    (the random states are in the checkpoint; EpochLoader skips the batches trained on).

    Anywhere else (in a validation, the head analysis, the test, a multi-device run) and after Ctrl-C or another
    exit, which can land inside an optimizer step, last.ckpt stays the one written after the last validation: a
    resume repeats the work since then, and ends the same."""

    def on_exception(self, trainer, pl_module, exception):
        checkpoint = trainer.checkpoint_callback
        between_steps = trainer.training and trainer.world_size == 1  # not validating, testing or sanity checking
        if isinstance(exception, SIGTERMException) and between_steps and checkpoint and checkpoint.dirpath:
            trainer.save_checkpoint(Path(checkpoint.dirpath) / "last.ckpt")


def stop_if_signalled(trainer) -> None:
    """Lightning notes a SIGTERM and stops at its next step or batch; work of ours that runs long inside a fit
    (the head analysis) asks the same question between its own steps."""
    if trainer.received_sigterm:
        raise SIGTERMException
