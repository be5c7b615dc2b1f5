"""What a sweep says when it ends: the jobs that did not complete (one line per distinct reason), a compact table of
the sweep's numbers grouped by the keys that vary (what headlab-compare prints first), what to do next, and a
non-zero exit code when any job did not complete. A job that refused its directory (it holds another run's records)
did not complete, whatever that directory's records say."""

import logging
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from headlab.launch import estimates, rundir
from headlab.record import TEST_ACC, VAL_ACC_BEST, read_record

log = logging.getLogger("headlab")
METRICS = (VAL_ACC_BEST, TEST_ACC)
SETTINGS = ("ConfigError", "InvalidSetting", "DataError")  # failures a rerun cannot mend: the settings must change


class SweepSummary(Callback):
    began = ""  # when this sweep started (a record's started_at): a run it made counts beside a job refused there
    stopwatch = None  # what the command takes, said beside its dry run's estimate (headlab.launch.estimates)

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        self.stopwatch = estimates.Stopwatch()

    def on_run_end(self, config: DictConfig, **kwargs) -> None:
        if said := self.stopwatch.line(config, "run", alone=False):
            log.info(said)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        rundir.take_refused(Path(config.hydra.sweep.dir))  # refusals of an earlier sweep that never ended
        self.began = datetime.now(timezone.utc).isoformat()
        self.stopwatch = estimates.Stopwatch()

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        if config.get("sweep", {}).get("dry_run"):  # nothing ran
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        runs = sorted(sweep_dir.glob("*/results.json"), key=lambda p: (len(p.parent.name), p.parent.name))  # 2, 10
        statuses = [(path.parent, read_record(path.parent) or {"status": "unreadable"}) for path in runs]
        refused = rundir.take_refused(sweep_dir)
        ours = lambda r: str(r.get("started_at", "")) >= self.began  # noqa: E731 (a run this sweep made)
        statuses = [(d, r) for d, r in statuses if d not in refused or ours(r)]  # another run's records: not a job
        statuses += [(d, {"status": "refused", "error": why}) for d, why in refused.items()]
        failed = [(d, r) for d, r in statuses if r.get("status") != "completed"]
        by_reason: dict[str, list[str]] = {}  # a setting every job shares fails every job alike: said once
        for job_dir, record in failed:
            reason = f"{record.get('status')}: {record['error']}" if record.get("error") else str(record.get("status"))
            by_reason.setdefault(reason, []).append(job_dir.name)
        for reason, names in by_reason.items():
            many = f"{len(names)} jobs in {sweep_dir} ({job_ranges(names)})"
            jobs = str(sweep_dir / names[0]) if len(names) == 1 else many
            print(f"headlab-train: not completed: {jobs} ({reason})", file=sys.stderr)
        done = len(statuses) - len(failed)
        if done:
            from headlab.launch import tensorboard  # scipy (0.6 s) when a sweep ends, not in every run's start

            print(table(sweep_dir))
            view = tensorboard.write(sweep_dir, str(config.get("sweep", {}).get("objective", VAL_ACC_BEST)))
            if view:
                print(f"TensorBoard, runs named by what varies: tensorboard --logdir {view}")
        log.info(self.stopwatch.line(config, f"sweep {sweep_dir}"))
        log.info("sweep %s: %d of %d jobs completed", sweep_dir, done, len(statuses))
        if not failed:
            return
        mend = [r for _, r in failed if r.get("status") != "refused"]  # a refused job needs another directory
        settings = all(str(r.get("error", "")).startswith(SETTINGS) for r in mend)
        then = (
            "fix the settings above and run the sweep again"
            if settings
            else f"rerun the same command with sweep.resume=true and hydra.sweep.dir={sweep_dir} to run only those"
        )
        print(f"headlab-train: {len(failed)} of {len(statuses)} jobs did not complete; {then}", file=sys.stderr)
        sys.exit(1)


def table(sweep_dir: Path) -> str:
    """The completed runs grouped by the keys that vary, each metric's mean and standard deviation over seeds (or
    folds)."""
    from headlab.stats.comparison import compare
    from headlab.stats.contrasts import Design
    from headlab.stats.runs import load_dirs

    completed = load_dirs([sweep_dir]).completed
    keys, rows = compare(completed, Design(list(METRICS)))
    over = "folds" if any(r["config"].get("data.cv.fold") is not None for r in completed) else "seeds"
    header = [*(k.rsplit(".", 1)[-1] if k.count(".") > 1 else k for k in keys), "runs", *METRICS]
    body = []
    for row in rows:
        cells = [*(str(row[k]) for k in keys), str(row["runs"])]
        for metric in METRICS:
            s = row.get(metric)
            cells.append(
                "" if s is None else f"{s['mean']:.4f}" + ("" if math.isnan(s["std"]) else f" +- {s['std']:.4f}")
            )
        body.append(cells)
    widths = [max(len(c) for c in column) for column in zip(header, *body, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *body]]
    return "\n".join([*lines, f"(mean +- sd over {over}; intervals, tests and plots: headlab-compare {sweep_dir})"])


def job_ranges(names: list[str], shown: int = 6) -> str:
    """Job folder names for one line, consecutive numbers as ranges: 0-29, 45, 60-89 (then how many more)."""
    numbers = sorted(int(n) for n in names if n.isdigit())
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    items = [str(a) if a == b else f"{a}-{b}" for a, b in spans] + sorted(n for n in names if not n.isdigit())
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more
