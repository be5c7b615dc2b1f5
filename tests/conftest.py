import atexit
import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")  # tests never reach W&B's servers (CI sets this too)
os.environ["HEADLAB_NEIGHBOURS"] = "ignore"  # a sweep training beside the suite changes no run's output in it
if "HEADLAB_CACHE" not in os.environ:  # the suite prepares data in a cache of its own (xdist's workers inherit it)
    os.environ["HEADLAB_CACHE"] = tempfile.mkdtemp(prefix="headlab-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["HEADLAB_CACHE"], True)

from headlab.launch import runtime  # noqa: E402
from hydra_plugins.headlab_launcher import register  # noqa: E402

register()  # configs composed in a test compose as in the CLI: headlab's resolvers and launchers


def pytest_configure(config):
    """Under pytest-xdist (`make test`), worker k of n runs on its own share of the usable cores, and so does every
    run it starts (affinity is inherited; headlab gives torch the process's usable cores): n workers' runs do not
    each start a thread per core of the machine and fight over them."""
    worker = getattr(config, "workerinput", None)  # set in xdist's workers only (not in pytest run by a test)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker and 1 < worker["workercount"] <= len(cores):
        k = int(worker["workerid"].removeprefix("gw")) % worker["workercount"]  # a replaced worker: gw<n + k>
        share = set(cores[k :: worker["workercount"]])
        os.sched_setaffinity(0, share)
        import torch

        torch.set_num_threads(len(share))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """The test modules import torch, Lightning and the rest as a headlab process imports them (runtime.heavy_imports):
    the garbage collector's passes during the tests after do not walk their objects again and again."""
    with runtime.heavy_imports():
        return (yield)


def pytest_collection_modifyitems(items):
    """The modules of the slowest tests first (SLURM's, then those with end-to-end runs), each module's tests kept
    together (their module fixtures built once): under pytest-xdist the last tests either worker runs are short, so
    the two end together."""
    modules = {}
    for item in items:
        rank = 0 if item.get_closest_marker("slurm") else 1 if item.get_closest_marker("e2e") else 2
        modules[item.module] = min(rank, modules.get(item.module, 2))
    items.sort(key=lambda item: modules[item.module])  # stable: each module's own order


TESTS = Path(__file__).parent  # helpers (faults.py, the Triton runners) and fixtures/ live here
ROOT = TESTS.parent  # the repository
NO_FIGURES = "callbacks.attention.figures_every_n_val_epochs=0"  # drawing them takes most of a tiny run's time
SMALL_ANALYSIS = [  # the head analysis over two batches of each split, its ablations and patching on one (20 and 4
    "callbacks.attention.analysis_batches=2",  # by default): what the tests of small runs need of it
    "callbacks.attention.causal_batches=1",
]
TINY = [  # a run of a second: small data, two short epochs, no figures, a small head analysis
    "data.n_train=256",
    "data.n_val=64",
    "data.n_test=64",
    "data.batch_size=32",
    "model.d_model=16",
    "trainer.max_epochs=2",
    "callbacks.progress_bar=null",
    NO_FIGURES,
    *SMALL_ANALYSIS,
]
# the packed launcher one pack at a time (n_jobs auto splits a pack to fill the cores): a pack of several members,
# whatever the machine's cores, in the launcher's own process (test_packed.py tests the split)
PACKED = ("hydra/launcher=packed", "hydra.launcher.n_jobs=1")


def launcher_overrides(name: str) -> tuple[str, ...]:
    """hydra/launcher=NAME as the tests give it: packed as PACKED."""
    return PACKED if name == "packed" else (f"hydra/launcher={name}",)


DRAWN = [o for o in TINY if o != NO_FIGURES]  # TINY with its figures drawn as shipped (W&B, TensorBoard)


FATAL = ("terminate called", "what():", "Fatal Python error", "Segmentation fault")  # a process's abnormal end


def said(stderr: str, tail: int = 3000) -> str:
    """A failed command's stderr for an assertion's message: first the lines that say how one of its processes ended
    abnormally (a DDP rank's C++ abort, which the job process's traceback pushes out of the tail), then the tail."""
    fatal = [line for line in stderr.splitlines() if line.lstrip().startswith(FATAL)]
    return "\n".join([*fatal[:10], "[...]", stderr[-tail:]]) if fatal else stderr[-tail:]


def cli_env() -> dict:
    """This process's environment, without HYDRA_FULL_ERROR (which would turn one-line errors into tracebacks)."""
    return {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "HEADLAB_TRACEBACKS")}


def headlab_train(*overrides: str, cwd: Path, timeout: float = 300, env: dict | None = None):
    """The real CLI, `python -m headlab.cli.train`, in a subprocess with stdin closed; env: cli_env() by default."""
    env = cli_env() if env is None else env
    return subprocess.run(
        [sys.executable, "-m", "headlab.cli.train", *overrides],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_here(*overrides: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """What headlab_train runs (headlab.cli.train's cli) in this process: cli_here("train", ...)."""
    return cli_here("train", *overrides, cwd=cwd, env=env)


def cli_here(name: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """headlab-<name> (its console script's function) in this process, as `python -m headlab.cli.<name>` would run
    it but without an interpreter's start-up (5 s of importing torch and Lightning); env: cli_env() by default.
    What the CLI sets in its process is put back afterwards (_process_state_kept). For the runs whose process is
    not the point: not signals, kills, DDP ranks, import times or a package installed for the run."""
    import importlib

    entry = {"train": "cli"}.get(name, "main")  # pyproject's [project.scripts]
    function = getattr(importlib.import_module(f"headlab.cli.{name}"), entry)
    env = cli_env() if env is None else env
    stdout, stderr = io.StringIO(), io.StringIO()
    with _process_state_kept(cwd), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        sys.argv = [f"headlab-{name}", *args]
        os.environ.clear()
        os.environ.update(env)
        try:
            function()
            code = 0
        except SystemExit as stop:  # as the interpreter ends: None is 0, a message goes to stderr with 1
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
    command = [sys.executable, "-m", f"headlab.cli.{name}", *args]  # as a process would run it
    return subprocess.CompletedProcess(command, code, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def _process_state_kept(cwd: Path):
    """Environment, argv, working directory, signal handlers, warnings, logging, torch's threads, random states and
    determinism, Hydra's global state and the CLI's once-a-process state (what it said, the W&B servers it asked,
    its run directories' locks), as they were."""
    import random

    import numpy as np
    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from headlab.launch import job as job_
    from headlab.launch import rundir
    from headlab.model import dispatch
    from headlab.training import cores
    from headlab.training import loggers as loggers_

    environ, argv, here = dict(os.environ), list(sys.argv), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    known = {name: lg for name, lg in logging.Logger.manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    loggers = {name: (lg.level, list(lg.handlers), lg.disabled, lg.propagate) for name, lg in known.items()}
    root = (logging.root.level, list(logging.root.handlers))
    threads, threaded = torch.get_num_threads(), cores.threaded
    randomness = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    determinism = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    precision = torch.get_float32_matmul_precision()
    os.chdir(cwd)
    with warnings.catch_warnings():
        try:
            yield
        finally:
            logging.captureWarnings(False)  # the CLI routes warnings to its log; the next run routes them again
            os.chdir(here)
            sys.argv = argv
            os.environ.clear()
            os.environ.update(environ)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for handler in set(logging.root.handlers) - set(root[1]):
                handler.close()
            logging.root.setLevel(root[0])
            logging.root.handlers[:] = root[1]
            for name, (level, kept, disabled, propagate) in loggers.items():
                lg = logging.getLogger(name)
                lg.setLevel(level)
                lg.handlers[:] = kept
                lg.disabled, lg.propagate = disabled, propagate
            torch.set_num_threads(threads)
            cores.threaded = threaded
            random.setstate(randomness[0])
            np.random.set_state(randomness[1])
            torch.set_rng_state(randomness[2])
            torch.use_deterministic_algorithms(determinism[0], warn_only=determinism[1])
            torch.set_float32_matmul_precision(precision)
            GlobalHydra.instance().clear()
            HydraConfig.instance().cfg = None
            job_._began, job_._ctrl_c = False, False
            job_._said.clear()
            loggers_._said.clear()
            loggers_._server_failed.clear()
            loggers_._answers.cache_clear()
            dispatch.triton_kernels.cache_clear()  # it reads HEADLAB_TRITON
            for held in list(rundir._held):  # the run directories' locks, which a process holds until it ends
                rundir.release(held)


def as_interrupted(run: Path) -> Path:
    """Mark a completed run as one that stopped before its end (resume= refuses a completed run)."""
    record = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps({**record, "status": "interrupted"}, indent=2))
    return run


@pytest.fixture
def run_cli(tmp_path):
    """The CLI's runs in tmp_path, in the test process (train_here); headlab_train where the process is the point."""
    return lambda *overrides: train_here(*overrides, cwd=tmp_path)


@pytest.fixture
def run_process(tmp_path):
    """The CLI's runs in tmp_path, each a process of its own (headlab_train): for DDP's ranks, signals, kills."""
    return lambda *overrides, timeout=300: headlab_train(*overrides, cwd=tmp_path, timeout=timeout)


def session_processes(session: int) -> list[int]:
    """The processes still alive in a session (a command started with start_new_session=True, and its children)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and fields[0] != "Z":  # after the name: state, ppid, pgrp, session
                alive.append(int(stat.parent.name))
    return alive


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path):
    """Headless Debian Chromium driven by ChromeDriver (selenium); skips where neither is installed."""
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium and chromedriver installed (Debian packages chromium, chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        f"--user-data-dir={tmp_path}/profile",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs (skipped where this process cannot mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)
