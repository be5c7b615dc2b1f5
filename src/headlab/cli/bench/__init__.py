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
from headlab.printing import duration


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

        def save(figures: dict) -> None:  # after each figure: a run stopped on the way keeps what it measured
            sections["gpu"] = "\n".join(gpu.report({**figures, **r}))
            write_text_atomic(args.out, report.join(sections))

        gpu.figures(tmp, args.repeats, args.data_dir, save)
        print(f"wrote the GPU section of {args.out}", file=sys.stderr)
        return
    quick = args.quick

    def peak() -> float:  # what the encoder's rows are a share of (micro.encoder_throughput reads args.peak)
        args.peak = timing.matmul_peak()
        return args.peak

    sizes, shapes = ((1, 4), ("default run",)) if quick else ((1, 4, 16), tuple(packing.SHAPES))
    steps = [  # (key, what is measured, how): each said on stderr as it starts, with the time so far
        ("peak", "matmul peak", peak),
        ("encoder", "encoder throughput",
         lambda: [row for d in ((32,) if quick else (128, 256)) for row in micro.encoder_throughput(d, args)]),
        ("dropout", "dropout masks", lambda: micro.dropout_masks(args)),
        ("freed_memory", "freed memory", lambda: micro.freed_memory(args)),
        ("additive", "additive scoring", lambda: micro.additive_throughput(args)),
        ("designs", "head designs", lambda: micro.design_throughput(args)),
        ("hooks", "hook points", lambda: micro.hook_cost(args)),
        ("memory", "attention memory", lambda: micro.attention_memory(args.memory_seq)),
        ("capture", "attention capture", lambda: micro.capture_cost(args)),
        ("startup", "start-up", lambda: commands.startup(tmp, 1 if quick else 3)),
        ("default_run", "the default run", lambda: None if quick else commands.default_run(tmp)),
        ("dry_run", "the dry run against the sweeps it prices",
         lambda: None if quick else commands.dry_run_against_sweeps(tmp, args.data_dir)),
        ("sst2", "SST-2 preparation", lambda: commands.sst2_preparation(tmp, args.data_dir, 2000 if quick else None)),
        ("sst2_recipe", "the SST-2 recipe",
         lambda: commands.sst2_recipe(tmp, args.data_dir) if args.sst2_recipe and not quick else None),
        ("sst2_overhead", "the SST-2 recipe's overhead",
         lambda: overhead.sst2_recipe_overhead(tmp, args.data_dir, "cpu") if r["sst2_recipe"] else None),
        ("packs", "pack throughput",
         lambda: packing.pack_throughput(torch.device("cpu"), sizes, args.repeats, shapes, not quick, args.peak)),
        ("sweep", "a packed sweep against the default launcher's",
         lambda: None if quick else packing.sweep_wall(tmp, args.sweep_jobs, "cpu", solo=True)),
        ("parallel_packs", "packs side by side", lambda: None if quick else packing.parallel_packs(tmp)),
    ]  # fmt: skip
    sections = report.sections(args.out)
    before = report.section_times(sections.get("cpu", ""))  # the last run's, to say what is left
    started, r["times"] = time.monotonic(), {}
    for k, (key, what, measure) in enumerate(steps, 1):
        left = [before.get(later) for later, _, _ in steps[k - 1 :]]
        said = f", about {duration(sum(left))} left by the last run's times" if None not in left else ""
        print(f"headlab-bench: [{k}/{len(steps)}] {what} ({duration(time.monotonic() - started)} so far{said})",
              file=sys.stderr, flush=True)  # fmt: skip
        begun = time.monotonic()
        r[key] = measure()
        r["times"][key] = time.monotonic() - begun
    sections["cpu"] = report.report(r, args)
    write_text_atomic(args.out, report.join(sections))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
