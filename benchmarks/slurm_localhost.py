"""A real Slurm on this one machine: does it accept `piebald launch --slurm` scripts, and
record a training's failure as FAILED?

Installs Debian's slurm-wlm and munge if missing (root, apt), writes a minimal slurm.conf
(one node, ``localhost``, this machine's CPUs, no GPUs, no accounting database; finished
jobs stay visible to ``scontrol show job`` for an hour), starts munged, slurmctld and slurmd
in the foreground as children of this script, and then:

* ``completed``: a one-node CPU cluster file that names its host, a plan for the ``tiny``
  preset, the script from ``piebald launch --slurm --no-gpus``, sbatch; the job must end
  COMPLETED with exit code 0:0 after a short training (torchrun, two CPU processes, gloo);
* ``failed``: the same with ``--train-args '--steps 0'`` (rejected by `piebald train`), which
  must end FAILED with a non-zero exit code.

Prints a table of both and exits 1 if either is wrong; stops the daemons it started.

    python benchmarks/slurm_localhost.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
_JOB_TIMEOUT_S = 300.0
# The node advertises two GPUs that have no device files, so that a script requesting GPUs
# (--gpus-per-node) is scheduled; training runs on the CPU either way.
_FAKE_GPUS = 2

CLUSTER_YAML = """\
name: slurm-localhost
nodes:
  - name: cpu
    gpu: T4                # priced as a T4; trains on the CPU (gloo)
    gpus_per_node: 2       # torchrun starts two processes
    intra_link: 16GB/s
    hosts: [localhost]
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    train_args: str
    expected_state: str
    gpus: bool  # the script requests the node's GPUs (--gpus) or none (--no-gpus)


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    state: str
    exit_code: str
    gpus_requested: int
    gpus_allocated: int
    wall_s: float
    log_tail: str


CASES = (
    Case(name="completed", train_args="--steps 2", expected_state="COMPLETED", gpus=False),
    Case(name="failed", train_args="--steps 0", expected_state="FAILED", gpus=False),
    Case(name="gpus", train_args="--steps 1", expected_state="COMPLETED", gpus=True),
)


def _ensure_installed() -> None:
    needed = ("slurmctld", "slurmd", "sbatch", "scontrol", "munged")
    if all(shutil.which(tool) for tool in needed):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"], check=True, env=env)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _node_hardware() -> str:
    """CPUs, sockets, cores and memory as slurmd sees them: a node whose slurm.conf line
    promises more than slurmd finds is drained."""
    line = subprocess.run(["slurmd", "-C"], check=True, capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", line.splitlines()[0]))
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
    return " ".join(f"{key}={fields[key]}" for key in keys) + f" RealMemory={fields['RealMemory']}"


def _write_conf(root: Path) -> Path:
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    controller = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=piebald-local
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 {_node_hardware()} Gres=gpu:{_FAKE_GPUS} State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""",
        encoding="utf-8",
    )
    # GPUs whose "device files" are empty files: Slurm drops GPUs without files, and with
    # these it schedules them; nothing opens them.
    for index in range(_FAKE_GPUS):
        (root / f"fakegpu{index}").touch()
    (root / "gres.conf").write_text(
        f"NodeName=localhost Name=gpu File={root}/fakegpu[0-{_FAKE_GPUS - 1}]\n",
        encoding="utf-8",
    )
    return conf


def _munge_answers() -> bool:
    encoded = subprocess.run(["munge", "-n"], capture_output=True, check=False)
    if encoded.returncode != 0:
        return False
    decoded = subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True, check=False)
    return decoded.returncode == 0


class Daemons:
    """munged (unless one already answers), slurmctld and slurmd, stopped in reverse."""

    def __init__(self, conf: Path, root: Path) -> None:
        self.conf = conf
        self.root = root
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def _start(self, name: str, command: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("wb")
        # SLURM_CONF, not only -f: slurmd finds gres.conf beside the file it names.
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=_slurm_env(self.conf)
        )
        self.started.append((name, process))

    def start(self) -> None:
        if not _munge_answers():
            key = Path("/etc/munge/munge.key")
            if not key.exists():
                subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            self._start("munged", ["munged", "--foreground", "--force"])
            _wait_for(_munge_answers, what="munged", timeout_s=20)
        self._start("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._start("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
        _wait_for(self._node_idle, what="the node to be idle", timeout_s=60)

    def _node_idle(self) -> bool:
        for name, process in self.started:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see {self.root}/log")
        result = subprocess.run(
            ["sinfo", "-h", "-n", "localhost", "-o", "%T"],
            capture_output=True,
            text=True,
            check=False,
            env=_slurm_env(self.conf),
        )
        return result.stdout.strip() == "idle"

    def stop(self) -> None:
        for _, process in reversed(self.started):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for(ready: object, *, what: str, timeout_s: float) -> None:
    assert callable(ready)
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _slurm_env(conf: Path) -> dict[str, str]:
    # torchrun and python of this interpreter's environment, for the job steps too (sbatch
    # exports the submitting environment by default).
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "SLURM_CONF": str(conf), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _piebald(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "piebald", *args], cwd=cwd, check=True)


def _job_fields(job_id: str, env: dict[str, str], *, record: Path) -> dict[str, str]:
    """``scontrol -d show job``'s fields; ``GPUs`` from its per-node detail line
    (``GRES=gpu:2(IDX:0-1)``, present while the job runs): the GPUs Slurm allocated."""
    text = subprocess.run(
        ["scontrol", "-d", "show", "job", job_id],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    record.write_text(text, encoding="utf-8")
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    allocated = re.search(r"GRES=gpu(?::\w+)?:(\d+)\(IDX", text)
    fields["GPUs"] = allocated.group(1) if allocated else "0"
    return fields


def run_case(case: Case, *, workdir: Path, conf: Path) -> Outcome:
    env = _slurm_env(conf)
    script = workdir / f"{case.name}.sbatch"
    _piebald(
        "launch",
        "--plan",
        "plan.json",
        "--slurm",
        "--gpus" if case.gpus else "--no-gpus",
        f"--train-args={case.train_args}",
        "--out",
        str(script),
        "--force",
        cwd=workdir,
    )
    log = workdir / f"{case.name}.out"
    started = time.monotonic()
    job_id = subprocess.run(
        ["sbatch", "--parsable", f"--output={log}", str(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=workdir,
        env=env,
    ).stdout.strip()
    gpus_allocated = 0
    while True:
        fields = _job_fields(job_id, env, record=workdir / f"{case.name}.job")
        gpus_allocated = max(gpus_allocated, int(fields["GPUs"]))
        if fields.get("JobState") in _TERMINAL_STATES:
            break
        if time.monotonic() - started > _JOB_TIMEOUT_S:
            subprocess.run(["scancel", job_id], env=env, check=False)
            break
        time.sleep(1)
    requested = re.search(r"gpu:(\d+)", fields.get("TresPerNode", ""))
    tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
    return Outcome(
        state=fields.get("JobState", "?"),
        exit_code=fields.get("ExitCode", "?"),
        gpus_requested=int(requested.group(1)) if requested else 0,
        gpus_allocated=gpus_allocated,
        wall_s=time.monotonic() - started,
        log_tail="\n".join(tail),
    )


def _expected(case: Case, outcome: Outcome) -> bool:
    # The plan's node has two GPUs: a script that requests GPUs asks for both and gets them
    # (an --exclusive job is given every GPU of its nodes whether it asks or not).
    if outcome.gpus_requested != 2 * case.gpus or (case.gpus and outcome.gpus_allocated != 2):
        return False
    if outcome.state != case.expected_state:
        return False
    success = outcome.exit_code == "0:0"
    return success if case.expected_state == "COMPLETED" else not success


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="Work (and leave logs) in this directory.")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("slurm_localhost: run as root (installs packages, starts slurmd)", file=sys.stderr)
        return 2
    _ensure_installed()
    root = args.keep or Path(tempfile.mkdtemp(prefix="piebald-slurm-"))
    root.mkdir(parents=True, exist_ok=True)
    conf = _write_conf(root)
    workdir = root / "work"
    workdir.mkdir(exist_ok=True)
    (workdir / "cluster.yaml").write_text(CLUSTER_YAML, encoding="utf-8")
    _piebald(
        "plan",
        "--cluster",
        "cluster.yaml",
        "--model",
        "tiny",
        "--global-batch",
        "4",
        "--seq-len",
        "32",
        "--out",
        "plan.json",
        "--force",
        cwd=workdir,
    )
    daemons = Daemons(conf, root)
    outcomes: list[tuple[Case, Outcome]] = []
    try:
        daemons.start()
        for case in CASES:
            outcomes.append((case, run_case(case, workdir=workdir, conf=conf)))
    finally:
        daemons.stop()
    print(
        f"{'case':<10} {'train args':<12} {'GPUs asked/got':<15} {'expected':<10} {'state':<10} "
        f"{'exit':<6} wall"
    )
    wrong = 0
    for case, outcome in outcomes:
        ok = _expected(case, outcome)
        wrong += not ok
        print(
            f"{case.name:<10} {case.train_args:<12} "
            f"{f'{outcome.gpus_requested}/{outcome.gpus_allocated}':<15} "
            f"{case.expected_state:<10} "
            f"{outcome.state:<10} {outcome.exit_code:<6} {outcome.wall_s:5.1f} s"
            + ("" if ok else "   WRONG")
        )
        if not ok:
            print(f"  log tail:\n{outcome.log_tail}")
    print(f"logs and scripts in {root}")
    return 1 if wrong or len(outcomes) != len(CASES) else 0


if __name__ == "__main__":
    sys.exit(main())
