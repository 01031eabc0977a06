"""Launch commands for a plan's real cluster: one ``torchrun`` per node, or an sbatch script.

Nodes of a heterogeneous cluster have different GPU counts, so every node gets its own
``--nproc-per-node``. torchrun numbers global ranks by node rank, then local rank (each
agent's base rank is the sum of the local world sizes of the agents before it), so giving
node i of the plan's cluster ``--node-rank i`` makes the global ranks those of the plan.

Per node the environment carries what the plan needs (Holmes, arXiv 2312.03549, keeps
each data-parallel group inside one NIC class): RoCE nodes use GID index 3 (RoCE v2),
Ethernet-only nodes have InfiniBand verbs turned off, every node sees exactly its GPUs, and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` lets gloo groups reconnect after a restart
(research/torch_distributed.md).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from piebald.specs.cluster import ClusterSpec, NicKind

__all__ = ["NodeLaunch", "node_launches", "shell_script", "slurm_script"]

DEFAULT_PORT = 29500


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLaunch:
    node_name: str
    node_rank: int
    host: str  # a host name, or a shell expression that yields one
    first_rank: int
    num_gpus: int
    environment: Mapping[str, str]
    command: tuple[str, ...]

    def shell_line(self) -> str:
        """The command as one line of shell, environment first."""
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.environment.items())
        return f"{env} {shlex.join(self.command)}"


def _environment(cluster: ClusterSpec, node_index: int) -> dict[str, str]:
    node = cluster.nodes[node_index]
    group = cluster.node_groups[node.group_index]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(node.num_gpus)),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
    if group.nic.kind is NicKind.ROCE:
        env["NCCL_IB_GID_INDEX"] = "3"
    elif group.nic.kind is NicKind.ETHERNET:
        env["NCCL_IB_DISABLE"] = "1"
    return env


def node_launches(
    cluster: ClusterSpec,
    *,
    plan_path: str,
    hosts: Sequence[str] | None = None,
    master_port: int = DEFAULT_PORT,
    train_args: Sequence[str] = (),
) -> list[NodeLaunch]:
    """One launch per node of ``cluster``, in rank order; ``hosts`` names them (default:
    the node names of the cluster file), the first host runs the rendezvous."""
    names = [node.name for node in cluster.nodes]
    if hosts is not None and len(hosts) != len(names):
        raise ValueError(
            f"{len(names)} hosts, one per node of cluster {cluster.name!r} "
            f"({', '.join(names)}), not {len(hosts)}"
        )
    hosts = list(hosts) if hosts is not None else names
    launches = []
    for node in cluster.nodes:
        command = (
            "torchrun",
            f"--nnodes={len(cluster.nodes)}",
            f"--nproc-per-node={node.num_gpus}",
            f"--node-rank={node.index}",
            f"--master-addr={hosts[0]}",
            f"--master-port={master_port}",
            "-m",
            "piebald",
            "train",
            "--plan",
            plan_path,
            *train_args,
        )
        launches.append(
            NodeLaunch(
                node_name=node.name,
                node_rank=node.index,
                host=hosts[node.index],
                first_rank=node.first_rank,
                num_gpus=node.num_gpus,
                environment=_environment(cluster, node.index),
                command=command,
            )
        )
    return launches


def shell_script(launches: Sequence[NodeLaunch], *, plan_name: str, workdir: str) -> str:
    """A script that starts every node over ssh in ``workdir`` (a directory every node
    shares, holding the plan), rank 0's node first."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Launch plan {plan_name}: one torchrun per node; node i gets --node-rank i, so",
        "# global ranks match the plan. Run from a directory every node shares.",
        "set -euo pipefail",
        "",
    ]
    for launch in launches:
        ranks = f"ranks {launch.first_rank}-{launch.first_rank + launch.num_gpus - 1}"
        lines.append(f"# node {launch.node_rank}: {launch.node_name}, {ranks}")
        remote = f"cd {shlex.quote(workdir)} && {launch.shell_line()}"
        lines.append(f"ssh {shlex.quote(launch.host)} {shlex.quote(remote)} &")
    lines += ["wait", ""]
    return "\n".join(lines)


def slurm_script(
    launches: Sequence[NodeLaunch], *, plan_name: str, job_name: str = "piebald"
) -> str:
    """An sbatch script: one allocation of all nodes; node i of the plan runs on the i-th
    host of the allocation with its own GPU count (one ``srun`` step per node)."""
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={len(launches)}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        f"# Plan {plan_name}. Node i of the plan runs on the i-th host of the allocation:",
        "# order the allocation (e.g. --nodelist) so that hosts match the cluster file.",
        "set -euo pipefail",
        'mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'master="${hosts[0]}"',
        "",
    ]
    for launch in launches:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in launch.environment.items())
        # The rendezvous host is known only inside the allocation: left to the shell.
        args = " ".join(
            '--master-addr="$master"' if part.startswith("--master-addr=") else shlex.quote(part)
            for part in launch.command
        )
        lines.append(f"# node {launch.node_rank}: {launch.node_name} ({launch.num_gpus} GPUs)")
        lines.append(
            f'srun --nodes=1 --ntasks=1 --nodelist="${{hosts[{launch.node_rank}]}}" '
            f"env {env} {args} &"
        )
    lines += ["wait", ""]
    return "\n".join(lines)
