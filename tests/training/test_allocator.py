"""headlab's runs keep freed memory for the next step (headlab.training.allocator): a training step does not fault
the pages of its gradients and activations in again, step after step."""

import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

KEEP = "from headlab.training import allocator\nprint(allocator.keep_freed_memory())"
DRY_RUN = """
import contextlib, io, sys
from headlab.cli.train import cli
sys.argv = ["headlab-train", *{overrides!r}, "--dry-run"]
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli()
print(True)
"""
FAULTS = """
import resource, torch
from headlab.model.encoder import Encoder
torch.manual_seed(0)
torch.set_num_threads(1)
model = Encoder(vocab_size=65536, n_classes=2, max_len=16, readout="mean", d_model=64, attention={"n_heads": 4})
optimizer = torch.optim.AdamW(model.parameters())
tokens = torch.randint(0, 65536, (32, 16))
for _ in range(21):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(tokens)[0].logsumexp(-1).mean().backward()  # a 16 MiB embedding gradient, freed by zero_grad
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(keep: str, first: str = KEEP, cwd: Path | None = None) -> tuple[bool, float]:
    """Whether what the process did first (first: keep_freed_memory) says it took effect, and the median page
    faults of 20 training steps after it, after their first (which faults its pages in however malloc is set; the
    heap may still grow at an odd later step as its free blocks settle: the median is the steady state)."""
    env = {"HEADLAB_KEEP_FREED": keep, "PATH": "/usr/bin:/bin", "HEADLAB_CACHE": os.environ["HEADLAB_CACHE"]}
    command = [sys.executable, "-c", first + FAULTS]
    out = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    took, _, *steps = out.stdout.split()
    return took == "True", statistics.median(map(int, steps))


def test_training_steps_reuse_their_memory_without_page_faults():
    pages = (16 << 20) // resource.getpagesize()  # of the embedding's gradient alone
    took, kept = faults("1")
    assert took
    assert kept < pages / 10
    took, returned = faults("0")  # glibc's defaults, the control: the count sees the faults (about two of that
    # gradient's pages a step here)
    assert not took
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not (thp.is_file() and "[always]" in thp.read_text()):  # 2 MiB pages would fault 512 times less
        assert returned >= pages


@pytest.mark.e2e  # the real CLI in a process of its own
def test_a_dry_run_times_the_steps_with_malloc_set_as_the_runs_set_it(tmp_path):
    """The dry run (and the packed launcher's estimate, which measures as it does: headlab.launch.cost) times a
    run's and a pack's steps in its own process: with glibc's defaults there, a batched pack's large buffers were
    faulted in again at every step it timed (its way timed 20-25% slower than it then trained, and the choice kept
    for the pack the slower way); after a dry run the process keeps freed memory as a run's does."""
    pages = (16 << 20) // resource.getpagesize()
    dry_run = DRY_RUN.format(overrides=[*TINY, "callbacks.attention=null", "logger=csv"])
    took, kept = faults("1", dry_run, tmp_path)
    assert took and kept < pages / 10
