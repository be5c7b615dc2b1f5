"""What both SLURM launchers (one run a job, hydra/launcher=slurm; one pack a job, hydra/launcher=packed_slurm) do
around submitit: SLURM's refusals in one line naming the launcher key, a wait that asks SLURM itself (squeue, then
sacct where accounting runs) so that a job ending without a result (scancel, a node failure, out of memory) is
noticed and recorded, never waited for, and each task's threads from the CPUs SLURM granted it.
"""

import contextlib
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from headlab.errors import ConfigError
from headlab.record import read_record, write_record

log = logging.getLogger("headlab")
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
GRACE_S = 15  # a job ended in SLURM may still be writing its result: waited for this long before it counts
# words of sbatch's refusals -> the launcher key that caused them
REFUSED_KEYS = {
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "time limit": "timeout_min",
    "memory": "mem_gb",
    "gres": "gpus_per_node",
    "cpu": "cpus_per_task",
}


BASE_KEYS = ("timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name")
BASE_KEYS += ("stderr_to_stdout",)  # submitit's own names; every other key is SLURM's (slurm_<key>)


def submit(folder: str, params: dict, function, *arguments, prefix: str = "hydra.launcher") -> list:
    """function(*arguments[k]) as task k of a SLURM job array (submitit), with the launcher's keys as submitit
    takes them (partition -> slurm_partition, ...; max_num_timeout: how often a timed-out job is requeued). A
    submission SLURM refuses is one ConfigError line naming the key (prefix: where the keys are)."""
    import submitit

    params = {k: v for k, v in params.items() if v is not None and k != "submitit_folder"}
    executor = submitit.AutoExecutor(
        folder=folder, cluster="slurm", slurm_max_num_timeout=params.pop("max_num_timeout", 0)
    )
    executor.update_parameters(**{k if k in BASE_KEYS else f"slurm_{k}": v for k, v in params.items()})
    with tempfile.TemporaryFile() as said, _stderr_to(said):  # sbatch's own lines: in the refusal, not beside it
        try:
            return executor.map_array(function, *arguments)
        except submitit.core.utils.FailedJobError as error:
            raise refusal(error, params, prefix) from None


@contextlib.contextmanager
def _stderr_to(file):
    """File descriptor 2 (what subprocesses write to) into file while the block runs."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def refusal(error: Exception, params: dict, prefix: str = "hydra.launcher") -> ConfigError:
    """submitit's FailedJobError for a submission sbatch refused, as one line naming the key it refers to."""
    said = [line.split("error:", 1)[-1].strip() for line in str(error).splitlines() if line.strip()]
    reason = said[0] if said else type(error).__name__
    key = next((k for word, k in REFUSED_KEYS.items() if word in reason.lower()), None)
    if key is None:
        return ConfigError(f"SLURM refused the sweep's jobs (sbatch: {reason})")
    value = params.get(key)
    return ConfigError(f"{prefix}.{key}={value!r} is invalid: SLURM refused it (sbatch: {reason})")


def requeue_survives_its_sigterm() -> None:
    """In a SLURM job, before training: submitit requeues a warned job with `scontrol requeue`, and SLURM carries
    out the requeue by sending SIGTERM to every process of the job, scontrol included. Where scontrol has not yet
    exited (a loaded node), it dies of that signal, submitit raises CalledProcessError, and the run is recorded
    failed although SLURM did requeue it. scontrol runs here with SIGTERM ignored, so it returns once SLURM has
    the requeue; the job itself still ends by submitit's exit, and by SIGKILL after SLURM's KillWait."""
    import signal

    from submitit.slurm import slurm as submitit_slurm

    def requeue(environment, countdown: int) -> None:
        ignore = lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN)  # noqa: E731 (in the child, before exec)
        subprocess.run(["scontrol", "requeue", environment.job_id], check=True, timeout=60, preexec_fn=ignore)
        log.info("requeued SLURM job %s (%d timeouts left)", environment.job_id, countdown)

    submitit_slurm.SlurmJobEnvironment._requeue = requeue


def stop_when_warned() -> Callable[[], None]:
    """In a SLURM job, before training: SLURM warns a job before its time limit with USR2, on which submitit
    requeues it and exits at once, wherever training is: work since the last validation is lost, and an epoch
    longer than the warning's lead would restart from the same place at every requeue. Here the warning stops the
    job as SIGTERM does (at its next training step, saving last.ckpt there: pack.writer.MemberWriter), and
    the returned function, called once the job has stopped, has submitit requeue it then."""
    import signal

    requeue = signal.getsignal(signal.SIGUSR2)  # submitit's: scontrol requeue, then exit
    warned = []

    def warn(signum, frame) -> None:
        if not warned:
            warned.append(frame)
            log.info("warned by SLURM (USR2): stopping at the next step, then requeued")
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGUSR2, warn)

    def then() -> None:
        if warned and callable(requeue):
            requeue(signal.SIGUSR2, warned[0])

    return then


def states(job_ids: list[str]) -> dict[str, str]:
    """SLURM's state of each job (array tasks as 12_3), from squeue (it lists ended jobs for a while) and, for
    those it no longer lists, sacct where accounting runs; a job neither knows is absent."""
    found: dict[str, str] = {}
    mains = sorted({i.split("_")[0] for i in job_ids})
    queue = subprocess.run(  # -r: one line per array task, also while the array waits in the queue (not 5_[0-1])
        ["squeue", "-h", "-r", "-t", "all", "-j", ",".join(mains), "-o", "%i %T"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    for line in queue.stdout.splitlines():
        job, _, state = line.strip().partition(" ")
        found[job] = state
    missing = [i for i in job_ids if i not in found]
    if missing and shutil.which("sacct"):
        account = subprocess.run(
            [
                "sacct",
                "-n",
                "-P",
                "-X",
                "-o",
                "JobID,State",
                "-j",
                ",".join(sorted({i.split("_")[0] for i in missing})),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in account.stdout.splitlines() if account.returncode == 0 else []:
            job, _, state = line.partition("|")
            found.setdefault(job, state.split()[0] if state else "")
    return {i: found[i] for i in job_ids if i in found}


def wait(jobs: list, on_end: Callable[[int, str], None], poll_s: float = 5.0, look_s: float = 0.5) -> list[bool]:
    """Wait until every submitit job has a result or SLURM says it ended without one; on_end(k, state) for the
    latter (state: SLURM's, or "UNKNOWN" when SLURM no longer knows the job). SLURM is asked every poll_s, the
    result files are looked at every look_s: the wait ends as soon as the last result is written. Returns which
    jobs have a result."""
    pending, ended_at, asked = set(range(len(jobs))), {}, -math.inf  # SLURM asked first at once
    while pending:
        for k in sorted(pending):
            if jobs[k].paths.result_pickle.exists():
                pending.discard(k)
        if pending and time.monotonic() - asked >= poll_s:
            asked, known = time.monotonic(), states([jobs[k].job_id for k in pending])
            for k in sorted(pending):
                state = known.get(jobs[k].job_id, "UNKNOWN").split("+")[0]
                if state in ENDED or state == "UNKNOWN":
                    ended_at.setdefault(k, time.monotonic())
                    if time.monotonic() - ended_at[k] >= GRACE_S and not jobs[k].paths.result_pickle.exists():
                        on_end(k, state)
                        pending.discard(k)
                else:
                    ended_at.pop(k, None)  # requeued, pending or running again
        if pending:
            time.sleep(look_s)
    return [job.paths.result_pickle.exists() for job in jobs]


def record_ended(run_dir: Path, job_id: str, state: str) -> None:
    """The record of a run whose SLURM job ended without a result: cancelled by scancel, or failed with SLURM's
    state (the run's own record, if it wrote one, said "running" or "interrupted": it was stopped from outside)."""
    record = read_record(run_dir) or {"config": {}}
    if record.get("status") == "completed":
        return
    cancelled = state == "CANCELLED"
    record.update(
        status="cancelled" if cancelled else "failed",
        error=f"SLURM job {job_id} ended as {state} without a result"
        + (" (scancel)" if cancelled else " (killed: a time limit past its requeues, a node failure, memory?)"),
    )
    write_record(run_dir, record)
