"""A real SLURM on 127.0.0.1 for the cluster tests: Debian's slurm-wlm
(slurmctld, slurmd, sbatch, scancel) and munge, installed by `make
setup-slurm`, started from a slurm.conf written into a temporary folder and
stopped by PID afterwards.

One node that calls itself 4 GPUs: GRES needs a device file per GPU, so four
empty files stand in for /dev/nvidia0-3 (nothing reads them; the jobs run
on the CPU, where device ids do nothing). ``config_overrides`` lets the node
claim more CPUs than the machine has, so an array's tasks run side by side
as on a cluster. The daemons run as root (slurmd starts jobs as their
user); the tests submit the project's own sbatch scripts from slurm/.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "scontrol")
GPUS = 4


def missing() -> str | None:
    """Why no SLURM can start here, in one line (None when one can)."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not Path("/usr/sbin", d).exists()]
    if absent:
        return (f"{', '.join(absent)} missing: `make setup-slurm` installs Debian's slurm-wlm and munge (as root, "
                "or with password-less sudo)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs: run the cluster tests as root"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin") / name)


@dataclass
class Slurm:
    """A running controller and node; ``env`` is what a client command needs."""

    folder: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, cwd: Path | None = None, env: dict | None = None) -> str:
        r = subprocess.run(list(args), env={**self.env, **(env or {})}, cwd=cwd, capture_output=True, text=True,
                           timeout=120)
        if check:
            assert r.returncode == 0, f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def sbatch(self, script: Path, *options: str, cwd: Path, env: dict | None = None) -> str:
        """Submit ``script`` (its #SBATCH lines, ``options`` over them); the job id."""
        return self.run("sbatch", "--parsable", *options, str(script), cwd=cwd, env=env).strip().split(";")[0]

    def states(self, job: str) -> dict[str, str]:
        """Each task of a job (array tasks as ``<job>_<i>``) and its state, while the controller remembers it."""
        out = self.run("scontrol", "show", "job", "-o", job, check=False)
        found = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            task = fields.get("ArrayTaskId")
            found[f"{job}_{task}" if task and task.isdigit() else fields.get("JobId", job)] = fields.get("JobState", "")
        return found

    def wait(self, job: str, timeout: float = 900) -> dict[str, str]:
        """Until no task of ``job`` is pending or running; their end states."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.states(job)
            if states and not any(s in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for s in states.values()):
                return states
            assert time.monotonic() < deadline, f"job {job} still {states} after {timeout} s"
            time.sleep(0.5)


    def wait_for_file(self, path: Path, job: str, logs: Path, timeout: float = 900) -> None:
        """Until ``path`` exists (a gate the job's process writes); fails at once if the job ends first."""
        deadline = time.monotonic() + timeout
        while not path.exists():
            states = self.states(job)
            assert states and any(s in ("PENDING", "RUNNING", "CONFIGURING") for s in states.values()), \
                f"job {job} ended ({states}) before {path.name}:\n" + "\n".join(
                    p.read_text()[-2000:] for p in sorted(logs.glob("*.out")))
            assert time.monotonic() < deadline, f"{path} not written after {timeout} s"
            time.sleep(0.2)


def write_config(folder: Path, host: str) -> Path:
    (folder / "state").mkdir()
    (folder / "spool").mkdir()
    devices = folder / "dev"
    devices.mkdir()
    for i in range(GPUS):
        (devices / f"gpu{i}").touch()
    (folder / "gres.conf").write_text(f"NodeName={host} Name=gpu File={devices}/gpu[0-{GPUS - 1}]\n")
    (folder / "plugstack.conf").touch()
    conf = folder / "slurm.conf"
    conf.write_text(f"""ClusterName=agentr-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
PlugStackConfig={folder}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
ReturnToService=2
MinJobAge=3600
KillWait=5
GresTypes=gpu
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def start(folder: Path) -> Slurm:
    """munged, slurmctld and slurmd from ``folder``; returns once the node is idle."""
    host = socket.gethostname().split(".")[0]
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    subprocess.run([binary("munged"), f"--key-file={key}", f"--socket={folder}/munge.socket",
                    f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                    f"--seed-file={folder}/munge.seed", "--force"], check=True, timeout=60)
    conf = write_config(folder, host)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([binary(daemon), "-f", str(conf)], env=env, check=True, timeout=60)
    slurm = Slurm(folder, env)
    deadline = time.monotonic() + 120
    while "idle" not in slurm.run("sinfo", "-h", "-N", "-o", "%T", check=False):
        assert time.monotonic() < deadline, (folder / "slurmctld.log").read_text()[-3000:]
        time.sleep(0.3)
    return slurm


def stop(folder: Path) -> None:
    """Each daemon by the PID its file holds, the node first; waits until they are gone."""
    for name in ("slurmd.pid", "slurmctld.pid", "munged.pid"):
        try:
            pid = int((folder / name).read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
