"""hydra/launcher=slurm: each job of a sweep as a SLURM job (submitit), run in the job as hydra-submitit-launcher
runs it, with what headlab adds around the submission (headlab.launch.slurm): SLURM's refusals in one line, a wait
that notices a job that ended without a result (scancel, a node failure) and records it, and the sweep summary in
every case."""

import logging
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher

log = logging.getLogger("headlab")


class SlurmLauncher(SubmititSlurmLauncher):
    def __call__(self, *arguments) -> JobReturn:
        """A job, in SLURM: run as hydra-submitit-launcher runs it, with a requeue that survives its SIGTERM, after
        the run stopped at a step where it saved (when SLURM warned it of its time limit)."""
        from headlab.launch import runtime, slurm

        runtime.configure()  # the resolvers, in the SLURM job's process
        slurm.requeue_survives_its_sigterm()
        requeue_if_warned = slurm.stop_when_warned()
        try:
            return super().__call__(*arguments)
        finally:  # the run stopped (its SIGTERM ends it with an exit): requeued now, if SLURM warned it
            requeue_if_warned()

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from headlab.launch import slurm

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        numbers = [initial_job_idx + i for i in range(len(job_overrides))]
        for idx, overrides in zip(numbers, job_overrides, strict=True):
            log.info("\t#%d : %s", idx, " ".join(filter_overrides(overrides)))
        state = Singleton.get_state()
        arguments = [
            (list(o), "hydra.sweep.dir", idx, f"job_id_for_{idx}", state)
            for idx, o in zip(numbers, job_overrides, strict=True)
        ]
        jobs = slurm.submit(self.params["submitit_folder"], self.params, self, *zip(*arguments, strict=True))
        log.info(
            "submitted %d SLURM job(s) %s; waiting for them (squeue shows them)",
            len(jobs),
            jobs[0].job_id.split("_")[0],
        )

        def ended(k: int, state: str) -> None:
            slurm.record_ended(sweep_dir / str(numbers[k]), jobs[k].job_id, state)

        have = slurm.wait(jobs, ended)
        nan = float("nan")
        return [
            job.results()[0] if ok else JobReturn(_return_value=nan, status=JobStatus.COMPLETED)
            for job, ok in zip(jobs, have, strict=True)
        ]
