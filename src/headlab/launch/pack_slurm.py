"""Packs as SLURM jobs (hydra/launcher=packed_slurm): each pack one task of a SLURM job array (submitit). The job
trains its pack and closes its members' records itself, so that the submitting process may end (or crash) while
the packs train; requeued, by preemption or a time limit, a pack's job continues every member from its own
last.ckpt. The submitting process waits for the array and records a pack that ended without a result (scancel).
"""

import logging
import sys

from headlab.errors import ConfigError
from headlab.launch import console, rundir, slurm
from headlab.launch.job import Job
from headlab.launch.plan import Pack
from headlab.launch.workers import LOG_FORMAT

log = logging.getLogger("headlab")


class PackJob:
    """What a pack's SLURM job runs: submitit calls it in the job, and again after a requeue (checkpoint)."""

    def __call__(self, pack_id: str, jobs: list[Job]) -> list[float]:
        from headlab.launch import runtime

        runtime.configure()
        console.to_stderr(LOG_FORMAT)
        slurm.requeue_survives_its_sigterm()
        requeue_if_warned = slurm.stop_when_warned()
        with runtime.heavy_imports():
            import torch

            from headlab.training.cores import usable_cores
            from headlab.training.pack.train import train_members

        torch.set_num_threads(usable_cores())
        for job in jobs:
            rundir.lock(job.run_dir)
            job.owned = True
            if not job.cfg.get("resume") and rundir.continues(job.run_dir, job.record["config"]):
                log.info("continuing %s from its checkpoints/last.ckpt", job.run_dir)
                job.cfg.resume, job.continued = str(job.run_dir), True
            job.start(pack_id)
        try:
            results = train_members([job.member() for job in jobs], pack_id, False)
        except BaseException as interrupt:  # scancel, or a requeue: each member is recorded, then the job ends
            for job in jobs:
                job.close(error=interrupt, stop=False)
            requeue_if_warned()  # warned of its time limit: requeued now that every member saved its step
            raise
        return [
            job.close(error=r, stop=False) if isinstance(r, BaseException) else job.close(r)
            for job, r in zip(jobs, results, strict=True)
        ]

    def checkpoint(self, *args):
        """Requeued as it was submitted: the members' last.ckpt files hold where they were."""
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args)


def run_on_slurm(packs: list[Pack], params: dict) -> None:
    """Submit each pack (its jobs opened and checked) as a task of one SLURM job array and wait for them."""
    params = dict(params)
    if params.get("mem_gb") is None:
        params["mem_gb"] = max(pack.mem_gb() for pack in packs)
    for pack in packs:
        for job in pack.jobs:
            rundir.release(job.run_dir)  # the pack's SLURM job takes the lock
    ids, members = [pack.id for pack in packs], [pack.jobs for pack in packs]
    folder = params["submitit_folder"]
    try:
        submitted = slurm.submit(folder, params, PackJob(), ids, members, prefix="hydra.launcher.slurm")
    except ConfigError as refused:  # nothing was submitted: every job records why, said once
        for job in (job for pack in packs for job in pack.jobs):
            rundir.lock(job.run_dir)
            job.close(error=refused)
        sys.exit(2)
    log.info(
        "submitted %d pack(s) as SLURM job array %s (%s GB each); waiting for them (squeue shows them)",
        len(submitted), submitted[0].job_id.split("_")[0], params["mem_gb"],
    )  # fmt: skip

    def ended(k: int, state: str) -> None:
        for job in packs[k].jobs:
            slurm.record_ended(job.run_dir, submitted[k].job_id, state)

    slurm.wait(submitted, ended)
