"""BENCHMARKS.md from the figures of headlab-bench runs: a CPU section and a GPU section, each rewritten by its own
run (`--device cuda` on a GPU machine) and kept by the other's."""

import re
from pathlib import Path

from headlab.cli.bench import overhead

MARK = "<!-- section: {} -->"
TIMES = "Time by section (s): "


def sections(path: Path) -> dict[str, str]:
    """The sections of an existing BENCHMARKS.md ({"cpu": ..., "gpu": ...}); a file without marks is all CPU."""
    if not path.exists():
        return {}
    text, found = path.read_text(), {}
    if MARK.format("cpu") not in text:
        return {"cpu": text.strip()}
    for part in text.split("<!-- section: ")[1:]:
        name, body = part.split(" -->", 1)
        found[name] = body.strip()
    return found


def section_times(text: str) -> dict[str, float]:
    """Each section's seconds as a report's "Time by section" line gives them ({} where it has none)."""
    line = next((x for x in text.splitlines() if x.startswith(TIMES)), "")
    return {key: float(value) for key, value in re.findall(r"(\w+)=(\d+)", line)}


def times_line(times: dict[str, float]) -> str:
    """The line a report states its sections' seconds in, which the next run reads to say how long is left."""
    return (
        TIMES
        + ", ".join(f"{key}={round(t)}" for key, t in times.items())
        + f"; in all {sum(times.values()) / 60:.0f} min."
    )


def join(found: dict[str, str]) -> str:
    return "\n\n".join(f"{MARK.format(name)}\n{found[name]}" for name in ("cpu", "gpu") if name in found) + "\n"


def freed_memory(f: dict) -> list[str]:
    """The line on malloc keeping freed memory (headlab.training.allocator)."""
    kept, default = f["kept"], f["glibc's defaults"]
    return [
        "A training step of a text-default model (8k vocabulary, d_model 128, 16 heads, dropout 0.3; one thread, a",
        "fresh process per repeat) with malloc keeping freed memory, as headlab's runs set it",
        f"(`headlab.training.allocator`): {kept['tokens_per_s']:,.0f} tokens/s and {kept['faults']:,.0f} page faults a",
        f"step, against {default['tokens_per_s']:,.0f} tokens/s and {default['faults']:,.0f} with glibc's defaults",
        f"({kept['tokens_per_s'] / default['tokens_per_s']:.2f}x; the same numbers either way).",
    ]


def _figure(value: float | None) -> str:
    """A measured rate as the tables print it; one that --quick leaves out says so."""
    return "not measured" if value is None else f"{value:,.0f}"


def cpu_packs(rows: list[dict]) -> list[str]:
    """The section of packed training on this CPU: pack_throughput's rows as a table, with what they measure."""
    return [
        "## Packed training on this CPU",
        "",
        "A training step of a pack of E members (forward, backward, per-member clipping and AdamW) against the",
        "same E models stepped one after another. A pack computes its members one after another on views of the",
        "stacked parameters (each with the single model's kernels), or as one batched computation",
        "(torch.func.vmap); `pack.compute=auto` times both on the pack's first batch and keeps the faster (the",
        "packed column: that way, chosen by a timing of its own; a pack of one is its model alone). Beside them,",
        "the pack compiled (`model.compile=true`: torch.compile of the members' forward, compilation untimed).",
        "Two ceilings, each with its ratio to one at a time: at the peak, a step that were its training FLOPs",
        "alone (6 N + the attention's, Kaplan et al.) at the matmul peak measured above; its matmuls alone, the",
        "products a member's step computes (its linear layers forward and both gradients, its attention), at",
        "their own shapes, for all the members and nothing else, timed with the others: the most any way of",
        "packing could reach on this CPU, where the rest of a step only adds to it.",
        "",
        "| model | members | packed tokens/s (way) | one at a time tokens/s | ratio | one after another tokens/s "
        "| as one vmap tokens/s | compiled tokens/s | ceiling at the peak tokens/s (ratio) "
        "| its matmuls alone tokens/s (ratio) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {x['shape']} | {x['members']} | {x['packed_tokens_per_s']:,.0f} ({x['compute']}) | "
            f"{x['solo_tokens_per_s']:,.0f} | {x['ratio']:.2f}x | {_figure(x.get('each_tokens_per_s'))} | "
            f"{_figure(x.get('vmap_tokens_per_s')) if x['members'] > 1 else '-'} | "
            f"{_figure(x.get('compiled_tokens_per_s'))} | {_ceiling(x, 'ceiling')} | {_ceiling(x, 'matmuls')} |"
            for x in rows
        ),
    ]


def _ceiling(row: dict, which: str) -> str:
    """A pack row's ceiling (ceiling: at the peak; matmuls: its matmuls alone), its tokens/s and its ratio to one at
    a time, or that it was not measured."""
    ratio = f" ({row[f'{which}_ratio']:.2f}x)" if f"{which}_ratio" in row else ""
    return _figure(row.get(f"{which}_tokens_per_s")) + ratio


def report(r: dict, args) -> str:
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{r['command']}` on {r['date']}.",
        f"Machine: {r['machine']}.",
        f"Matmul peak (fp32, 1024 x 1024, its fastest call): {r['peak']:.0f} GFLOP/s.",
        "",
        "Medians of interleaved repeats; ratios compare runs measured side by side in the same process.",
        *([times_line(r["times"])] if r.get("times") else []),
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
        "On one thread, as packs and sweeps of several jobs run, the native dropout kernel (`dropout.c`: the mask",
        "applied in one pass over memory each way) against torch ops (the path on more threads and without a C",
        f"compiler; the same numbers), d_model 128, dropout 0.1, attention dropout 0: {r['dropout']['native']:,.0f}",
        f"against {r['dropout']['torch ops']:,.0f} tokens/s "
        f"({r['dropout']['native'] / r['dropout']['torch ops']:.2f}x).",
        "",
        *freed_memory(r["freed_memory"]),
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
        f"## Head designs (batch {args.batch}, sequence {args.seq}, d_model 128, 4 layers, 4 heads)",
        "",
        "Forward + backward + AdamW of the encoder with each design of `conf/design` (`+design=NAME`; docs/heads.md),",
        "against the plain heads in the same run. `fused` designs keep SDPA (the gate, QK-norm, latent K/V, the value",
        "residual, rope and the mixture of heads act outside it; softmax1 adds one zero key); the others run the",
        "explicit path, which stores the weights.",
        "",
        "| design | parameters | attention path | tokens/s | vs plain |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['design']} | {row['params']:,} | {row['path']} | {row['tokens_per_s']:,.0f} | "
        f"{row['ratio_to_plain']:.2f}x |"
        for row in r["designs"]
    ]
    hooks = r["hooks"]
    lines += [
        "",
        "Hook points (`hook_q`, `hook_pattern`, ...; docs/heads.md) left unused cost one module call each: the same",
        f"step {hooks['with hook points']:,.0f} tokens/s with them against {hooks['without']:,.0f} without any "
        f"({hooks['with hook points'] / hooks['without']:.3f}x).",
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
    if r.get("dry_run"):
        lines += [
            "",
            "`--dry-run` against the sweep it prices (`headlab-train -m ... logger=csv --dry-run --json`, then the "
            "sweep, start to exit; docs/plan.md says what it prices):",
            "",
            "| sweep | estimated | took | estimate / took |",
            "|---|---|---|---|",
            *(
                f"| {d['sweep']} | {d['estimate_s']:.0f} s | {d['wall_s']:.0f} s | {d['ratio']:.2f} |"
                for d in r["dry_run"]
            ),
        ]
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
    if r.get("packs"):
        lines += ["", *cpu_packs(r["packs"])]
    if r.get("sweep"):
        s = r["sweep"]
        each = s["jobs"] * s["one_run_s"]  # one process per job, one after another
        lines += [
            "",
            f"A {s['jobs']}-seed sweep of the default run, start to end: packed (`-m hydra/launcher=packed "
            f"seed='range({s['jobs']})'`: {s['packs']} pack(s), as `n_jobs=auto` makes them) {s['packed_s']:.0f} s; "
            f"one process per job, one after another ({s['jobs']} x one run alone, {s['one_run_s']:.0f} s) "
            f"{each:.0f} s ({each / s['packed_s']:.2f}x); the default launcher's jobs one after another in one "
            f"process (`-m seed='range({s['jobs']})'`) {s['solo_s']:.0f} s ({s['solo_s'] / s['packed_s']:.2f}x).",
        ]
    if r.get("parallel_packs"):
        s, k = r["parallel_packs"], r["parallel_packs"]["at_once"]
        lines += [
            "",
            f"Packs side by side: `-m hydra/launcher=packed model.attention.n_heads={s['arms']} "
            f"seed='range({s['seeds']})'` (one pack per head count) start to end, its packs one at a time "
            f"(`hydra.launcher.n_jobs=1`) {s['s_1']:.0f} s, {k} at a time with 1/{k} of the cores each "
            f"(`hydra.launcher.n_jobs={k}`) {s[f's_{k}']:.0f} s ({s['s_1'] / s[f's_{k}']:.2f}x; "
            f"{s[f'completed_{k}']} runs completed).",
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
        lines += overhead.report(r.get("sst2_overhead"))
    return "\n".join(lines) + "\n"
