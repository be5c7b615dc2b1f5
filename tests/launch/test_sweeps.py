"""Sweeps: failures recorded and resumable, parallel and SLURM launchers, Optuna, W&B sweeps, experiments."""

import csv
import itertools
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy import stats

from conftest import PACKED, ROOT, TINY, cli_env, headlab_train, launcher_overrides, train_here
from headlab.cli.compare import main as compare_main
from headlab.config.check import check_config
from headlab.launch import runtime
from headlab.launch.plan import PER_MEMBER
from headlab.stats import sequential as sequential_stats
from headlab.stats.runs import load_dirs

runtime.configure()  # the resolvers the launcher configs use
EXPERIMENTS = sorted(p.stem for p in (ROOT / "experiments").glob("*.yaml"))
SST2 = ROOT / ".." / "shared" / "data" / "sst2"
SST2_FILES = ["data=files", f"data.files.train={SST2 / 'train.tsv'}", "data.text_column=sentence"]
SST2_SENTENCE_SPLITS = (("train", "train.tsv"), ("val", "dev.tsv"), ("test", "test_labeled_senteval.tsv"))
OFFLINE_DATA = {  # experiments on hub data run here on the same data from local files
    "sst2_recipe": [*SST2_FILES, f"data.files.val={SST2 / 'dev.tsv'}"],
    "sst2_heads_fixed_width": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "text_heads_fixed_width": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "text_head_designs": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "text_head_designs_2": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "text_rdrop": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "text_defaults_search": [*SST2_FILES, f"data.files.test={SST2 / 'dev.tsv'}"],
    "sst2_scoring": [f"data.files.{s}={SST2 / f}" for s, f in SST2_SENTENCE_SPLITS],
}
# experiments on the repository's own files (relative to its root, where experiments are run from), a fold of them
SENTENCES = ROOT / "experiments" / "data" / "sentences"
REPO_DATA = {"text_defaults_unseen": [f"data.files.train={SENTENCES / 'amazon.all'}", "data.cv.fold=0"]}
RECIPES = ("sst2_recipe", "head_roles", "differential_confound")  # one run; readings of heads at one chosen rate
SCREENS = ("text_defaults_search",)  # a search's first stage: 3 seeds (or folds) a setting, its finalists then 10
# at the defaults' own learning rate: a shipped default against its absence, or arms read in rounds (a rate chosen
# on validation cannot be read at a look)
DEFAULT_CHECKS = ("text_rdrop", "text_head_designs_2", "text_defaults_unseen")
QUICK = [*TINY, "trainer.max_epochs=1", "callbacks.attention=null", "logger=csv"]


def status(job_dir: Path) -> dict:
    return json.loads((job_dir / "results.json").read_text())


@pytest.mark.e2e
def test_failed_job_is_recorded_others_complete_and_resume_reruns_only_it(run_cli, tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    (sweep / "1" / "checkpoints").touch()  # job 1 cannot write its checkpoints: it fails mid-run
    args = ["-m", *QUICK, "model.attention.n_heads=1,2,4", "hydra.sweep.dir=sweep"]
    first = run_cli(*args)
    assert first.returncode == 1
    assert [status(sweep / j)["status"] for j in "012"] == ["completed", "failed", "completed"]
    assert "FileExistsError" in status(sweep / "1")["error"] and "Traceback" in status(sweep / "1")["traceback"]
    assert "1 of 3 jobs did not complete" in first.stderr and "Traceback" not in first.stderr
    before = {j: status(sweep / j)["started_at"] for j in "02"}

    (sweep / "1" / "checkpoints").unlink()
    for j in "02":  # recorded by a headlab whose sweep group had fewer keys: the same runs all the same
        record = status(sweep / j)
        record["config"] = {
            k: v for k, v in record["config"].items() if not k.startswith("sweep.") or k == "sweep.resume"
        }
        (sweep / j / "results.json").write_text(json.dumps(record))
    second = run_cli(*args, "sweep.resume=true")
    assert second.returncode == 0, second.stderr[-2000:]
    assert [status(sweep / j)["status"] for j in "012"] == ["completed"] * 3
    assert {j: status(sweep / j)["started_at"] for j in "02"} == before  # completed jobs were not rerun
    assert second.stdout.count("skipping") + second.stderr.count("skipping") == 2


@pytest.mark.parametrize("launcher", ["basic", "packed"])
def test_a_setting_every_job_shares_is_reported_once_not_once_per_job(run_cli, tmp_path, launcher):
    args = ["-m", *QUICK, "model.attention.n_heads=3", "seed=range(12)", *launcher_overrides(launcher)]
    result = run_cli(*args, "hydra.sweep.dir=sweep")
    lines = [line for line in result.stderr.splitlines() if line.startswith("headlab-train")]
    reason = "model.attention.n_heads=3 is invalid: expected a divisor of model.d_model=16"
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"headlab-train: invalid config: {reason}")
    sweep = tmp_path / "sweep"
    assert lines[1].startswith(
        "headlab-train: not completed: 12 jobs in sweep (0-11) (failed: InvalidSetting: " + reason
    )
    assert lines[2].startswith("headlab-train: 12 of 12 jobs did not complete")
    assert [status(sweep / str(j))["status"] for j in range(12)] == ["failed"] * 12


@pytest.mark.parametrize("launcher", ["basic", "packed"])
def test_a_dry_run_says_the_jobs_packs_steps_and_time_and_starts_nothing(run_cli, tmp_path, launcher):
    args = ["-m", *QUICK, "model.attention.n_heads=1,2", "seed=0,1,2", *launcher_overrides(launcher)]
    result = run_cli(*args, "trainer.max_epochs=3", "hydra.sweep.dir=sweep", "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    said = result.stdout
    what = " in 2 pack(s) of at most 64" if launcher == "packed" else ""
    assert f"headlab-train --dry-run: 6 jobs{what}; nothing is started" in said
    steps = 3 * 256 // 32  # 3 epochs of 256 training examples in batches of 32
    lines = [line for line in said.splitlines() if line.startswith(("  pack", "  job"))]
    assert len(lines) == (2 if launcher == "packed" else 6)
    assert all(f", {steps} steps and 3 validations each at " in line for line in lines)
    if launcher == "packed":
        assert lines[0].startswith("  pack 0: 3 run(s) of model.attention.n_heads=1,") and "seed" not in lines[0]
    assert said.splitlines()[-1].startswith("about ") and " on this machine (" in said
    assert not (tmp_path / "sweep").exists() and "jobs completed" not in result.stdout + result.stderr


@pytest.mark.e2e
def test_a_dry_run_of_a_resumed_sweep_prices_only_the_jobs_left_to_run(run_cli, tmp_path):
    """sweep.resume=true: the jobs that completed before with the same config are skipped by the launcher, and by
    the dry run's price too; a job whose config changed since is not."""
    first = run_cli("-m", *QUICK, "model.attention.n_heads=1,2", "hydra.sweep.dir=sweep")
    assert first.returncode == 0, first.stderr[-2000:]
    grown = ["-m", *QUICK, "model.attention.n_heads=1,2,4", "hydra.sweep.dir=sweep", "--dry-run", "--json"]
    resumed = run_cli(*grown, "sweep.resume=true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    said = json.loads(resumed.stdout)
    (job,) = said["jobs"]
    assert said["skipped"] == 2 and "model.attention.n_heads=4" in job["overrides"]
    assert json.loads(run_cli(*grown).stdout)["skipped"] == 0  # without sweep.resume every job runs
    changed = json.loads(run_cli(*grown, "sweep.resume=true", "model.d_ff=64").stdout)  # another config: none done
    assert changed["skipped"] == 0 and len(changed["jobs"]) == 3
    done = run_cli("-m", *QUICK, "model.attention.n_heads=1,2", "hydra.sweep.dir=sweep", "--dry-run", "--json",
                   "sweep.resume=true")  # fmt: skip
    assert json.loads(done.stdout) | {"threads": 0} == {
        "jobs": [],
        "packs": 0,
        "pack_steps": [],
        "seconds": 0,
        "at_a_time": 0,
        "threads": 0,
        "skipped": 2,
    }  # nothing left: still one object


def test_a_command_says_what_it_took_against_its_dry_runs_estimate(run_cli, tmp_path):
    """After --dry-run, the same command (a sweep, a single run) says when it ends what it took beside the dry run's
    estimate (kept in the cache: headlab.launch.estimates); a single run no dry run priced says its outcome alone."""
    sweep = ["-m", *QUICK, "model.attention.n_heads=2", "hydra.sweep.dir=sweep"]
    run_cli(*sweep, "--dry-run")  # its data prepared: the next estimate is a few hundredths of a second
    estimate = json.loads(run_cli(*sweep, "--dry-run", "--json").stdout)["seconds"]
    assert 0 < estimate < 0.5
    ran = run_cli(*sweep)
    assert ran.returncode == 0, ran.stderr[-2000:]
    said = re.search(
        r"sweep sweep took (\d+) s start to exit \(its dry run of \S+ estimated (\d+) s, took / estimated ([\d.]+)\)",
        ran.stdout + ran.stderr,
    )
    assert said, (ran.stdout + ran.stderr)[-2000:]
    took, estimated, ratio = int(said[1]), int(said[2]), float(said[3])
    assert estimated == int(f"{estimate:.0f}") and abs(ratio * estimate - took) <= 0.5 + 0.005 * estimate
    alone = run_cli(*QUICK)  # a single run no dry run priced (the sweep's estimate is not its): its outcome alone
    assert alone.returncode == 0 and "run took" not in alone.stdout + alone.stderr, alone.stderr[-2000:]
    run_cli(*QUICK, "--dry-run")
    priced = run_cli(*QUICK)
    assert re.search(r"run took \d+ s start to exit \(its dry run of ", priced.stdout + priced.stderr)


def test_a_packed_sweep_after_its_dry_run_starts_with_the_dry_runs_estimate_of_its_packs(run_cli, tmp_path):
    """The packed launcher says when it starts how long its packs will take: measured again where no dry run of the
    same command was made, else the dry run's (its packs' seconds, the process's start-up aside), not measured
    twice."""
    sweep = ["-m", *QUICK, "seed=0,1", *PACKED]
    unpriced = run_cli(*sweep, "hydra.sweep.dir=first")
    assert unpriced.returncode == 0, unpriced.stderr[-2000:]
    said = unpriced.stdout + unpriced.stderr
    assert re.search(r"packed launcher: 2 jobs to train in 1 pack\(s\) of at most 64, 1 at a time, about \d+ s here$",
                     said, re.MULTILINE)  # fmt: skip
    priced = json.loads(run_cli(*sweep, "hydra.sweep.dir=second", "--dry-run", "--json").stdout)
    ran = run_cli(*sweep, "hydra.sweep.dir=second")
    assert ran.returncode == 0, ran.stderr[-2000:]
    said = re.search(r"1 at a time, about (\d+) s \(its dry run of \S+\)", ran.stdout + ran.stderr)
    assert said and abs(int(said[1]) - sum(job["seconds"] for job in priced["jobs"])) <= 1, ran.stdout[-2000:]


def test_the_packed_launchers_estimate_times_a_packs_step_and_a_run_alone_only_for_a_pack_of_one():
    """The launcher's estimate prices packs: a pack's members are not timed alone as well (the dry run's own lines
    say each run's step alone, so it times both); a pack of one is its run alone."""
    import torch

    from headlab.launch.cost import costs

    pair, single = compose_job(*QUICK), compose_job(*QUICK, "model.attention.n_heads=2")
    threads = torch.get_num_threads()  # measuring sets them, as in a process of its own: put back for the next test
    try:
        packed, alone = costs([pair, single], threads=1, members=[2, 1], alone=False)
        dry_run = costs([pair], threads=1, members=[2])[0]  # the dry run's: the run alone too
    finally:
        torch.set_num_threads(threads)
    assert packed.step_s is None and 2 in packed.packs and packed.pack_seconds(2) > 0
    assert alone.step_s > 0 and not alone.packs and alone.pack_seconds(1) == pytest.approx(alone.seconds)
    assert dry_run.step_s > 0 and 2 in dry_run.packs


def test_the_packed_launchers_estimate_times_shapes_only_while_that_costs_a_tenth_of_what_they_take():
    """Three shapes of packs of short runs: timing the first costs about as much as its pack trains, so the others
    are priced like it; the same shapes trained 400 epochs: each is timed (a dry run times every shape)."""
    import torch

    from headlab.launch.dry_run import estimate

    shapes = [compose_job(*QUICK, f"model.attention.n_heads={h}") for h in (1, 2, 4)]
    long = [compose_job(*QUICK, f"model.attention.n_heads={h}", "trainer.max_epochs=400") for h in (1, 2, 4)]
    threads = torch.get_num_threads()  # measuring sets them, as in a process of its own: put back for the next test
    try:
        short_seconds, *short_timed = estimate([2, 2, 4], shapes, n_jobs=1)
        long_seconds, *long_timed = estimate([2, 2, 4], long, n_jobs=1)
    finally:
        torch.set_num_threads(threads)
    assert short_timed == [1, 3] and long_timed == [3, 3]
    assert 0 < short_seconds < long_seconds


def test_a_dry_run_of_a_sweep_in_rounds_prices_every_round_and_the_first_alone(run_cli, tmp_path):
    """sweep.sequential.looks=2 over 4 seeds: the sweep's seconds price every round (its most), seconds_first_look
    its first round alone (2 seeds an arm: where every arm is decided at the first look, its least)."""
    args = ["-m", *QUICK, "optim.lr=1e-2,1e-6", "seed=range(4)", "sweep.sequential.looks=2",
            "sweep.sequential.baseline='optim.lr=1e-2'", "hydra.sweep.dir=sweep", "--dry-run"]  # fmt: skip
    said = json.loads(run_cli(*args, "--json").stdout)
    seeds = [int(next(o for o in job["overrides"] if o.startswith("seed="))[5:]) for job in said["jobs"]]
    later = sum(job["seconds"] for job, seed in zip(said["jobs"], seeds, strict=True) if seed >= 2)
    rounding = 0.05 * (len(said["jobs"]) + 2)  # each figure to 0.1 s
    assert abs(said["seconds"] - said["seconds_first_look"] - later / said["at_a_time"]) <= rounding
    text = run_cli(*args).stdout
    assert "in rounds: about " in text and " if every arm is decided at the first look" in text


def test_a_dry_run_in_json_says_the_datas_preparation_on_stderr(run_cli, tmp_path):
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{i % 2} {['good', 'bad'][i % 2]} film {i}\n" for i in range(60)))
    files = ["data=files", f"data.files.train={data}", "data.cv.folds=3", "data.n_classes=2"]
    result = run_cli("-m", *files, "model.d_model=16", "trainer.max_epochs=1", "hydra.sweep.dir=sweep", "--dry-run",
                     "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(json.loads(result.stdout)["jobs"]) == 3 and f"data: preparing train from {data}" in result.stderr


def test_a_dry_run_in_json_is_one_object_with_each_jobs_steps_and_seconds(run_cli, tmp_path, monkeypatch):
    """--dry-run --json: stdout is one JSON object, nothing else (Lightning's lines about the Trainer that times the
    steps are not said): jobs (overrides, pack, steps, seconds alone), packs, each pack's step timed as the pack
    takes it (its members stacked, computing the faster way: pack.compute=auto), and the sweep's seconds. The way
    it timed is kept: the sweep's packs compute that way, timing nothing again."""
    monkeypatch.setenv("HEADLAB_CACHE", str(tmp_path / "cache"))  # no choice kept by another test
    args = ["-m", *QUICK, "model.attention.n_heads=1,2", "seed=0,1", *PACKED, "trainer.max_epochs=3"]
    result = run_cli(*args, "hydra.sweep.dir=sweep", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout)
    assert plan["packs"] == 2 and len(plan["jobs"]) == 4
    assert sorted(job["pack"] for job in plan["jobs"]) == [0, 0, 1, 1]
    assert all(job["steps"] == 3 * 256 // 32 and job["seconds"] > 0 for job in plan["jobs"])
    assert all(job["analysis_seconds"] == 0 < job["evaluation_seconds"] for job in plan["jobs"])  # attention=null
    assert {" ".join(job["overrides"][-2:]) for job in plan["jobs"]} == {
        f"model.attention.n_heads={h} seed={s}" for h in (1, 2) for s in (0, 1)
    }  # each job's overrides as its job would get them, the dry run's own left out
    assert [(p["pack"], p["members"]) for p in plan["pack_steps"]] == [(0, 2), (1, 2)]
    assert all(p["step_seconds"] > 0 and p["compute"] in ("each", "batched") for p in plan["pack_steps"])
    at_once = sum(p["seconds"] for p in plan["pack_steps"]) / plan["at_a_time"]
    rounding = 0.05 * (len(plan["pack_steps"]) + 1)  # each figure to 0.1 s, the packs' and the total
    assert at_once - rounding <= plan["seconds"] < at_once + rounding + 60  # and this process's start-up
    assert not (tmp_path / "sweep").exists()

    done = run_cli(*args, "hydra.sweep.dir=sweep")
    assert done.returncode == 0, done.stderr[-2000:]
    ways = {}
    for run in (tmp_path / "sweep").glob("*/results.json"):
        record = json.loads(run.read_text())
        ways[record["config"]["model.attention.n_heads"]] = (record["pack"]["compute"], record["pack"]["compute_kept"])
    assert ways == {h: (p["compute"], True) for h, p in zip((1, 2), plan["pack_steps"], strict=True)}


def test_a_dry_run_plans_from_a_prior_sweep_what_its_seeds_detect_and_what_a_budget_buys(run_cli, tmp_path):
    """--prior DIR --baseline KEY=VALUE --effect X --budget T: per arm the difference the planned seeds detect at
    80% power (Welch's noncentral t from the prior's sds, written out here), the seeds the margin needs, the share
    of the prior's runs still improving at the planned epoch; the budget's seeds; in the JSON as `plan`."""
    import math
    import statistics

    from scipy import optimize, stats

    acc = {1: [0.60, 0.70, 0.65, 0.72], 2: [0.80, 0.82, 0.79, 0.84]}
    for heads, values in acc.items():
        for seed, value in enumerate(values):
            run = tmp_path / "prior" / f"{heads}-{seed}"
            run.mkdir(parents=True)
            curve = [
                {"epoch": e, "step": e + 1, "val/acc": v} for e, v in enumerate([0.3, 0.5, 0.5 + 0.1 * (heads == 1)])
            ]
            record = {"status": "completed", "metrics": {"test/acc": value, "val/acc_best": value}, "curve": curve,
                      "config": {"model.attention.n_heads": heads, "seed": seed}}  # fmt: skip
            (run / "results.json").write_text(json.dumps(record))
    args = ["-m", *QUICK, "model.attention.n_heads=1,2", "seed=range(3)", "trainer.max_epochs=3"]
    plan_args = ["--prior", str(tmp_path / "prior"), "--baseline", "model.attention.n_heads=2", "--effect", "0.05"]
    result = run_cli(*args, "--dry-run", "--json", *plan_args, "--budget", "10h")
    assert result.returncode == 0, result.stderr[-2000:]
    planned = json.loads(result.stdout)
    (row,) = planned["plan"]
    n = planned["budget"]["replicates"]
    assert planned["replicates"] == 3 and n > 3 and planned["budget"]["seconds"] == 36000
    va, vb = statistics.variance(acc[1]) / n, statistics.variance(acc[2]) / n
    df = (va + vb) ** 2 / (va**2 / (n - 1) + vb**2 / (n - 1))
    crit = stats.t.ppf(0.975, df)

    def power(d):  # the far tail underflows to nan in scipy: 0 to many digits
        nc = d / math.sqrt(va + vb)
        return stats.nct.sf(crit, df, nc) + (0 if math.isnan(far := stats.nct.cdf(-crit, df, nc)) else far)

    by_hand = optimize.brentq(lambda d: power(d) - 0.8, 1e-9, 40 * math.sqrt(va + vb))
    assert row["arm"] == "model.attention.n_heads=1" and row["from"] == "prior"
    assert row["detectable"] == pytest.approx(by_hand, abs=1e-5)
    assert row["still_improving"] == 1.0  # every one-head run of the prior rose at its third validation
    assert row["needed_for_effect"] >= 2
    said = run_cli(*args, "--dry-run", *plan_args)
    assert said.returncode == 0, said.stderr[-2000:]
    assert "plan against model.attention.n_heads=2 on test/acc (Welch's t over seeds), 3 seeds an arm" in said.stdout
    assert (
        "model.attention.n_heads=1: detects ±" in said.stdout
        and "100% of the prior's runs still improving" in said.stdout
    )
    refused = run_cli(*QUICK, "--prior", str(tmp_path / "prior"))
    assert refused.returncode == 2 and "give them with --dry-run" in refused.stderr
    wrong = run_cli(*args, "--dry-run", "--prior", str(tmp_path / "prior"), "--baseline", "optim.lr=1e-3")
    assert (
        wrong.returncode == 2
        and "expected KEY=VALUE of a key the sweep varies (model.attention.n_heads)" in wrong.stderr
    )


@pytest.mark.parametrize(
    "args, said",
    [
        (["model.attention.gate=headwize"],
         "headlab-train: invalid config: model.attention.gate='headwize' is invalid: expected one of "),
        (["data=cr"], "headlab-train: data error: data.files.train: cannot read "),
    ],
)  # fmt: skip
def test_a_dry_run_that_cannot_price_its_jobs_says_why_in_one_line(tmp_path, monkeypatch, args, said):
    """A bad value (named with its whole key, before any data is prepared) or data that is not there: one line,
    exit 2, as the run itself would say it."""
    env = cli_env() | {"HEADLAB_DATA": str(tmp_path / "nothing")}
    result = train_here(*(QUICK if args[0] != "data=cr" else []), *args, "--dry-run", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(said), result.stderr[-2000:]


@pytest.mark.parametrize(
    "limit, steps",
    [("+trainer.max_steps=2", 2), ("++trainer.limit_train_batches=3", 3 * 50), ("trainer=ddp_cpu", 8 // 2 * 50)],
)
def test_a_dry_run_counts_the_steps_the_trainer_will_take(run_cli, tmp_path, limit, steps):
    """max_steps=2 with max_epochs=50 trains 2 steps (Lightning stops at whichever comes first), limit_train_batches=3
    trains 3 steps an epoch, and two ranks share an epoch's 8 batches, 4 steps (as the DDP run of
    test_distributed trains): the dry run says so."""
    result = run_cli(*QUICK, "trainer.max_epochs=50", limit, "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("  job 0: ")]
    assert f", {steps} steps and " in line, line


@pytest.mark.parametrize(
    "trainer, ranks",
    [
        ({"devices": 1}, 1),
        ({"devices": 2, "strategy": "ddp_fork"}, 2),
        ({"devices": "3"}, 3),
        ({"devices": [0, 2]}, 2),
        ({"devices": 4, "num_nodes": 2}, 8),
        ({"devices": -1, "accelerator": "cpu"}, 1),  # all GPUs: none on a CPU
        ({"devices": "auto", "accelerator": "cpu"}, 1),
    ],
)
def test_a_dry_run_counts_the_ranks_a_run_trains_in_whatever_form_its_devices_take(trainer, ranks):
    from headlab.launch import schedule

    assert schedule.ranks(OmegaConf.create({"trainer": trainer})) == ranks


def test_a_dry_run_counts_each_jobs_own_budget_where_the_budget_follows_the_data(run_cli, tmp_path):
    """trainer.max_epochs=auto: a job of twice the budget (auto_epochs.scale=2) trains twice the steps, though its
    model and data are those of a job of the first budget (timed once, for both)."""
    args = ["-m", *QUICK, "trainer.max_epochs=auto", "+auto_epochs.scale=1,2", "hydra.sweep.dir=sweep"]
    result = run_cli(*args, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    steps = {job["overrides"][-1]: job["steps"] for job in json.loads(result.stdout)["jobs"]}
    per_epoch = 256 // 32  # 5,000 steps within 5-10 epochs (x the scale): the most epochs, at 8 steps an epoch
    assert steps == {"+auto_epochs.scale=1": 10 * per_epoch, "+auto_epochs.scale=2": 20 * per_epoch}


@pytest.mark.parametrize(
    "schedule, checks",
    [
        (["+trainer.check_val_every_n_epoch=2"], 2),  # of 4 epochs, the second and the fourth
        (["+trainer.val_check_interval=0.5"], 8),  # at the 4th and 8th of an epoch's 8 batches
        (["+trainer.val_check_interval=3"], 8),  # at the 3rd and 6th of them
        (["+trainer.val_check_interval=3", "+trainer.check_val_every_n_epoch=null"], 10),  # every 3 of the 32
        (["+trainer.max_steps=12"], 1),  # the run ends in its second epoch, before its validation
    ],
)
def test_a_dry_run_counts_the_validations_lightning_schedules(run_cli, tmp_path, schedule, checks):
    result = run_cli(*QUICK, "trainer.max_epochs=4", *schedule, "--dry-run", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = json.loads(result.stdout)["jobs"]
    assert job["validations"] == checks


@pytest.mark.parametrize("logger, every, draws", [("csv", 3, 0), ("tensorboard", 3, 2), ("tensorboard", 0, 0)])
def test_a_dry_run_prices_the_attention_maps_a_run_draws_for_its_logger(run_cli, tmp_path, logger, every, draws):
    """TensorBoard (and W&B) get the attention maps at every figures_every_n_val_epochs-th validation and after the
    last: of 4, the 3rd and the 4th, and the head analysis' figures after training; a CSV logger gets none, nor
    does any with figures_every_n_val_epochs 0. The dry run counts them and times a drawing of each."""
    cadence = f"callbacks.attention.figures_every_n_val_epochs={every}"
    result = run_cli(*TINY, "trainer.max_epochs=4", cadence, f"logger={logger}", "--dry-run", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    (job,) = json.loads(result.stdout)["jobs"]
    assert job["figures"] == draws and (job["figures_seconds"] > 0) == (draws > 0)
    assert (job["importance_figures_seconds"] > 0) == (draws > 0)
    parts = ("evaluation_seconds", "analysis_seconds", "figures_seconds", "importance_figures_seconds")
    assert job["analysis_seconds"] > 0 and job["evaluation_seconds"] > 0
    assert sum(job[k] for k in parts) <= job["seconds"] + 0.05 * len(parts)  # shares of the run, each to 0.1 s
    said = run_cli(*TINY, "trainer.max_epochs=4", cadence, f"logger={logger}", "--dry-run").stdout
    drawn = ", 2 drawings of the attention maps and head analysis with its figures about "
    assert (drawn in said) == (draws > 0) and (" and head analysis about " in said) == (draws == 0), said
    assert re.search(r"; training [^;]+ and head analysis [^;]+ of it\)", said), said  # the sweep's line
    written = [p.name for p in tmp_path.rglob("*") if p.suffix in (".json", ".html", ".png")]  # its head analysis
    assert written == []  # timed as the run makes it (heads.json, the head view) in a folder removed after


@pytest.mark.e2e  # the real CLI in a process of its own
def test_a_dry_run_says_its_own_lines_not_the_notes_of_what_it_times(tmp_path):
    """Timing a run's figures loads matplotlib's fonts, whose notes (a math font missing here, replaced; once a
    process) go where a run's notes go, its log file: a packed dry run in a process of its own says its lines alone."""
    sweep = ["-m", *PACKED, "seed=0,1", *TINY, "logger=tensorboard", "hydra.sweep.dir=s"]
    result = headlab_train(*sweep, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert said[0] == "headlab-train --dry-run: 2 jobs in 1 pack(s) of at most 64; nothing is started", said
    assert len(said) == 3 and said[1].startswith("  pack 0: 2 run(s)") and said[2].startswith("about "), said


def test_a_dry_runs_validations_are_the_runs(run_cli, tmp_path):
    """Validations every 3 training batches across epochs: the dry run's count is the one the run makes (its
    metrics.csv: a row of val/acc each)."""
    every_3 = ["+trainer.val_check_interval=3", "+trainer.check_val_every_n_epoch=null"]
    schedule = [*QUICK, "trainer.max_epochs=4", *every_3]
    planned = json.loads(run_cli(*schedule, "--dry-run", "--json").stdout)["jobs"][0]["validations"]
    assert run_cli(*schedule, "hydra.run.dir=run").returncode == 0
    with (tmp_path / "run" / "metrics.csv").open() as f:
        made = sum(1 for row in csv.DictReader(f) if row.get("val/acc"))
    assert planned == made == 10


@pytest.mark.parametrize("launcher", ["basic", "packed"])
def test_jobs_given_one_run_directory_are_refused_before_any_trains(run_cli, tmp_path, launcher):
    args = ["-m", *QUICK, "seed=0,1", *launcher_overrides(launcher), "hydra.sweep.subdir=same"]
    result = run_cli(*args, "hydra.sweep.dir=sweep")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "headlab-train: invalid config: hydra.sweep.subdir='same' is invalid: expected a name that differs between "
        "the sweep's 2 jobs" in result.stderr
    )
    assert not (tmp_path / "sweep").exists()


def test_a_job_refused_where_another_job_of_the_sweep_ran_counts_beside_it(run_cli, tmp_path):
    """A subdir with an interpolation can still name one directory twice (here the data's seed, the same for both
    jobs): the first job's run is counted, the second's refusal too."""
    args = ["-m", *QUICK, "optim.lr=1e-3,3e-3", "hydra.sweep.subdir=seed_${seed}", "hydra.sweep.dir=sweep"]
    result = run_cli(*args)
    assert result.returncode == 1
    assert status(tmp_path / "sweep" / "seed_0")["status"] == "completed"
    assert "sweep sweep: 1 of 2 jobs completed" in result.stdout + result.stderr
    assert "headlab-train: 1 of 2 jobs did not complete" in result.stderr


@pytest.mark.e2e
def test_local_launcher_runs_two_jobs_at_once_sharing_the_cores(run_cli, tmp_path):
    result = run_cli("-m", *QUICK, "hydra/launcher=local", "seed=0,1", "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = [status(tmp_path / "sweep" / j) for j in "01"]
    spans = []
    for job in jobs:
        start = datetime.fromisoformat(job["started_at"]).timestamp()
        spans.append((start, start + job["duration_s"]))
        assert job["resources"]["threads"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]  # the two jobs overlapped in time


@pytest.mark.e2e
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a host with two cores")
def test_a_run_confined_to_one_core_trains_on_one_thread(tmp_path):
    """SLURM, taskset and containers grant a process some of the host's cores: torch gets those, not all."""
    one_core = min(os.sched_getaffinity(0))
    done = subprocess.run(
        [sys.executable, "-m", "headlab.cli.train", *TINY, "trainer.max_epochs=1", "logger=none", "hydra.run.dir=r"],
        cwd=tmp_path, env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, {one_core}),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert status(tmp_path / "r")["resources"]["threads"] == 1


def compose_job(*overrides: str):
    with initialize_config_module("headlab.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def sweep_jobs(experiment: str) -> list[list[str]]:
    """Every job of an experiment: the cartesian product of its sweeper params, parsed as Hydra parses them."""
    params = compose_job(f"experiment={experiment}").hydra.sweeper.params or {}
    overrides = OverridesParser.create().parse_overrides([f"{key}={values}" for key, values in params.items()])
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in overrides]
    return [list(job) for job in itertools.product(*choices)]


def arms(jobs: list[list[str]]) -> list[list[str]]:
    """The jobs that differ in more than the keys a pack's members may differ in (seed, learning rate, ...)."""
    member = {f"{key}=" for key in PER_MEMBER}
    unique = {tuple(o for o in job if not any(o.startswith(k) for k in member)): job for job in jobs}
    return list(unique.values())


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_arm_of_every_experiment_composes_and_validates(experiment):
    if experiment in OFFLINE_DATA and not SST2.exists():  # the config check reads that its data files exist
        pytest.skip("../shared/data is absent")
    jobs = sweep_jobs(experiment)
    if experiment not in RECIPES:  # the ablations: 10 seeds and a learning-rate grid per arm, packed
        values = {key: {o for job in jobs for o in job if o.startswith(f"{key}=")} for key in ("seed", "optim.lr")}
        assert len(values["seed"]) >= (3 if experiment in SCREENS else 10)
        assert len(values["optim.lr"]) >= 3 or (experiment in DEFAULT_CHECKS and not values["optim.lr"])
        assert len(jobs) == len(arms(jobs)) * len(values["seed"]) * max(len(values["optim.lr"]), 1)
        assert compose_job(f"experiment={experiment}").hydra.launcher._target_.endswith("PackedLauncher")
    for job in arms(jobs):
        local = OFFLINE_DATA.get(experiment, REPO_DATA.get(experiment, []))
        cfg = compose_job(f"experiment={experiment}", *job, *local)
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        check_config(cfg)


@pytest.mark.e2e
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_its_first_job_for_a_few_batches(run_cli, tmp_path, experiment):
    job = sweep_jobs(experiment)[0]
    quick = [*QUICK, "+trainer.limit_train_batches=3", "+trainer.limit_val_batches=2"]
    text = [
        "trainer.max_epochs=1",
        "callbacks.attention=null",
        "logger=csv",
        "+trainer.limit_train_batches=4",
        "+trainer.limit_val_batches=2",
        "+trainer.limit_test_batches=2",
        "++trainer.val_check_interval=2",
    ]
    if experiment in OFFLINE_DATA:
        if not SST2.exists():
            pytest.skip("../shared/data is absent")
        head = tmp_path / "train.tsv"  # SST-2 train's first 2,000 sentences: the same code, prepared in seconds
        with (SST2 / "train.tsv").open() as f:
            head.write_text("".join(itertools.islice(f, 2001)))
        quick = [*(a.replace(str(SST2 / "train.tsv"), str(head)) for a in OFFLINE_DATA[experiment]), *text]
    elif experiment in REPO_DATA:
        quick = [*REPO_DATA[experiment], *text]
    result = run_cli(f"experiment={experiment}", *job, "hydra.mode=RUN", *quick, "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-2000:]
    record = status(tmp_path / "run")
    assert record["status"] == "completed" and record["config"]["experiment"] == experiment
    stated = yaml.safe_load((ROOT / "experiments" / f"{experiment}.yaml").read_text()).get("compare")
    recorded = {k.split(".", 1)[1]: v for k, v in record["config"].items() if k.startswith("compare.")}
    assert recorded == (stated or {})  # headlab-compare finds the pre-stated analysis in every run


def test_slurm_launcher_asks_for_what_the_trainer_uses():
    cfg = compose_job("hydra/launcher=slurm", "trainer.accelerator=gpu", "trainer.devices=4", "+trainer.num_nodes=2")
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    assert launcher._target_.endswith("SlurmLauncher")
    cpu = compose_job("hydra/launcher=slurm").hydra.launcher
    assert (cpu.nodes, cpu.tasks_per_node, cpu.gpus_per_node) == (1, 1, 0)
    # a strategy that starts its ranks itself is one task: SLURM starting one per device, each would start them all
    for strategy, tasks in (("ddp", 4), ("ddp_fork", 1), ("ddp_spawn", 1), ("ddp_notebook", 1)):
        ranks = ["trainer=ddp_cpu", "trainer.devices=4", f"trainer.strategy={strategy}"]
        assert compose_job("hydra/launcher=slurm", *ranks).hydra.launcher.tasks_per_node == tasks, strategy


def test_wandb_sweep_passes_hydra_overrides_to_headlab_train():
    spec = yaml.safe_load((ROOT / "sweeps" / "wandb_heads.yaml").read_text())
    assert spec["command"] == ["${env}", "headlab-train", "${args_no_hyphens}"]
    objective = compose_job().sweep.objective  # what every run (and Optuna) is selected on
    assert spec["metric"] == {"name": objective, "goal": "maximize"} and objective == "val/acc_best"
    values = {key: p["values"] for key, p in spec["parameters"].items()}
    for combination in itertools.product(*values.values()):
        overrides = [f"{k}={v}" for k, v in zip(values, combination, strict=True)]  # what ${args_no_hyphens} gives
        cfg = compose_job(*overrides)
        check_config(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        assert cfg.model.attention.n_heads == combination[0]


def test_fixed_head_size_control_arms_match_the_fixed_size_arms_in_parameters():
    params = {}
    for job in arms(sweep_jobs("fixed_head_size")):
        cfg = compose_job("experiment=fixed_head_size", *job)
        task = instantiate(cfg.data.task)
        sizes = {"vocab_size": task.vocab_size, "n_classes": task.n_classes, "max_len": task.max_len}
        architecture = OmegaConf.masked_copy(cfg.model, [k for k in cfg.model if k != "compile"])
        model = instantiate(architecture, **sizes, readout="token", _convert_="all")
        arm = (cfg.model.attention.n_heads, cfg.model.attention.d_k, cfg.model.d_ff)
        params[arm] = sum(p.numel() for p in model.parameters())
    assert len(params) == 9 and task.max_len == 64
    for h in (4, 8, 16):
        fixed = params[h, 32, None]
        (matched,) = [n for (heads, d_k, d_ff), n in params.items() if heads == h and d_k is None and d_ff]
        assert abs(matched - fixed) / fixed < 1e-3 and params[h, None, None] < 0.85 * fixed


@pytest.mark.e2e
def test_a_sequential_sweep_stops_a_broken_arm_at_the_first_look_and_runs_an_arm_without_a_difference_to_the_end(
    run_cli, tmp_path
):
    """sweep.sequential.looks=2 over 8 seeds: at 4 seeds a learning rate of 1e-6 is decided (its test loss far above
    the baseline's beyond the first look's O'Brien-Fleming boundary) and stops; 1.01e-2, no real difference from
    1e-2 and no margin stated, goes on to 8. sequential.json says each arm's look, reading and runs."""
    args = [*QUICK, "trainer.max_epochs=2", *PACKED, "optim.lr=1e-2,1e-6,1.01e-2", "seed=range(8)"]
    sequential = [
        "sweep.sequential.looks=2",
        "sweep.sequential.baseline='optim.lr=1e-2'",
        "sweep.sequential.metric=test/loss",
        "sweep.sequential.alpha=0.025",  # two arms against the baseline: 0.05 / 2 each
    ]
    result = run_cli("-m", *args, *sequential, "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads((tmp_path / "sweep" / "sequential.json").read_text())
    arms = {a["arm"]: a for a in said["arms"]}
    first_look = sequential_stats.level(sequential_stats.boundaries((0.5, 1.0), 0.025)[0])
    assert said["alpha"] == 0.025 and arms["optim.lr=1e-06"]["level"] == pytest.approx(first_look)
    assert said["looks"] == [4, 8] and arms["optim.lr=0.01"]["reading"] == "baseline"
    broken, same = arms["optim.lr=1e-06"], arms["optim.lr=0.0101"]
    assert broken["look"] == 1 and broken["reading"] == "significant" and len(broken["runs"]) == 4
    assert broken["p"] < broken["level"] < 0.01 and broken["difference"] > 0  # the higher test loss
    assert same["look"] == 2 and same["reading"] is None and len(same["runs"]) == 8
    assert len(list((tmp_path / "sweep").glob("*/results.json"))) == 20  # 4 seeds of the broken arm never ran
    assert "sweep.sequential look 1: optim.lr=1e-06: significant" in result.stderr + result.stdout
    compare_main([str(tmp_path / "sweep"), "--no-plots"])  # compare.md says what each arm's round read
    table = (tmp_path / "sweep" / "compare.md").read_text()
    assert f"Rounds ({tmp_path / 'sweep'}/sequential.json: looks at 4, 8 replicates, baseline optim.lr=1e-2" in table
    assert f"| optim.lr=1e-06 | look 1 (4 runs) | significant | {broken['p']:.3g} ({broken['level']:.3g}) |" in table
    assert "| optim.lr=0.0101 | look 2 (8 runs) | undecided |" in table


@pytest.mark.e2e
def test_a_cross_validated_sequential_sweep_adds_folds_in_rounds_and_reads_the_corrected_t(run_cli, tmp_path):
    """sweep.sequential.looks=2 over 8 folds of a text file (the label: whether the first word is good or bad): at
    4 folds a learning rate of 1e-6 is decided against 1e-2 on test loss by the corrected paired t over the folds
    both ran, and the last 4 folds of either never run."""
    data = tmp_path / "train.txt"
    data.write_text("".join(f"{i % 2} {['good', 'bad'][i % 2]} film number {i}\n" for i in range(800)))
    files = ["data=files", f"data.files.train={data}", "data.cv.folds=8", "data.n_classes=2"]
    args = [*files, "model.d_model=16", "trainer.max_epochs=3", "logger=csv", "callbacks.progress_bar=null"]
    sequential = [
        "sweep.sequential.looks=2",
        "sweep.sequential.baseline='optim.lr=1e-2'",
        "sweep.sequential.metric=test/loss",
    ]
    result = run_cli("-m", *PACKED, *args, "optim.lr=1e-2,1e-6", *sequential, "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads((tmp_path / "sweep" / "sequential.json").read_text())
    broken = next(a for a in said["arms"] if a["arm"] == "optim.lr=1e-06")
    assert said["looks"] == [4, 8] and broken["look"] == 1 and broken["reading"] == "significant"
    runs = load_dirs([tmp_path / "sweep"]).completed
    loss = {
        lr: {r["config"]["data.cv.fold"]: r["metrics"]["test/loss"] for r in runs if r["config"]["optim.lr"] == lr}
        for lr in (1e-2, 1e-6)
    }
    assert sorted(loss[1e-6]) == sorted(loss[1e-2]) == [0, 1, 2, 3]  # decided: neither arm needs the other 4 folds
    d = np.array([loss[1e-6][f] - loss[1e-2][f] for f in range(4)])  # the first look, written out
    t = d.mean() / np.sqrt((1 / 4 + 1 / 7) * d.var(ddof=1))
    assert broken["p"] == pytest.approx(2 * stats.t.sf(abs(t), 3)) and broken["p"] < broken["level"]


def test_rounds_rank_folds_with_all_their_seeds_and_seeds_where_one_fold_is_run():
    from headlab.launch.grid import sequential_rounds

    folds = [[f"optim.lr={lr}", f"data.cv.fold={f}", f"seed={s}"] for lr in (1, 2) for f in range(4) for s in (0, 1)]
    arms, ranks, sizes = sequential_rounds(folds, 2)
    assert arms[0] == {"optim.lr": "1"} and ranks[:8] == [0, 0, 1, 1, 2, 2, 3, 3] and sizes == [2, 4]
    one_fold = [[f"optim.lr={lr}", "data.cv.fold=3", f"seed={s}"] for lr in (1, 2) for s in range(6)]
    _, ranks, sizes = sequential_rounds(one_fold, 3)
    assert ranks[:6] == [0, 1, 2, 3, 4, 5] and sizes == [2, 4, 6]
