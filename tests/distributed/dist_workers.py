"""What each spawned rank runs in the distributed tests; every check is an assertion on the
rank, so a failure anywhere fails the test (see ``dist_harness.run_ranks``).

The oracle is always single-process training: every rank can regenerate every other
rank's data, so it recomputes the whole reference run locally and compares.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from dist_harness import (
    SHAPES,
    TIED_NAME,
    StageSpec,
    build_params,
    init_param,
    local_loss,
    make_plan,
    reference_loss,
    role_loss,
    stage_param_names,
    three_stage_plan,
)
from torch import nn

from piebald.errors import SpecError
from piebald.runtime.distributed import checkpoint as checkpoint_module
from piebald.runtime.distributed.buckets import build_buckets
from piebald.runtime.distributed.checkpoint import (
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from piebald.runtime.distributed.collectives import (
    CollectiveMethod,
    all_gather_uneven,
    all_reduce_sum,
    reduce_scatter_uneven,
)
from piebald.runtime.distributed.groups import CommGroup, ProcessGroups, build_process_groups
from piebald.runtime.distributed.loss_scaler import DynamicLossScaler, LossScalerConfig
from piebald.runtime.distributed.optimizer import (
    OptimizerConfig,
    ShardedOptimizer,
    build_reference_optimizer,
)
from piebald.runtime.distributed.shard_layout import shard_ranges
from piebald.specs.plan import Plan, ZeroMode

SEED = 3

# --- uneven collectives -----------------------------------------------------------------------


def _rank_data(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 + rank)).to(dtype)


def collectives(rank: int, world_size: int) -> None:
    world = CommGroup(
        ranks=tuple(range(world_size)), process_group=dist.group.WORLD, backend="gloo"
    )
    sub_ranks = (1, 3)
    sub_pg = dist.new_group(list(sub_ranks))  # every rank calls new_group
    groups = [(world, (0.5, 0.3, 0.2, 0.0)), (world, (0.25,) * 4)]
    if rank in sub_ranks:
        groups.append(
            (CommGroup(ranks=sub_ranks, process_group=sub_pg, backend="gloo"), (0.1, 0.9))
        )
    n = 1001
    for group, fractions in groups:
        ranges = shard_ranges(fractions, num_elements=n)
        mine = ranges[group.index_of(rank)]
        expected = torch.stack([_rank_data(r, n, torch.float32) for r in group.ranks]).sum(0)
        for method in (CollectiveMethod.ALL_TO_ALL, CollectiveMethod.LIST, CollectiveMethod.PADDED):
            got = reduce_scatter_uneven(
                _rank_data(rank, n, torch.float32), ranges, group=group, rank=rank, method=method
            )
            assert got.shape == (mine.numel,), (method, got.shape)
            torch.testing.assert_close(got, expected[mine.start : mine.end], rtol=0, atol=1e-6)
        for dtype in (torch.float32, torch.bfloat16):
            # Owner i's shard of the gathered buffer is owner i's own data.
            everyone = [_rank_data(r, n, dtype) for r in group.ranks]
            gathered = torch.cat([everyone[i][r.start : r.end] for i, r in enumerate(ranges)])
            for method in (
                CollectiveMethod.AUTO,
                CollectiveMethod.BROADCAST,
                CollectiveMethod.ALL_TO_ALL,
                CollectiveMethod.PADDED,
            ):
                full = torch.full((n,), -1.0, dtype=dtype)
                full[mine.start : mine.end] = everyone[group.index_of(rank)][mine.start : mine.end]
                all_gather_uneven(full, ranges, group=group, rank=rank, method=method)
                assert torch.equal(full, gathered), (method, dtype, fractions)


# --- the sharded optimizer against torch's, one stage of four ranks -----------------------------

ALL_NAMES = tuple(SHAPES)


def _one_stage_plan(zero: ZeroMode) -> Plan:
    fractions = (0.25,) * 4 if zero is ZeroMode.NONE else (0.5, 0.3, 0.2, 0.0)
    # ZeRO-2/3 stages run equal counts (specs.plan); the others a rank with none.
    counts = (2, 2, 2, 2) if zero.per_pass else (3, 2, 1, 0)
    return make_plan(
        [
            StageSpec(
                layer_end=6,
                ranks=(0, 1, 2, 3),
                num_micro_batches=counts,
                fractions=fractions,
                zero=zero,
            )
        ],
        num_gpus=4,
    )


def _local_loss_one(
    plan: Plan, params: dict[str, nn.Parameter], *, step: int, j: int
) -> torch.Tensor:
    """Micro-batch j's loss in a one-stage plan (all three roles)."""
    weight = 1.0 / len(plan.routes)
    first, middle, last = (
        role_loss(role, params, seed=SEED, step=step, j=j, weight=weight)
        for role in ("first", "middle", "last")
    )
    return first + middle + last


def _per_rank_reference_grads(plan: Plan, params: dict[str, nn.Parameter], *, step: int) -> None:
    """Set ``.grad`` to what the ranks compute, summed in the same order: each rank
    accumulates its micro-batches in route order, the reduce-scatter sums ranks in order."""
    per_rank = []
    for r in plan.used_ranks:
        accumulated = [torch.zeros_like(p) for p in params.values()]
        for j, route in enumerate(plan.routes):
            if route[0] == r:
                loss = _local_loss_one(plan, params, step=step, j=j)
                grads = torch.autograd.grad(loss, list(params.values()))
                accumulated = [a + g for a, g in zip(accumulated, grads, strict=True)]
        per_rank.append(accumulated)
    for i, p in enumerate(params.values()):
        p.grad = torch.stack([grads[i] for grads in per_rank]).sum(0)


def _run_stage(
    plan: Plan,
    rank: int,
    config: OptimizerConfig,
    *,
    steps: int,
    scaler: DynamicLossScaler | None = None,
    poison: tuple[int, int] | None = None,  # (step, rank) whose loss becomes inf
) -> tuple[dict[str, nn.Parameter], ShardedOptimizer, list[Any]]:
    groups = build_process_groups(plan, timeout_s=30)
    params = build_params(ALL_NAMES, seed=SEED)
    # One bucket gathered and reduced once per step: the toy's parameters are not layers.
    buckets = build_buckets(groups, named_params=list(params.items()), stream_layers=False)
    optimizer = ShardedOptimizer(buckets, config=config, used_group=groups.used, loss_scaler=scaler)
    zero = plan.stages[0].zero
    results = []
    for step in range(steps):
        optimizer.gather_params()
        mbs = [j for j, route in enumerate(plan.routes) if route[0] == rank]
        for count, j in enumerate(mbs):
            loss = _local_loss_one(plan, params, step=step, j=j)
            if poison == (step, rank):
                loss = loss * float("inf")
            optimizer.scale_loss(loss).backward()
            if count == 0 and zero is ZeroMode.GRADIENTS:
                # ZeRO-2 style: an extra reduce-scatter mid-step, once on every rank.
                optimizer.buckets[0].reduce_gradients()
        optimizer.release_params()
        if zero is ZeroMode.FULL:
            assert optimizer.buckets[0].params_flat.untyped_storage().nbytes() == 0
        results.append(optimizer.step())
    optimizer.gather_params()
    return params, optimizer, results


def sharded_optimizer(rank: int, world_size: int) -> None:
    exact = OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=None)
    for zero in (ZeroMode.NONE, ZeroMode.OPTIMIZER, ZeroMode.GRADIENTS, ZeroMode.FULL):
        plan = _one_stage_plan(zero)
        params, _, _ = _run_stage(plan, rank, exact, steps=3)
        reference = build_params(ALL_NAMES, seed=SEED)
        torch_optimizer = build_reference_optimizer(reference.items(), exact)
        for step in range(3):
            _per_rank_reference_grads(plan, reference, step=step)
            torch_optimizer.step()
            torch_optimizer.zero_grad()
        for name in ALL_NAMES:
            if zero is ZeroMode.GRADIENTS:
                # The extra reduce-scatter sums in another order: equal up to rounding.
                torch.testing.assert_close(params[name], reference[name], rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(params[name], reference[name]), (zero, name)

    # Clipping: the norm of the owned shards, all-reduced, is clip_grad_norm_'s norm.
    clipped = OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=0.2)
    plan = _one_stage_plan(ZeroMode.OPTIMIZER)
    params, _, results = _run_stage(plan, rank, clipped, steps=4)
    reference = build_params(ALL_NAMES, seed=SEED)
    torch_optimizer = build_reference_optimizer(reference.items(), clipped)
    for step in range(4):
        reference_loss(plan, reference, seed=SEED, step=step).backward()
        norm = torch.nn.utils.clip_grad_norm_(list(reference.values()), 0.2)
        assert norm.item() > 0.2
        assert abs(results[step].grad_norm - norm.item()) <= 1e-6 * norm.item()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    for name in ALL_NAMES:
        torch.testing.assert_close(params[name], reference[name], rtol=1e-5, atol=1e-6)

    # An overflow on one rank only: every rank skips, the scale backs off everywhere.
    scaler = DynamicLossScaler(LossScalerConfig(init_scale=2.0**10, growth_interval=100))
    params, optimizer, results = _run_stage(
        plan, rank, exact, steps=3, scaler=scaler, poison=(1, 2)
    )
    assert [r.skipped for r in results] == [False, True, False]
    assert [r.loss_scale for r in results] == [2.0**10, 2.0**9, 2.0**9]
    assert optimizer.num_updates == 2
    reference = build_params(ALL_NAMES, seed=SEED)
    torch_optimizer = build_reference_optimizer(reference.items(), exact)
    for step in (0, 2):
        _per_rank_reference_grads(plan, reference, step=step)
        torch_optimizer.step()
        torch_optimizer.zero_grad()
    for name in ALL_NAMES:
        assert torch.equal(params[name], reference[name]), ("scaler", name)


# --- stages of different sizes and a tied embedding/head ---------------------------------------


def _stage_setup(
    plan: Plan, rank: int, config: OptimizerConfig, *, scaler: DynamicLossScaler | None = None
) -> tuple[ProcessGroups, dict[str, nn.Parameter], ShardedOptimizer]:
    groups = build_process_groups(plan, timeout_s=30)
    stage_index = plan.stage_of_rank[rank]
    names = stage_param_names(stage_index, plan.num_stages)
    params = build_params(names, seed=SEED)
    if stage_index == plan.num_stages - 1 and TIED_NAME in params:
        # The head replica starts elsewhere: the embedding's values must win.
        params[TIED_NAME] = nn.Parameter(torch.zeros_like(params[TIED_NAME]))
    buckets = build_buckets(
        groups, named_params=list(params.items()), tied_name=TIED_NAME, stream_layers=False
    )
    optimizer = ShardedOptimizer(buckets, config=config, used_group=groups.used, loss_scaler=scaler)
    return groups, params, optimizer


def _train_step(
    plan: Plan,
    rank: int,
    params: dict[str, nn.Parameter],
    optimizer: ShardedOptimizer,
    *,
    step: int,
    used: CommGroup,
) -> tuple[float, float]:
    """One step; returns (global loss, grad norm)."""
    optimizer.gather_params()
    loss = local_loss(plan, rank, params, seed=SEED, step=step)
    total = torch.zeros(1, dtype=torch.float64)
    if loss is not None:
        optimizer.scale_loss(loss).backward()
        total += loss.item()
    optimizer.release_params()
    result = optimizer.step()
    all_reduce_sum(total, group=used)
    return total.item(), result.grad_norm


def _tied_replicas_agree(params: dict[str, nn.Parameter], groups: ProcessGroups) -> None:
    value = params[TIED_NAME].detach().clone() if groups.tied is not None else None
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    replicas = [v for v in gathered if v is not None]
    assert len(replicas) == 3
    assert all(torch.equal(replicas[0], v) for v in replicas[1:])


def _owned_gradients_equal_reference(
    plan: Plan,
    rank: int,
    params: dict[str, nn.Parameter],
    optimizer: ShardedOptimizer,
    reference: dict[str, nn.Parameter],
) -> None:
    """After the reduce-scatters, every owner's gradient slice (the tied weight's: the sum
    of the embedding's and the head's uses over all ranks) is the reference gradient's."""
    optimizer.gather_params()
    loss = local_loss(plan, rank, params, seed=SEED, step=0)
    if loss is not None:
        loss.backward()
    optimizer.release_params()
    for bucket in optimizer.buckets:  # stage bucket, then tied: the global order
        bucket.reduce_gradients()
    reference_loss(plan, reference, seed=SEED, step=0).backward()
    for bucket in optimizer.buckets:
        expected = torch.cat(
            [reference[slot.name].grad.reshape(-1) for slot in bucket.layout.slots]
        )[bucket.shard.start : bucket.shard.end]
        torch.testing.assert_close(bucket.grad_shard, expected, rtol=1e-6, atol=1e-7)
    tied = [b for b in optimizer.buckets if b.name == "tied"]
    if tied:
        assert tied[0].layout.slots[0].name == TIED_NAME
    optimizer.zero_grad()
    for p in reference.values():
        p.grad = None


def stages_with_tied_head(rank: int, world_size: int) -> None:
    plan = three_stage_plan()
    config = OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=0.5)
    groups, params, optimizer = _stage_setup(plan, rank, config)
    # The groups: rank 3 alone in stage 0, rank 0 alone in the middle stage (outside the
    # tied group), ranks 1 and 2 share the last stage; the tied group is {1, 2, 3}.
    expected_stage = {0: (0,), 1: (1, 2), 2: (1, 2), 3: (3,)}[rank]
    assert groups.stage is not None and groups.stage.ranks == expected_stage
    assert (groups.tied.ranks if groups.tied else None) == (None if rank == 0 else (1, 2, 3))
    mine = [(0, 1, 2, 3)] + ([(1, 2)] if rank in (1, 2) else []) + ([(1, 2, 3)] if rank else [])
    assert sorted(groups.by_ranks) == mine
    optimizer.gather_params()
    if TIED_NAME in params:
        assert torch.equal(params[TIED_NAME], init_param(TIED_NAME, seed=SEED))
    optimizer.release_params()

    reference = build_params(tuple(SHAPES), seed=SEED)
    _owned_gradients_equal_reference(plan, rank, params, optimizer, reference)
    torch_optimizer = build_reference_optimizer(reference.items(), config)
    for step in range(4):
        loss, norm = _train_step(plan, rank, params, optimizer, step=step, used=groups.used)
        expected_loss = reference_loss(plan, reference, seed=SEED, step=step)
        expected_loss.backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(list(reference.values()), 0.5).item()
        torch_optimizer.step()
        torch_optimizer.zero_grad()
        assert abs(loss - expected_loss.item()) <= 1e-5 * abs(expected_loss.item())
        assert abs(norm - expected_norm) <= 1e-5 * expected_norm
        optimizer.gather_params()
        for name, p in params.items():
            torch.testing.assert_close(p, reference[name], rtol=1e-5, atol=1e-6)
        optimizer.release_params()
    optimizer.gather_params()
    _tied_replicas_agree(params, groups)


# --- checkpoints: save, restart in new processes, resume bit for bit ---------------------------


def resume_plan(fractions: tuple[float, ...] = (0.6, 0.4)) -> Plan:
    return make_plan(
        [
            StageSpec(
                layer_end=3,
                ranks=(0,),
                num_micro_batches=(3,),
                fractions=(1.0,),
                zero=ZeroMode.NONE,
            ),
            StageSpec(layer_end=6, ranks=(1, 2), num_micro_batches=(2, 1), fractions=fractions),
        ],
        num_gpus=3,
    )


def reshard_plan() -> Plan:
    return make_plan(
        [
            StageSpec(layer_end=2, ranks=(1,), num_micro_batches=(3,), fractions=(1.0,)),
            StageSpec(layer_end=6, ranks=(0,), num_micro_batches=(3,), fractions=(1.0,)),
        ],
        num_gpus=2,
    )


RESUME_CONFIG = OptimizerConfig(lr=0.05, weight_decay=0.1, max_grad_norm=0.5)
TOTAL_STEPS, SAVE_AT, KILLED_AT = 6, 3, 5


def _scaler() -> DynamicLossScaler:
    return DynamicLossScaler(LossScalerConfig(init_scale=2.0**8, growth_interval=2))


def _record(
    params: dict[str, nn.Parameter], optimizer: ShardedOptimizer
) -> dict[str, torch.Tensor]:
    optimizer.gather_params()
    return {name: p.detach().clone() for name, p in params.items()}


def resume_uninterrupted(rank: int, world_size: int, directory: str, results: str) -> None:
    plan = resume_plan()
    groups, params, optimizer = _stage_setup(plan, rank, RESUME_CONFIG, scaler=_scaler())
    history = []
    for step in range(TOTAL_STEPS):
        history.append(_train_step(plan, rank, params, optimizer, step=step, used=groups.used))
        if step + 1 == SAVE_AT:
            save_checkpoint(
                Path(directory),
                step=step + 1,
                optimizer=optimizer,
                group=groups.used,
                rank=rank,
                extra={"plan": "resume"},
            )
    torch.save(
        {"history": history, "params": _record(params, optimizer)},
        Path(results) / f"rank{rank}.pt",
    )


def _die(path: Path) -> str:
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def resume_killed(rank: int, world_size: int, directory: str, results: str) -> None:
    """Resume, train on, and die while saving the next checkpoint: rank 2 is SIGKILLed
    right after writing its shard, before the manifest exists."""
    plan = resume_plan()
    groups, params, optimizer = _stage_setup(plan, rank, RESUME_CONFIG, scaler=_scaler())
    info = load_checkpoint(Path(directory), optimizer=optimizer, group=groups.used, rank=rank)
    for step in range(info.step, KILLED_AT):
        _train_step(plan, rank, params, optimizer, step=step, used=groups.used)
    if rank == 2:
        checkpoint_module._sha256 = _die  # type: ignore[assignment]
    save_checkpoint(
        Path(directory), step=KILLED_AT, optimizer=optimizer, group=groups.used, rank=rank
    )
    raise AssertionError("the save should never complete")


def resume_restarted(rank: int, world_size: int, directory: str, results: str) -> None:
    plan = resume_plan()
    groups, params, optimizer = _stage_setup(plan, rank, RESUME_CONFIG, scaler=_scaler())
    root = Path(directory)
    saved = root / f"step-{SAVE_AT:08d}"
    # The killed save left an incomplete temporary directory and no step-5 checkpoint.
    assert find_latest_checkpoint(root) == saved
    incomplete = root / f".tmp-step-{KILLED_AT:08d}"
    assert (incomplete / "rank-00002.pt").is_file() and not (incomplete / "manifest.json").exists()
    assert not (root / f"step-{KILLED_AT:08d}").exists()

    # A truncated shard of rank 2: every rank gets the same one-line error, nobody hangs.
    broken = root / "broken"
    if rank == 0:
        shutil.copytree(saved, broken)
        shard = broken / "rank-00002.pt"
        shard.write_bytes(shard.read_bytes()[:-64])
    dist.barrier()
    try:
        load_checkpoint(broken, optimizer=optimizer, group=groups.used, rank=rank)
    except SpecError as error:
        assert str(broken / "rank-00002.pt") in str(error) and "truncated" in str(error)
    else:
        raise AssertionError("a truncated checkpoint loaded")

    info = load_checkpoint(root, optimizer=optimizer, group=groups.used, rank=rank)  # latest
    assert (info.path, info.step, dict(info.extra)) == (saved, SAVE_AT, {"plan": "resume"})
    history = [
        _train_step(plan, rank, params, optimizer, step=step, used=groups.used)
        for step in range(SAVE_AT, TOTAL_STEPS)
    ]
    reference = torch.load(Path(results) / f"rank{rank}.pt", weights_only=True)
    assert history == reference["history"][SAVE_AT:], (history, reference["history"])
    final = _record(params, optimizer)
    for name, value in final.items():
        assert torch.equal(value, reference["params"][name]), name


def resume_resharded(rank: int, world_size: int, directory: str, results: str) -> None:
    """The 3-rank checkpoint into 2 ranks with other stage cuts: same numbers up to
    reassociation of the gradient sums."""
    plan = reshard_plan()
    groups, params, optimizer = _stage_setup(plan, rank, RESUME_CONFIG, scaler=_scaler())
    load_checkpoint(
        Path(directory) / f"step-{SAVE_AT:08d}", optimizer=optimizer, group=groups.used, rank=rank
    )
    history = [
        _train_step(plan, rank, params, optimizer, step=step, used=groups.used)
        for step in range(SAVE_AT, TOTAL_STEPS)
    ]
    uninterrupted = torch.load(Path(results) / "rank1.pt", weights_only=True)["history"]
    for (loss, norm), (loss_ref, norm_ref) in zip(history, uninterrupted[SAVE_AT:], strict=True):
        assert abs(loss - loss_ref) <= 1e-5 * abs(loss_ref)
        assert abs(norm - norm_ref) <= 1e-5 * norm_ref
    final = _record(params, optimizer)
    for saved_rank in (0, 1):
        saved = torch.load(Path(results) / f"rank{saved_rank}.pt", weights_only=True)["params"]
        for name, value in saved.items():
            if name in final:
                torch.testing.assert_close(final[name], value, rtol=1e-4, atol=1e-5)


# --- point-to-point mailbox -------------------------------------------------------------------


def mailbox_releases_sends(rank: int, world_size: int) -> None:
    """Rank 0 sends four activations to rank 1, which answers each with its gradient; an
    activation's payload is released once its gradient is taken, before the step ends."""
    from piebald.runtime.pipeline.mailbox import Mailbox, MessageKind

    mailbox = Mailbox(device=torch.device("cpu"), stamped=False)
    shape = (2, 3)
    act, grad = MessageKind.ACTIVATION, MessageKind.GRADIENT
    peer = 1 - rank
    for j in range(4):
        kind = grad if rank == 0 else act
        mailbox.post_receive(kind, micro_batch=j, peer=peer, shape=shape, dtype=torch.float32)
    if rank == 0:
        for j in range(4):
            mailbox.send(act, micro_batch=j, peer=peer, tensor=torch.full(shape, float(j)))
        assert 1 <= mailbox.sends_in_flight <= 4
        for j in range(4):
            tensor, _ = mailbox.take(grad, micro_batch=j)
            assert torch.equal(tensor, torch.full(shape, -float(j)))
            assert mailbox.sends_in_flight <= 3 - j  # activations j and before: released
    else:
        for j in range(4):
            tensor, _ = mailbox.take(act, micro_batch=j)
            assert torch.equal(tensor, torch.full(shape, float(j)))
            mailbox.send(grad, micro_batch=j, peer=peer, tensor=-tensor)
    mailbox.finish()
    assert mailbox.sends_in_flight == 0


def mailbox_gloo_sends_release_once_done(rank: int, world_size: int) -> None:
    """On gloo a send never reports completion unless waited on; the mailbox's waiter
    thread waits on each, so a gradient's payload (which nothing answers) is released at
    the next send once its receiver has it, not held until the step ends."""
    from piebald.runtime.pipeline.mailbox import Mailbox, MessageKind

    grad = MessageKind.GRADIENT
    shape = (2, 3)
    mailbox = Mailbox(device=torch.device("cpu"), stamped=False)
    if rank == 0:
        for j in range(3):
            mailbox.send(grad, micro_batch=j, peer=1, tensor=torch.full(shape, float(j)))
        dist.barrier()  # the peer has taken all three
        time.sleep(0.5)  # the waiter thread's turn
        mailbox.send(grad, micro_batch=3, peer=1, tensor=torch.full(shape, 3.0))
        assert mailbox.sends_in_flight == 1  # only the newest is still held
    else:
        for j in range(3):
            mailbox.post_receive(grad, micro_batch=j, peer=0, shape=shape, dtype=torch.float32)
            assert mailbox.take(grad, micro_batch=j)[0][0, 0].item() == float(j)
        dist.barrier()
        mailbox.post_receive(grad, micro_batch=3, peer=0, shape=shape, dtype=torch.float32)
        assert mailbox.take(grad, micro_batch=3)[0][0, 0].item() == 3.0
    mailbox.finish()
    assert mailbox.sends_in_flight == 0


def mailbox_one_tag_matches_in_posting_order(rank: int, world_size: int) -> None:
    """With every message on one tag, gloo matches a pair's messages in posting order, as
    NCCL does: receives posted in the senders' order get the right payloads, and receives
    posted in the other order get each other's (which is why the schedule's order matters,
    and what the one-tag equivalence runs check)."""
    from piebald.runtime.pipeline.mailbox import Mailbox, MessageKind

    act = MessageKind.ACTIVATION
    shape = (2, 3)
    for reversed_receives in (False, True):
        mailbox = Mailbox(device=torch.device("cpu"), stamped=False, one_tag=True)
        if rank == 0:
            for j in range(3):
                mailbox.send(act, micro_batch=j, peer=1, tensor=torch.full(shape, float(j)))
        else:
            order = [2, 1, 0] if reversed_receives else [0, 1, 2]
            for j in order:
                mailbox.post_receive(act, micro_batch=j, peer=0, shape=shape, dtype=torch.float32)
            got = {j: mailbox.take(act, micro_batch=j)[0][0, 0].item() for j in order}
            if reversed_receives:
                assert got == {2: 0.0, 1: 1.0, 0: 2.0}  # matched by order, not by micro-batch
            else:
                assert got == {0: 0.0, 1: 1.0, 2: 2.0}
        mailbox.finish()
        dist.barrier()
