"""``piebald launch``: every node's torchrun gives the plan's global ranks; scripts parse."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster_builders import cluster, group
from piebald.cli import app
from piebald.launch import (
    NODE_VARIABLE,
    ElasticLaunch,
    NodeLaunch,
    node_launches,
    shell_script,
    slurm_script,
)
from piebald.planner.search import search
from piebald.specs.job import JobSpec
from piebald.specs.plan_io import save_plan
from piebald.specs.presets import load_model

# Nodes with 4, 1 and 2 GPUs on three NIC classes, so every node needs its own launch.
MIXED = cluster(
    "mixed",
    group("a100", "A100-80GB", 4, nic=("infiniband", "200Gb/s")),
    group("t4", "T4", 1, nic=("ethernet", "25Gb/s")),
    group("l4", "L4", 2, nic=("roce", "100Gb/s")),
)


def _with_hosts(spec: dict[str, Any], *hosts: str) -> dict[str, Any]:
    return {**spec, "hosts": list(hosts)}


# Four node groups, three GPU counts (4, 1, 2); the 4-GPU nodes are not adjacent in rank
# order, so a Slurm component is not a run of consecutive nodes.
SHAPES = cluster(
    "shapes",
    group("a100", "A100-80GB", 4, count=2),
    group("t4", "T4", 1),
    group("h100", "H100-SXM", 4),
    group("l4", "L4", 2),
)
NAMED = cluster(
    "named",
    _with_hosts(group("a100", "A100-80GB", 4, count=2), "gpu-b", "gpu-a"),
    _with_hosts(group("t4", "T4", 1), "old-1"),
)
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="runs a bash script")


def _option(command: tuple[str, ...], name: str) -> str:
    (value,) = [part.split("=", 1)[1] for part in command if part.startswith(f"--{name}=")]
    return value


def test_torchrun_rank_assignment_reproduces_the_plans_ranks() -> None:
    launches = node_launches(MIXED, plan_path="plan.json", train_args=["--steps", "3"])
    assert [launch.node_name for launch in launches] == [node.name for node in MIXED.nodes]
    # torchrun: an agent's base rank is the sum of the local world sizes of lower node ranks.
    ordered = sorted(launches, key=lambda launch: int(_option(launch.command, "node-rank")))
    base = 0
    for launch in ordered:
        num_procs = int(_option(launch.command, "nproc-per-node"))
        ranks = range(base, base + num_procs)
        node = MIXED.nodes[launch.node_rank]
        assert [MIXED.gpus[r].node_index for r in ranks] == [node.index] * node.num_gpus
        assert _option(launch.command, "nnodes") == "3"
        assert _option(launch.command, "master-addr") == MIXED.nodes[0].name
        assert launch.command[-5:] == ("train", "--plan", "plan.json", "--steps", "3")
        base += num_procs
    assert base == MIXED.num_gpus


def test_environment_follows_each_nodes_nic_class() -> None:
    env = [launch.environment for launch in node_launches(MIXED, plan_path="p.json")]
    assert env[0]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "NCCL_IB_DISABLE" not in env[0]  # InfiniBand
    assert env[1]["NCCL_IB_DISABLE"] == "1"  # Ethernet only
    assert env[2]["NCCL_IB_GID_INDEX"] == "3"  # RoCE v2
    assert all(e["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" for e in env)


def test_shell_line_round_trips_through_the_shell() -> None:
    launch = node_launches(MIXED, plan_path="my plan.json")[1]
    words = shlex.split(launch.shell_line())
    assert words[: len(launch.environment)] == [f"{k}={v}" for k, v in launch.environment.items()]
    assert tuple(words[len(launch.environment) :]) == launch.command


@pytest.mark.slow
def test_wrong_number_of_hosts_is_one_line_and_exit_2(tmp_path: Path) -> None:
    plan = search(
        MIXED, model=load_model("tiny"), job=JobSpec(global_batch_size=8, seq_len=64)
    ).best.plan
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--hosts", "a,b"])
    assert result.exit_code == 2
    assert "--hosts" in result.output and "3 hosts, one per node" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--hosts", "x,y,z"])
    assert result.exit_code == 0, result.output
    assert result.output.count("torchrun") == 3 and "--master-addr=x" in result.output
    out = tmp_path / "launch.sh"
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--out", str(out)])
    assert result.exit_code == 0 and out.read_text().count("ssh ") == 3
    before = out.read_text()
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--slurm", "--out", str(out)])
    assert result.exit_code == 2 and out.read_text() == before


# --- sbatch scripts -------------------------------------------------------------------------


def _sbatch_components(script: str) -> list[dict[str, str]]:
    """The #SBATCH options of each component, read as sbatch does: up to the first command."""
    components: list[dict[str, str]] = [{}]
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if not line.startswith("#SBATCH "):
            continue
        option = line.removeprefix("#SBATCH ").strip()
        if option == "hetjob":
            components.append({})
        else:
            key, _, value = option.partition("=")
            components[-1][key] = value
    return components


def _steps(script: str) -> list[list[str]]:
    """Every srun line as the shell splits it (without the trailing ``&``)."""
    lines = [line for line in script.splitlines() if line.startswith("srun ")]
    assert all(line.endswith(" &") for line in lines)
    return [shlex.split(line[: -len(" &")]) for line in lines]


def _srun_option(words: list[str], name: str) -> str | None:
    found = [w.split("=", 1)[1] for w in words[: words.index("env")] if w.startswith(f"--{name}=")]
    return found[0] if found else None


@needs_bash
def test_slurm_asks_for_each_nodes_gpus_in_one_request_when_all_nodes_agree(
    tmp_path: Path,
) -> None:
    same = cluster("same", group("a100", "A100-80GB", 8, count=3))
    script = slurm_script(node_launches(same, plan_path="plan.json"), plan_name="plan.json")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    (only,) = _sbatch_components(script)
    assert only["--nodes"] == "3" and only["--gpus-per-node"] == "8"
    assert only["--ntasks-per-node"] == "1" and "--nodelist" not in only
    steps = _steps(script)
    assert len(steps) == 3
    for words in steps:
        assert _srun_option(words, "het-group") is None
        assert _srun_option(words, "gpus-per-node") == "8"
        # Slurm picks the step's GPUs and sets CUDA_VISIBLE_DEVICES for them.
        assert not any(w.startswith("CUDA_VISIBLE_DEVICES=") for w in words)


def test_slurm_makes_one_hetjob_component_per_gpu_count() -> None:
    script = slurm_script(node_launches(SHAPES, plan_path="p.json"), plan_name="p.json")
    # The oracle: the cluster's nodes grouped by GPU count, counts in order of appearance.
    counts = list(dict.fromkeys(node.num_gpus for node in SHAPES.nodes))
    members = {n: [node.index for node in SHAPES.nodes if node.num_gpus == n] for n in counts}
    components = _sbatch_components(script)
    assert script.count("#SBATCH hetjob") == len(counts) - 1 == 2
    assert [c["--gpus-per-node"] for c in components] == [str(n) for n in counts]
    assert [c["--nodes"] for c in components] == [str(len(members[n])) for n in counts]
    assert all(c["--ntasks-per-node"] == "1" for c in components)
    steps = _steps(script)
    assert len(steps) == len(SHAPES.nodes)
    for words in steps:
        rank = int(next(w for w in words if w.startswith("--node-rank=")).split("=")[1])
        node = SHAPES.nodes[rank]
        assert _srun_option(words, "het-group") == str(counts.index(node.num_gpus))
        assert _srun_option(words, "gpus-per-node") == str(node.num_gpus)
        assert f"--nproc-per-node={node.num_gpus}" in words


def test_no_gpus_is_one_plain_request_for_a_cpu_cluster() -> None:
    launches = node_launches(SHAPES, plan_path="p.json")
    script = slurm_script(launches, plan_name="p.json", request_gpus=False)
    (only,) = _sbatch_components(script)
    assert only["--nodes"] == str(len(SHAPES.nodes)) and "--gpus-per-node" not in only
    assert not any(_srun_option(words, "gpus-per-node") for words in _steps(script))
    # torchrun still starts one process per planned GPU.
    for words, node in zip(_steps(script), SHAPES.nodes, strict=True):
        assert f"--nproc-per-node={node.num_gpus}" in words


def test_cluster_file_hosts_place_every_node_and_the_flag_overrides_them() -> None:
    launches = node_launches(NAMED, plan_path="p.json")
    assert [launch.host for launch in launches] == ["gpu-b", "gpu-a", "old-1"]
    script = slurm_script(launches, plan_name="p.json")
    components = _sbatch_components(script)
    assert [c["--nodelist"] for c in components] == ["gpu-b,gpu-a", "old-1"]
    steps = _steps(script)
    assert [_srun_option(words, "nodelist") for words in steps] == ["gpu-b", "gpu-a", "old-1"]
    assert all("--master-addr=gpu-b" in words for words in steps)
    assert "scontrol" not in script  # nothing left to the allocation's order
    override = node_launches(NAMED, plan_path="p.json", hosts=["x", "y", "z"])
    assert [launch.host for launch in override] == ["x", "y", "z"]
    assert "--master-addr=x" in override[2].command
    with pytest.raises(ValueError, match="host 'x' named for two nodes"):
        slurm_script(node_launches(NAMED, plan_path="p", hosts=["x", "y", "x"]), plan_name="p")


# --- running the scripts against stub srun / ssh / scontrol ------------------------------------

# Stands in for srun and for ssh: records its arguments under the node rank found in them;
# the node STUB_FAIL_RANK exits 7 after a moment, the others run STUB_SLEEP_S seconds and
# leave a mark if they are stopped (SIGTERM) first.
_STUB = r"""#!/usr/bin/env bash
[[ "$*" =~ --node-rank=([0-9]+) ]] || exit 90
rank=${BASH_REMATCH[1]}
printf '%s\n' "$@" > "$STUB_DIR/args.$rank"
if [[ $rank == "$STUB_FAIL_RANK" ]]; then sleep 0.3; exit 7; fi
trap 'touch "$STUB_DIR/killed.$rank"; kill "$child" 2>/dev/null; exit 143' TERM
sleep "$STUB_SLEEP_S" & child=$!
wait "$child"
"""
# scontrol show hostnames LIST, for the plain comma-separated lists the tests set.
_SCONTROL = """#!/usr/bin/env bash
tr ',' '\n' <<< "$3"
"""


def _job_with_stubs(script: str, tmp_path: Path, *, stub: str) -> tuple[Path, Path]:
    """(the stub bin directory, the job script): srun and ssh run ``stub``, scontrol
    lists the hosts."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, text in (("srun", stub), ("ssh", stub), ("scontrol", _SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    path = tmp_path / "job.sh"
    path.write_text(script)
    return stubs, path


def _run(
    script: str, tmp_path: Path, *, fail_rank: int | None, sleep_s: float, env: dict[str, str]
) -> tuple[int, float]:
    stubs, path = _job_with_stubs(script, tmp_path, stub=_STUB)
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(path)],
        env={
            **os.environ,
            **env,
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "STUB_DIR": str(tmp_path),
            "STUB_FAIL_RANK": "" if fail_rank is None else str(fail_rank),
            "STUB_SLEEP_S": str(sleep_s),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, time.monotonic() - started


def _recorded(tmp_path: Path, rank: int) -> list[str]:
    return (tmp_path / f"args.{rank}").read_text().splitlines()


def _scripts(launches: list[NodeLaunch]) -> dict[str, str]:
    return {
        "slurm": slurm_script(launches, plan_name="p.json"),
        "ssh": shell_script(launches, plan_name="p.json", workdir="/shared dir"),
    }


@needs_bash
@pytest.mark.parametrize("kind", ["slurm", "ssh"])
def test_first_failing_node_stops_the_others_and_sets_the_exit_status(
    tmp_path: Path, kind: str
) -> None:
    script = _scripts(node_launches(MIXED, plan_path="p.json"))[kind]
    hosts = {f"SLURM_JOB_NODELIST_HET_GROUP_{k}": f"h{k}" for k in range(3)}
    status, elapsed_s = _run(script, tmp_path, fail_rank=1, sleep_s=30, env=hosts)
    assert status == 7
    assert elapsed_s < 15  # not the 30 s the other nodes would run
    assert (tmp_path / "killed.0").exists() and (tmp_path / "killed.2").exists()
    assert not (tmp_path / "killed.1").exists()


@needs_bash
@pytest.mark.parametrize("kind", ["slurm", "ssh"])
def test_all_nodes_succeeding_is_exit_0(tmp_path: Path, kind: str) -> None:
    script = _scripts(node_launches(MIXED, plan_path="p.json"))[kind]
    hosts = {f"SLURM_JOB_NODELIST_HET_GROUP_{k}": f"h{k}" for k in range(3)}
    status, _ = _run(script, tmp_path, fail_rank=None, sleep_s=0.5, env=hosts)
    assert status == 0
    assert all((tmp_path / f"args.{rank}").exists() for rank in range(3))
    assert not list(tmp_path.glob("killed.*"))


@needs_bash
def test_without_hosts_node_i_runs_on_the_ith_host_of_its_component(tmp_path: Path) -> None:
    script = slurm_script(node_launches(SHAPES, plan_path="p.json"), plan_name="p.json")
    # Slurm's node lists per component (4-GPU nodes, the 1-GPU node, the 2-GPU node).
    allocation = {0: ["n4", "n9", "n2"], 1: ["n7"], 2: ["n5"]}
    env = {f"SLURM_JOB_NODELIST_HET_GROUP_{k}": ",".join(v) for k, v in allocation.items()}
    status, _ = _run(script, tmp_path, fail_rank=None, sleep_s=0, env=env)
    assert status == 0
    counts = list(dict.fromkeys(node.num_gpus for node in SHAPES.nodes))
    for node in SHAPES.nodes:
        component = counts.index(node.num_gpus)
        position = [n.index for n in SHAPES.nodes if n.num_gpus == node.num_gpus].index(node.index)
        words = _recorded(tmp_path, node.index)
        assert f"--nodelist={allocation[component][position]}" in words
        assert "--master-addr=n4" in words  # node 0: the first host of component 0


@needs_bash
def test_ssh_script_runs_each_node_on_its_host_in_the_shared_directory(tmp_path: Path) -> None:
    script = shell_script(
        node_launches(NAMED, plan_path="my plan.json", train_args=["--note", "it's a b"]),
        plan_name="my plan.json",
        workdir="/shared dir",
    )
    status, _ = _run(script, tmp_path, fail_rank=None, sleep_s=0, env={})
    assert status == 0
    for node in NAMED.nodes:
        ssh_args = _recorded(tmp_path, node.index)
        assert ssh_args[:2] == ["-tt", node.host]
        # What the remote shell runs, split as it would split it.
        remote = shlex.split(ssh_args[2])
        assert remote[:3] == ["cd", "/shared dir", "&&"]
        assert remote[-4:] == ["--plan", "my plan.json", "--note", "it's a b"]


# --- the CLI ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def named_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plan for NAMED; it embeds the cluster, hosts included."""
    plan = search(
        NAMED, model=load_model("tiny"), job=JobSpec(global_batch_size=8, seq_len=64)
    ).best.plan
    path = tmp_path_factory.mktemp("named") / "plan.json"
    save_plan(plan, path)
    return path


@pytest.mark.slow
def test_cli_train_args_keep_their_shell_quoting(named_plan: Path, tmp_path: Path) -> None:
    path = named_plan
    train_args = """--steps 3 --note "two words" --other 'it"s'"""
    expected = shlex.split(train_args)
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(
        app,
        ["launch", "--plan", str(path), "--slurm", "--train-args", train_args, "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    for words in _steps(out.read_text()):
        assert words[-len(expected) :] == expected
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--train-args", train_args])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "torchrun" in line]
    assert len(lines) == 3 and all(
        shlex.split(line)[-len(expected) :] == expected for line in lines
    )
    result = CliRunner().invoke(
        app, ["launch", "--plan", str(path), "--train-args", "--note 'unclosed"]
    )
    assert result.exit_code == 2
    assert "--train-args" in result.output and "Traceback" not in result.output


def test_cli_uses_the_plans_hosts_and_no_gpus(named_plan: Path) -> None:
    path = named_plan
    result = CliRunner().invoke(app, ["launch", "--plan", str(path)])
    assert result.exit_code == 0, result.output
    assert [line.rsplit(" on ", 1)[1] for line in result.output.splitlines() if " on " in line] == [
        "gpu-b",
        "gpu-a",
        "old-1",
    ]
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--slurm", "--no-gpus"])
    assert result.exit_code == 0, result.output
    (only,) = _sbatch_components(result.output)
    assert only["--nodelist"] == "gpu-b,gpu-a,old-1" and "--gpus-per-node" not in only
    result = CliRunner().invoke(app, ["launch", "--plan", str(path), "--slurm", "--hosts", "x,y,x"])
    assert result.exit_code == 2 and "--hosts" in result.output


@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (["--hosts", "a,,b"], "--hosts"),  # an empty host
        (["--hosts", "a, ,b"], "--hosts"),
        (["--hosts", ""], "--hosts"),
        (["--hosts", "a,b;rm -rf ~,c"], "--hosts"),  # would run in the script's shell
        (["--hosts", "a,b b,c"], "--hosts"),
        (["--master-port", "-1"], "--master-port"),
        (["--master-port", "0"], "--master-port"),
        (["--master-port", "99999"], "--master-port"),
    ],
)
def test_finding_33_bad_hosts_and_ports_are_one_line_and_exit_2(
    named_plan: Path, tmp_path: Path, flags: list[str], option: str
) -> None:
    """Finding 33: launch refused nothing of --hosts a,,b or --master-port -1 / 99999."""
    for extra in ([], ["--slurm"], ["--out", str(tmp_path / "run.sh")]):
        result = CliRunner().invoke(app, ["launch", "--plan", str(named_plan), *flags, *extra])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and option in lines[0], result.output
        assert not (tmp_path / "run.sh").exists()


def test_finding_33_train_args_keep_quoted_words(named_plan: Path) -> None:
    """Finding 33: ``--train-args "--data 'my file.bin'"`` is two words, the path one."""
    result = CliRunner().invoke(
        app, ["launch", "--plan", str(named_plan), "--train-args", "--data 'my file.bin'"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "torchrun" in line]
    assert lines and all(shlex.split(line)[-2:] == ["--data", "my file.bin"] for line in lines)


def test_ports_and_hosts_at_the_edges_are_accepted(named_plan: Path) -> None:
    for port in ("1", "65535"):
        result = CliRunner().invoke(
            app,
            ["launch", "--plan", str(named_plan), "--master-port", port, "--hosts", "a,b.c,d-1"],
        )
        assert result.exit_code == 0, result.output
        assert result.output.count(f"--master-port={port}") == 3


# --- elastic ------------------------------------------------------------------------------------

ELASTIC = ElasticLaunch(min_nodes=2, run_id="piebald-abc", max_restarts=5)


def test_elastic_commands_use_torchruns_rendezvous_and_name_each_node() -> None:
    launches = node_launches(
        MIXED, plan_path="p.json", train_args=["--steps", "3"], elastic=ELASTIC, master_port=7
    )
    for launch, node in zip(launches, MIXED.nodes, strict=True):
        command = launch.command
        assert _option(command, "nnodes") == f"2:{len(MIXED.nodes)}"
        assert _option(command, "nproc-per-node") == str(node.num_gpus)
        assert _option(command, "rdzv-backend") == "c10d"
        assert _option(command, "rdzv-endpoint") == f"{MIXED.nodes[0].name}:7"
        assert _option(command, "rdzv-id") == "piebald-abc"
        assert _option(command, "max-restarts") == "5"
        # torchrun numbers the agents itself: no static rank, address or port.
        assert not any(part.startswith(("--node-rank", "--master-")) for part in command)
        assert command[-6:] == ("train", "--plan", "p.json", "--elastic", "--steps", "3")
        # torchrun's parser would take a --node after the script for its --node-rank.
        assert launch.environment[NODE_VARIABLE] == node.name
        assert "--node" not in command
        words = shlex.split(launch.shell_line())
        assert f"{NODE_VARIABLE}={node.name}" in words[: len(launch.environment)]


@pytest.mark.parametrize("minimum", [0, 4])
def test_elastic_minimum_is_a_number_of_the_clusters_nodes(minimum: int) -> None:
    with pytest.raises(ValueError, match=r"a minimum of 1\.\.3 nodes"):
        node_launches(
            MIXED,
            plan_path="p.json",
            elastic=ElasticLaunch(min_nodes=minimum, run_id="r"),
        )


def test_elastic_sbatch_keeps_the_other_nodes_and_finds_the_rendezvous_host() -> None:
    launches = node_launches(SHAPES, plan_path="p.json", elastic=ELASTIC)
    script = slurm_script(launches, plan_name="p.json")
    assert "#SBATCH --no-kill" in script.splitlines()[:3]
    for words in _steps(script):
        # The first host of component 0's allocation, as for a static launch's master.
        (endpoint,) = [w for w in words if w.startswith("--rdzv-endpoint=")]
        assert endpoint == "--rdzv-endpoint=$master:29500"
        assert words[-2:] == ["p.json", "--elastic"]
    named = slurm_script(node_launches(NAMED, plan_path="p", elastic=ELASTIC), plan_name="p")
    assert all("--rdzv-endpoint=gpu-b:29500" in words for words in _steps(named))


# Stands in for srun and ssh under --elastic: records its arguments under the node named in
# them (PIEBALD_NODE); the node STUB_FAIL_NODE exits 7 at once (lost), the others run
# STUB_SLEEP_S seconds and leave a mark if they are stopped first.
_ELASTIC_STUB = r"""#!/usr/bin/env bash
[[ "$*" =~ PIEBALD_NODE=([a-z0-9]+-[0-9]+) ]] || exit 90
node=${BASH_REMATCH[1]}
printf '%s\n' "$@" > "$STUB_DIR/args.$node"
if [[ $node == "$STUB_FAIL_NODE" ]]; then exit 7; fi
trap 'touch "$STUB_DIR/killed.$node"; kill "$child" 2>/dev/null; exit 143' TERM
sleep "$STUB_SLEEP_S" & child=$!
wait "$child"
exit "${STUB_STATUS:-0}"
"""


def _run_elastic(
    script: str, tmp_path: Path, *, fail: str, status: int = 0, sleep_s: float = 0.5
) -> subprocess.CompletedProcess[str]:
    stubs, path = _job_with_stubs(script, tmp_path, stub=_ELASTIC_STUB)
    return subprocess.run(
        ["bash", str(path)],
        env={
            **os.environ,
            "PATH": f"{stubs}:{os.environ['PATH']}",
            "STUB_DIR": str(tmp_path),
            "STUB_FAIL_NODE": fail,
            "STUB_SLEEP_S": str(sleep_s),
            "STUB_STATUS": str(status),
            **{f"SLURM_JOB_NODELIST_HET_GROUP_{k}": f"h{k}" for k in range(3)},
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_bash
@pytest.mark.parametrize("kind", ["slurm", "ssh"])
def test_elastic_scripts_outlive_a_lost_node(tmp_path: Path, kind: str) -> None:
    launches = node_launches(MIXED, plan_path="p.json", elastic=ELASTIC)
    script = _scripts(launches)[kind]
    lost = MIXED.nodes[1].name
    done = _run_elastic(script, tmp_path, fail=lost)
    # The others ran to their end, and finished the run: the job succeeded.
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("killed.*"))
    assert all((tmp_path / f"args.{node.name}").exists() for node in MIXED.nodes)
    assert "node 1 exited with status 7" in done.stderr
    # No node finished the run: the status of the first node that failed (the lost one,
    # seconds before the others).
    failed = _run_elastic(script, tmp_path, fail=lost, status=3, sleep_s=2.5)
    assert failed.returncode == 7, failed.stderr


@pytest.mark.parametrize(
    ("flags", "option"),
    [
        (["--elastic", "0"], "--elastic"),
        (["--elastic", "4"], "--elastic"),  # the cluster has 3 nodes
        (["--elastic", "-1"], "--elastic"),
        (["--elastic", "two"], "--elastic"),
        (["--elastic", "1.5"], "--elastic"),
        (["--max-restarts", "2"], "--max-restarts"),  # without --elastic
        (["--elastic", "2", "--max-restarts", "-1"], "--max-restarts"),
    ],
)
def test_bad_elastic_minimum_is_one_line_and_exit_2(
    named_plan: Path, tmp_path: Path, flags: list[str], option: str
) -> None:
    for extra in ([], ["--slurm"], ["--out", str(tmp_path / "run.sh")]):
        result = CliRunner().invoke(app, ["launch", "--plan", str(named_plan), *flags, *extra])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {option}"), result.output
        assert not (tmp_path / "run.sh").exists()


def test_cli_elastic_writes_elastic_scripts(named_plan: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["launch", "--plan", str(named_plan), "--elastic", "1"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "torchrun" in line]
    assert len(lines) == 3
    assert all("--nnodes=1:3" in line and "--max-restarts=3" in line for line in lines)
    # One rendezvous id for the job, from the plan file.
    assert len({word for line in lines for word in line.split() if "rdzv-id" in word}) == 1
    out = tmp_path / "job.sbatch"
    flags = ["--elastic", "3", "--max-restarts", "0", "--slurm", "--out", str(out)]
    result = CliRunner().invoke(app, ["launch", "--plan", str(named_plan), *flags])
    assert result.exit_code == 0, result.output
    script = out.read_text()
    assert "#SBATCH --no-kill" in script and script.count("--nnodes=3:3") == 3
    assert script.count("--max-restarts=0") == 3 and "--node-rank" not in script
