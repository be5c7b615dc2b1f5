"""GPU figures (`headlab-bench --device cuda`): additive scoring's fused kernels against dot scoring, headlab's
encoder against nn.TransformerEncoder in bf16, the head designs, a packed 64-seed sweep against one run, packs of E
members."""

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from headlab.cli.bench import micro, overhead, packing
from headlab.cli.bench.micro import HeadlabStack, torch_stack
from headlab.cli.bench.timing import matmul_peak, synchronized
from headlab.launch.cost import median_seconds
from headlab.model import MultiHeadAttention, training_flops_per_token
from headlab.printing import duration
from headlab.timing import interleaved

ENCODERS = ((256, 4), (512, 6), (768, 12))  # (d_model, layers), heads d_model / 64


def _timed(step, repeats: int, device: torch.device) -> float:
    """Median seconds of a synchronised step."""
    return median_seconds(synchronized(step, device), repeats, warm_up=3)


def bf16_peak(n: int = 8192) -> float:
    """Dense bf16 matmul FLOP/s measured on this GPU (timing.matmul_peak): the practical peak for MFU."""
    return matmul_peak(n, device=torch.device("cuda"), dtype=torch.bfloat16) * 1e9


def _train_step(model: nn.Module, x: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=x.is_cuda)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        optimizer.step()

    return step


class Bert(nn.Module):
    """Hugging Face's BertModel (sdpa attention) on (B, n, d) inputs, or None without transformers: post-norm like
    headlab, GELU, plus BERT's embedding sum and LayerNorm."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    @classmethod
    def build(cls, d: int, heads: int, layers: int, n: int, dropout: float):
        try:
            from transformers import BertConfig, BertModel
        except ImportError:
            return None
        config = BertConfig(
            vocab_size=2, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * d,
            hidden_dropout_prob=dropout, attention_probs_dropout_prob=0.0, max_position_embeddings=n,
            attn_implementation="sdpa",
        )  # fmt: skip
        return cls(BertModel(config, add_pooling_layer=False))

    def forward(self, x):
        return self.bert(inputs_embeds=x).last_hidden_state


def encoders(
    repeats: int, peak: float, device: torch.device, sizes=ENCODERS, batch: int = 32, n: int = 128
) -> list[dict]:
    """Training tokens/s and MFU of headlab's encoder, nn.TransformerEncoder and BertModel (where transformers is
    installed) at the same sizes: (d_model, layers) in sizes, heads of 64 (or one head below d_model 64)."""
    rows = []
    for d, layers in sizes:
        heads = max(1, d // 64)
        x = torch.randn(batch, n, d, device=device)
        models = {
            "torch": torch_stack(d, heads, layers, 0.1),
            "headlab": HeadlabStack(d, heads, layers, 0.1, 0.0),
            "BertModel": Bert.build(d, heads, layers, n, 0.1),
        }
        seconds = {name: _timed(_train_step(m.to(device), x), repeats, device) for name, m in models.items() if m}
        params = sum(p.numel() for p in models["headlab"].parameters())
        flops = training_flops_per_token(params, layers, n, heads, d // heads, d // heads) * batch * n
        rows += [
            {
                "d_model": d,
                "layers": layers,
                "model": name,
                "tokens_per_s": batch * n / s,
                "ratio_to_torch": seconds["torch"] / s,
                "mfu": flops / s / peak,
            }
            for name, s in seconds.items()
        ]
    return rows


def _additive_layers(d: int, device: torch.device, n: int, batch: int) -> dict[str, tuple]:
    """The attention layers one row each times: dot scoring (SDPA), and additive scoring on each path it takes at
    this size: its stored (B, H, n, n) weights below FUSED_ABOVE, above it the Triton kernels (where Triton is
    installed) and the chunked torch ops they replace. {path: (layer, Triton on)}."""
    from headlab.model import dispatch

    paths = {"dot (SDPA)": (MultiHeadAttention(d, 4).to(device), True)}
    additive = MultiHeadAttention(d, 4, scoring="additive").to(device)
    if batch * 4 * n * n <= dispatch.FUSED_ABOVE:
        return paths | {"additive, stored weights": (additive, True)}
    if device.type == "cuda" and dispatch.triton_kernels() is not None:
        paths["additive, Triton"] = (additive, True)
    return paths | {"additive, chunked torch ops": (additive, False)}


def additive(
    repeats: int, device: torch.device, lengths=(128, 512, 2048, 8192), batch: int = 8, d: int = 128
) -> list[dict]:
    """ms per forward + backward of one attention layer (fp32 and bf16 autocast) on each path, and peak memory."""
    from headlab.model import dispatch

    rows, given = [], os.environ.get("HEADLAB_TRITON")  # the caller's setting, put back at the end
    for n in lengths:
        x = torch.randn(batch, n, d, device=device, requires_grad=True)
        for path, (layer, triton) in _additive_layers(d, device, n, batch).items():
            os.environ["HEADLAB_TRITON"] = "1" if triton else "0"
            dispatch.triton_kernels.cache_clear()
            for precision in ("fp32", "bf16"):
                if n == 8192 and precision == "fp32":
                    continue

                def step(layer=layer, x=x, bf16=precision == "bf16"):
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        out, _ = layer(x, need_weights=False)
                    out.float().sum().backward()

                on_gpu = device.type == "cuda"  # (a CPU runs this code only in its test)
                if on_gpu:
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                seconds = _timed(step, max(3, repeats // max(1, n // 128)), device)
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if on_gpu else float("nan")
                rows.append({"n": n, "path": path, "precision": precision, "ms": seconds * 1e3, "peak_mib": peak})
        if given is None:
            os.environ.pop("HEADLAB_TRITON", None)
        else:
            os.environ["HEADLAB_TRITON"] = given
        dispatch.triton_kernels.cache_clear()
    return rows


def designs(repeats: int, device: torch.device, d: int = 512, heads: int = 8, batch: int = 32, n: int = 256):
    """Training tokens/s of a 4-layer encoder with each head design of conf/design against the plain heads (bf16
    autocast, fused AdamW)."""
    stacks = {name: stack.to(device) for name, stack in micro.design_stacks(d, heads, 4).items()}
    x = torch.randn(batch, n, d, device=device)
    seconds = interleaved({k: synchronized(_train_step(m, x), device) for k, m in stacks.items()}, repeats, warmup=3)
    return micro.design_rows(stacks, seconds, batch * n)


def figures(tmp: Path, repeats: int, data_dir: Path, save) -> dict:
    """Each GPU figure in turn, said on stderr as it starts; save(r) after each, so a stopped run keeps the rest."""
    device = torch.device("cuda")
    r = {"device": torch.cuda.get_device_name(), "peak": bf16_peak()}
    steps = {  # the goals first: the fused kernels, the encoder against torch's, the designs, the sweep
        "additive": lambda: additive(repeats, device),
        "encoders": lambda: encoders(repeats, r["peak"], device),
        "designs": lambda: designs(repeats, device),
        "sweep": lambda: packing.sweep_wall(tmp, 64, "gpu", solo=False),
        "packs": lambda: packing.pack_throughput(device, (1, 4, 16, 64), repeats),
        "sst2_overhead": lambda: overhead.sst2_recipe_overhead(tmp, data_dir, "gpu"),
    }
    started = time.monotonic()
    for k, (key, measure) in enumerate(steps.items(), 1):
        print(f"headlab-bench: [{k}/{len(steps)}] GPU {key} ({duration(time.monotonic() - started)} so far)",
              file=sys.stderr, flush=True)  # fmt: skip
        r[key] = measure()
        save(r)
    return r


def report(r: dict) -> list[str]:
    """The GPU section's lines, from the figures measured so far (a stopped run: the ones it reached)."""
    lines = [
        f"## GPU: {r['device']} (`headlab-bench --device cuda`, {r['date']})",
        "",
        f"Measured bf16 matmul peak {r['peak'] / 1e12:.0f} TFLOP/s (8192 x 8192, its fastest call), the base of MFU.",
    ]
    if "additive" in r:
        lines += [
            "",
            "One attention layer, forward + backward (batch 8, d_model 128, 4 heads), median ms and peak memory;",
            "additive scoring on each path it takes at that size (Triton: the fused kernels; chunked torch ops: what",
            "they replace, HEADLAB_TRITON=0):",
            "",
            "| n | path | precision | ms | peak MiB |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['n']} | {x['path']} | {x['precision']} | {x['ms']:.2f} | {x['peak_mib']:,.0f} |"
            for x in r["additive"]
        ]
    if "encoders" in r:
        lines += [
            "",
            "Encoder training step (batch 32, sequence 128, heads of 64, dropout 0.1, bf16 autocast, fused AdamW;",
            "BertModel: Hugging Face's, sdpa attention, where transformers is installed):",
            "",
            "| d_model | layers | model | tokens/s | vs torch | MFU |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['d_model']} | {x['layers']} | {x['model']} | {x['tokens_per_s']:,.0f} | "
            f"{x['ratio_to_torch']:.2f}x | {x['mfu']:.1%} |"
            for x in r["encoders"]
        ]
    if "designs" in r:
        lines += [
            "",
            "The head designs of conf/design: training step of a 4-layer encoder (d_model 512, 8 heads, batch 32,",
            "sequence 256, no dropout, bf16 autocast, fused AdamW), interleaved, median:",
            "",
            "| design | parameters | attention path | tokens/s | vs plain |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {x['design']} | {x['params']:,} | {x['path']} | {x['tokens_per_s']:,.0f} | {x['ratio_to_plain']:.2f}x |"
            for x in r["designs"]
        ]
    if "sweep" in r:
        s = r["sweep"]
        lines += [
            "",
            f"A {s['jobs']}-seed sweep of the default run, `headlab-train -m hydra/launcher=packed "
            f"seed='range({s['jobs']})' trainer=gpu`, start to end: {s['packed_s']:.0f} s for {s['completed']} "
            f"completed runs, against {s['one_run_s']:.0f} s for one run (`headlab-train trainer=gpu`): "
            f"{s['packed_s'] / s['one_run_s']:.1f}x the wall time of one run.",
        ]
    if "packs" in r:
        lines += [
            "",
            "Packs of E members against the same E models stepped one after another (forward, backward, clipping and",
            "AdamW; bf16 autocast; GPU busy: nvidia-smi's utilisation while the packed steps ran):",
            "",
            "| model | members | packed tokens/s | one at a time tokens/s | ratio | GPU busy |",
            "|---|---|---|---|---|---|",
        ]
        for x in r["packs"]:
            busy = f"{x['gpu_busy']:.0f}%" if x.get("gpu_busy") is not None else "n/a"
            lines.append(
                f"| {x['shape']} | {x['members']} | {x['packed_tokens_per_s']:,.0f} | "
                f"{x.get('solo_tokens_per_s', 0):,.0f} | {x.get('ratio', float('nan')):.1f}x | {busy} |"
            )
    return lines + overhead.report(r.get("sst2_overhead"))
