"""The sharded optimizer step: reduce-scatter, global norm, clipping, loss scaling, AdamW on
the owned fp32 shard, all-gather (ZeRO over uneven shards).

One step, on every rank, in this fixed order (collectives in the same relative order on
every rank, so groups that overlap, a stage group and the tied group, cannot deadlock):

1. each bucket reduce-scatters its accumulated gradient onto the owners (stage bucket
   first, then the tied bucket; streamed buckets of a ZeRO-2/3 stage did so pass by pass);
2. with a loss scaler, owners multiply their gradient shard by 1/scale (fp16 runs);
3. the squared norm of the owned shards (each element is owned exactly once in the plan,
   the tied weight included) is summed in fp64 and all-reduced over every used rank; its
   square root is the global gradient norm, so overflow is agreed by all ranks at once;
4. non-finite norm with a loss scaler: every rank skips the step and the scale backs off;
5. clipping: ``g *= min(1, max_norm / (norm + 1e-6))``, the formula of
   ``torch.nn.utils.clip_grad_norm_``;
6. AdamW (``torch.optim.AdamW`` on the owned shard, so the update is torch's formula:
   Loshchilov & Hutter 2019) with decoupled weight decay ``p *= 1 - lr * wd`` applied
   first, as torch does, but only to the elements of parameters with at least
   ``decay_min_ndim`` dimensions (norm gains and biases are not decayed, as in nanoGPT);
   SGD (``p -= lr * g``) for equivalence tests;
7. buckets whose parameters are resident all-gather the updated shard in the compute
   dtype; under ZeRO FULL the parameters stay released until the next ``gather_params``.

ZeRO NONE replicates the optimizer: gradients are all-reduced, every rank steps the whole
fp32 master, and its even shard only says which elements it counts in the norm and writes
to checkpoints (loading all-gathers them back).
:func:`build_reference_optimizer` gives the single-process reference with the same
parameter groups.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from piebald.runtime.distributed.collectives import all_gather_uneven, all_reduce_sum
from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.distributed.groups import CommGroup
from piebald.runtime.distributed.loss_scaler import DynamicLossScaler
from piebald.specs.job import Optimizer

__all__ = ["OptimizerConfig", "ShardedOptimizer", "StepResult", "build_reference_optimizer"]

logger = logging.getLogger(__name__)

_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerConfig:
    kind: Optimizer = Optimizer.ADAMW
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decay_min_ndim: int = 2  # parameters with fewer dimensions (gains, biases) never decay
    max_grad_norm: float | None = 1.0  # None: no clipping

    def __post_init__(self) -> None:
        if not self.lr >= 0:
            raise ValueError(f"OptimizerConfig.lr = {self.lr}; expected >= 0")
        if self.weight_decay < 0:
            raise ValueError(f"OptimizerConfig.weight_decay = {self.weight_decay}; expected >= 0")
        if self.kind is Optimizer.SGD and self.weight_decay:
            raise ValueError(
                f"OptimizerConfig.weight_decay = {self.weight_decay} with SGD; expected 0 "
                "(SGD is the plain p -= lr * g of the equivalence tests)"
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(
                f"OptimizerConfig.max_grad_norm = {self.max_grad_norm}; expected > 0 or None"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    grad_norm: float  # global, unscaled, before clipping
    skipped: bool  # overflow under a loss scaler: no parameter changed
    loss_scale: float  # the scale the next step's loss is multiplied by (1.0 without one)


def _torch_optimizer(config: OptimizerConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    # One tensor at a time (foreach=False): AdamW's temporaries (the square root of v and
    # its quotient) then exist for one chunk, not for every chunk at once.
    if config.kind is Optimizer.SGD:
        return torch.optim.SGD(params, lr=config.lr, foreach=False)
    # Weight decay is applied by hand (per parameter, see the module docstring); with 0
    # here torch skips its own decay and the rest of the update is exactly torch's.
    return torch.optim.AdamW(
        params, lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=0.0, foreach=False
    )


def build_reference_optimizer(
    named_params: Iterable[tuple[str, nn.Parameter]], config: OptimizerConfig
) -> torch.optim.Optimizer:
    """The single-process optimizer the sharded one is equal to: torch's AdamW (or SGD) with
    decay on parameters of ``decay_min_ndim`` dimensions or more. Clip with
    ``torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)`` before stepping."""
    params = [p for _, p in named_params]
    if config.kind is Optimizer.SGD:
        return torch.optim.SGD(params, lr=config.lr)
    decay = [p for p in params if p.dim() >= config.decay_min_ndim]
    keep = [p for p in params if p.dim() < config.decay_min_ndim]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]], lr=config.lr, betas=config.betas, eps=config.eps
    )


class _ShardStepper:
    """The torch optimizer over the fp32 master a bucket steps (its shard, or all of it when
    replicated), in chunks of the bucket's ``chunk_numel`` so that the optimizer's
    temporaries stay about one chunk large (``cost.memory.adamw_temporary_elements``)."""

    def __init__(self, bucket: FlatBucket, config: OptimizerConfig) -> None:
        self.bucket = bucket
        self.param = nn.Parameter(bucket.master, requires_grad=True)
        numel = bucket.master.numel()
        size = min(bucket.chunk_numel or numel, numel) or 1
        self.bounds = tuple((a, min(a + size, numel)) for a in range(0, numel, size))
        self.chunks = [nn.Parameter(bucket.master[a:b], requires_grad=True) for a, b in self.bounds]
        self.optimizer = _torch_optimizer(config, self.chunks) if numel else None
        self._reset_moments()
        start = bucket.stepped.start
        segments: list[tuple[int, int]] = []
        for piece in bucket.stepped_pieces:
            if len(bucket.layout.slot(piece.name).shape) < config.decay_min_ndim:
                continue
            lo = piece.buffer_offset - start
            if segments and segments[-1][1] == lo:  # merge neighbours: fewer kernel calls
                segments[-1] = (segments[-1][0], lo + piece.numel)
            else:
                segments.append((lo, lo + piece.numel))
        self.decay_segments = tuple(segments)

    def step(self, *, lr: float, weight_decay: float) -> None:
        if self.optimizer is None:
            return
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if weight_decay:
            with torch.no_grad():
                factor = 1 - lr * weight_decay  # torch's decoupled decay, same float
                for lo, hi in self.decay_segments:
                    self.param[lo:hi].mul_(factor)
        grad = self.bucket.grad_shard
        for chunk, (a, b) in zip(self.chunks, self.bounds, strict=True):
            chunk.grad = grad[a:b]
        self.optimizer.step()

    def _reset_moments(self) -> None:
        """Adam's state as torch makes it on the first step (zero moments, step 0), made
        now: the run holds its whole training state from the start, so a plan that does
        not fit fails before its first pass and the first step's peak is every step's."""
        if self.optimizer is None or not isinstance(self.optimizer, torch.optim.AdamW):
            return
        for chunk in self.chunks:
            self.optimizer.state[chunk] = {
                # torch keeps the count as a 0-d tensor in the default float dtype.
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(chunk, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(chunk, memory_format=torch.preserve_format),
            }

    def moments(self) -> dict[str, torch.Tensor]:
        """Adam's first and second moments of the rank's shard (zeros before the first
        step; a slice of the whole when the optimizer is replicated)."""
        if self.optimizer is None or not isinstance(self.optimizer, torch.optim.AdamW):
            return {}
        where = self.bucket.shard_in_stepped
        whole: dict[str, torch.Tensor] = {}
        for key in ("exp_avg", "exp_avg_sq"):
            parts = [self.optimizer.state[c][key] for c in self.chunks]
            whole[key] = torch.cat(parts)[where] if len(parts) > 1 else parts[0][where]
        return whole

    def load_moments(self, moments: dict[str, torch.Tensor], *, num_updates: int) -> None:
        """Install the shard's moments as :meth:`moments` returns them; a replicated
        optimizer all-gathers every rank's (collective over the bucket's group)."""
        if self.optimizer is None or not isinstance(self.optimizer, torch.optim.AdamW):
            return
        if num_updates == 0:
            self._reset_moments()
            return
        first = self.whole_from_shard(moments["exp_avg"])
        second = self.whole_from_shard(moments["exp_avg_sq"])
        for chunk, (a, b) in zip(self.chunks, self.bounds, strict=True):
            self.optimizer.state[chunk] = {
                "step": torch.tensor(float(num_updates)),
                "exp_avg": first[a:b].clone(),
                "exp_avg_sq": second[a:b].clone(),
            }

    def whole_from_shard(self, shard: torch.Tensor) -> torch.Tensor:
        """What this rank steps, from its shard: the shard itself, or (replicated) the
        whole buffer gathered from every rank's shard."""
        bucket = self.bucket
        if not bucket.replicated:
            return shard.detach().clone()
        whole = torch.zeros_like(self.param)
        whole[bucket.shard_in_stepped].copy_(shard)
        all_gather_uneven(whole, bucket.ranges, group=bucket.group, rank=bucket.rank)
        return whole


class ShardedOptimizer:
    """Steps every bucket this rank belongs to (stage bucket first, then the tied one)."""

    def __init__(
        self,
        buckets: Sequence[FlatBucket],
        *,
        config: OptimizerConfig,
        used_group: CommGroup,
        loss_scaler: DynamicLossScaler | None = None,
    ) -> None:
        names = [b.name for b in buckets]
        if len(set(names)) != len(names):
            raise ValueError(f"bucket names {names}: expected unique")
        self.buckets = tuple(buckets)
        self.config = config
        self.used_group = used_group
        self.loss_scaler = loss_scaler
        self.lr = config.lr
        self.num_updates = 0  # optimizer steps applied (skipped ones excluded): Adam's t
        self._steppers = tuple(_ShardStepper(b, config) for b in self.buckets)

    # --- around the passes ------------------------------------------------------------------

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: times the loss scale under fp16, else unchanged."""
        return loss * self.loss_scaler.scale if self.loss_scaler is not None else loss

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.zero_grad()

    def gather_params(self, *, streamed: bool = True) -> None:
        """ZeRO FULL buckets: materialise the parameters (collective); ``streamed=False``
        leaves the streamed buckets, which the passes gather layer by layer, alone."""
        for bucket in self.buckets:
            if streamed or not bucket.streamed:
                bucket.gather_params()

    def release_params(self, *, streamed: bool = True) -> None:
        for bucket in self.buckets:
            if streamed or not bucket.streamed:
                bucket.release_params()

    # --- the step ---------------------------------------------------------------------------

    def step(self, *, lr: float | None = None) -> StepResult:
        """Steps 1-7 of the module docstring. Collective over every used rank."""
        if lr is not None:
            self.lr = lr
        for bucket in self.buckets:
            bucket.reduce_gradients()
        if self.loss_scaler is not None:
            inverse = self.loss_scaler.inverse_scale()
            for bucket in self.buckets:
                bucket.grad_shard.mul_(inverse)

        squared = torch.zeros(1, dtype=torch.float64, device=self._device())
        for bucket in self.buckets:
            squared += torch.linalg.vector_norm(bucket.norm_grad, dtype=torch.float64) ** 2
        all_reduce_sum(squared, group=self.used_group)
        norm = math.sqrt(squared.item()) if squared.item() >= 0 else math.nan

        if not math.isfinite(norm):
            if self.loss_scaler is not None:
                self.loss_scaler.update(found_inf=True)
                logger.info("gradient overflow: step skipped, loss scale now %g", self._scale())
                self.zero_grad()
                return StepResult(grad_norm=norm, skipped=True, loss_scale=self._scale())
            logger.warning("non-finite gradient norm %s without a loss scaler", norm)

        if self.config.max_grad_norm is not None:
            # clip_grad_norm_'s arithmetic: an fp32 norm, coefficient clamped at 1.
            total = torch.tensor(norm, dtype=torch.float32)
            coefficient = torch.clamp(self.config.max_grad_norm / (total + _CLIP_EPS), max=1.0)
            for bucket in self.buckets:
                bucket.grad_shard.mul_(coefficient.to(bucket.grad_shard.device))

        for stepper in self._steppers:
            stepper.step(lr=self.lr, weight_decay=self.config.weight_decay)
        self.num_updates += 1
        if self.loss_scaler is not None:
            self.loss_scaler.update(found_inf=False)
        for bucket in self.buckets:
            if not bucket.sharded_at_rest:
                bucket.publish_params()
        self.zero_grad()
        return StepResult(grad_norm=norm, skipped=False, loss_scale=self._scale())

    def _scale(self) -> float:
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def _device(self) -> torch.device:
        return self.buckets[0].master.device if self.buckets else torch.device("cpu")

    # --- checkpoint access --------------------------------------------------------------------

    def shard_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Per bucket: the owned fp32 master shard and Adam's moments (empty for SGD)."""
        return {
            stepper.bucket.name: {
                "master": stepper.bucket.master[stepper.bucket.shard_in_stepped],
                **stepper.moments(),
            }
            for stepper in self._steppers
        }

    def load_shard_states(
        self, states: dict[str, dict[str, torch.Tensor]], *, num_updates: int
    ) -> None:
        """Install owned shards (as :meth:`shard_states` returns them), then all-gather the
        resident parameters. Collective, like a step."""
        for stepper in self._steppers:
            state = states[stepper.bucket.name]
            with torch.no_grad():
                stepper.bucket.master.copy_(stepper.whole_from_shard(state["master"]))
            stepper.load_moments(state, num_updates=num_updates)
        self.num_updates = num_updates
        for bucket in self.buckets:
            if not bucket.sharded_at_rest:
                bucket.publish_params()
        self.zero_grad()
