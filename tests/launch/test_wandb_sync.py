"""headlab-sync: a sweep's offline W&B runs found below its directories, uploaded by W&B's own `wandb sync` each,
several at a time; runs W&B marked synced are skipped, and one that failed says why and waits for the next call."""

import http.server
import threading
from pathlib import Path

import pytest

from conftest import TINY, train_here
from headlab.cli.sync import main

QUICK = [*TINY, "trainer.max_epochs=1", "callbacks.attention=null", "logger=wandb"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A sweep of two jobs logged to W&B offline (no credentials here)."""
    where = tmp_path_factory.mktemp("sync")
    done = train_here("-m", *QUICK, "seed=0,1", "hydra.sweep.dir=sweep", cwd=where)
    assert done.returncode == 0, done.stderr[-2000:]
    return where / "sweep"


class Refusing(http.server.BaseHTTPRequestHandler):
    """A W&B server that answers every request, and refuses it (an invalid API key)."""

    def refuse(self):
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"errors": [{"message": "invalid api key"}]}')

    do_GET = do_POST = do_HEAD = do_PUT = refuse

    def log_message(self, *args):
        pass


def test_the_offline_runs_below_a_sweep_are_listed_and_those_synced_before_skipped(sweep, tmp_path, capsys):
    main([str(sweep), "--dry-run"])
    said = capsys.readouterr().out
    runs = sorted(sweep.glob("*/wandb/offline-run-*"))
    assert len(runs) == 2 and "headlab-sync: 2 offline run(s): 0 uploaded before, 2 to upload" in said
    assert all(str(run) in said for run in runs)
    copy = tmp_path / "copy"
    for run in runs:  # the first one as W&B leaves a run it uploaded
        target = copy / run.relative_to(sweep)
        target.mkdir(parents=True)
        if run == runs[0]:
            (target / f"run-{run.name.rsplit('-', 1)[1]}.wandb.synced").touch()
    main([str(copy), "--dry-run"])
    assert "2 offline run(s): 1 uploaded before, 1 to upload" in capsys.readouterr().out


def test_without_credentials_nothing_is_uploaded_in_one_line(sweep, monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    with pytest.raises(SystemExit) as stopped:
        main([str(sweep)])
    assert str(stopped.value.code) == (
        "headlab-sync: nothing uploaded: no W&B credentials (run `wandb login` or set WANDB_API_KEY); rerun once "
        "W&B answers"
    )
    assert not list(sweep.glob("*/wandb/offline-run-*/*.synced"))


def test_a_run_the_server_refuses_says_why_and_waits_for_the_next_call(sweep, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)  # where wandb sync keeps its own logs (./wandb/logs)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        with pytest.raises(SystemExit) as stopped:
            main([str(sweep), "-j", "2"])
    finally:
        server.shutdown()
    said = capsys.readouterr()
    assert stopped.value.code == 1 and "headlab-sync: 0 of 2 uploaded; rerun for the rest" in said.out
    refused = [line for line in said.err.splitlines() if ": not uploaded: " in line]
    assert len(refused) == 2 and all("401" in line and "invalid api key" in line for line in refused)
    assert not list(sweep.glob("*/wandb/offline-run-*/*.synced"))  # both wait for the next call


def test_each_offline_run_is_read_back_without_the_server(sweep, capsys):
    """--show reads each run's own W&B log (no server): its group, the steps logged, the final numbers as its
    results.json has them."""
    import json

    main([str(sweep), "--show"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for job, line in zip("01", lines, strict=True):
        record = json.loads((sweep / job / "results.json").read_text())
        assert line.startswith(str(next((sweep / job / "wandb").glob("offline-run-*"))) + ": ")
        assert "(group sweep)" in line and " logged steps; " in line  # the sweep's group, as W&B got it
        assert (
            f"val/acc_best {record['metrics']['val/acc_best']:.4f}, test/acc {record['metrics']['test/acc']:.4f}"
            in line
        )
