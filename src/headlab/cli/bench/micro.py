"""Micro-benchmarks: headlab's encoder against nn.TransformerEncoder, additive scoring paths, the head designs,
the hook points, attention memory, the cost of capturing attention weights."""

import importlib.resources
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from headlab.model import Encoder, MultiHeadAttention, kernels, rules, training_flops_per_token
from headlab.model.additive import additive_scores_naive
from headlab.model.encoder import Block
from headlab.timing import interleaved

MEMORY_PROBE = Path(__file__).with_name("memory_probe.py")
STEP_PROBE = Path(__file__).with_name("step_probe.py")
MEMORY_PATHS = ("dot", "additive, fused", "additive, fused, torch ops", "additive, lean scores", "additive, naive")


class HeadlabStack(nn.Module):
    """headlab's blocks on (B, n, d) inputs: the encoder without embeddings and classifier."""

    def __init__(
        self,
        d: int,
        heads: int,
        layers: int,
        dropout: float,
        attention_dropout: float,
        scoring: str = "dot",
        design: dict | None = None,
    ):
        super().__init__()
        attention = {"n_heads": heads, "dropout": attention_dropout, "scoring": scoring, **(design or {})}
        self.blocks = nn.ModuleList(Block(d, 4 * d, dropout, "post", attention, i) for i in range(layers))

    def forward(self, x):
        pass_state = {}  # the first layer's values, for the value residual
        for block in self.blocks:
            x, _ = block(x, pass_state=pass_state)
        return x


def torch_stack(d: int, heads: int, layers: int, dropout: float) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout, batch_first=True)  # post-norm, ReLU, as headlab
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def train_step(model: nn.Module, x: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        optimizer.step()

    return step


def torch_ops(step):
    """The same step with the native kernels switched off (the path on GPUs, or without a C compiler)."""

    def run():
        kernels.ENABLED = False
        try:
            step()
        finally:
            kernels.ENABLED = True

    return run


def encoder_throughput(d: int, args) -> list[dict]:
    """Training tokens/s of headlab's encoder against nn.TransformerEncoder at the same sizes and dropout."""
    B, n, heads, layers = args.batch, args.seq, 4, 4
    x = torch.randn(B, n, d)
    rows = []
    for dropout in (0.0, 0.1):
        torch.manual_seed(0)
        same = HeadlabStack(d, heads, layers, dropout, attention_dropout=dropout)  # the same dropout everywhere
        fast = HeadlabStack(d, heads, layers, dropout, attention_dropout=0.0)  # headlab's default: none on attention
        steps = {"torch": train_step(torch_stack(d, heads, layers, dropout), x), "headlab": train_step(same, x)}
        if dropout:
            steps["headlab, attention dropout 0"] = train_step(fast, x)
        compile_s = None
        if args.compile:
            compiled = torch.compile(HeadlabStack(d, heads, layers, dropout, attention_dropout=dropout))
            step = train_step(compiled, x)
            start = time.perf_counter()
            step()  # compiles
            compile_s = time.perf_counter() - start
            steps["headlab, compiled"] = step
        seconds = interleaved(steps, args.repeats)
        params = sum(p.numel() for p in same.parameters())
        flops_per_token = training_flops_per_token(params, layers, n, heads, d // heads, d // heads)
        for name, s in seconds.items():
            rows.append(
                {
                    "d_model": d,
                    "dropout": dropout,
                    "model": name,
                    "tokens_per_s": B * n / s,
                    "ratio_to_torch": seconds["torch"] / s,
                    "mfu": flops_per_token * B * n / s / (args.peak * 1e9),
                    "compile_s": compile_s if "compiled" in name else None,
                }
            )
    return rows


def dropout_masks(args) -> dict:
    """Training tokens/s of headlab's encoder (d_model 128, dropout 0.1, attention dropout 0) on one thread, as
    packs and sweeps of several jobs run: dropout masks by the native kernel against torch ops."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # where the native dropout applies
    try:
        x = torch.randn(args.batch, args.seq, 128)
        step = train_step(HeadlabStack(128, 4, 4, 0.1, attention_dropout=0.0), x)
        seconds = interleaved({"native": step, "torch ops": torch_ops(step)}, args.repeats)
    finally:
        torch.set_num_threads(threads)
    return {path: args.batch * args.seq / s for path, s in seconds.items()}


def freed_memory(args) -> dict:
    """A text-default model's training step on one thread (step_probe.py, a fresh process per repeat, in turns)
    with malloc keeping freed memory, as headlab's runs set it, and with glibc's defaults: median tokens/s and
    page faults a step."""
    batch, n = (4, 16) if args.quick else (64, 32)
    runs = {"kept": [], "glibc's defaults": []}
    for _ in range(args.repeats):
        for path, keep in (("kept", "1"), ("glibc's defaults", "0")):
            command = [sys.executable, str(STEP_PROBE), str(batch), str(n), "5" if args.quick else "40"]
            out = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
                env=os.environ | {"HEADLAB_KEEP_FREED": keep},
            )
            runs[path].append([float(x) for x in out.stdout.split()])
    return {
        path: {
            "tokens_per_s": batch * n / statistics.median(s for s, _ in r),
            "faults": statistics.median(f for _, f in r),
        }
        for path, r in runs.items()
    }


def additive_throughput(args) -> list[dict]:
    """Forward + backward at n = seq, d_model 128, 4 heads: one attention layer (dot on SDPA; additive on the
    native kernels, on torch ops, and naive) and a 4-layer encoder step (dot; additive native and on torch ops)."""
    B, n, d = args.batch, args.seq, 128
    x = torch.randn(B, n, d)
    dot = MultiHeadAttention(d, 4)
    additive = MultiHeadAttention(d, 4, scoring="additive")

    class Naive(MultiHeadAttention):
        def forward(self, x, need_weights=False):
            q = self.q_proj(x).view(B, n, 4, -1).transpose(1, 2)
            k = self.k_proj(x).view(B, n, 4, -1).transpose(1, 2)
            v = self.v_proj(x).view(B, n, 4, -1).transpose(1, 2)
            y = additive_scores_naive(q, k, self.score_vector).softmax(-1) @ v
            return self.out_proj(y.transpose(1, 2).reshape(B, n, -1)), None

    def step(module):
        return lambda: module(x, need_weights=False)[0].sum().backward()

    layer = interleaved(
        {
            "dot (SDPA)": step(dot),
            "additive, native kernels": step(additive),
            "additive, torch ops": torch_ops(step(additive)),
            "additive, naive": step(Naive(d, 4, scoring="additive")),
        },
        args.repeats,
    )
    encoder_additive = HeadlabStack(d, 4, 4, 0.0, 0.0, scoring="additive")
    encoder = interleaved(
        {
            "dot": train_step(HeadlabStack(d, 4, 4, 0.0, 0.0), x),
            "additive, native kernels": train_step(encoder_additive, x),
            "additive, torch ops": torch_ops(train_step(encoder_additive, x)),
        },
        args.repeats,
    )
    rows = [{"scope": "one layer", "path": k, "seconds": s, "base": layer["dot (SDPA)"]} for k, s in layer.items()]
    rows += [{"scope": "4-layer encoder", "path": k, "seconds": s, "base": encoder["dot"]} for k, s in encoder.items()]
    return [
        {**row, "tokens_per_s": B * n / row["seconds"], "ratio_to_dot": row["base"] / row["seconds"]} for row in rows
    ]


def designs() -> dict[str, dict]:
    """The head designs of conf/design, each as the model keys it sets beyond the plain model's ({"attention":
    {...}, "d_ff": ...}), composed as +design=NAME composes them (a design may build on another), the plain one
    first."""
    from hydra import compose, initialize_config_module

    folder = importlib.resources.files("headlab.conf") / "design"
    names = sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))
    with initialize_config_module("headlab.conf", version_base="1.3"):
        base = OmegaConf.to_container(compose("train").model)
        found = {n: OmegaConf.to_container(compose("train", overrides=[f"+design={n}"]).model) for n in names}

    def beyond(model: dict, plain: dict) -> dict:
        return {k: v if k != "attention" else beyond(v, plain[k]) for k, v in model.items() if v != plain.get(k)}

    found = {n: beyond(model, base) for n, model in found.items()}
    return {"plain": found.pop("plain"), **found}


def design_stacks(d: int, heads: int, layers: int) -> dict[str, HeadlabStack]:
    """A stack of `layers` blocks (no dropout) for each head design of conf/design, the plain one first."""
    stacks = {}
    for name, keys in designs().items():
        if not keys.keys() <= {"attention", "positional"}:
            continue  # a variant matched at another width (gate_elementwise_narrow): not the design's own cost
        attention = dict(keys.get("attention", {}))
        if keys.get("positional") in rules.IN_HEADS:  # rope, alibi: the heads' own positions
            attention["position"] = keys["positional"]
        torch.manual_seed(0)
        stacks[name] = HeadlabStack(d, heads, layers, 0.0, 0.0, design=attention)
    return stacks


def design_rows(stacks: dict[str, HeadlabStack], seconds: dict[str, float], tokens: int) -> list[dict]:
    """Each design's parameters, attention path, training tokens/s and speed against the plain heads."""
    rows = []
    for name, stack in stacks.items():
        attn = stack.blocks[0].attn
        # the normalisers with an exact fused path: softmax, and softmax1 over a zero key (dot scoring here)
        fused = attn.fusable and attn.normalizer in ("softmax", "softmax1")
        rows.append(
            {
                "design": name,
                "params": sum(p.numel() for p in stack.parameters()),
                "path": "fused (SDPA)" if fused else "explicit",
                "tokens_per_s": tokens / seconds[name],
                "ratio_to_plain": seconds["plain"] / seconds[name],
            }
        )
    return rows


def design_throughput(args) -> list[dict]:
    """Training tokens/s of a 4-layer encoder (d_model 128, 4 heads) with each head design of conf/design against
    the plain heads, and whether its attention runs a fused path (SDPA) or the explicit one."""
    x = torch.randn(args.batch, args.seq, 128)
    stacks = design_stacks(128, 4, 4)
    seconds = interleaved({name: train_step(stack, x) for name, stack in stacks.items()}, args.repeats)
    return design_rows(stacks, seconds, args.batch * args.seq)


def hook_cost(args) -> dict:
    """The hook points unused against none at all: a training step of the 4-layer encoder (d_model 128, 4 heads)
    as it is, and with every hook point taken out of its attention layers (plain attributes that return their
    input, no module call)."""
    B, n, d = args.batch, args.seq, 128
    x = torch.randn(B, n, d)
    torch.manual_seed(0)
    hooked = HeadlabStack(d, 4, 4, 0.0, 0.0)
    torch.manual_seed(0)
    bare = HeadlabStack(d, 4, 4, 0.0, 0.0)
    for block in bare.blocks:
        for name in [n for n in block.attn._modules if n.startswith("hook_")]:
            del block.attn._modules[name]
            object.__setattr__(block.attn, name, _Bare())
    seconds = interleaved({"with hook points": train_step(hooked, x), "without": train_step(bare, x)}, args.repeats)
    return {k: B * n / s for k, s in seconds.items()}


class _Bare:
    """A hook point as a plain callable: what the attention costs without hook points at all."""

    hooked = False

    def __call__(self, x):
        return x


def attention_memory(n: int) -> list[dict]:
    """Peak memory (MiB above the process's baseline) of one attention op's forward and backward, in a fresh
    process each: B = 8, 4 heads, d_k = 32."""
    rows = []
    for path in MEMORY_PATHS:
        native = "0" if "torch ops" in path else "1"
        out = subprocess.run(
            [sys.executable, str(MEMORY_PROBE), path, str(n)],
            capture_output=True,
            text=True,
            timeout=600,
            env=os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536", "HEADLAB_NATIVE": native},  # MALLOC_...: freed
            # tensors leave the resident size at once
        )
        rows.append({"path": path, "n": n, "peak_mib": float(out.stdout.strip() or "nan")})
    dot = rows[0]["peak_mib"]
    for row in rows:
        row["ratio_to_dot"] = row["peak_mib"] / dot if dot > 0 else float("nan")
    return rows


def capture_cost(args) -> dict:
    """Per-head weights on a probe batch (explicit path) against the same forward without them (SDPA)."""
    model = Encoder(1000, 2, args.seq, readout="mean", d_model=128, n_layers=4, dropout=0.0).eval()
    tokens = torch.randint(1, 1000, (16, args.seq))
    with torch.no_grad():
        seconds = interleaved(
            {"without weights": lambda: model(tokens), "with weights": lambda: model(tokens, need_weights=True)},
            args.repeats,
        )
    return {k: s * 1000 for k, s in seconds.items()}
