"""PassShape: built from a job in the dtype the device trains in, validated, and a cache key
that prices equal shapes once."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest

from cluster_builders import hand_model
from piebald.cost.compute import layer_backward_time_s
from piebald.cost.pass_shape import PassShape
from piebald.cost.pass_times import pass_times
from piebald.specs.devices import DeviceType, Dtype
from piebald.specs.job import JobSpec
from piebald.specs.recompute import Recompute

# No bf16 units, fp16 faster than fp32 (a V100): a bf16 job trains in fp16 there.
V100_LIKE = DeviceType(
    name="v100-like",
    memory_bytes=32e9,
    bf16_flops=0.0,
    fp16_flops=125e12,
    fp32_flops=15.7e12,
    memory_bandwidth_bytes_per_s=900e9,
)
JOB = JobSpec(global_batch_size=8, seq_len=128, precision=Dtype.BF16)


def test_for_job_takes_the_dtype_the_device_trains_in() -> None:
    shape = PassShape.for_job(JOB, device=V100_LIKE, micro_batch_size=2, recompute=Recompute.FULL)
    assert shape == PassShape(
        device=V100_LIKE,
        dtype=Dtype.FP16,
        micro_batch_size=2,
        seq_len=128,
        recompute=Recompute.FULL,
    )
    assert shape.num_tokens == 2 * 128


@pytest.mark.parametrize(("size", "seq_len"), [(0, 128), (2, 0), (-1, 5)])
def test_an_empty_pass_is_refused(size: int, seq_len: int) -> None:
    with pytest.raises(ValueError, match=f"micro_batch_size = {size}, seq_len = {seq_len}"):
        PassShape(
            device=V100_LIKE,
            dtype=Dtype.FP16,
            micro_batch_size=size,
            seq_len=seq_len,
            recompute=Recompute.NONE,
        )


def test_equal_shapes_share_one_cache_entry_and_recompute_adds_a_forward() -> None:
    model = hand_model(3)

    def shape(recompute: Recompute) -> PassShape:
        return PassShape.for_job(JOB, device=V100_LIKE, micro_batch_size=2, recompute=recompute)

    none, full = Recompute.NONE, Recompute.FULL
    assert shape(none) is not shape(none) and hash(shape(none)) == hash(shape(none))
    plain = pass_times(model, shape=shape(none))
    assert pass_times(model, shape=shape(none)) is plain  # a cache hit
    recomputed = pass_times(model, shape=shape(full))
    blocks = (1, model.num_layers - 1)
    # Recompute runs (most of) each block's forward again in its backward; the forward is
    # unchanged.
    assert recomputed.forward_s(*blocks) == plain.forward_s(*blocks)
    again = sum(
        layer_backward_time_s(layer, shape=shape(full))
        for layer in model.layers[blocks[0] : blocks[1]]
    )
    assert recomputed.backward_s(*blocks) == pytest.approx(again, rel=1e-12)
    assert plain.backward_s(*blocks) < again < plain.backward_s(*blocks) + plain.forward_s(*blocks)
    for end in (0, model.num_layers - 1):  # the embedding and the head are never recomputed
        # (differences of prefix sums: equal to rounding)
        assert recomputed.backward_s(end, end + 1) == pytest.approx(
            plain.backward_s(end, end + 1), rel=1e-12
        )


def test_a_pickled_shape_hashes_as_one_built_in_the_other_process() -> None:
    """The hash is computed once per object; a pickle carries the fields, not the hash
    (string hashes differ between processes)."""
    shape = PassShape.for_job(JOB, device=V100_LIKE, micro_batch_size=2, recompute=Recompute.NONE)
    assert pickle.loads(pickle.dumps(shape)) == shape
    assert copy.deepcopy(shape) == shape and hash(copy.copy(shape)) == hash(shape)
    code = (
        "import pickle, sys; shape = pickle.loads(sys.stdin.buffer.read()); "
        "from piebald.cost.pass_shape import PassShape; import dataclasses; "
        "fresh = dataclasses.replace(shape); print(hash(shape) == hash(fresh), shape == fresh)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(shape),
        capture_output=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": ":".join(sys.path)},
    )
    assert result.stdout.split() == [b"True", b"True"]
