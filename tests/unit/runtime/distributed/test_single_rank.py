"""The sharded optimizer and checkpoints on a group of one rank (no processes to spawn):
equal to torch's AdamW and clip_grad_norm_, loss scaling, ZeRO FULL release/gather, and
atomic checkpoints with clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from dist_harness import SHAPES, StageSpec, build_params, make_plan, reference_loss

from piebald.cost.memory import adamw_temporary_elements
from piebald.errors import SpecError
from piebald.runtime.distributed import checkpoint as checkpoint_module
from piebald.runtime.distributed.checkpoint import (
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.distributed.group_layout import BucketPlacement
from piebald.runtime.distributed.groups import single_rank_group
from piebald.runtime.distributed.loss_scaler import DynamicLossScaler, LossScalerConfig
from piebald.runtime.distributed.optimizer import (
    OptimizerConfig,
    ShardedOptimizer,
    build_reference_optimizer,
)
from piebald.runtime.distributed.tensor_slice import TensorSlice
from piebald.runtime.training.memory_meter import MemoryMeter
from piebald.specs.job import Optimizer
from piebald.specs.plan import ZeroMode
from small_disk import fill, small_disk

PLAN = make_plan(
    [StageSpec(layer_end=6, ranks=(0,), num_micro_batches=(3,), fractions=(1.0,))], num_gpus=1
)
NAMES = tuple(SHAPES)
GROUP = single_rank_group(0)


def _sharded(
    *,
    config: OptimizerConfig,
    zero: ZeroMode = ZeroMode.OPTIMIZER,
    scaler: DynamicLossScaler | None = None,
    dtype: torch.dtype = torch.float32,
    chunk_numel: int | None = None,
) -> tuple[dict[str, torch.nn.Parameter], ShardedOptimizer]:
    params = build_params(NAMES, seed=1, dtype=dtype)
    bucket = FlatBucket(
        "stage0",
        named_params=list(params.items()),
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=zero),
        group=GROUP,
        rank=0,
        compute_dtype=dtype,
        chunk_numel=chunk_numel,
    )
    optimizer = ShardedOptimizer([bucket], config=config, used_group=GROUP, loss_scaler=scaler)
    return params, optimizer


def _train(
    params: dict[str, torch.nn.Parameter], optimizer: ShardedOptimizer, steps: range
) -> list[float]:
    norms = []
    for step in steps:
        optimizer.gather_params()
        loss = reference_loss(PLAN, params, seed=7, step=step)
        optimizer.scale_loss(loss).backward()
        optimizer.release_params()
        norms.append(optimizer.step().grad_norm)
    return norms


def _flat(params: dict[str, torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in params.values()])


@pytest.mark.parametrize("kind", [Optimizer.ADAMW, Optimizer.SGD])
def test_equals_torch_optimizer_bit_for_bit_without_clipping(kind: Optimizer) -> None:
    weight_decay = 0.1 if kind is Optimizer.ADAMW else 0.0
    config = OptimizerConfig(kind=kind, lr=0.05, weight_decay=weight_decay, max_grad_norm=None)
    params, optimizer = _sharded(config=config)
    reference = build_params(NAMES, seed=1)
    torch_optimizer = build_reference_optimizer(reference.items(), config)
    _train(params, optimizer, range(4))
    for step in range(4):
        reference_loss(PLAN, reference, seed=7, step=step).backward()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    for name in NAMES:
        assert torch.equal(params[name], reference[name]), name


def test_clipping_matches_clip_grad_norm() -> None:
    config = OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=0.3)
    params, optimizer = _sharded(config=config)
    reference = build_params(NAMES, seed=1)
    torch_optimizer = build_reference_optimizer(reference.items(), config)
    norms = _train(params, optimizer, range(4))
    for step in range(4):
        reference_loss(PLAN, reference, seed=7, step=step).backward()
        norm = torch.nn.utils.clip_grad_norm_(list(reference.values()), 0.3)
        assert norm.item() > 0.3  # the test exercises clipping
        assert norms[step] == pytest.approx(norm.item(), rel=1e-6)
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    torch.testing.assert_close(_flat(params), _flat(reference), rtol=1e-6, atol=1e-7)


def test_a_power_of_two_loss_scale_changes_nothing_in_fp32() -> None:
    config = OptimizerConfig(lr=0.05, max_grad_norm=0.3)
    plain, plain_optimizer = _sharded(config=config)
    scaled, scaled_optimizer = _sharded(
        config=config, scaler=DynamicLossScaler(LossScalerConfig(init_scale=2.0**12))
    )
    assert _train(plain, plain_optimizer, range(3)) == _train(scaled, scaled_optimizer, range(3))
    assert torch.equal(_flat(plain), _flat(scaled))


def test_fp16_overflow_skips_the_step_and_backs_off() -> None:
    config = OptimizerConfig(lr=0.05, max_grad_norm=None)
    scaler = DynamicLossScaler(LossScalerConfig(init_scale=2.0**8, growth_interval=2))
    params, optimizer = _sharded(config=config, scaler=scaler, dtype=torch.float16)
    assert {p.dtype for p in params.values()} == {torch.float16}
    before = _flat(params)
    loss = reference_loss(PLAN, params, seed=7, step=0)
    optimizer.scale_loss(loss * 1e30).backward()  # overflows fp16
    result = optimizer.step()
    assert result.skipped and result.loss_scale == 2.0**7
    assert torch.equal(_flat(params), before)
    assert optimizer.num_updates == 0
    for step in range(2):
        optimizer.scale_loss(reference_loss(PLAN, params, seed=7, step=step)).backward()
        result = optimizer.step()
        assert not result.skipped
    assert result.loss_scale == 2.0**8  # grew after two good steps
    assert not torch.equal(_flat(params), before)
    assert optimizer.num_updates == 2


@pytest.mark.parametrize("num_chunks", [1, 2, 5])
def test_adamw_holds_its_state_from_the_start_and_the_priced_temporaries(num_chunks: int) -> None:
    """Adam's moments exist before the first step (so the first step's peak is every
    step's), and the step's peak above them is what ``cost.memory`` prices for torch's
    chunked single-tensor AdamW."""
    numel = sum(torch.Size(shape).numel() for shape in SHAPES.values())
    chunk = -(-numel // num_chunks)
    config = OptimizerConfig(lr=0.05, max_grad_norm=None)
    with MemoryMeter(torch.device("cpu")) as meter:
        params, optimizer = _sharded(config=config, chunk_numel=chunk)
        loss = reference_loss(PLAN, params, seed=7, step=0)
        loss.backward()
        del loss
        optimizer.buckets[0].reduce_gradients()  # its wire buffers come and go before
        held = meter.live_bytes()
        meter.start_step()
        optimizer.step()
        assert meter.live_bytes() == held  # no state made by the first step
        temporaries = adamw_temporary_elements(stepped_numel=numel, chunk_numel=chunk)
        scalars = meter.peak_bytes() - held - 4 * temporaries  # the norm and such, 0-d
        assert 0 <= scalars <= 16


def test_zero_full_releases_parameters_at_rest() -> None:
    config = OptimizerConfig(lr=0.05, max_grad_norm=None)
    params, optimizer = _sharded(config=config, zero=ZeroMode.FULL)
    bucket = optimizer.buckets[0]
    assert not bucket.params_resident
    assert bucket.params_flat.untyped_storage().nbytes() == 0
    optimizer.gather_params()
    assert torch.equal(_flat(params), _flat(build_params(NAMES, seed=1)))
    replicated, replicated_optimizer = _sharded(config=config, zero=ZeroMode.NONE)
    _train(params, optimizer, range(3))
    _train(replicated, replicated_optimizer, range(3))
    optimizer.gather_params()
    assert torch.equal(_flat(params), _flat(replicated))


def test_gradients_survive_a_caller_that_clears_or_replaces_them() -> None:
    config = OptimizerConfig(lr=0.05, max_grad_norm=None)
    params, optimizer = _sharded(config=config)
    twin, twin_optimizer = _sharded(config=config)
    reference_loss(PLAN, params, seed=7, step=0).backward()
    for p in params.values():  # replaced by a fresh tensor: must be copied back
        p.grad = p.grad.clone()
    reference_loss(PLAN, twin, seed=7, step=0).backward()
    optimizer.step()
    twin_optimizer.step()
    assert torch.equal(_flat(params), _flat(twin))


# --- checkpoints ------------------------------------------------------------------------------


def _fresh() -> tuple[dict[str, torch.nn.Parameter], ShardedOptimizer]:
    return _sharded(
        config=OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=0.3),
        scaler=DynamicLossScaler(LossScalerConfig(init_scale=2.0**4, growth_interval=1)),
    )


def test_resume_is_bit_for_bit(tmp_path: Path) -> None:
    params, optimizer = _fresh()
    _train(params, optimizer, range(2))
    path = save_checkpoint(
        tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0, extra={"tokens": 96}
    )
    assert path == tmp_path / "step-00000002"
    uninterrupted = _train(params, optimizer, range(2, 5))

    resumed, resumed_optimizer = _fresh()
    info = load_checkpoint(tmp_path, optimizer=resumed_optimizer, group=GROUP, rank=0)
    assert (info.step, info.num_updates, dict(info.extra)) == (2, 2, {"tokens": 96})
    assert resumed_optimizer.loss_scaler is not None
    assert resumed_optimizer.loss_scaler.scale == 2.0**6  # grew twice, restored
    assert _train(resumed, resumed_optimizer, range(2, 5)) == uninterrupted
    assert torch.equal(_flat(resumed), _flat(params))


def _saved(tmp_path: Path) -> Path:
    params, optimizer = _fresh()
    _train(params, optimizer, range(1))
    return save_checkpoint(tmp_path, step=1, optimizer=optimizer, group=GROUP, rank=0)


def _load_error(path: Path) -> str:
    _, optimizer = _fresh()
    with pytest.raises(SpecError) as caught:
        load_checkpoint(path, optimizer=optimizer, group=GROUP, rank=0)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_truncated_shard_file_is_a_clear_error(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    shard = path / "rank-00000.pt"
    shard.write_bytes(shard.read_bytes()[:-100])
    message = _load_error(path)
    assert str(shard) in message and "truncated" in message


def test_corrupt_shard_file_is_a_clear_error(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    shard = path / "rank-00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    message = _load_error(path)
    assert str(shard) in message and "sha256" in message


def test_missing_or_broken_checkpoints_are_clear_errors(tmp_path: Path) -> None:
    assert "does not exist" in _load_error(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "manifest.json" in _load_error(tmp_path / "empty")
    path = _saved(tmp_path / "ok")
    (path / "manifest.json").write_text('{"format": 1, "st')
    assert "JSON" in _load_error(path)
    (path / "rank-00000.pt").unlink()
    (path / "manifest.json").unlink()
    shutil.rmtree(path)
    assert "none is complete" in _load_error(tmp_path / "ok")


def test_a_crash_while_saving_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params, optimizer = _fresh()
    _train(params, optimizer, range(1))
    good = save_checkpoint(tmp_path, step=1, optimizer=optimizer, group=GROUP, rank=0)
    _train(params, optimizer, range(1, 2))

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", crash)
    with pytest.raises(SpecError) as caught:
        save_checkpoint(tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0, keep_last=1)
    assert str(caught.value) == (
        f"--checkpoint-dir: got {str(tmp_path)!r}; expected a location piebald can write "
        "(disk full)"
    )
    monkeypatch.undo()
    assert find_latest_checkpoint(tmp_path) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]  # no temporary
    _, reloaded = _fresh()
    assert load_checkpoint(tmp_path, optimizer=reloaded, group=GROUP, rank=0).step == 1

    # The next save succeeds over the leftovers, then prunes the older checkpoint.
    newer = save_checkpoint(tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0, keep_last=1)
    assert find_latest_checkpoint(tmp_path) == newer
    assert not good.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002"]


def test_what_stands_under_a_checkpoints_name_is_set_aside_never_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Something that appeared under ``step-N`` during the run (a user's directory, a
    restored backup, a file) was deleted, or crashed the run: it is not this run's, so it
    is renamed ``foreign-step-N`` and reported; the new checkpoint takes its place."""
    params, optimizer = _fresh()
    _train(params, optimizer, range(1))
    save_checkpoint(tmp_path, step=1, optimizer=optimizer, group=GROUP, rank=0)
    (tmp_path / "step-00000002").mkdir()
    (tmp_path / "step-00000002" / "user.txt").write_text("MINE")
    (tmp_path / "step-00000003").write_text("x")  # a file where a directory goes
    (tmp_path / ".tmp-step-00000003").write_text("y")  # and where the temporary goes
    _train(params, optimizer, range(1, 2))
    with caplog.at_level("WARNING"):
        save_checkpoint(tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0)
        path = save_checkpoint(tmp_path, step=3, optimizer=optimizer, group=GROUP, rank=0)
        again = save_checkpoint(tmp_path, step=3, optimizer=optimizer, group=GROUP, rank=0)
    assert again == path
    assert (tmp_path / "foreign-step-00000002" / "user.txt").read_text() == "MINE"
    assert (tmp_path / "foreign-step-00000003").read_text() == "x"
    assert (tmp_path / "foreign-.tmp-step-00000003").read_text() == "y"
    assert (tmp_path / "foreign-step-00000003.2" / "manifest.json").is_file()  # kept too
    _, reloaded = _fresh()
    assert load_checkpoint(tmp_path, optimizer=reloaded, group=GROUP, rank=0).step == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 4 and all("\n" not in w and "moved aside" in w for w in warnings)
    assert any(str(tmp_path / "step-00000002") in w for w in warnings)


def test_a_full_disk_is_one_line_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A checkpoint that no longer fits: one line naming --checkpoint-dir, the path and
    the OS's words; the temporary directory is removed, the older checkpoint intact."""
    with small_disk(tmp_path / "disk", size="256k") as disk:
        params, optimizer = _fresh()
        _train(params, optimizer, range(1))
        good = save_checkpoint(disk, step=1, optimizer=optimizer, group=GROUP, rank=0)
        fill(disk / "filler")
        with pytest.raises(SpecError) as caught:
            save_checkpoint(disk, step=2, optimizer=optimizer, group=GROUP, rank=0)
        assert str(caught.value) == (
            f"--checkpoint-dir: got {str(disk)!r}; expected a location piebald can write "
            "(No space left on device)"
        )
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "step-00000001"]
        verify_checkpoint(good)


def test_a_checkpoint_of_another_model_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    params = build_params(("a.weight", "a.bias"), seed=1)
    params["a.weight"] = torch.nn.Parameter(torch.zeros(3, 4))
    bucket = FlatBucket(
        "stage0",
        named_params=list(params.items()),
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=ZeroMode.NONE),
        group=GROUP,
        rank=0,
    )
    optimizer = ShardedOptimizer(
        [bucket],
        config=OptimizerConfig(),
        used_group=GROUP,
        loss_scaler=DynamicLossScaler(),
    )
    with pytest.raises(SpecError, match=r"parameter a\.weight.*shape \[3, 4\]"):
        load_checkpoint(path, optimizer=optimizer, group=GROUP, rank=0)


def test_a_format_2_checkpoint_still_loads(tmp_path: Path) -> None:
    """Written before tensor-parallel slices were recorded: no ``slices``, format 2."""
    params, optimizer = _fresh()
    _train(params, optimizer, range(2))
    path = save_checkpoint(tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format"] = 2
    for entry in manifest["ranks"]:
        del entry["slices"]
    manifest["checksum"] = checkpoint_module._content_sha256(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    uninterrupted = _train(params, optimizer, range(2, 4))
    resumed, resumed_optimizer = _fresh()
    assert load_checkpoint(path, optimizer=resumed_optimizer, group=GROUP, rank=0).step == 2
    assert _train(resumed, resumed_optimizer, range(2, 4)) == uninterrupted


def test_a_tensor_parallel_slice_loads_from_a_whole_checkpoint(tmp_path: Path) -> None:
    """A rank holding member 1 of 2's slices (a row-parallel weight, a column-parallel
    bias) takes exactly those elements of a checkpoint saved whole, moments included."""
    params, optimizer = _fresh()
    _train(params, optimizer, range(2))
    path = save_checkpoint(tmp_path, step=2, optimizer=optimizer, group=GROUP, rank=0)
    saved = {key: value.clone() for key, value in optimizer.shard_states()["stage0"].items()}
    layout = optimizer.buckets[0].layout
    slices = {
        "a.weight": TensorSlice(dim=1, chunks=1, degree=2, position=1),
        "a.bias": TensorSlice(dim=0, chunks=1, degree=2, position=1),
    }

    def held(flat: torch.Tensor) -> torch.Tensor:
        """What the sliced rank holds of a whole flat buffer, in its own layout order."""
        parts = []
        for slot in layout.slots:
            whole = flat[slot.offset : slot.end].view(slot.shape)
            part = slices[slot.name].of(whole) if slot.name in slices else whole
            parts.append(part.reshape(-1))
        return torch.cat(parts)

    fresh = build_params(NAMES, seed=2)
    sliced = [
        (name, torch.nn.Parameter(slices[name].of(p.detach()) if name in slices else p.detach()))
        for name, p in fresh.items()
    ]
    bucket = FlatBucket(
        "stage0",
        named_params=sliced,
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=ZeroMode.OPTIMIZER),
        group=GROUP,
        rank=0,
    )
    reloaded = ShardedOptimizer(
        [bucket], config=optimizer.config, used_group=GROUP, loss_scaler=DynamicLossScaler()
    )
    load_checkpoint(path, optimizer=reloaded, group=GROUP, rank=0, slices=slices)
    for key, value in reloaded.shard_states()["stage0"].items():
        assert torch.equal(value, held(saved[key])), key


def test_16_bit_gradients_accumulate_in_fp32() -> None:
    """Megatron's main_grad: each micro-batch's bf16 gradient is added into an fp32
    accumulator, so 64 small gradients on top of a large one are not rounded away."""
    weight = torch.nn.Parameter(torch.ones(4))
    bucket = FlatBucket(
        "stage0",
        named_params=[("w", weight)],
        placement=BucketPlacement(ranks=(0,), fractions=(1.0,), zero=ZeroMode.OPTIMIZER),
        group=GROUP,
        rank=0,
        compute_dtype=torch.bfloat16,
    )
    assert weight.dtype == torch.bfloat16 and bucket.master.dtype == torch.float32
    scales = [256.0] + [1.0] * 64
    expected = torch.zeros(4)
    bf16_sum = torch.zeros(4, dtype=torch.bfloat16)
    for scale in scales:
        (weight * scale).sum().backward()
        assert weight.grad is None  # folded into the accumulator by the hook
        grad = torch.full((4,), scale, dtype=torch.bfloat16)
        expected += grad.float()
        bf16_sum += grad
    assert torch.equal(bucket.main_grad, expected)  # 320
    assert not torch.equal(bf16_sum.float(), expected)  # bf16 would have stopped at 256
    bucket.reduce_gradients()
    assert torch.equal(bucket.grad_shard, expected)
