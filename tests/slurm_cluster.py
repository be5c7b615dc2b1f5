"""A real single-node SLURM cluster for tests, started as root from Debian's packages (slurmctld, slurmd,
slurm-client, munge; .ci/run installs them), with its own configuration file (SLURM_CONF), state, ports and
logs in a folder of its own, and stopped by the PIDs it started. No accounting: headlab must not need it.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PROGRAMS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "munged", "munge")


def ports() -> tuple[int, int]:
    """slurmctld's and slurmd's ports: not SLURM's defaults (a cluster the machine runs already is left alone), and
    each pytest-xdist worker its own (two workers may each start a cluster)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = 16817 + 10 * (int(worker) if worker.isdigit() else 0)
    return base, base + 1


def unavailable() -> str | None:
    """Why a cluster cannot be started here (None when it can)."""
    if os.geteuid() != 0:
        return "not root"
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    return f"not installed: {', '.join(missing)}" if missing else None


def _wait(test, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while not test():
        if time.time() > deadline:
            raise RuntimeError(f"SLURM did not start: {what}")
        time.sleep(0.1)


class Cluster:
    def __init__(self, folder: Path):
        self.folder, self.pids = folder, []
        self.conf = folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self) -> "Cluster":
        for name in ("state", "spool", "log", "run"):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        self._munge()
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        node = self.run("slurmd", "-C").stdout.split("\n")[0]
        cpus = node.split("CPUs=")[1].split()[0]
        memory = int(int(node.split("RealMemory=")[1].split()[0]) * 0.9)
        f = self.folder
        # A requeued job waits cred_expire seconds (default 120), then only the main scheduling loop starts it
        # (every sched_interval seconds, default 60): 5 (SLURM's least) and 1 keep each requeue test from idling up
        # to three minutes, its worker's core idle meanwhile
        self.conf.write_text(
            f"""ClusterName=headlabtest{ports()[0]}
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/run/slurmctld.pid
SlurmdPidFile={f}/run/slurmd.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd.log
SlurmctldPort={ports()[0]}
SlurmdPort={ports()[1]}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MpiDefault=none
SwitchType=switch/none
JobRequeue=1
AuthInfo=cred_expire=5
MailProg=/bin/true
ReturnToService=2
InactiveLimit=0
KillWait=30
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""
        )
        for daemon, pid_file in (("slurmctld", "slurmctld.pid"), ("slurmd", "slurmd.pid")):
            arguments = ["-c"] if daemon == "slurmctld" else []  # forget the jobs of an earlier start
            started = self.run(daemon, *arguments)
            if started.returncode:
                raise RuntimeError(f"SLURM did not start: {daemon}: {started.stderr.strip()}")
            path = self.folder / "run" / pid_file
            _wait(lambda path=path: path.is_file() and path.read_text().strip(), 20, daemon)
            self.pids.append(int(path.read_text()))
        _wait(lambda: self.run("sinfo", "-h", "-N", "-o", "%T").stdout.strip() == "idle", 30, "the node")
        if self.run("srun", "--time=1", "true", timeout=120).returncode:  # "idle" is schedulable only once a job ran
            raise RuntimeError("SLURM did not start: srun failed")
        return self

    def _munge(self) -> None:
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return  # a munged answers already
        key = Path("/etc/munge/munge.key")
        if not key.exists() or key.stat().st_size == 0:
            key.write_bytes(os.urandom(1024))
        subprocess.run(["chown", "munge:munge", str(key)], check=True)
        key.chmod(0o400)
        for folder, mode in (("/run/munge", 0o755), ("/var/lib/munge", 0o700), ("/var/log/munge", 0o700)):
            Path(folder).mkdir(parents=True, exist_ok=True)
            subprocess.run(["chown", "munge:munge", folder], check=True)
            Path(folder).chmod(mode)
        # 2 threads by default: under a loaded CI, sbatch then failed with "If munged is up, restart with
        # --num-threads=10" while slurmctld and slurmd also authenticated
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--force", "--num-threads=10"], check=True)
        _wait(lambda: Path("/run/munge/munged.pid").is_file(), 10, "munged")
        # munged stays up after stop(): it is the machine's one authentication daemon, and another pytest-xdist
        # worker's cluster (the tests of this module may be spread over workers) may be using it (sbatch failed
        # there with "Failed to access /run/munge/munge.socket.2" when the first cluster to stop took it down)

    def stop(self) -> None:
        self.run("scancel", "--full", "--user=root")
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.time() + 10
            while time.time() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
