"""What headlab-train costs over its model's bare training step: a run's training tokens/s (its results.json)
against a plain loop of the same step (forward, loss, backward, clipping, AdamW) over the same model, config and
batches, the batches already on the device, with one synchronisation at each end."""

import os
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from headlab.cli.bench.commands import TRAIN, sst2_recipe_overrides
from headlab.cli.bench.timing import synchronize
from headlab.conventions import IGNORE_INDEX
from headlab.record import read_record


def bare_step(cfg: DictConfig) -> dict:
    """Real (non-padding) training tokens per second of one epoch of cfg's model stepped in a plain loop, and the
    tokens counted. The first batch is stepped once before the clock starts (one-off costs)."""
    import lightning.pytorch as pl

    from headlab.launch import runtime
    from headlab.training import optim
    from headlab.training.build import build, configure_torch

    runtime.configure()
    configure_torch(cfg, torch.get_num_threads())
    pl.seed_everything(cfg.seed, verbose=False)
    datamodule, model = build(cfg)
    device = torch.device("cuda" if cfg.trainer.accelerator == "gpu" else "cpu")
    model.to(device).train()
    bf16 = "bf16" in str(cfg.trainer.get("precision", "32"))
    groups = optim.parameter_groups(model, cfg.optim.weight_decay)  # the run's AdamW (optim.fused's rule)
    optimizer = optim.adamw(groups, cfg.optim.lr, cfg.optim.betas, device.type == "cpu" and not bf16)
    clip = cfg.trainer.get("gradient_clip_val")
    batches = [{k: v.to(device) for k, v in b.items()} for b in datamodule.train_dataloader()]

    def step(batch: dict) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(batch["tokens"], batch["padding_mask"])  # (B, C) or (B, n, C)
        loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=IGNORE_INDEX
        )
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step(batches[0])
    synchronize(device)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = sum(int((~b["padding_mask"]).sum()) for b in batches)
    return {"tokens": tokens, "tokens_per_s": tokens / seconds}


def step_overhead(tmp: Path, name: str, overrides: list[str], label: str | None = None) -> dict:
    """headlab-train with these overrides (offline W&B), then the bare step on its saved config; label: the
    command as the report names it (default: the command)."""
    run_dir = tmp / name
    subprocess.run(
        [*TRAIN, *overrides, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env=os.environ | {"WANDB_MODE": "offline"},
        check=True,
    )
    record = read_record(run_dir)
    bare = bare_step(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
    run_rate = record["throughput"]["train_tokens_per_s"]
    return {
        "command": label or "headlab-train " + " ".join(overrides),
        "run_tokens_per_s": run_rate,
        "bare_tokens_per_s": bare["tokens_per_s"],
        "ratio": bare["tokens_per_s"] / run_rate,
    }


def sst2_recipe_overhead(tmp: Path, data_dir: Path, trainer: str) -> dict | None:
    """step_overhead of one epoch of the SST-2 recipe on trainer (cpu, gpu); None without the SST-2 files."""
    overrides = sst2_recipe_overrides(data_dir, tmp / "sst2-recipe-cache")
    if overrides is None:
        return None
    shown = f"headlab-train experiment=sst2_recipe trainer={trainer} trainer.max_epochs=1"  # SST-2 from the files
    return step_overhead(tmp, f"sst2-{trainer}", [*overrides, f"trainer={trainer}", "trainer.max_epochs=1"], shown)


def report(r: dict | None) -> list[str]:
    """The markdown lines of a step_overhead figure (none without one)."""
    if r is None:
        return []
    return [
        "",
        f"Step overhead: `{r['command']}` trains at {r['run_tokens_per_s']:,.0f} tokens/s; the same model's bare "
        f"step (forward, loss, backward, clipping, AdamW, batches already on the device) at "
        f"{r['bare_tokens_per_s']:,.0f}: headlab-train is {r['ratio']:.2f}x slower than its model's step.",
    ]
