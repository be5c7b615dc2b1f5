"""A real W&B run in offline mode, read back from its files; no prompt and no hang without credentials."""

import csv
import http.server
import json
import os
import socket
import threading
import time

import pytest

from conftest import TINY, cli_here, headlab_train
from headlab.cli import heads
from headlab.launch.wandb_offline import read_run

pytestmark = pytest.mark.e2e


def test_heads_json_holds_statistics_importance_and_pruning(run_cli, tmp_path):
    shipped = "callbacks.attention.analysis_batches=20"  # its default: every training batch of the 8 (TINY's: two)
    result = run_cli(*TINY, shipped, "logger=none", "model.n_layers=2", "hydra.run.dir=run")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "heads.json").read_text())
    assert [(r["layer"], r["head"]) for r in report["rows"]] == [(lay, h) for lay in range(2) for h in range(4)]
    for row in report["rows"]:
        assert 0 <= row["entropy_normalised"] <= 1 + 1e-6 and 0 < row["confidence"] <= 1
    norms = [sum(r["importance"] ** 2 for r in report["rows"] if r["layer"] == lay) for lay in range(2)]
    assert norms == pytest.approx([1.0, 1.0])
    assert report["logging_seconds"] > 0 and report["analysis_seconds"] > 0
    curve = report["pruning_curve"]
    assert [p["heads_pruned"] for p in curve] == list(range(9)) and len(report["similarity"]) == 8
    # ranked on training batches, scored on validation, on the best checkpoint's weights (the ones tested)
    best = json.loads((tmp_path / "run" / "results.json").read_text())["checkpoints"]["best"]
    assert report["checkpoint"] == best and report["analysis_examples"] == {"train": 256, "val": 64}
    assert curve[0]["metric"] == pytest.approx(
        json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]["val/acc_best"]
    )
    baselines = report["pruning_baselines"]
    assert set(baselines) == {"reverse", "random"}
    assert baselines["reverse"][-1]["pruned"] == curve[-1]["pruned"][::-1]
    assert sorted(map(tuple, baselines["random"][-1]["pruned"])) == [(lay, h) for lay in range(2) for h in range(4)]
    assert {b[0]["metric"] for b in baselines.values()} == {curve[0]["metric"]}


def test_multirun_gives_one_wandb_run_per_job_grouped_by_sweep(run_cli, tmp_path):
    result = run_cli("-m", *TINY, "trainer.max_epochs=1", "logger=wandb", "seed=0,1", "hydra.sweep.dir=sweep")
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [read_run(tmp_path / "sweep" / job)["run"] for job in ("0", "1")]
    assert runs[0].run_id != runs[1].run_id
    assert runs[0].run_group == runs[1].run_group == "sweep"
    assert ["seed=0" in runs[0].display_name, "seed=1" in runs[1].display_name] == [True, True]


def test_no_credentials_goes_offline_without_prompting_or_hanging(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)  # no ~/.netrc, no cached login
    started = time.time()
    result = headlab_train(
        *TINY, "trainer.max_epochs=1", "logger=wandb", "hydra.run.dir=run", cwd=tmp_path, env=env, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "W&B logs offline: no W&B credentials" in result.stdout + result.stderr
    assert "wandb sync" in result.stdout + result.stderr
    assert json.loads((tmp_path / "run" / "results.json").read_text())["wandb"]["id"]
    assert time.time() - started < 120


def wandb_env(tmp_path, url: str) -> dict:
    """Credentials for the W&B server at url, and nothing of this machine's W&B settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {
        "HOME": str(tmp_path),
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": url,
        "WANDB_INIT_TIMEOUT": "3",
    }


def test_a_wandb_server_that_does_not_answer_costs_one_probe_per_sweep_and_the_runs_go_on(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))  # accepts connections, never answers
    connections = []
    threading.Thread(target=lambda: [connections.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
    env = wandb_env(tmp_path, f"http://127.0.0.1:{server.getsockname()[1]}")
    result = headlab_train(
        "-m", *TINY, "trainer.max_epochs=1", "seed=0,1", "hydra.sweep.dir=sweep", cwd=tmp_path, env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(connections) == 1  # one probe for the whole sweep; W&B itself never waits on the server
    assert result.stdout.count("does not answer. Upload later with `wandb sync") == 1  # said once for the sweep
    for job in "01":
        record = json.loads((tmp_path / "sweep" / job / "results.json").read_text())
        assert record["status"] == "completed" and record["metrics"]["test/acc"] >= 0
        assert list((tmp_path / "sweep" / job / "wandb").glob(f"offline-run-*-{record['wandb']['id']}"))


class AnswersOnlyProbes(http.server.BaseHTTPRequestHandler):
    """A W&B server that answers HEAD / and never answers W&B's own requests."""

    posts: list[str] = []

    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        if self.path.startswith("/sdk/otel/"):  # W&B's own telemetry, which it probes for at exit: a server without
            self.send_response(404)  # it answers so (a hung probe would cost this test ~20 s of W&B's exit)
            self.end_headers()
            return
        AnswersOnlyProbes.posts.append(self.path)
        time.sleep(120)

    def log_message(self, *args):
        pass


def test_a_wandb_server_that_fails_a_run_is_not_tried_again_by_the_later_runs_of_the_sweep(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AnswersOnlyProbes)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = wandb_env(tmp_path, f"http://127.0.0.1:{server.server_address[1]}")
    result = headlab_train(
        "-m", *TINY, "trainer.max_epochs=1", "seed=0,1", "hydra.sweep.dir=sweep", cwd=tmp_path, env=env, timeout=240
    )
    server.shutdown()
    assert result.returncode == 0, result.stderr[-3000:]
    assert "W&B init failed" in result.stdout and "logging offline instead" in result.stdout
    assert "failed an earlier run of this process" in result.stdout  # the second job went offline at once
    assert AnswersOnlyProbes.posts  # the first job did try the server
    for job in "01":
        assert json.loads((tmp_path / "sweep" / job / "results.json").read_text())["status"] == "completed"


def test_headlab_heads_writes_maps_and_table_for_a_finished_run(run_cli, tmp_path):
    assert run_cli(*TINY, "logger=none", "model.n_layers=2", "hydra.run.dir=run").returncode == 0
    run = tmp_path / "run"
    result = cli_here("heads", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in (run / "heads").iterdir())
    assert written == [
        "ablation.png",  # the run's heads.json has ablations, patching, importance and pruning: their figures too
        "attention_layer_0.png",
        "attention_layer_1.png",
        "importance_map.png",
        "patching.png",
        "pruning_curves.png",
        "similarity.png",
        "statistics.csv",
        "view.html",
    ]
    assert (run / "heads" / "attention_layer_0.png").read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader((run / "heads" / "statistics.csv").open()))
    assert list(rows[0])[:3] == ["layer", "head", "entropy"] and len(rows) == 8
    measured = json.loads((run / "heads.json").read_text())["rows"]  # the same best checkpoint: its importance
    assert [float(r["importance"]) for r in rows] == pytest.approx([r["importance"] for r in measured])
    # the console script's main called directly: its refusals raise SystemExit with the message
    heads.main([str(run), "--checkpoint", "last", "--out", str(tmp_path / "last")])
    assert "importance" not in (tmp_path / "last" / "statistics.csv").read_text()

    with pytest.raises(SystemExit) as refused:  # a one-line message, no traceback
        heads.main([str(run), "--text", "a dog"])
    assert str(refused.value) == (
        "headlab-heads: probe sentences need a text dataset; this task is generated from token ids"
    )
    (run / ".hydra" / "config.yaml").write_text(
        (run / ".hydra" / "config.yaml").read_text().replace("d_model: 16", "d_model: 32")
    )
    with pytest.raises(SystemExit) as mismatch:
        heads.main([str(run)])
    assert "does not fit the run's model config" in str(mismatch.value)
