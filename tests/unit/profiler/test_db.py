"""ProfileDB: deterministic names, lossless round trip, merging by copying (conflicts keep
both runs and combine by median), and one-line errors naming file and field."""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from piebald.errors import SpecError
from piebald.profiler.db import (
    content_digest,
    load_profile_db,
    merge_profile_dbs,
    profile_file_name,
    write_profile,
)
from piebald.profiler.fit import fit_alpha_beta
from piebald.profiler.keys import layer_signature
from piebald.profiler.records import NetworkKey, NetworkKind, NetworkProfile
from piebald.specs.model import HfModelType, LayerKind
from piebald.specs.presets import PRESETS

from .conftest import MakeProfile, provenance


def _network(
    times: tuple[float, ...], created: str = "2026-01-01T00:00:00+00:00"
) -> NetworkProfile:
    sizes = (1e6, 4e6, 16e6)
    fit = fit_alpha_beta(sizes, times)
    return NetworkProfile(
        key=NetworkKey(kind=NetworkKind.P2P, scope="inter-node", groups=("a", "b"), num_ranks=2),
        backend="gloo",
        message_bytes=sizes,
        time_s=times,
        latency_s=fit.latency_s,
        bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s,
        provenance=provenance(created),
    )


def test_round_trip_and_deterministic_names(tmp_path: Path, profile_of: MakeProfile) -> None:
    profile = profile_of()
    path = write_profile(profile, tmp_path)
    assert path.name == profile_file_name(profile_of())  # same content, same name
    assert path.name.startswith("compute--cpu-a--block-llama-h64-a4-kv2-d16-f176--s32--fp32--")
    assert write_profile(profile, tmp_path) == path  # writing again is a no-op
    network = _network((1e-3, 2e-3, 6e-3))
    write_profile(network, tmp_path)
    db = load_profile_db(tmp_path)
    assert db.num_files == 2
    assert db.compute(profile.key) == profile
    assert db.network(network.key) == network


def test_merging_two_machines_gives_one_usable_db(tmp_path: Path, profile_of: MakeProfile) -> None:
    first, second, merged = tmp_path / "a", tmp_path / "b", tmp_path / "merged"
    for kind in LayerKind:
        write_profile(profile_of(device="cpu-a", kind=kind), first)
        write_profile(profile_of(device="cpu-b", kind=kind, forward_s=(3e-3, 5e-3)), second)
    copied = merge_profile_dbs([first, second], merged)
    assert len(copied) == 6
    assert merge_profile_dbs([first, second], merged) == []  # idempotent
    db = load_profile_db(merged)
    assert db.devices == ("cpu-a", "cpu-b")
    assert len(db.compute_runs) == 6
    # Merging in the other order gives the same files, hence the same DB identity.
    other = tmp_path / "other"
    merge_profile_dbs([second, first], other)
    assert load_profile_db(other).digest == db.digest


def test_conflicting_runs_are_both_kept_and_combined_by_median(
    tmp_path: Path, profile_of: MakeProfile
) -> None:
    runs = [
        profile_of(sizes=(1, 2), forward_s=(1e-3, 2e-3), host="m1"),
        profile_of(sizes=(1, 2, 4), forward_s=(3e-3, 4e-3, 8e-3), host="m2"),
        profile_of(sizes=(2,), forward_s=(9e-3,), host="m3", created="2026-02-01T00:00:00+00:00"),
    ]
    for index, run in enumerate(runs):
        write_profile(run, tmp_path / f"m{index}")
    merge_profile_dbs([tmp_path / f"m{index}" for index in range(3)], tmp_path / "all")
    db = load_profile_db(tmp_path / "all")
    assert db.num_files == 3 and len(db.compute_runs) == 1
    combined = db.compute(runs[0].key)
    assert combined is not None
    by_size = {t.micro_batch_size: t for t in combined.timings}
    assert sorted(by_size) == [1, 2, 4]  # the union of the sizes
    assert by_size[1].forward_s == pytest.approx(statistics.median([1e-3, 3e-3]))
    assert by_size[2].forward_s == pytest.approx(statistics.median([2e-3, 4e-3, 9e-3]))
    assert by_size[4].forward_s == pytest.approx(8e-3)
    assert combined.provenance.host == "m3"  # the newest run's provenance


def test_network_runs_combine_by_median_and_refit(tmp_path: Path) -> None:
    write_profile(_network((1e-3, 2e-3, 6e-3)), tmp_path)
    write_profile(_network((3e-3, 4e-3, 8e-3), created="2026-03-01T00:00:00+00:00"), tmp_path)
    db = load_profile_db(tmp_path)
    (key,) = db.network_runs
    combined = db.network(key)
    assert combined is not None
    assert combined.time_s == pytest.approx((2e-3, 3e-3, 7e-3))
    refit = fit_alpha_beta(combined.message_bytes, combined.time_s)
    assert combined.latency_s == pytest.approx(refit.latency_s)


def _written(tmp_path: Path, profile_of: MakeProfile) -> Path:
    return write_profile(profile_of(), tmp_path)


def _rewrite(path: Path, change: dict[str, object]) -> None:
    data = json.loads(path.read_text())
    data.update(change)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "field", "expected"),
    [
        ({"version": 0}, "version", "profile format version 1"),
        ({"seq_len": "32"}, "seq_len", "a whole number"),
        ({"dtype": "fp8"}, "dtype", "one of"),
        ({"timings": []}, "timings", "non-empty"),
        ({"layer_kind": "head"}, "signature", "mixes two layers"),
        ({"colour": "red"}, "colour", "one of the fields"),
    ],
)
def test_bad_files_are_one_line_errors_naming_file_and_field(
    tmp_path: Path, profile_of: MakeProfile, change: dict[str, object], field: str, expected: str
) -> None:
    path = _written(tmp_path, profile_of)
    _rewrite(path, change)
    with pytest.raises(SpecError) as caught:
        load_profile_db(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert path.name in message and field in message and expected in message


def test_a_file_from_an_older_version_still_loads(tmp_path: Path, profile_of: MakeProfile) -> None:
    """A profile written before the model gained fields (sliding_window, the biases, ...)
    is checked against the digest of its own content, not of what this version writes:
    it loads, with the fields' defaults, and measures what it measured."""
    path = _written(tmp_path, profile_of)
    written = load_profile_db(tmp_path)
    data = json.loads(path.read_text())
    for newer in ("sliding_window", "mlp_bias", "attention_out_bias", "hf_model_type"):
        data["model"].pop(newer, None)
    path.unlink()
    stem = path.name.rsplit("--", 1)[0]
    (tmp_path / f"{stem}--{content_digest(data)}.json").write_text(json.dumps(data))
    older = load_profile_db(tmp_path)
    assert older.compute_runs.keys() == written.compute_runs.keys()
    for key, runs in older.compute_runs.items():
        assert [run.timings for run in runs] == [run.timings for run in written.compute_runs[key]]


def test_edited_content_and_renamed_files_are_refused(
    tmp_path: Path, profile_of: MakeProfile
) -> None:
    path = _written(tmp_path, profile_of)
    data = json.loads(path.read_text())
    data["timings"][0]["forward_s"] = 1.0  # valid, but not what was measured under this name
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="digest does not match"):
        load_profile_db(tmp_path)
    path.unlink()
    path = _written(tmp_path, profile_of)
    shutil.move(path, tmp_path / "compute--gpu--x.json")
    with pytest.raises(SpecError, match="renamed"):
        load_profile_db(tmp_path)


def test_corrupt_json_and_missing_directory(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(SpecError, match=r"broken\.json.*readable JSON"):
        load_profile_db(tmp_path)
    with pytest.raises(SpecError, match="profile DB directory"):
        load_profile_db(tmp_path / "absent")


def test_merge_refuses_a_broken_source(tmp_path: Path, profile_of: MakeProfile) -> None:
    path = _written(tmp_path / "src", profile_of)
    _rewrite(path, {"version": 99})
    with pytest.raises(SpecError, match="version"):
        merge_profile_dbs([tmp_path / "src"], tmp_path / "into")
    assert not (tmp_path / "into").exists()


def test_blocks_with_biases_get_their_own_signature() -> None:
    """A Qwen2 block does more work than a Llama block of the same shape: their profiles must
    not be shared; a bias-free block keeps the signature older profile files carry."""
    llama = PRESETS["tiny"]
    qwen2 = replace(llama, hf_model_type=HfModelType.QWEN2, attention_qkv_bias=True)
    biased = replace(llama, attention_qkv_bias=True, attention_out_bias=True, mlp_bias=True)
    assert layer_signature(llama, LayerKind.BLOCK) == "block-llama-h64-a4-kv2-d16-f176"
    assert layer_signature(qwen2, LayerKind.BLOCK) == "block-llama-h64-a4-kv2-d16-f176-bqkv"
    assert layer_signature(biased, LayerKind.BLOCK).endswith("-bqkv-bo-bmlp")
