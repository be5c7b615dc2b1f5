"""What a person sees, captured from the real CLI with its output redirected (as in a batch job): the model, the
data being prepared, progress, each run's outcome and a sweep's table; no noise; and, when something stops a run,
what happened and what to do."""

import csv
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NO_FIGURES, TINY, cli_env, train_here

pytestmark = pytest.mark.e2e
NOISE = (
    "Tip:",
    "srun",
    "Total FLOPs",
    "LeafSpec",
    "anonymous",
    "GPU available",
    "Warning",
    "warn(",
    "pack None",
    "findfont",
)


@pytest.mark.parametrize("path", ["pack of one", "a bar of its own"])
def test_a_run_says_its_model_progress_and_outcome_and_nothing_else(run_cli, tmp_path, path):
    """Plain lines where output is not a terminal, as a run trains (with TensorBoard: the time its figures took, a
    run's, not a pack's, and none of matplotlib's notes, such as a math font it replaces), also with the plain
    progress given as a callback of the run's own."""
    own = ["callbacks.progress_bar=null", "+callbacks.plain._target_=headlab.training.progress.PlainProgress"]
    logger = "logger=csv" if path == "a bar of its own" else "logger=[csv,tensorboard]"
    done = run_cli(*[o for o in TINY if o not in ("callbacks.progress_bar=null", NO_FIGURES)], logger,
                   *(own if path == "a bar of its own" else []), "hydra.run.dir=run")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    lines = done.stdout.splitlines()
    metrics = record["metrics"]
    assert any(f"model: {record['params']['total']:,} parameters" in line for line in lines)
    validated = [line for line in lines if " validated: val/" in line]
    tested = [line.split(" - ", 1)[1] for line in lines if " - tested: " in line]
    assert len(validated) == 2 and f"val/acc {record['curve'][-1]['val/acc']:.4f}" in validated[-1]
    assert len(tested) == 1 and re.fullmatch(r"tested: (test/\w+ [0-9.]+(, | )?){2} \(\d+ s\)", tested[0])
    assert f"test/acc {metrics['test/acc']:.4f}" in tested[0] and f"test/loss {metrics['test/loss']:.4f}" in tested[0]
    if path == "pack of one":  # the maps after the last validation, the head analysis' figures after the test
        drawn = [line.split(" - ", 1)[1] for line in lines if "figures in " in line]
        assert [re.sub(r"[0-9.]+ s$", "N s", line) for line in drawn] == ["figures in N s", "importance figures in N s"]
    outcome = lines[-1].split(" - ", 1)[1]
    assert outcome == (
        f"{tmp_path / 'run'}: completed in {record['duration_s']:.0f} s: val/acc_best {metrics['val/acc_best']:.4f}, "
        f"test/acc {metrics['test/acc']:.4f}, test/loss {metrics['test/loss']:.4f}"
    )
    assert done.stderr == "" and not [n for n in NOISE if n in done.stdout]
    log = (tmp_path / "run" / "train.log").read_text()  # what the console leaves out, the log keeps
    assert "Seed set to" in log


def test_text_data_preparation_says_what_it_does_with_counts(run_cli, tmp_path):
    rows = "text,label\n" + "".join(f"word{i} word{i + 1} {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(80))
    (tmp_path / "train.csv").write_text(rows)
    done = run_cli("data=files", f"data.files.train={tmp_path}/train.csv", "model.d_model=16", "trainer.max_epochs=1",
                   "logger=csv", "hydra.run.dir=run", "data.tokenizer.vocab_size=60")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line.split(" - ", 1)[1] for line in done.stdout.splitlines() if " - data: " in line]
    assert said[0] == f"data: preparing train from {tmp_path}/train.csv"
    assert said[1] == "data: learning a wordpiece vocabulary of 60 tokens from 76 texts"  # val carved: 4 of 80
    assert said[2] == "data: tokenizing train (76), val (4)"
    assert said[-1].startswith("data: train 76, val 4 examples, 2 classes, ")


def test_a_sweep_ends_with_its_table_and_says_what_to_do_about_what_failed(run_cli, tmp_path):
    done = run_cli("-m", "model.attention.n_heads=1,2", "seed=0,1", *TINY, "trainer.max_epochs=1", "logger=csv",
                   "hydra.sweep.dir=sweep")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout[done.stdout.index("n_heads  runs") :].splitlines()
    assert table[0].split() == ["n_heads", "runs", "val/acc_best", "test/acc"]
    assert [line.split()[:2] for line in table[1:3]] == [["1", "2"], ["2", "2"]]
    assert table[3] == "(mean +- sd over seeds; intervals, tests and plots: headlab-compare sweep)"

    refused = run_cli("-m", "model.attention.n_heads=3,5", *TINY, "logger=csv", "hydra.sweep.dir=refused")
    assert refused.returncode == 1 and "sweep.resume" not in refused.stderr
    assert refused.stderr.strip().endswith(
        "2 of 2 jobs did not complete; fix the settings above and run the sweep again"
    )


def _last_logged_step(metrics: Path) -> int:
    """The last training step the CSV logger has written (it writes every 50 steps, flushes every 100)."""
    try:
        rows = list(csv.DictReader(metrics.open()))
    except (OSError, csv.Error):
        return -1
    return max((int(r["step"]) for r in rows if r.get("step", "").isdigit()), default=-1)


def test_ctrl_c_stops_at_the_next_step_saves_where_it_stopped_and_says_how_to_continue(tmp_path):
    slow = [*TINY, "data.n_train=4000", "trainer.max_epochs=100", "logger=csv", "hydra.run.dir=run"]
    epoch = 4000 // 32  # steps
    command = [sys.executable, "-m", "headlab.cli.train", *slow]
    pipes = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    process = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), **pipes)
    deadline = time.time() + 600  # seconds on an idle 2-core CPU; minutes beside other work
    while _last_logged_step(tmp_path / "run" / "metrics.csv") <= epoch and time.time() < deadline:
        time.sleep(0.1)  # until training is seen past the first validation, however loaded the machine
    seen = _last_logged_step(tmp_path / "run" / "metrics.csv")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGINT and "Traceback" not in stderr
    assert "headlab-train: stopping at the next step (Ctrl-C again to stop at once)" in stderr
    assert f"headlab-train: interrupted: continue it with: headlab-train resume={tmp_path / 'run'}" in stderr
    import torch

    step = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert step >= seen > epoch  # saved where training stopped, in the second epoch or later, not at the validation
    record = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (record["status"], record["error"]) == ("interrupted", "stopped by Ctrl-C")


def test_resuming_a_completed_run_says_what_to_do_instead(tmp_path):
    done = train_here(*TINY, "trainer.max_epochs=1", "logger=csv", "hydra.run.dir=run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    again = train_here("resume=run", cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.strip() == (
        "headlab-train: invalid config: resume='run' is invalid: expected an incomplete run: it completed, its "
        "records are final (headlab-eval run evaluates a checkpoint of it again; a new run needs a new directory)"
    )


def test_packs_side_by_side_say_each_packs_progress_with_its_members_spread(run_process, tmp_path):
    """Two packs at once share the console: each says where it is, the time left, and at each validation its
    members' metrics as a mean and a range, in lines named by the pack (no bars to overwrite each other)."""
    tiny = [o for o in TINY if not o.startswith("callbacks.progress_bar")]
    done = run_process(
        "-m", "hydra/launcher=packed", "hydra.launcher.n_jobs=2", "model.attention.n_heads=1,2", "seed=0,1,2", *tiny,
        "callbacks.progress_bar.every_s=0.05", "logger=csv", "hydra.sweep.dir=sweep",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (done.stdout + done.stderr).splitlines()
    for pack, jobs in (("sweep-pack0", "012"), ("sweep-pack1", "345")):
        said = [line.split(" - ", 1)[1] for line in lines if f" - pack {pack}: epoch " in line]
        assert any(" batch " in line and " left: train/loss " in line and "over 3)" in line for line in said), said
        validated = [line for line in said if "validated: val/acc " in line]
        assert len(validated) == 2 and validated[-1].startswith(f"pack {pack}: epoch 2/2 validated: val/acc ")
        accs = [json.loads((tmp_path / "sweep" / j / "results.json").read_text())["metrics"]["val/acc"] for j in jobs]
        spread = f"val/acc {sum(accs) / 3:.4f} ({min(accs):.4f}-{max(accs):.4f} over 3)"
        assert spread in validated[-1], (spread, validated[-1])
    assert "it/s" not in done.stdout + done.stderr and "━" not in done.stdout + done.stderr
    ended = [line.split("] ", 1)[1] for line in lines if "packs ended" in line]
    took = r"\d+ (s|min)"  # headlab.printing.duration
    assert re.fullmatch(rf"packed launcher: 2 of 2 packs ended; 6 of the 6 jobs to train completed; they took {took} "
                        rf"\(estimated {took}\)", ended[-1]), ended  # fmt: skip
    assert re.fullmatch(rf"packed launcher: 1 of 2 packs ended; 3 of the 6 jobs to train completed; about {took} "
                        "to go at this pace", ended[0]), ended  # fmt: skip
    first = next(line.split("] ", 1)[1] for line in lines if "jobs to train in" in line)
    assert re.fullmatch(rf"packed launcher: 6 jobs to train in 2 pack\(s\) of at most 64, 2 at a time, about {took} "
                        r"here \(1 of its 2 shapes timed, the rest priced alike: timing each would cost more than a "
                        r"tenth of the sweep\)", first), first  # fmt: skip
