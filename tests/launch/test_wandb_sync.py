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


def run_log(folder: Path, display_name: str) -> Path:
    """An offline run folder whose run-x.wandb holds one run record named display_name, framed as W&B frames it."""
    import struct

    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    record.run.display_name = display_name
    data = record.SerializeToString()
    folder.mkdir(parents=True)
    (folder / "run-x.wandb").write_bytes(
        struct.pack("<4sHB", b":W&B", 0xBEE1, 0) + struct.pack("<IHB", 0, len(data), 1) + data
    )
    return folder


def test_a_link_out_of_a_received_sweep_is_never_listed_nor_uploaded(sweep, tmp_path, capsys):
    """recv/0/wandb/offline-run-X -> a private run, a whole wandb/ linked, a run folder with a link inside: left
    out and named, never 'to upload', never shown."""
    private = next(sweep.glob("0/wandb/offline-run-*"))
    received = tmp_path / "recv"
    (received / "0" / "wandb").mkdir(parents=True)
    (received / "0" / "wandb" / "offline-run-X").symlink_to(private)
    (received / "1").mkdir()
    (received / "1" / "wandb").symlink_to(private.parent)
    inside = run_log(received / "2" / "wandb" / "offline-run-Y", "inside")
    (inside / "files").mkdir()
    (inside / "files" / "secret").symlink_to(private / next(private.glob("run-*.wandb")).name)
    main([str(received), "--dry-run"])
    said = capsys.readouterr()
    assert "headlab-sync: 0 offline run(s): 0 uploaded before, 0 to upload" in said.out
    assert f"headlab-sync: {received / '0' / 'wandb' / 'offline-run-X'}: left out: a link (to {private})" in said.err
    assert f"headlab-sync: {received / '1' / 'wandb'}: left out: a link" in said.err
    assert f"headlab-sync: {inside}: left out: files/secret is a link" in said.err
    main([str(received), "--show"])
    assert capsys.readouterr().out.strip() == ""


def test_show_reads_every_run_it_can_and_says_why_not_of_the_others(tmp_path, capsys):
    """A pipe (never read: it would block), a link to /dev/zero (never ends), an empty log, a corrupt one, two
    logs: one line each on why, in no time; the readable run is shown, its name escaped for the terminal (no
    title set, no screen cleared)."""
    import os

    runs = tmp_path / "recv" / "0" / "wandb"
    run_log(runs / "offline-run-a", "\x1b]0;owned\x07\x1b[2Jfine\nheadlab-sync: forged")
    (runs / "offline-run-b").mkdir()
    os.mkfifo(runs / "offline-run-b" / "run-b.wandb")
    (runs / "offline-run-c").mkdir()
    (runs / "offline-run-c" / "run-c.wandb").write_bytes(b"")
    (runs / "offline-run-d").mkdir()
    (runs / "offline-run-d" / "run-d.wandb").write_bytes(
        b":W&B\xe1\xbe\x00" + b"\x00\x00\x00\x00\x20\x00\x01" + b"\xff" * 32
    )
    (runs / "offline-run-e").mkdir()
    for name in ("run-1.wandb", "run-2.wandb"):
        (runs / "offline-run-e" / name).write_bytes(b"")
    (runs / "offline-run-f").mkdir()
    (runs / "offline-run-f" / "run-f.wandb").symlink_to("/dev/zero")  # never ends
    main([str(tmp_path / "recv"), "--show"])
    said = capsys.readouterr()
    lines = said.out.splitlines()
    assert "\x1b" not in said.out + said.err and len(lines) == 4, said  # the pipe's run is left out, and named
    assert (
        lines[0] == f"{runs / 'offline-run-a'}: \\x1b]0;owned\\x07\\x1b[2Jfine\\nheadlab-sync: forged: 0 config keys, "
        "0 logged steps"
    )
    assert f"{runs / 'offline-run-b'}: left out: run-b.wandb is a pipe" in said.err
    assert f"{runs / 'offline-run-f'}: left out: run-f.wandb is a link" in said.err
    assert lines[1].startswith(f"{runs / 'offline-run-c'}: cannot be read (ValueError: ")
    assert lines[2].startswith(f"{runs / 'offline-run-d'}: cannot be read (")
    assert lines[3] == f"{runs / 'offline-run-e'}: cannot be read (no run-*.wandb, or several)"


@pytest.mark.parametrize("what", ["missing", "file"])
def test_a_path_that_is_no_directory_is_one_line(tmp_path, capsys, what):
    path = tmp_path / what
    if what == "file":
        path.write_text("")
    with pytest.raises(SystemExit) as stopped:
        main([str(path)])
    reason = "no such directory" if what == "missing" else "not a directory"
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == f"headlab-sync: {path}: {reason}: expected a sweep or run directory"
