"""``piebald launch``: every node's torchrun gives the plan's global ranks; scripts parse."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster_builders import cluster, group
from piebald.cli import app
from piebald.launch import node_launches, slurm_script
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


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to parse the script")
def test_slurm_script_is_valid_bash_with_one_step_per_node(tmp_path: Path) -> None:
    script = slurm_script(node_launches(MIXED, plan_path="plan.json"), plan_name="plan.json")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    subprocess.run(["bash", "-n", str(path)], check=True)
    assert "#SBATCH --nodes=3" in script
    assert script.count("srun ") == 3
    assert '--master-addr="$master"' in script and "--master-addr=a100-0" not in script


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
