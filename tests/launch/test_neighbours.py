"""Two headlab-train runs on the same cores contend (each takes every usable core as torch threads): headlab-train
says so when it starts beside another, and stays quiet about its own processes and about runs on other cores."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import headlab_train
from headlab.cli import neighbours

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="reads /proc and CPU affinity (Linux)")

# a process that is a headlab-train to `ps` (its interpreter runs a script of that name): it sleeps, or with
# "child" it first reports what a process it starts finds (as a sweep's worker or a DDP rank would)
FAKE = textwrap.dedent("""
    import subprocess, sys, time
    if sys.argv[1:] == ["child"]:
        check = "from headlab.cli import neighbours; print(neighbours.sharing_cores())"
        print(subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def fake_trainer(tmp_path):
    script = tmp_path / "headlab-train"
    script.write_text(FAKE)
    started = []

    def start(*args: str) -> subprocess.Popen:
        started.append(subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True))
        return started[-1]

    yield start
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def said(monkeypatch):
    """headlab-train says it (the suite sets HEADLAB_NEIGHBOURS=ignore for every other test)."""
    monkeypatch.delenv("HEADLAB_NEIGHBOURS")


def test_a_run_on_the_same_cores_is_found_with_the_cores_it_shares(fake_trainer, said, monkeypatch):
    other = fake_trainer()
    cores = sorted(os.sched_getaffinity(0))
    assert (other.pid, cores) in neighbours.sharing_cores()
    line = neighbours.warning()
    assert f"{other.pid}" in line and "taskset -c" in line
    monkeypatch.setenv("HEADLAB_NEIGHBOURS", "ignore")
    assert neighbours.warning() is None


def test_a_run_on_other_cores_is_not_a_neighbour(fake_trainer):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two usable cores")
    other = fake_trainer()
    os.sched_setaffinity(other.pid, {cores[-1]})
    mine = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, set(cores[:-1]))
        assert other.pid not in [pid for pid, _ in neighbours.sharing_cores()]
    finally:
        os.sched_setaffinity(0, mine)


def test_a_runs_own_processes_are_not_its_neighbours(fake_trainer):
    parent = fake_trainer("child")
    found = parent.stdout.readline()  # what the child of a headlab-train found
    assert str(parent.pid) not in found, found


def test_headlab_train_says_it_starts_beside_another_run(fake_trainer, said, tmp_path):
    other = fake_trainer()
    result = headlab_train("model.attention.n_heads=0", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    pids = re.match(
        r"headlab-train: (another headlab-train|\d+ other headlab-train runs) \(pids? ([\d, ]+)\) ", lines[0]
    )
    assert pids and str(other.pid) in pids[2].split(", ") and "taskset -c" in lines[0], lines
    assert lines[1].startswith("headlab-train: invalid config: model.attention.n_heads=0"), lines


def test_taskset_ranges():
    assert neighbours._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_a_dry_run_beside_another_run_says_its_times_are_measured_beside_it(fake_trainer, said, tmp_path):
    """A busy machine slows the dry run's measured steps as it slows the runs: the estimate is said to hold while
    the other run goes on (on stderr: --dry-run --json keeps stdout one JSON object)."""
    other = fake_trainer()
    result = headlab_train("model.attention.n_heads=0", "--dry-run", "--json", cwd=tmp_path)
    first = result.stderr.splitlines()[0]
    assert str(other.pid) in first and first.endswith("this dry run's times are measured beside it"), first
    assert result.stdout == ""
