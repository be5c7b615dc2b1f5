"""headlab-bench: speed and memory against peers measured in the same run; rewrites BENCHMARKS.md.

Every comparison is interleaved (A, B, A, B, ...) and reported as the median of the repeats, and as a ratio, so
that a shared, noisy machine slows both sides alike. `--quick` shrinks everything for a smoke test.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from headlab import kernels
from headlab.attention import MultiHeadAttention, additive_scores_naive
from headlab.encoder import Block


def median_time(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(n: int = 1024, repeats: int = 10) -> float:
    """fp32 GFLOP/s of a square matmul: the machine's practical peak."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / median_time(lambda: a @ b, repeats) / 1e9


class HeadlabStack(nn.Module):
    """headlab's blocks on (B, n, d) inputs: the encoder without embeddings and classifier."""

    def __init__(self, d: int, heads: int, layers: int, dropout: float, attention_dropout: float, scoring: str = "dot"):
        super().__init__()
        attention = {"n_heads": heads, "dropout": attention_dropout, "scoring": scoring}
        self.blocks = nn.ModuleList(Block(d, 4 * d, dropout, "post", attention) for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x, _ = block(x)
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


def interleaved(steps: dict, repeats: int, warmup: int = 2) -> dict:
    """Median seconds per call of each step, timed in turn (A, B, A, B, ...)."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


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
        flops_per_token = 6 * params + 12 * layers * n * d
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

    def torch_ops(step):  # the same step with the native kernels switched off (the path on GPUs, or without cc)
        def run():
            kernels.ENABLED = False
            try:
                step()
            finally:
                kernels.ENABLED = True

        return run

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


MEMORY_PROBE = """
import torch
from headlab.attention import AdditiveAttention, additive_scores, additive_scores_naive

def rss(field):  # kB, from /proc/self/status
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field))

B, H, n, d = 8, 4, {n}, 32
q, k, v = (torch.randn(B, H, n, d, requires_grad=True) for _ in range(3))
w = torch.randn(H, d, requires_grad=True)
def step():
    if "{path}" == "dot":
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    elif "{path}".startswith("additive, fused"):
        y = AdditiveAttention.apply(q, k, v, w, torch.zeros(B, 1, 1, n))
    else:
        fn = additive_scores if "{path}" == "additive, lean scores" else additive_scores_naive
        y = fn(q, k, w).softmax(-1) @ v
    y.sum().backward()

step()  # the first step also loads kernels and sizes thread-local buffers: not what a training step costs
open("/proc/self/clear_refs", "w").write("5")  # reset the peak resident size (VmHWM) to the current one
base = rss("VmRSS:")
step()
print((rss("VmHWM:") - base) / 1024)
"""


def attention_memory(n: int) -> list[dict]:
    """Peak memory (MiB above the process's baseline) of one attention op's forward and backward, in a fresh
    process each: B = 8, 4 heads, d_k = 32."""
    rows = []
    for path in ("dot", "additive, fused", "additive, fused, torch ops", "additive, lean scores", "additive, naive"):
        native = "0" if "torch ops" in path else "1"
        out = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE.format(n=n, path=path)],
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
    from headlab.encoder import Encoder

    model = Encoder(1000, 2, args.seq, readout="mean", d_model=128, n_layers=4, dropout=0.0).eval()
    tokens = torch.randint(1, 1000, (16, args.seq))
    with torch.no_grad():
        seconds = interleaved(
            {"without weights": lambda: model(tokens), "with weights": lambda: model(tokens, need_weights=True)},
            args.repeats,
        )
    return {k: s * 1000 for k, s in seconds.items()}


def command_seconds(argv: list[str], repeats: int, expect: int = 0) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return statistics.median(times)


def startup(tmp: Path, repeats: int) -> dict:
    exe = [sys.executable, "-m", "headlab.train"]
    first_step = exe + [
        "+trainer.max_steps=1",
        "+trainer.limit_val_batches=0",
        "callbacks.attention=null",
        "logger=none",
        "data.n_test=64",
        f"hydra.run.dir={tmp}/first_step",
    ]
    return {
        "--help": command_seconds(exe + ["--help"], repeats),
        "config error": command_seconds(exe + ["model.attention.n_heads=0", f"hydra.run.dir={tmp}/err"], repeats, 2),
        "one-step run (no validation), start to exit": command_seconds(first_step, repeats),
    }


def default_run(tmp: Path) -> dict:
    """The default run (make train): duration, throughput, attention-logging and analysis overhead."""
    run = tmp / "default"
    subprocess.run(
        [sys.executable, "-m", "headlab.train", "callbacks.progress_bar=null", f"hydra.run.dir={run}"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=900,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    results = json.loads((run / "results.json").read_text())
    heads = json.loads((run / "heads.json").read_text())
    fit = results["throughput"]["fit_s"] - heads["analysis_seconds"]
    return {
        "duration_s": results["duration_s"],
        "test_acc": results["metrics"].get("test/acc"),
        "train_tokens_per_s": results["throughput"]["train_tokens_per_s"],
        "logging_s": heads["logging_seconds"],
        "logging_share": heads["logging_seconds"] / fit,
        "analysis_s": heads["analysis_seconds"],
    }


def sst2_preparation(tmp: Path) -> dict | None:
    sst2 = Path("../shared/data/sst2")
    if not (sst2 / "train.tsv").exists():
        return None
    from headlab.data.text import TextDataModule

    times = []
    for _ in range(2):
        dm = TextDataModule(
            "sentence",
            "label",
            n_classes=2,
            files={"train": str(sst2 / "train.tsv")},
            cache_dir=str(tmp / "sst2-cache"),
        )
        start = time.perf_counter()
        dm.setup()
        times.append(time.perf_counter() - start)
    loader_s = {}
    for workers in (0, 2):  # one epoch of training batches, nothing else: what feeding the model costs
        dm.num_workers = workers
        start = time.perf_counter()
        batches = sum(1 for _ in dm.train_dataloader())
        loader_s[workers] = time.perf_counter() - start
    sentences = len(dm.splits["train"]) + len(dm.splits["val"])
    return {"first_s": times[0], "cached_s": times[1], "sentences": sentences, "batches": batches, "loader_s": loader_s}


def sst2_recipe(tmp: Path) -> dict | None:
    """experiment=sst2_recipe on the local SST-2 files, start to end, with its data cache cold."""
    sst2 = Path("../shared/data/sst2").resolve()
    if not (sst2 / "train.tsv").exists():
        return None
    run_dir = tmp / "sst2-recipe"
    command = [
        sys.executable, "-m", "headlab.train", "experiment=sst2_recipe", "data=files",
        f"data.files.train={sst2 / 'train.tsv'}", f"data.files.val={sst2 / 'dev.tsv'}",
        f"data.files.test={sst2 / 'test_labeled_senteval.tsv'}", "data.column_names={test:[sentence,label]}",
        "data.text_column=sentence", f"data.cache_dir={tmp / 'sst2-recipe-cache'}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL, env=os.environ | {"WANDB_MODE": "offline"})
    record = json.loads((run_dir / "results.json").read_text())
    metrics = record.get("metrics", {})
    return {
        "wall_s": time.perf_counter() - start,
        "dev": metrics.get("val/acc_best"),
        "test": metrics.get("test/acc"),
        "epoch_s": record.get("throughput", {}).get("fit_s", float("nan")) / (record.get("epochs") or 1),
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    models = (
        [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        if cpuinfo.exists()
        else []
    )
    cpu = models[0] if models else cpu
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"


def report(r: dict, args) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{r['command']}` on {r['date']}.",
        f"Machine: {r['machine']}.",
        f"Matmul peak (fp32, 1024 x 1024): {r['peak']:.0f} GFLOP/s.",
        "",
        "Medians of interleaved repeats; ratios compare runs measured side by side in the same process.",
        "",
        f"## Encoder training throughput (batch {args.batch}, sequence {args.seq}, 4 layers, 4 heads, d_ff 4d)",
        "",
        "Forward + backward + AdamW on (B, n, d) inputs. MFU uses FLOPs per token = 6N + 12 L n d.",
        "",
        "| d_model | dropout | model | tokens/s | vs torch | MFU | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in r["encoder"]:
        compile_s = f"{row['compile_s']:.1f}" if row["compile_s"] else ""
        lines.append(
            f"| {row['d_model']} | {row['dropout']} | {row['model']} | {row['tokens_per_s']:,.0f} | "
            f"{row['ratio_to_torch']:.2f}x | {row['mfu']:.1%} | {compile_s} |"
        )
    lines += [
        "",
        "`torch` is `nn.TransformerEncoder` (post-norm, ReLU, dropout on attention probabilities and residuals).",
        "`headlab` uses the same dropout everywhere; on the CPU its dropout mask costs a quarter of a random draw",
        "per element (`headlab.dropout`), where torch's costs one. `compiled` is `model.compile=true`, the same",
        "dropout. `attention dropout 0` is headlab's default (`model.attention.dropout=0`, which keeps PyTorch's",
        "fused SDPA kernels). At dropout 0 most of a step is matmuls on both sides (see MFU): headlab's margin",
        "there comes from the rest of the step, and moves the most between runs.",
        "",
        f"## Additive scoring (batch {args.batch}, sequence {args.seq}, d_model 128, 4 heads, d_k 32)",
        "",
        "Training stores the (B, H, n, n) weights while a layer's fit in 16 MiB, and takes the fused path (scores,",
        "softmax and values chunked over queries, nothing of size n x n stored) above that, as for the memory figure",
        "below. `native kernels` is the CPU path (`headlab.kernels`: C compiled on first use; tanh(q + k) computed",
        "from e^2q e^2k with one reciprocal, in registers, never stored); `torch ops` is the path on GPUs and where",
        "no C compiler is found (chunked over queries, tanh recomputed in the backward pass).",
        "",
        "| scope | path | tokens/s (fwd + bwd) | vs dot |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {row['scope']} | {row['path']} | {row['tokens_per_s']:,.0f} | {row['ratio_to_dot']:.2f}x |"
        for row in r["additive"]
    ]
    lines += [
        "",
        f"Peak memory of one attention op's second forward + backward (B 8, 4 heads, d_k 32, n {r['memory'][0]['n']}),",
        "resident size above the baseline, each in a fresh process (large blocks returned to the system on free):",
        "",
        "| path | peak MiB | vs dot |",
        "|---|---|---|",
    ]
    lines += [f"| {row['path']} | {row['peak_mib']:,.0f} | {row['ratio_to_dot']:.1f}x |" for row in r["memory"]]
    cap = r["capture"]
    lines += [
        "",
        "## Attention capture (probe batch of 16, d_model 128, 4 layers)",
        "",
        f"Forward without weights (SDPA): {cap['without weights']:.1f} ms; with every layer's weights "
        f"(explicit path): {cap['with weights']:.1f} ms ({cap['with weights'] / cap['without weights']:.2f}x). "
        "Training steps never ask for weights.",
        "",
        "## Start-up (median wall seconds of whole commands)",
        "",
        "| command | seconds |",
        "|---|---|",
    ]
    lines += [f"| `headlab-train {k}` | {v:.2f} |" for k, v in r["startup"].items()]
    d = r["default_run"]
    lines += (
        []
        if d is None
        else [
            "",
            "## The default run (`make train`)",
            "",
            f"Wall time {d['duration_s']:.1f} s, test accuracy {d['test_acc']:.4f}, {d['train_tokens_per_s']:,.0f} "
            f"training tokens/s. Attention logging at the default cadence took {d['logging_s']:.2f} s, "
            f"{d['logging_share']:.1%} of training; end-of-training importance and pruning took "
            f"{d['analysis_s']:.2f} s.",
        ]
    )
    if r["sst2"]:
        s = r["sst2"]
        lines += [
            "",
            "## Data",
            "",
            f"Preparing SST-2 train ({s['sentences']:,} sentences: load, tokenizer training, "
            f"tokenization, cache): {s['first_s']:.1f} s the first time, {s['cached_s']:.2f} s from the cache.",
            "",
            f"Feeding the model: one epoch of its training batches ({s['batches']:,} batches, DataLoader alone) takes "
            f"{s['loader_s'][0]:.2f} s in the main process (`data.num_workers=0`, the default) and "
            f"{s['loader_s'][2]:.2f} s with 2 workers (their start included)"
            + (
                f"; a training epoch of the SST-2 recipe takes {r['sst2_recipe']['epoch_s']:.0f} s."
                if r.get("sst2_recipe")
                else "."
            ),
        ]
    if r.get("sst2_recipe"):
        s = r["sst2_recipe"]
        lines += [
            "",
            "## SST-2 recipe (`experiment=sst2_recipe`, all of SST-2 train, offline W&B, data cache cold)",
            "",
            f"Start to end {s['wall_s']:.0f} s ({s['wall_s'] / 60:.1f} min): best dev accuracy {s['dev']:.3f}, "
            f"labelled SentEval test accuracy {s['test']:.3f}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--memory-seq", type=int, default=512)
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    parser.add_argument("--sst2-recipe", action="store_true", help="also train experiment=sst2_recipe (7 min)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 2 repeats: a smoke test, not figures")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.batch, args.seq, args.memory_seq, args.compile = 2, 4, 16, 32, False
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"headlab-bench-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    r = {
        "command": "headlab-bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
    }
    r["peak"] = args.peak = matmul_peak(repeats=args.repeats)
    r["encoder"] = [row for d in ((32,) if args.quick else (128, 256)) for row in encoder_throughput(d, args)]
    r["additive"] = additive_throughput(args)
    r["memory"] = attention_memory(args.memory_seq)
    r["capture"] = capture_cost(args)
    r["startup"] = startup(tmp, 1 if args.quick else 3)
    r["default_run"] = None if args.quick else default_run(tmp)
    r["sst2"] = sst2_preparation(tmp)
    r["sst2_recipe"] = sst2_recipe(tmp) if args.sst2_recipe and not args.quick else None
    args.out.write_text(report(r, args))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
