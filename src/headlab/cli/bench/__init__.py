"""headlab-bench: speed and memory against peers measured in the same run; rewrites BENCHMARKS.md.

Every comparison is interleaved (A, B, A, B, ...) and reported as the median of the repeats, and as a ratio, so
that a shared, noisy machine slows both sides alike. `--quick` shrinks everything for a smoke test.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from headlab.cli.arguments import at_least
from headlab.cli.bench import commands, micro, overhead, packing, report, timing
from headlab.files import write_text_atomic


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headlab-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    parser.add_argument("--repeats", type=at_least(1), default=7)
    parser.add_argument("--batch", type=at_least(1), default=32)
    parser.add_argument("--seq", type=at_least(1), default=128)
    parser.add_argument("--memory-seq", type=at_least(1), default=512)
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    parser.add_argument("--sst2-recipe", action="store_true", help="also train experiment=sst2_recipe (7 min)")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"), help="holds sst2/ (SST-2 rows)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 1 repeat: a smoke test, not figures")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: the GPU section only")
    parser.add_argument("--sweep-jobs", type=at_least(1), default=16, help="jobs of the packed-against-solo seed sweep")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.batch, args.seq, args.memory_seq, args.compile = 1, 4, 16, 32, False
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"headlab-bench-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    r = {
        "command": "headlab-bench " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "machine": timing.machine(),
    }
    if args.device == "cuda":
        from headlab.cli.bench import gpu

        sections = report.sections(args.out)
        sections["gpu"] = "\n".join(gpu.report({**gpu.figures(tmp, args.repeats, args.data_dir), **r}))
        write_text_atomic(args.out, report.join(sections))
        print(f"wrote the GPU section of {args.out}", file=sys.stderr)
        return
    r["peak"] = args.peak = timing.matmul_peak(repeats=args.repeats)
    r["encoder"] = [row for d in ((32,) if args.quick else (128, 256)) for row in micro.encoder_throughput(d, args)]
    r["dropout"] = micro.dropout_masks(args)
    r["freed_memory"] = micro.freed_memory(args)
    r["additive"] = micro.additive_throughput(args)
    r["designs"] = micro.design_throughput(args)
    r["hooks"] = micro.hook_cost(args)
    r["memory"] = micro.attention_memory(args.memory_seq)
    r["capture"] = micro.capture_cost(args)
    r["startup"] = commands.startup(tmp, 1 if args.quick else 3)
    r["default_run"] = None if args.quick else commands.default_run(tmp)
    r["sst2"] = commands.sst2_preparation(tmp, args.data_dir, 2000 if args.quick else None)
    r["sst2_recipe"] = commands.sst2_recipe(tmp, args.data_dir) if args.sst2_recipe and not args.quick else None
    r["sst2_overhead"] = overhead.sst2_recipe_overhead(tmp, args.data_dir, "cpu") if r["sst2_recipe"] else None
    sizes, shapes = ((1, 4), ("default run",)) if args.quick else ((1, 4, 16), tuple(packing.SHAPES))
    r["packs"] = packing.pack_throughput(torch.device("cpu"), sizes, args.repeats, shapes)
    r["sweep"] = None if args.quick else packing.sweep_wall(tmp, args.sweep_jobs, "cpu", solo=True)
    r["parallel_packs"] = None if args.quick else packing.parallel_packs(tmp)
    sections = report.sections(args.out)
    sections["cpu"] = report.report(r, args)
    write_text_atomic(args.out, report.join(sections))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
