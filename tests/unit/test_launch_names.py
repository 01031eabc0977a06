r"""Names that reach a launch script cannot add shell commands to it.

The plan file's name, the cluster's name, group names, site names and host names come from
files and command lines. For any such names, a cluster is either refused in one line or
every script ``launch`` writes (ssh and sbatch) keeps its shape.

The oracle, and why it is sound: bash splits a script into commands at newlines and
control operators outside quotes, ends a comment at the newline, and expands ``$``,
backticks, ``~`` and globs outside single quotes; inside single quotes, after a backslash,
and in double quotes holding none of ``$ ` \``, everything is literal. Each script is
compared with the one written for benign names (same nodes and GPUs): it must be the same
text once comments are one mark and every run of literal text and plain word characters
(letters, digits and ``_ . / - @ % + = : ,``, those ``shlex.quote`` leaves bare) is one
mark. Words then keep their places, so a word from a name is an argument where the benign
one is (an ``=`` in it assigns nothing), and text from a name can start no command.
``#SBATCH`` comments, which sbatch reads, must keep their shape too; the remote command of
``ssh``, which the remote shell parses again, is checked the same way. Finally ``bash -n``
parses the script.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from piebald.cli import app
from piebald.errors import SpecError
from piebald.launch import node_launches, shell_script, slurm_script
from piebald.planner.search import search
from piebald.specs.cluster_yaml import parse_cluster
from piebald.specs.job import JobSpec
from piebald.specs.plan_io import save_plan
from piebald.specs.presets import load_model

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="parses a bash script")

_HOSTILE = [
    "a\n",
    "a\ntouch PWNED\n",
    "\n#SBATCH --wrap=id",
    "x\x00y",
    "x\ry",
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "a && b",
    "a|b",
    "${IFS}",
    "-oProxyCommand=id",
    "dé\u2028jà",
    "\u0085next",
    "tab\there",
    "back\\slash",
    "#hash",
    "x" * 300,
]
_ALPHABET = st.sampled_from(list("ab0-._ \n\r\t\x00\x1b'\"$`()[]{};&|<>\\#*?~!,=\u2028\u0085é漢"))
_NAME = st.one_of(
    st.sampled_from(_HOSTILE),
    st.text(_ALPHABET, min_size=1, max_size=12),
    st.text(min_size=1, max_size=12),
    st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True),  # plain names: valid clusters
)


def _cluster(names: dict[str, Any], *, with_hosts: bool) -> dict[str, Any]:
    groups = []
    for index, (count, gpus) in enumerate(((2, 2), (1, 1))):
        group: dict[str, Any] = {
            "name": names["groups"][index],
            "gpu": "A100-80GB" if index == 0 else "T4",
            "gpus_per_node": gpus,
            "count": count,
            "intra_link": "64GB/s",
            "site": names["site"],
        }
        if with_hosts:
            group["hosts"] = names["hosts"][index][:count]
        groups.append(group)
    return {"name": names["cluster"], "nodes": groups}


_BENIGN = {
    "cluster": "c",
    "site": "s",
    "groups": ["g0", "g1"],
    "hosts": [["h0", "h1"], ["h2"]],
    "plan": "p.json",
}


def _scan(script: str) -> tuple[str, list[str]]:
    """The script's shape (what bash interprets: literal text, that is single-quoted or
    escaped, and runs of word characters as one mark; comments as a mark unless sbatch
    reads them) and its words' values (quotes removed)."""
    shape: list[str] = []
    words: list[str] = []
    word: list[str] | None = None
    index = 0
    while index < len(script):
        char = script[index]
        if char in " \t\n":
            if word is not None:
                words.append("".join(word))
                word = None
            shape.append(char)
            index += 1
            continue
        if word is None and char == "#":  # a comment, to the end of the line
            end = script.find("\n", index)
            end = len(script) if end < 0 else end
            comment = script[index:end]
            shape.append(comment if comment.startswith("#SBATCH") else "#c")
            index = end
            continue
        word = [] if word is None else word
        if char == "'":
            end = script.index("'", index + 1)
            word.append(script[index + 1 : end])
            shape.append("w")  # literal, like word characters
            index = end + 1
        elif char == '"':
            end = index + 1
            while script[end] != '"':
                end += 2 if script[end] == "\\" else 1
            content = script[index + 1 : end]
            word.append(content)  # (escapes kept: the remote command has none)
            # without $, ` or \ it is literal; with them bash expands what it holds
            shape.append(f'"{content}"' if re.search(r"[$`\\]", content) else "w")
            index = end + 1
        elif char == "\\":
            word.append(script[index + 1])
            shape.append("w")
            index += 2
        else:  # plain text
            word.append(char)
            shape.append(char)
            index += 1
    if word is not None:
        words.append("".join(word))
    return re.sub(r"[A-Za-z0-9_./@%+=:,-]+", "w", "".join(shape)), words


def _same_shape(real: str, benign: str) -> None:
    (real_shape, real_words), (benign_shape, benign_words) = _scan(real), _scan(benign)
    assert real_shape == benign_shape, real
    for index, word in enumerate(benign_words):
        if word == "ssh":  # ssh HOST 'REMOTE': the remote shell parses REMOTE again
            _same_shape(real_words[index + 3], benign_words[index + 3])


def _scripts(names: dict[str, Any], *, with_hosts: bool) -> list[str]:
    cluster = parse_cluster(_cluster(names, with_hosts=with_hosts), source="cluster.yaml")
    launches = node_launches(cluster, plan_path=f"runs/{names['plan']}", train_args=["--x", "y"])
    return [
        shell_script(launches, plan_name=names["plan"], workdir="/shared/work dir"),
        slurm_script(launches, plan_name=names["plan"]),
        slurm_script(launches, plan_name=names["plan"], request_gpus=False),
    ]


@needs_bash
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=_NAME,
    site=_NAME,
    groups=st.lists(_NAME, min_size=2, max_size=2),
    hosts=st.lists(_NAME, min_size=3, max_size=3),
    plan=_NAME,
    with_hosts=st.booleans(),
)
def test_names_are_refused_in_one_line_or_cannot_inject_commands(
    cluster: str, site: str, groups: list[str], hosts: list[str], plan: str, with_hosts: bool
) -> None:
    names = {
        "cluster": cluster,
        "site": site,
        "groups": groups,
        "hosts": [hosts[:2], hosts[2:]],
        "plan": plan,
    }
    try:
        scripts = _scripts(names, with_hosts=with_hosts)
    except SpecError as error:
        assert "\n" not in str(error) and str(error).startswith("cluster.yaml: ")
        return
    benign = _scripts(_BENIGN, with_hosts=with_hosts)
    for script, reference in zip(scripts, benign, strict=True):
        _same_shape(script, reference)
        parsed = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert parsed.returncode == 0, (parsed.stderr, script)


@pytest.mark.parametrize("name", ["a\n", "a100\n", "a\x00", "a b", "a\u2028"])
def test_group_and_host_names_with_a_line_break_are_refused(name: str) -> None:
    """A pattern with ``$`` matched before a trailing newline; names are matched whole."""
    for field, names in (
        ("nodes[0].name", {**_BENIGN, "groups": [name, "g1"]}),
        ("nodes[0].hosts", {**_BENIGN, "hosts": [[name, "h1"], ["h2"]]}),
        ("name", {**_BENIGN, "cluster": name}),
        ("nodes[0].site", {**_BENIGN, "site": name}),
    ):
        if field in ("name", "nodes[0].site") and name == "a b":
            continue  # a space is fine where the name never reaches a script unquoted
        with pytest.raises(SpecError) as caught:
            parse_cluster(_cluster(names, with_hosts=True), source="c.yaml")
        assert f"c.yaml: {field}" in str(caught.value) and "\n" not in str(caught.value)


@needs_bash
@pytest.mark.slow
@pytest.mark.parametrize("slurm", [False, True])
def test_cli_plan_file_name_cannot_inject_a_command(tmp_path: Path, slurm: bool) -> None:
    """The plan file ``p<newline>touch PWNED<newline>.json`` went into a comment line."""
    cluster = parse_cluster(_cluster(_BENIGN, with_hosts=True), source="c.yaml")
    plan = search(
        cluster, model=load_model("tiny"), job=JobSpec(global_batch_size=8, seq_len=64)
    ).best.plan
    path = tmp_path / "p\ntouch PWNED\n.json"
    save_plan(plan, path)
    out = tmp_path / "job.sh"
    result = CliRunner().invoke(
        app, ["launch", "--plan", str(path), "--out", str(out), *(["--slurm"] if slurm else [])]
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "p\\ntouch PWNED\\n.json" in text  # escaped in the comment
    # Run it: ssh, srun and scontrol do nothing, and `touch` would leave a mark.
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in (("ssh", "exit 0"), ("srun", "exit 0"), ("touch", "echo RAN >> MARK")):
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    (stubs / "scontrol").write_text("#!/bin/sh\nprintf 'h0\\nh1\\nh2\\n'\n")
    (stubs / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(out)], check=True, cwd=tmp_path, env=env, timeout=60)
    assert not (tmp_path / "MARK").exists() and not (tmp_path / "PWNED").exists()
