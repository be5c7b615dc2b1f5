"""A callback of a run's own (+callbacks.watch._target_=own_callback.Watch), reading what a callback written for a
single run reads: its model's weights and gradients (pl_module.model), its metrics (trainer.callback_metrics) and
loggers, logging through pl_module.log, and keeping its state in the run's checkpoints. And one that says what the
garbage collector holds as training starts (own_callback.Collector)."""

import atexit
import gc
import json
import sys
from pathlib import Path

import lightning.pytorch as pl


class Watch(pl.Callback):
    """At each validation: the epoch, the step, the token embedding's norm and the metrics the trainer holds, logged
    as own/embedding_norm; the first step's gradient norm; all of it written to `out` when training ends."""

    def __init__(self, out: str):
        self.out, self.seen, self.first_gradient = Path(out), [], None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.first_gradient is None:
            self.first_gradient = float(pl_module.model.tok_emb.weight.grad.norm())

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        norm = float(pl_module.model.tok_emb.weight.norm())
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.seen.append({"epoch": trainer.current_epoch, "step": trainer.global_step, "norm": norm, **metrics})
        pl_module.log("own/embedding_norm", norm)

    def on_train_end(self, trainer, pl_module):
        loggers = [type(logger).__name__ for logger in trainer.loggers]
        self.out.write_text(json.dumps({"seen": self.seen, "first_gradient": self.first_gradient, "loggers": loggers}))

    def state_dict(self) -> dict:
        return {"seen": self.seen, "first_gradient": self.first_gradient}

    def load_state_dict(self, state: dict) -> None:
        self.seen, self.first_gradient = state["seen"], state["first_gradient"]


class Collector(pl.Callback):
    """As training starts: how many objects the garbage collector has frozen and whether it is on, written by each
    rank to its own file in the folder `out` (rank0.json, ...); as the run's last stage ends, the scipy modules
    its process has imported (rank0_end.json, ...); as the process of a stage's rank exits, whether a process group
    is still up (rank0_fit_exit.json, ...)."""

    def __init__(self, out: str):
        self.out, self.exit_files = Path(out), []

    def setup(self, trainer, pl_module, stage):
        if self not in _collectors:  # a rank that re-ran the command sets up for the fit, then for the test
            _collectors.append(self)
        self.exit_files.append(self.out / f"rank{trainer.global_rank}_{stage.value}_exit.json")

    def on_train_start(self, trainer, pl_module):
        self.out.mkdir(parents=True, exist_ok=True)
        state = {"frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(state))

    def teardown(self, trainer, pl_module, stage):
        scipy = sorted(m for m in sys.modules if m.startswith(("scipy.signal", "scipy.stats")))
        (self.out / f"rank{trainer.global_rank}_end.json").write_text(json.dumps({"stage": stage, "scipy": scipy}))


_collectors: list[Collector] = []  # those set up in this process


def _at_exit() -> None:
    """Registered as this module imports (a spawned rank unpickles its callbacks before it sets up), so it runs
    after the exit handlers the run registers as it sets up: what is left of the process group at the very end, and
    of the DDP wrappers that hold one."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    wrappers = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())  # each holds a group
    state = {"process_group": dist.is_available() and dist.is_initialized(), "ddp_wrappers": wrappers}
    for path in (path for collector in _collectors for path in collector.exit_files):
        path.write_text(json.dumps(state))


atexit.register(_at_exit)
