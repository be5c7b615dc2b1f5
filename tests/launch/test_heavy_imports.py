"""torch, Lightning and headlab's training imported without the garbage collector's passes over them: held off
while they import, their objects frozen out of later passes (runtime.heavy_imports), in a run's process and in
every pack worker the forkserver forks; and without scipy's signal processing and statistics, which a run does not
use (torchmetrics imports scipy.signal as it imports: runtime._torchmetrics_without_scipy_signal)."""

import json
import subprocess
import sys

import pytest

from conftest import TESTS, TINY, cli_env, headlab_train

FRESH = """
import gc, sys
from headlab.launch import runtime

with runtime.heavy_imports():
    during = gc.isenabled()
    import headlab.training.pack.train
frozen = gc.get_freeze_count()
gc.disable()
with runtime.heavy_imports():
    import headlab.training.pack.train  # imported already: nothing new to freeze
print(during, gc.isenabled(), frozen, gc.get_freeze_count() - frozen, "lightning.pytorch" in sys.modules)
print(sorted(m for m in ("scipy.signal", "scipy.stats") if m in sys.modules) or "no-scipy")
import scipy.signal  # wherever it is asked for afterwards: the real one
window = scipy.signal.windows.hamming(3)
print(bool(abs(window - [0.08, 1.0, 0.08]).max() < 1e-12), "placeholder" in (scipy.signal.__doc__ or ""))
"""

WORKER = """
import gc, multiprocessing
from headlab.launch import workers

context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(workers.PRELOAD)
with context.Pool(1) as pool:
    print(pool.apply(gc.get_freeze_count), gc.get_freeze_count())
    print(pool.apply(eval, ("sorted({'scipy.signal', 'scipy.stats'} & set(__import__('sys').modules))",)))
"""


def fresh(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_the_heavy_imports_run_without_the_collector_and_leave_their_objects_frozen_and_it_as_it_was():
    during, after, frozen, again, imported, scipy, real, placeholder = fresh(FRESH)
    assert (during, after, imported) == ("False", "False", "True")  # held off, then as it was (here: disabled)
    assert int(frozen) > 100_000 and int(again) == 0  # torch's and Lightning's objects; none the second time
    assert (scipy, real, placeholder) == ("no-scipy", "True", "False")


def test_a_pack_worker_starts_with_torch_and_lightning_imported_and_frozen_by_its_forkserver_without_scipy():
    in_worker, in_launcher, scipy = fresh(WORKER)
    assert int(in_worker) > 100_000 and int(in_launcher) == 0  # imported and frozen in the forkserver, not here
    assert scipy == "[]"  # the worker's modules: scipy.signal and scipy.stats not among them


@pytest.mark.e2e
def test_a_run_trains_with_torch_and_lightning_frozen_and_the_collector_on_and_ends_without_scipy(tmp_path):
    """headlab-train's process, as training starts and as it ends (a callback of the run's own looks)."""
    seen = tmp_path / "collector"
    collector = ["+callbacks.gc._target_=own_callback.Collector", f"+callbacks.gc.out={seen}"]
    env = cli_env() | {"PYTHONPATH": str(TESTS)}  # own_callback.py importable by the CLI
    done = headlab_train(*TINY, "logger=csv", *collector, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    state = json.loads((seen / "rank0.json").read_text())
    assert state["frozen"] > 100_000 and state["enabled"] is True
    ended = json.loads((seen / "rank0_end.json").read_text())  # its heads analysed, tested, recorded
    assert ended["scipy"] == [], ended
