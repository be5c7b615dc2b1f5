"""Which jobs of a sweep train together, decided once for every launcher (local packs, packs as SLURM jobs) and for
the dry run that prices them: jobs whose configurations differ only in PER_MEMBER keys (and in where they write)
share a pack, at most max_pack a pack, split further where fewer packs than train at once would leave cores idle
(at_once), and a pack knows the memory it takes."""

import itertools
import math
from dataclasses import dataclass

from hydra.core.utils import JobReturn

from headlab.conventions import PATH_SUFFIXES, is_launch_key
from headlab.launch.job import Job
from headlab.training import optim
from headlab.training.cores import usable_cores

# what a pack's members may differ in: their seeds, and the AdamW settings the vectorized optimizer takes per member
PER_MEMBER = ("seed", "data.seed", "callbacks.attention.seed", *(f"optim.{key}" for key in optim.PER_MEMBER))
PER_JOB = ("logger.wandb.name", "logger.wandb.group")  # set for each job from Hydra's job information
PROCESS_GB = 2  # what a pack's process takes beside its members (torch, Lightning, data)


def pack_key(flat_config: dict) -> tuple:
    """Everything that must be equal within a pack: the configuration without its per-member keys and paths."""
    skip = set(PER_MEMBER) | set(PER_JOB)
    return tuple(
        sorted(
            (k, repr(v))
            for k, v in flat_config.items()
            if k not in skip and not is_launch_key(k) and not k.endswith(PATH_SUFFIXES)
        )
    )


@dataclass
class Pack:
    """Jobs that train as one vectorized model: its id, its jobs (opened and checked, each with Hydra's return),
    and the memory it takes."""

    id: str
    jobs: list[Job]
    returns: list[JobReturn]

    def members(self) -> list:
        """What train_members takes: each job's Member (Job.member)."""
        return [job.member() for job in self.jobs]

    def mem_gb(self) -> int:
        return pack_gb(self.jobs[0].cfg, len(self.jobs))


def pack_gb(cfg, members: int) -> int:
    """The memory (GB) a pack's process needs: its members' estimate (headlab.config.memory), plus a process."""
    from headlab.config import memory

    return math.ceil(members * memory.model_bytes(cfg, memory.ConfigSizes(cfg.data)) / 2**30 + PROCESS_GB)


def max_pack(config) -> int:
    """A packed sweep's hydra.launcher.max_pack, checked: members a pack at most."""
    from headlab.config.check import POSITIVE
    from headlab.errors import fail

    if not POSITIVE[0](most := config.hydra.launcher.max_pack):
        fail("hydra.launcher.max_pack", most, POSITIVE[1])
    return most


def at_once(config) -> int:
    """The packs a packed sweep trains at once here (its config's hydra.launcher.n_jobs): `auto` is one a usable core
    on a CPU, each pack in a process of its own with one torch thread (a small model's step gains more from a core
    of its own than from a second thread: BENCHMARKS.md), and one on a GPU; packs submitted to SLURM train where
    SLURM puts them (1: none split for the cores here)."""
    from headlab.config.check import POSITIVE
    from headlab.errors import fail

    n_jobs = config.hydra.launcher.n_jobs
    if n_jobs != "auto" and not POSITIVE[0](n_jobs):
        fail("hydra.launcher.n_jobs", n_jobs, f"{POSITIVE[1]} or auto")
    if config.hydra.launcher.submit != "local":
        return 1
    if n_jobs != "auto":
        return n_jobs
    return usable_cores() if on_cpu(config) else 1


def trained_at_once(config, packs_gb: list[int], n_jobs: int) -> int:
    """How many of a sweep's packs (pack_gb each) train at once: n_jobs (at_once's, the packs made for it), no more
    than there are packs and, on a CPU, than the largest of them fit together in memory.SHARE of the host's free
    memory (at least one: a pack too large alone is split where it trains)."""
    k = max(1, min(n_jobs, len(packs_gb)))
    if k == 1 or not on_cpu(config):
        return k
    from headlab.config.memory import SHARE, free_bytes

    largest = sorted(packs_gb, reverse=True)
    while k > 1 and sum(largest[:k]) * 2**30 > SHARE * free_bytes("cpu"):
        k -= 1
    return k


def on_cpu(cfg) -> bool:
    """Whether runs of this config train on this machine's CPU (trainer.accelerator cpu, or auto without a GPU)."""
    accelerator = str(cfg.trainer.get("accelerator"))
    if accelerator != "auto":
        return accelerator == "cpu"
    import torch

    return not torch.cuda.device_count()


def split(groups: list[list], max_pack: int, at_least: int = 1) -> list[list]:
    """Groups of jobs (each sharing a pack_key) as packs: each group in as few packs of at most max_pack as it takes,
    of sizes as equal as they can be (the first the larger), and, while there are fewer packs than at_least (the packs
    trained at once), the group whose packs are the largest split into one more, down to packs of one."""
    parts = [math.ceil(len(group) / max_pack) for group in groups]
    while sum(parts) < at_least:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]) / parts[i], default=None)
        if largest is None or len(groups[largest]) <= parts[largest]:
            break
        parts[largest] += 1
    packs = []
    for group, k in zip(groups, parts, strict=True):
        size, more = divmod(len(group), k)
        starts = [i * size + min(i, more) for i in range(k + 1)]
        packs += [group[a:b] for a, b in itertools.pairwise(starts)]
    return packs


def plan(ready: list[tuple[JobReturn, Job]], max_pack: int, name: str, at_least: int = 1) -> list[Pack]:
    """The packs of a sweep, for every launcher: its jobs grouped by pack_key and split (split: at most max_pack a
    pack, at least at_least packs where the jobs allow), named NAME-pack<k>. Where a pack trains, members that differ
    in shape or in the step they continue from train as parts of it (headlab.training.pack.train), and a part larger
    than the device's memory is split."""
    groups: dict[tuple, list] = {}
    for ret, job in ready:
        groups.setdefault(pack_key(job.record["config"]), []).append((ret, job))
    chunks = split(list(groups.values()), max_pack, at_least)
    return [
        Pack(f"{name}-pack{k}", [job for _, job in chunk], [ret for ret, _ in chunk]) for k, chunk in enumerate(chunks)
    ]
