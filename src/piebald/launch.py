"""Launch commands for a plan's real cluster: one ``torchrun`` per node, or an sbatch script.

Nodes of a heterogeneous cluster have different GPU counts, so every node gets its own
``--nproc-per-node``. torchrun numbers global ranks by node rank, then local rank (each
agent's base rank is the sum of the local world sizes of the agents before it), so giving
node i of the plan's cluster ``--node-rank i`` makes the global ranks those of the plan.

Per node the environment carries what the plan needs (Holmes, arXiv 2312.03549, keeps
each data-parallel group inside one NIC class): RoCE nodes use GID index 3 (RoCE v2),
Ethernet-only nodes have InfiniBand verbs turned off, every node sees exactly its GPUs, and
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` lets gloo groups reconnect after a restart
(docs/research/torch_distributed.md).

Both scripts start every node in the background and wait on each; the first node that
fails stops the others and the script exits with its status. A bare ``wait`` returns 0
whatever its children did, so Slurm would record a failed training as COMPLETED.

Elastic (``piebald launch --elastic MIN``): every node runs an elastic agent
(``--nnodes MIN:N --rdzv-backend c10d``, the rendezvous on the first node's host at the
port, ``--max-restarts``) and ``piebald train --elastic``, which plans for the nodes that
are live at every (re)start and resumes from the newest checkpoint
(``runtime.training.elastic_rendezvous``); torchrun numbers the agents itself, so there is
no ``--node-rank``, and each node says which node of the cluster file it is in
``PIEBALD_NODE`` (torchrun's own parser refuses a ``--node`` after the script, taking it
for an abbreviation of its ``--node-rank``). A node that fails does not stop the others,
the script exits 0 when a node's torchrun finished the run, and an sbatch job keeps its
other nodes when one fails (``--no-kill``). The first node's host holds the rendezvous:
losing it ends the job (pytorch#67742). A node started again (its line of the script)
rejoins, and the next restart plans for it too.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from piebald.specs.cluster import ClusterSpec, NicKind
from piebald.specs.cluster_yaml import HOST_NAME_RULE, is_host_name

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "MAX_PORT",
    "NODE_VARIABLE",
    "ElasticLaunch",
    "NodeLaunch",
    "comment_text",
    "node_launches",
    "shell_script",
    "slurm_script",
]

DEFAULT_PORT = 29500
MAX_PORT = 65_535  # TCP ports are 16-bit; 0 would let the OS pick, which peers cannot know
DEFAULT_MAX_RESTARTS = 3  # an elastic job's failures (a lost node is one) before it ends
NODE_VARIABLE = "PIEBALD_NODE"  # an elastic worker's node of the cluster file


def _wait_on_nodes(*, comment: str, setup: str, on_exit: str, after: str) -> str:
    """Bash that waits on every node's background process (pids in the array `pids`), and
    runs ``on_exit`` for each one that ended (its status in `code`). It polls bash's own
    job table rather than using `wait -n`: bash before 5.1 can miss a job that ended before
    the call, and a pid from `kill -0` may have been reused by then."""
    loop = r"""
remaining=("${pids[@]}")
while ((${#remaining[@]})); do
  running=" $(jobs -pr | tr '\n' ' ') "
  still=()
  for pid in "${remaining[@]}"; do
    if [[ $running == *" $pid "* ]]; then
      still+=("$pid")
      continue
    fi
    code=0
    wait "$pid" || code=$?
<ON_EXIT>  done
  remaining=(${still[@]+"${still[@]}"})
  if ((${#remaining[@]})); then sleep 1; fi
done
"""
    return f"\n# {comment}\n{setup}" + loop.lstrip("\n").replace("<ON_EXIT>", on_exit) + after


# The first node to fail stops the others and sets the exit status.
_WAIT_FAIL_FAST = _wait_on_nodes(
    comment="Wait on every node; the first to fail stops the others and sets the exit status.",
    setup="",
    on_exit=r"""    if ((code != 0)); then
      echo "piebald launch: node ${node_of[$pid]} exited with status $code;" \
        "stopping the other nodes" >&2
      kill "${remaining[@]}" 2>/dev/null || true
      wait || true
      exit "$code"
    fi
""",
    after="",
)

# Elastic: a node that fails does not stop the others (the live ones re-plan and go on).
# The run is done when some node's torchrun finished it; else the status of the first node
# that failed.
_WAIT_ELASTIC = _wait_on_nodes(
    comment="Wait on every node; one that fails leaves the others running (elastic).",
    setup="status=0\nfinished=0\n",
    on_exit=r"""    if ((code == 0)); then
      finished=1
    else
      echo "piebald launch: node ${node_of[$pid]} exited with status $code;" \
        "the other nodes go on" >&2
      if ((status == 0)); then status=$code; fi
    fi
""",
    after='if ((finished)); then exit 0; fi\nexit "$status"\n',
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticLaunch:
    """torchrun's elastic rendezvous for every node: at least ``min_nodes`` of them."""

    min_nodes: int
    run_id: str  # --rdzv-id: the same on every node of one job
    max_restarts: int = DEFAULT_MAX_RESTARTS


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLaunch:
    node_name: str
    node_rank: int
    host: str  # the named host, else the node's name in the cluster file
    host_named: bool  # named by --hosts or the cluster file's hosts
    first_rank: int
    num_gpus: int
    environment: Mapping[str, str]
    command: tuple[str, ...]
    elastic: bool = False  # an elastic agent running piebald train --elastic

    def shell_line(self) -> str:
        """The command as one line of shell, environment first."""
        return f"{_env_words(self.environment)} {shlex.join(self.command)}"

    @property
    def ranks(self) -> str:
        return f"ranks {self.first_rank}-{self.first_rank + self.num_gpus - 1}"


def comment_text(text: str) -> str:
    """``text`` made safe for a ``#`` comment line of a script: a comment ends at the first
    newline, so every character that is not printable (line breaks, NUL, escapes, Unicode
    separators) is written as its Python escape (``\\n``, ``\\x00``). This is the one place
    where names that are not validated (the plan file's name) enter a script's text."""
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def _env_words(environment: Mapping[str, str]) -> str:
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in environment.items())


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
    elastic: ElasticLaunch | None = None,
) -> list[NodeLaunch]:
    """One launch per node of ``cluster``, in rank order. ``hosts`` names them; without it
    the cluster file's ``hosts``, else the node names. The first host runs the rendezvous
    (at ``master_port``). ``elastic``: elastic agents and ``piebald train --elastic``
    (module docstring)."""
    names = [node.name for node in cluster.nodes]
    if hosts is not None and len(hosts) != len(names):
        raise ValueError(
            f"{len(names)} host{'s' if len(names) != 1 else ''}, one per node of cluster "
            f"{cluster.name!r} ({', '.join(names)}), not {len(hosts)}"
        )
    # Hosts go into shell lines and Slurm node lists unquoted, as the cluster file's do.
    for index, host in enumerate(hosts or ()):
        if not is_host_name(host):
            raise ValueError(f"{HOST_NAME_RULE} for every host; host {index + 1} is {host!r}")
    if not 1 <= master_port <= MAX_PORT:
        raise ValueError(f"a master port of 1..{MAX_PORT}, not {master_port}")
    if elastic is not None and not 1 <= elastic.min_nodes <= len(names):
        raise ValueError(
            f"a minimum of 1..{len(names)} nodes (the cluster's), not {elastic.min_nodes}"
        )
    from_file = [node.host for node in cluster.nodes]
    if hosts is not None:
        chosen, named = list(hosts), True
    elif all(host is not None for host in from_file):
        chosen, named = [host for host in from_file if host is not None], True
    else:
        chosen, named = names, False
    launches = []
    for node in cluster.nodes:
        environment = _environment(cluster, node.index)
        if elastic is None:
            agent: tuple[str, ...] = (
                f"--nnodes={len(cluster.nodes)}",
                f"--nproc-per-node={node.num_gpus}",
                f"--node-rank={node.index}",
                f"--master-addr={chosen[0]}",
                f"--master-port={master_port}",
            )
            train: tuple[str, ...] = ("--plan", plan_path)
        else:
            agent = (
                f"--nnodes={elastic.min_nodes}:{len(cluster.nodes)}",
                f"--nproc-per-node={node.num_gpus}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={chosen[0]}:{master_port}",
                f"--rdzv-id={elastic.run_id}",
                f"--max-restarts={elastic.max_restarts}",
            )
            train = ("--plan", plan_path, "--elastic")
            environment[NODE_VARIABLE] = node.name
        command = ("torchrun", *agent, "-m", "piebald", "train", *train, *train_args)
        launches.append(
            NodeLaunch(
                node_name=node.name,
                node_rank=node.index,
                host=chosen[node.index],
                host_named=named,
                first_rank=node.first_rank,
                num_gpus=node.num_gpus,
                environment=environment,
                command=command,
                elastic=elastic is not None,
            )
        )
    return launches


def _is_elastic(launches: Sequence[NodeLaunch]) -> bool:
    return any(launch.elastic for launch in launches)


def _elastic_comment(launches: Sequence[NodeLaunch]) -> list[str]:
    if not _is_elastic(launches):
        return []
    return [
        "# Elastic: a lost node does not end the run; the live nodes re-plan and resume from",
        "# the newest checkpoint. Node 0's host holds the rendezvous (losing it ends the job);",
        "# a node started again with its line below rejoins.",
    ]


def shell_script(launches: Sequence[NodeLaunch], *, plan_name: str, workdir: str) -> str:
    """A script that starts every node over ssh in ``workdir`` (a directory every node
    shares, holding the plan), rank 0's node first, and fails as soon as one node fails
    (elastic: waits for every node, module docstring)."""
    title = f"# Launch plan {comment_text(plan_name)}:"
    if _is_elastic(launches):
        header = [f"{title} one elastic torchrun per node. Run from a directory every node"]
    else:
        header = [
            f"{title} one torchrun per node; node i gets",
            "# --node-rank i, so global ranks match the plan. Run from a directory every node",
        ]
    lines = [
        "#!/usr/bin/env bash",
        *header,
        "# shares.",
        *_elastic_comment(launches),
        "set -euo pipefail",
        "pids=()",
        "declare -A node_of",
        "",
    ]
    for launch in launches:
        lines.append(f"# node {launch.node_rank}: {comment_text(launch.node_name)}, {launch.ranks}")
        remote = f"cd {shlex.quote(workdir)} && {launch.shell_line()}"
        # -tt: the remote torchrun gets a terminal, so killing this ssh (when another node
        # fails) hangs it up and torchrun stops its workers instead of running on.
        lines.append(f"ssh -tt {shlex.quote(launch.host)} {shlex.quote(remote)} &")
        lines.append(f"pids+=($!); node_of[$!]={launch.node_rank}")
    lines.append(_WAIT_ELASTIC if _is_elastic(launches) else _WAIT_FAIL_FAST)
    return "\n".join(lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Component:
    """Nodes that Slurm can allocate with one request: the same number of GPUs each."""

    gpus_per_node: int
    launches: tuple[NodeLaunch, ...]


def _components(launches: Sequence[NodeLaunch], *, request_gpus: bool) -> list[_Component]:
    """One component per GPU count, in order of first appearance (so node 0, which runs
    the rendezvous, is in component 0); one component in all when no GPUs are requested."""
    if not request_gpus:
        return [_Component(gpus_per_node=0, launches=tuple(launches))]
    counts = list(dict.fromkeys(launch.num_gpus for launch in launches))
    return [
        _Component(
            gpus_per_node=count,
            launches=tuple(launch for launch in launches if launch.num_gpus == count),
        )
        for count in counts
    ]


def slurm_script(
    launches: Sequence[NodeLaunch],
    *,
    plan_name: str,
    job_name: str = "piebald",
    request_gpus: bool = True,
) -> str:
    """An sbatch script: one ``srun`` step per node with its own GPU count.

    Nodes with the same GPU count form one allocation request (``--gpus-per-node``); a
    cluster with several counts becomes a heterogeneous job, one component per count
    (``#SBATCH hetjob``, ``srun --het-group=K``). Named hosts (``--hosts`` or the cluster
    file's ``hosts``) are requested with ``--nodelist`` and node i runs on host i; without
    them node i runs on the i-th host of its component's allocation. ``request_gpus=False``
    asks for no GPUs (a CPU-only cluster; torchrun still starts one process per planned GPU).
    """
    if not is_host_name(job_name):  # an #SBATCH directive: one plain word
        raise ValueError(f"a job name of letters, digits, '_', '.' or '-', not {job_name!r}")
    named = all(launch.host_named for launch in launches)
    if named:
        seen: set[str] = set()
        for launch in launches:
            if launch.host in seen:
                raise ValueError(
                    f"host {launch.host!r} named for two nodes; Slurm allocates a host once "
                    "(one host per node of the cluster)"
                )
            seen.add(launch.host)
    components = _components(launches, request_gpus=request_gpus)
    hetjob = len(components) > 1
    lines = ["#!/usr/bin/env bash", f"#SBATCH --job-name={job_name}"]
    if _is_elastic(launches):
        lines.append("#SBATCH --no-kill")  # a failed node leaves the others their nodes
    for index, component in enumerate(components):
        if index:
            lines.append("#SBATCH hetjob")
        lines += [
            f"#SBATCH --nodes={len(component.launches)}",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
        ]
        if component.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={component.gpus_per_node}")
        if named:
            lines.append(f"#SBATCH --nodelist={','.join(item.host for item in component.launches)}")
    placement = (
        "# Node i of the plan runs on host i of the cluster file (or --hosts)."
        if named
        else "# Node i of the plan runs on the i-th host of its component's allocation."
    )
    shape = f", a heterogeneous job of {len(components)} components (one per GPU count)"
    lines += [
        f"# Plan {comment_text(plan_name)}: {len(launches)} nodes{shape if hetjob else ''}.",
        placement,
        *_elastic_comment(launches),
        "set -euo pipefail",
        "pids=()",
        "declare -A node_of",
    ]
    if not named:
        for index in range(len(components)):
            nodelist = f"SLURM_JOB_NODELIST_HET_GROUP_{index}" if hetjob else "SLURM_JOB_NODELIST"
            lines.append(f'mapfile -t hosts{index} < <(scontrol show hostnames "${nodelist}")')
        lines.append('master="${hosts0[0]}"')
    lines.append("")
    for index, component in enumerate(components):
        for position, launch in enumerate(component.launches):
            host = shlex.quote(launch.host) if named else f'"${{hosts{index}[{position}]}}"'
            environment = dict(launch.environment)
            if component.gpus_per_node:
                # Slurm sets CUDA_VISIBLE_DEVICES to the GPUs it gave the step, which need
                # not be the first ones of the node.
                environment.pop("CUDA_VISIBLE_DEVICES", None)
            args = " ".join(_slurm_word(part, named=named) for part in launch.command)
            step = ["srun"]
            if hetjob:
                step.append(f"--het-group={index}")
            step += ["--nodes=1", "--ntasks=1"]
            if component.gpus_per_node:
                step.append(f"--gpus-per-node={component.gpus_per_node}")
            step.append(f"--nodelist={host}")
            lines.append(
                f"# node {launch.node_rank}: {comment_text(launch.node_name)}, {launch.ranks} "
                f"({launch.num_gpus} GPUs)"
            )
            lines.append(f"{' '.join(step)} env {_env_words(environment)} {args} &")
            lines.append(f"pids+=($!); node_of[$!]={launch.node_rank}")
    lines.append(_WAIT_ELASTIC if _is_elastic(launches) else _WAIT_FAIL_FAST)
    return "\n".join(lines)


def _slurm_word(part: str, *, named: bool) -> str:
    """One word of a node's command in the sbatch script: the rendezvous host is the first
    host of the allocation (``$master``) when no host is named."""
    if not named and part.startswith("--master-addr="):
        return '--master-addr="$master"'
    if not named and part.startswith("--rdzv-endpoint="):
        port = part.rsplit(":", 1)[1]
        return f'--rdzv-endpoint="$master":{shlex.quote(port)}'
    return shlex.quote(part)
