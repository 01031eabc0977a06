"""Malformed and inconsistent cluster files: one SpecError line naming file, field, expectation.

Each case is a small YAML file with one mistake. The loader must raise
:class:`~piebald.errors.SpecError` (never a traceback from deeper down) whose message is a
single line that names the file and the offending field and says what was expected. The CLI
must print that line on stderr, prefixed ``error:``, and exit with code 2.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from piebald import __version__
from piebald.cli import app
from piebald.errors import SpecError
from piebald.examples import example_path
from piebald.specs.cluster_yaml import load_cluster

VALID_GROUP = "{name: a, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600GB/s}"


@dataclass(frozen=True)
class Case:
    """A cluster file with one mistake and what its error must say."""

    id: str
    text: str
    field: str  # SpecError.field; "" for problems with the file itself
    says: tuple[str, ...] = ()  # substrings the message must contain


CASES = [
    Case(
        "unknown-gpu",
        "name: x\nnodes:\n  - {name: a, gpu: A100-80G, gpus_per_node: 2, intra_link: 600GB/s}\n",
        "nodes[0].gpu",
        ("'A100-80G'", "did you mean 'A100-80GB'"),
    ),
    Case(
        "missing-gpus-per-node",
        "name: x\nnodes:\n  - {name: a, gpu: A100-80GB, intra_link: 600GB/s}\n",
        "nodes[0].gpus_per_node",
        ("required",),
    ),
    Case(
        "bad-bandwidth-unit",
        "name: x\nnodes:\n  - {name: a, gpu: A100-80GB, gpus_per_node: 1,"
        " nic: {kind: infiniband, bandwidth: 200Gbit}}\n",
        "nodes[0].nic.bandwidth",
        ("'200Gbit'", "200Gb/s"),
    ),
    Case(
        "bad-intra-link-unit",
        "name: x\nnodes:\n  - {name: a, gpu: A100-80GB, gpus_per_node: 2, intra_link: 600}\n",
        "nodes[0].intra_link",
        ("600", "unit"),
    ),
    Case(
        "negative-count",
        "name: x\nnodes:\n  - {name: a, count: -2, gpu: T4, gpus_per_node: 1}\n",
        "nodes[0].count",
        ("-2", ">= 1"),
    ),
    Case(
        "zero-gpus-per-node",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 0}\n",
        "nodes[0].gpus_per_node",
        ("0", ">= 1"),
    ),
    Case(
        "fractional-count",
        "name: x\nnodes:\n  - {name: a, count: 1.5, gpu: T4, gpus_per_node: 1}\n",
        "nodes[0].count",
        ("1.5", "whole number"),
    ),
    Case(
        "intra-link-required-with-several-gpus",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 4}\n",
        "nodes[0].intra_link",
        ("required",),
    ),
    Case(
        "unknown-nic-kind",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1,"
        " nic: {kind: infiniband2, bandwidth: 200Gb/s}}\n",
        "nodes[0].nic.kind",
        ("'infiniband2'", "did you mean 'infiniband'"),
    ),
    Case(
        "site-link-to-unknown-site",
        "name: x\nnodes:\n"
        "  - {name: a, gpu: T4, gpus_per_node: 1, site: dc1}\n"
        "  - {name: b, gpu: T4, gpus_per_node: 1, site: dc2}\n"
        "sites:\n  - {between: [dc1, dc3], bandwidth: 10Gb/s}\n",
        "sites[0].between",
        ("'dc3'", "site"),
    ),
    Case(
        "sites-without-link",
        "name: x\nnodes:\n"
        "  - {name: a, gpu: T4, gpus_per_node: 1, site: dc1}\n"
        "  - {name: b, gpu: T4, gpus_per_node: 1, site: dc2}\n",
        "sites",
        ("'dc1'", "'dc2'", "link"),
    ),
    Case(
        "duplicate-group-name",
        f"name: x\nnodes:\n  - {VALID_GROUP}\n  - {VALID_GROUP}\n",
        "nodes[1].name",
        ("'a'", "not used before"),
    ),
    Case(
        "unknown-top-level-key",
        f"name: x\nnode:\n  - {VALID_GROUP}\n",
        "node",
        ("did you mean 'nodes'",),
    ),
    Case(
        "unknown-group-key",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1, gpus_per_nodes: 2}\n",
        "nodes[0].gpus_per_nodes",
        ("did you mean 'gpus_per_node'",),
    ),
    Case(
        "missing-name",
        f"nodes:\n  - {VALID_GROUP}\n",
        "name",
        ("required",),
    ),
    Case(
        "no-node-groups",
        "name: x\nnodes: []\n",
        "nodes",
        ("non-empty",),
    ),
    Case(
        "nodes-not-a-list",
        "name: x\nnodes: {name: a}\n",
        "nodes",
        ("a list",),
    ),
    Case(
        "yaml-syntax-error",
        "name: x\n  y: z\n",  # a mapping value where none may start: line 2
        "",
        ("valid YAML", "line 2"),
    ),
    Case(
        "yaml-tab",
        "name: x\nnodes:\n\t- a\n",  # YAML forbids tabs for indentation: line 3
        "",
        ("valid YAML", "line 3"),
    ),
    Case(
        "empty-file",
        "",
        "<top level>",
        ("None", "mapping"),
    ),
    Case(
        "top-level-list",
        f"- {VALID_GROUP}\n",
        "<top level>",
        ("mapping",),
    ),
    # hosts: one plain host name per node, none twice in the file, on every group or none.
    Case(
        "hosts-count",
        "name: x\nnodes:\n  - {name: a, count: 2, gpu: T4, gpus_per_node: 1, hosts: [n1]}\n",
        "nodes[0].hosts",
        ("['n1']", "2 host names, one per node"),
    ),
    Case(
        "hosts-not-a-list",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1, hosts: n1}\n",
        "nodes[0].hosts",
        ("'n1'", "a list"),
    ),
    Case(
        "hosts-bad-characters",
        "name: x\nnodes:\n  - {name: a, count: 2, gpu: T4, gpus_per_node: 1,"
        " hosts: [n1, 'n2;rm -rf']}\n",
        "nodes[0].hosts",
        ("'n2;rm -rf'", "host name of letters, digits"),
    ),
    Case(
        "hosts-not-strings",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1, hosts: [7]}\n",
        "nodes[0].hosts",
        ("got 7", "host name"),
    ),
    Case(
        "hosts-duplicate-across-groups",
        "name: x\nnodes:\n  - {name: a, count: 2, gpu: T4, gpus_per_node: 1, hosts: [n1, n2]}\n"
        "  - {name: b, gpu: L4, gpus_per_node: 1, hosts: [n2]}\n",
        "nodes[1].hosts",
        ("'n2'", "not named before"),
    ),
    Case(
        "hosts-on-some-groups-only",
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1, hosts: [n1]}\n"
        "  - {name: b, gpu: L4, gpus_per_node: 1}\n",
        "nodes[1].hosts",
        ("group 'a' names its hosts", "every group's hosts or none"),
    ),
]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def assert_one_line_naming(message: str, *, source: str, field: str) -> None:
    assert "\n" not in message, message
    assert message.startswith(source), message
    if field:
        assert f": {field}:" in message, message
    assert "expected " in message, message


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_file_gives_one_line_spec_error(tmp_path: Path, case: Case) -> None:
    path = write(tmp_path, case.text)
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    error = caught.value
    assert error.source == str(path)
    assert error.field == case.field
    message = str(error)
    assert_one_line_naming(message, source=str(path), field=case.field)
    for fragment in case.says:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert_one_line_naming(message, source=str(path), field="")
    assert "No such file or directory" in message


def test_a_fifo_is_refused_unread(tmp_path: Path) -> None:
    """A named pipe would block the reader forever: it is refused before it is opened."""
    path = tmp_path / "cluster.yaml"
    os.mkfifo(path)
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    assert_one_line_naming(str(caught.value), source=str(path), field="")
    assert "named pipe" in str(caught.value)


def test_a_directory_is_not_a_cluster_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load_cluster(tmp_path)
    assert_one_line_naming(str(caught.value), source=str(tmp_path), field="")


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    assert_one_line_naming(str(caught.value), source=str(path), field="")
    assert "UTF-8" in str(caught.value)


def test_long_values_are_shortened_to_keep_the_line_readable(tmp_path: Path) -> None:
    path = write(
        tmp_path, f"name: x\nnodes:\n  - {{name: a, gpu: {'Z' * 500}, gpus_per_node: 1}}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    message = str(caught.value)
    assert "..." in message
    assert "Z" * 100 not in message


# --- PyYAML and float corner cases that once escaped the loader as other exceptions


def test_huge_integer_tflops_is_a_spec_error(tmp_path: Path) -> None:
    huge = "1" + "0" * 400
    path = write(
        tmp_path,
        "name: x\ngpu_types:\n"
        f"  - {{name: G, memory: 1GB, fp32_tflops: {huge}, memory_bandwidth: 1GB/s}}\n"
        "nodes:\n  - {name: a, gpu: G, gpus_per_node: 1}\n",
    )
    with pytest.raises(SpecError):
        load_cluster(path)


# PyYAML's SafeConstructor raises plain Python exceptions (not yaml.YAMLError) for
# impossible dates and for explicitly tagged scalars it cannot convert, and its composer
# recurses once per nesting level; read_yaml turns all of them into SpecError.
def _escapes(text: str, exception: type[Exception], case_id: str) -> object:
    del exception  # what PyYAML raised before read_yaml caught it; kept for the reader
    return pytest.param(text, id=case_id)


YAML_CONSTRUCTOR_CRASHES = [
    _escapes("name: 2024-02-30\n", ValueError, "impossible-date"),
    _escapes("name: 2024-13-01\n", ValueError, "month-13"),
    _escapes("name: !!int\n", IndexError, "empty-int-tag"),
    _escapes("name: !!int abc\n", ValueError, "int-tag-on-text"),
    _escapes("name: !!float ''\n", IndexError, "empty-float-tag"),
    _escapes("name: !!bool x\n", KeyError, "bool-tag-on-text"),
    _escapes("name: !!timestamp x\n", AttributeError, "timestamp-tag-on-text"),
    _escapes("name: " + "[" * 5000 + "]" * 5000 + "\n", RecursionError, "deep-nesting"),
]


@pytest.mark.parametrize("text", YAML_CONSTRUCTOR_CRASHES)
def test_yaml_constructor_failures_are_spec_errors(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    assert_one_line_naming(str(caught.value), source=str(path), field="")


def test_tflops_overflowing_to_infinity_is_a_spec_error(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: x\ngpu_types:\n"
        "  - {name: G, memory: 1GB, fp32_tflops: 1.0e+300, memory_bandwidth: 1GB/s}\n"
        "nodes:\n  - {name: a, gpu: G, gpus_per_node: 1}\n",
    )
    with pytest.raises(SpecError):
        load_cluster(path)


# --- the CLI -------------------------------------------------------------------------------


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def stderr_of(result: Result) -> str:
    """stderr alone where this typer/click keeps it apart, else the mixed output."""
    try:
        text = result.stderr
    except ValueError:  # older click with mix_stderr=True
        text = None
    return text if text is not None else result.output


CLI_CASES = [
    case
    for case in CASES
    if case.id
    in {
        "unknown-gpu",
        "missing-gpus-per-node",
        "bad-bandwidth-unit",
        "negative-count",
        "sites-without-link",
        "unknown-top-level-key",
        "yaml-syntax-error",
        "empty-file",
        "top-level-list",
    }
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[case.id for case in CLI_CASES])
def test_cli_prints_one_error_line_and_exits_2(tmp_path: Path, case: Case) -> None:
    path = write(tmp_path, case.text)
    result = invoke("check-cluster", str(path))
    assert result.exit_code == 2, result.output
    lines = [line for line in stderr_of(result).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error:")
    assert str(path) in lines[0]
    assert "Traceback" not in result.output
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    assert lines[0] == f"error: {caught.value}"


def test_cli_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    result = invoke("check-cluster", str(path))
    assert result.exit_code == 2
    lines = [line for line in stderr_of(result).splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert str(path) in lines[0]
    assert "Traceback" not in result.output


def test_cli_error_line_keeps_square_brackets(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "name: x\nnodes:\n  - {name: a, gpu: T4, gpus_per_node: 1, site: dc1}\n"
        "sites:\n  - {between: [dc1], bandwidth: 10Gb/s}\n",
    )
    with pytest.raises(SpecError) as caught:
        load_cluster(path)
    assert "[dc1, dc2]" in str(caught.value)  # the loader's message is right ...
    result = invoke("check-cluster", str(path))
    assert result.exit_code == 2
    assert f"error: {caught.value}" in stderr_of(result)  # ... the CLI drops the hint


def test_cli_value_that_looks_like_markup(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nnodes:\n  - {name: a, gpu: '[/x]', gpus_per_node: 1}\n")
    result = invoke("check-cluster", str(path))
    assert result.exit_code == 2, repr(result.exception)
    lines = [line for line in stderr_of(result).splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error:")


def test_cli_check_cluster_on_the_example() -> None:
    result = invoke("check-cluster", str(example_path()))
    assert result.exit_code == 0, result.output
    for gpu in ("A100-80GB", "V100-32GB", "MyGPU-24GB"):
        assert gpu in result.stdout
    assert "error" not in stderr_of(result)


def test_cli_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert __version__ in result.stdout
