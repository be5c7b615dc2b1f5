"""Lightning callbacks of every run: training throughput, the learning curve, and what a run needs to resume exactly,
stop cleanly and use its share of the CPU. (Per-head attention logging: headlab.training.attention_logging.)"""

import random
import time

import lightning.pytorch as pl
import numpy as np
import torch

CURVE_METRICS = ("val/acc", "val/loss")


class ThroughputMeter(pl.Callback):
    """Real (non-padding) training tokens per second of training.

    Timed from the second training step of each epoch to its last, with validation left out, and with one device
    synchronisation at each end of a timed stretch and none per step: the tokens are counted on the device (one
    rank's: pack.writer.MemberWriter logs the rate times the ranks as perf/train_tokens_per_s).
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


class LearningCurve(pl.Callback):
    """The validation metrics of every validation and the real (non-padding) training tokens seen by then, for
    results.json's `curve`: [{epoch, step, tokens, val/acc, val/loss}] (tokens: over all ranks, each rank's count
    times the ranks). Kept in checkpoints, so that a resumed run's curve and count start where they were left.
    A run's pack counts the tokens (headlab.training.pack.writer) and sets `tokens`; this callback only keeps them."""

    def __init__(self):
        self.points: list[dict] = []
        self.tokens = 0  # real training tokens so far

    def add(self, epoch: int, step: int, metrics: dict) -> None:
        point = {"epoch": epoch, "step": step, "tokens": int(self.tokens)}
        point.update({k: float(v) for k, v in metrics.items() if k in CURVE_METRICS})
        self.points = [p for p in self.points if p["step"] < step] + [point]  # a validation repeated on resume

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
