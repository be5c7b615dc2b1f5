"""Which jobs of a sweep train together, decided once for every launcher (local packs, packs as SLURM jobs): jobs
whose configurations differ only in PER_MEMBER keys (and in where they write) share a pack, at most max_pack a
pack, and a pack knows the memory it takes."""

import math
from dataclasses import dataclass

from hydra.core.utils import JobReturn

from headlab.conventions import PATH_SUFFIXES, is_launch_key
from headlab.launch.job import Job
from headlab.training import optim

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
        """The memory the pack's process needs: its members' estimate (headlab.config.memory), plus a process."""
        from headlab.config import memory

        cfg = self.jobs[0].cfg
        return math.ceil(len(self.jobs) * memory.model_bytes(cfg, memory.ConfigSizes(cfg.data)) / 2**30 + PROCESS_GB)


def plan(ready: list[tuple[JobReturn, Job]], max_pack: int, name: str) -> list[Pack]:
    """The packs of a sweep, for every launcher: its jobs grouped by pack_key, at most max_pack a pack, named
    NAME-pack<k>. Where a pack trains, members that differ in shape or in the step they continue from train as
    parts of it (headlab.training.pack.train), and a part larger than the device's memory is split."""
    groups: dict[tuple, list] = {}
    for ret, job in ready:
        groups.setdefault(pack_key(job.record["config"]), []).append((ret, job))
    chunks = [group[i : i + max_pack] for group in groups.values() for i in range(0, len(group), max_pack)]
    return [
        Pack(f"{name}-pack{k}", [job for _, job in chunk], [ret for ret, _ in chunk]) for k, chunk in enumerate(chunks)
    ]
