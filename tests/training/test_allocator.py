"""headlab's runs keep freed memory for the next step (headlab.training.allocator): a training step does not fault
the pages of its gradients and activations in again, step after step."""

import resource
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")

FAULTS = """
import resource, torch
from headlab.model.encoder import Encoder
from headlab.training import allocator
print(allocator.keep_freed_memory())
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


def faults(keep: str) -> tuple[bool, float]:
    """Whether keep_freed_memory took effect, and the median page faults of 20 training steps after the first
    (which faults its pages in however malloc is set; the heap may still grow at an odd later step as its free
    blocks settle: the median is the steady state)."""
    env = {"HEADLAB_KEEP_FREED": keep, "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, check=True)
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
