"""Packed training against one model at a time: training-step throughput of packs of E members, and whole sweeps
(a packed sweep against the same sweep on Hydra's default launcher), start to end."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from headlab.cli.bench import matmuls
from headlab.cli.bench.commands import TRAIN
from headlab.cli.bench.timing import synchronized
from headlab.files import write_text_atomic
from headlab.model import Encoder, flops_per_token
from headlab.record import RESULTS, TEST_ACC, read_record
from headlab.timing import interleaved
from headlab.training import optim
from headlab.training.cores import usable_cores
from headlab.training.pack import compute
from headlab.training.vectorized import PackedAdamW, Stacked, clip_per_member

# the default run's model and batches (pair_recall: 32 positions of two fused tokens, 19 classes), and the SST-2
# recipe's (one layer, d_model 256, sequences up to 64 tokens, 16k vocabulary)
SHAPES = {
    "default run": {"vocab": 139, "classes": 19, "n": 32, "batch": 64, "d_model": 64, "readout": "token"},
    "SST-2 recipe": {"vocab": 16000, "classes": 2, "n": 64, "batch": 64, "d_model": 256, "readout": "mean"},
}


class GpuBusy:
    """The GPU's utilisation (%) as nvidia-smi samples it every 100 ms while the block runs; None without it."""

    def __enter__(self):
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"]
        try:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        except OSError:
            return
        while not self._stop.is_set():
            line = process.stdout.readline()
            if line.strip().isdigit():
                self.samples.append(int(line))
        process.terminate()

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=2)

    @property
    def percent(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _models(shape: dict, E: int, device) -> list[Encoder]:
    kwargs = {"readout": shape["readout"], "d_model": shape["d_model"], "n_layers": 1, "dropout": 0.0}
    return [Encoder(shape["vocab"], shape["classes"], shape["n"], **kwargs).to(device) for _ in range(E)]


def _batch(shape: dict, E: int, device) -> tuple:
    tokens = torch.randint(1, shape["vocab"], (E, shape["batch"], shape["n"]), device=device)
    label_shape = (E, shape["batch"], shape["n"]) if shape["readout"] == "token" else (E, shape["batch"])
    return (
        tokens,
        torch.zeros_like(tokens, dtype=torch.bool),
        torch.randint(0, shape["classes"], label_shape, device=device),
    )


def _autocast(device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def pack_step(shape: dict, E: int, device, compute: str = "auto", compiled: bool = False):
    """One training step of a pack of E: forward, per-member losses, backward, per-member clipping, AdamW; compute:
    how the members compute together (pack.compute: each, batched, or the device's way); compiled: the members'
    forward through torch.compile (model.compile=true), compiled at its first step."""
    if compiled:
        torch._dynamo.reset()  # every pack its own graphs, none from an earlier pack's template
    stack = Stacked(_models(shape, E, device), compile=compiled, compute=compute).to(device)
    params = list(stack.parameters())
    optimizer = PackedAdamW(
        [{"params": params, "decay": True}], lr=[1e-4] * E, weight_decay=[0.01] * E, betas=[(0.9, 0.98)] * E
    )
    tokens, mask, labels = _batch(shape, E, device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device):
            logits = stack(tokens, mask)
        loss = F.cross_entropy(logits.reshape(-1, shape["classes"]).float(), labels.reshape(-1))
        loss.backward()
        clip_per_member([stack.flat], 1.0)
        optimizer.step()

    return step


def solo_steps(shape: dict, E: int, device):
    """E models stepped one after another, each with its own AdamW (optim.adamw, as a single run's) and clipping:
    what E separate jobs compute."""
    models = _models(shape, E, device)
    fused = device.type == "cpu"  # no Lightning, no mixed precision on the CPU here: optim.fused's rule
    optimizers = [optim.adamw([{"params": list(m.parameters())}], 1e-4, (0.9, 0.98), fused) for m in models]
    tokens, mask, labels = _batch(shape, E, device)

    def step():
        for e, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            optimizer.zero_grad(set_to_none=True)
            with _autocast(device):
                logits, _ = model(tokens[e], mask[e])
            F.cross_entropy(logits.reshape(-1, shape["classes"]).float(), labels[e].reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

    return step


def pack_throughput(
    device: torch.device,
    sizes: tuple,
    repeats: int,
    shapes: tuple = tuple(SHAPES),
    compiled: bool = False,
    peak: float | None = None,
) -> list[dict]:
    """Training tokens/s of packs of E against the same E models stepped one after another, and GPU busy (%);
    shapes: names in SHAPES. On a CPU both ways a pack computes (one member after another, and as one batched
    computation, torch.func.vmap), the pack's own being the one pack.compute=auto chooses by a timing of its own
    (compute.timed, not the figures reported); and compiled (model.compile=true, its compilation untimed).
    peak: the machine's matmul GFLOP/s, where measured: each row's ceiling, the tokens/s of a step that were its
    training FLOPs alone (headlab.model.flops_per_token) at that peak. On a CPU, beside it, the step's matmuls
    alone at their own shapes for the E members (matmuls.alone), timed with the others: the most any way of
    packing could reach here."""
    rows = []
    for name in shapes:
        shape = SHAPES[name]
        ceiling = peak * 1e9 / flops_per_token(_models(shape, 1, torch.device("cpu"))[0], shape["n"]) if peak else None
        for E in sizes:
            steps = {}
            if E <= 16 or device.type == "cuda":
                steps["one at a time"] = synchronized(solo_steps(shape, E, device), device)
            if device.type == "cpu":
                steps["matmuls alone"] = matmuls.alone(solo_steps(shape, 1, device), E)
            if device.type == "cpu" and E > 1:
                steps["each"] = synchronized(pack_step(shape, E, device, "each"), device)
                steps["vmap"] = synchronized(pack_step(shape, E, device, "batched"), device)
                chosen = compute.timed({"each": steps["each"], "vmap": steps["vmap"]})
                packed = min(chosen, key=chosen.get)
            else:  # a GPU's way (batched), or a pack of one (its model alone)
                packed = "each" if E == 1 else "vmap"
                steps[packed] = synchronized(pack_step(shape, E, device), device)
            if compiled:
                steps["compiled"] = synchronized(pack_step(shape, E, device, compiled=True), device)
                steps["compiled"]()  # its compilation, before the timed steps
            seconds = interleaved(steps, repeats)
            with GpuBusy() as busy:  # sampled while packed steps run for 2 s
                started = time.perf_counter()
                while time.perf_counter() - started < 2 and device.type == "cuda":
                    steps[packed]()
            tokens = E * shape["batch"] * shape["n"]
            row = {
                "shape": name,
                "members": E,
                "compute": "each" if packed == "each" else "batched",
                "packed_tokens_per_s": tokens / seconds[packed],
                "gpu_busy": busy.percent,
            }
            if "one at a time" in seconds:
                row["solo_tokens_per_s"] = tokens / seconds["one at a time"]
                row["ratio"] = seconds["one at a time"] / seconds[packed]
                if ceiling:
                    row["ceiling_tokens_per_s"], row["ceiling_ratio"] = ceiling, ceiling / row["solo_tokens_per_s"]
                if "matmuls alone" in seconds:
                    row["matmuls_tokens_per_s"] = tokens / seconds["matmuls alone"]
                    row["matmuls_ratio"] = seconds["one at a time"] / seconds["matmuls alone"]
            for path in ("each", "vmap", "compiled"):
                if path in seconds:
                    row[f"{path}_tokens_per_s"] = tokens / seconds[path]
            rows.append(row)
            del steps
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _wall(command: list[str], env: dict, log: Path) -> float:
    """Seconds of a command, start to end; its output in `log`."""
    started = time.perf_counter()
    done = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=3600
    )
    seconds = time.perf_counter() - started
    write_text_atomic(log, done.stdout.decode(errors="replace"))
    return seconds


def sweep_wall(tmp: Path, n_jobs: int, trainer: str, solo: bool) -> dict:
    """A seed sweep of the default run: one run, the packed sweep (its packs as the launcher makes them by default:
    on a CPU one a usable core), and (solo) the same sweep on Hydra's default launcher (its jobs one after another
    in this one process, no start-up between them), start to end."""
    env = os.environ | {"WANDB_MODE": "offline"}
    common = [f"trainer={trainer}", "callbacks.progress_bar=null"]
    one = _wall([*TRAIN, *common, f"hydra.run.dir={tmp}/one"], env, tmp / "one.log")
    packed_dir = tmp / f"packed-{n_jobs}"
    seeds = f"seed=range({n_jobs})"
    packed = _wall(
        [*TRAIN, "-m", "hydra/launcher=packed", seeds, *common, f"hydra.sweep.dir={packed_dir}"],
        env,
        tmp / f"packed-{n_jobs}.log",
    )
    records = [read_record(p.parent) or {} for p in packed_dir.glob(f"*/{RESULTS}")]
    completed = sum(r.get("status") == "completed" for r in records)
    packs = len({r["pack"]["id"] for r in records if r.get("pack")})
    row = {"jobs": n_jobs, "trainer": trainer, "one_run_s": one, "packed_s": packed, "packs": packs}
    row["completed"] = completed
    if solo:
        row["solo_s"] = _wall(
            [*TRAIN, "-m", seeds, *common, f"hydra.sweep.dir={tmp}/solo-{n_jobs}"], env, tmp / f"solo-{n_jobs}.log"
        )
    accuracies = [r.get("metrics", {}).get(TEST_ACC) for r in records]
    row["packed_test_acc"] = sorted(a for a in accuracies if a is not None)
    return row


def parallel_packs(tmp: Path, arms: str = "1,2,4,8", seeds: int = 4) -> dict:
    """An ablation-shaped packed sweep of the default run (one pack per head count), its packs one at a time
    (hydra.launcher.n_jobs=1) against one pack per core at once, start to end."""
    env = os.environ | {"WANDB_MODE": "offline"}
    sweep = ["-m", "hydra/launcher=packed", f"model.attention.n_heads={arms}", f"seed=range({seeds})"]
    common = [*sweep, "trainer=cpu", "callbacks.progress_bar=null"]
    at_once = max(2, min(usable_cores(), len(arms.split(","))))
    row = {"arms": arms, "seeds": seeds, "at_once": at_once}
    for n_jobs in (1, at_once):
        out = tmp / f"parallel-{n_jobs}"
        command = [*TRAIN, *common, f"hydra.launcher.n_jobs={n_jobs}", f"hydra.sweep.dir={out}"]
        row[f"s_{n_jobs}"] = _wall(command, env, tmp / f"parallel-{n_jobs}.log")
        statuses = [(read_record(p.parent) or {}).get("status") for p in out.glob(f"*/{RESULTS}")]
        row[f"completed_{n_jobs}"] = statuses.count("completed")
    return row


if __name__ == "__main__":  # a quick look: python -m headlab.cli.bench.packing [cuda]
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    for row in pack_throughput(device, (1, 4, 16, 64) if device.type == "cuda" else (1, 4, 16), 5):
        print(row)
