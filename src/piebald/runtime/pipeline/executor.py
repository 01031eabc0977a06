"""Run one rank's operations of a training step: the list ``build_schedule(plan)`` gives it,
in order (docs/design.md section 3; the simulator executes the same lists).

How each operation maps onto torch:

- ``RecvActivation`` / ``RecvGradient``: post an ``irecv`` into a buffer of the micro-batch's
  shape in the sender's compute dtype (``Mailbox``); the pass that needs it waits on it and
  casts it to this rank's dtype (an fp16 rank clamps activations, ``boundary``).
- ``Forward(j)``: stage 0 reads the rows of micro-batch j from the global batch; later
  stages take the received activation as a leaf that requires grad. The last stage turns
  logits into ``token_loss_sum / tokens_in_global_batch`` (so every reduction is a plain
  sum and the total equals one process's mean loss) and keeps it for the backward.
- ``SendActivation`` / ``SendGradient``: ``isend`` of the output (or of the input's
  gradient), completed at the end of the step.
- ``Backward(j)``: the last stage back-propagates the (loss-scaled) loss, other stages their
  output with the received gradient; gradients accumulate into the flat buckets.
- ``GatherPassParams`` / ``ScatterPassGrads``: a ZeRO-2/3 stage runs each pass layer by
  layer (``LayerStream``): under ZeRO-3 every layer's parameters are gathered right before
  it runs (the next layer's in the background) and released after; every layer's
  gradients are reduce-scattered onto their owners as soon as its backward is done. The
  operations mark that traffic in the schedule; the passes do it. Buckets that are not
  streamed (the tied weight's) are reduced once per step by the optimizer.
- ``AllReduceGrads`` / ``ReduceScatterGrads`` / ``AllGatherParams``: done inside
  ``ShardedOptimizer.step``, which ``OptimizerStep`` calls (every used rank, once per step).

Under emulation a ``Pacer`` stretches each pass, hop and the step's end to the emulated GPU's
times.

Tensor parallelism (a stage of degree t > 1): only a tensor group's leader appears in the
routes, so every member runs its leader's operation list. The leader alone posts the
receives and sends; what it receives (an activation, or the gradient of its output) it
broadcasts over the tensor group before the pass that needs it, each member waiting in
that broadcast. What a pass hands on is whole and the same on every member
(``models.tensor_ops``): sequence parallel, the blocks run on sequence chunks in between,
and the stage part gathers the last block's output and the gradient of its first block's
input; in the ``blocks`` layout, every member computes the whole output, and the
column-parallel layers' backward sums the input's gradient over the group. So the
leader's is the one sent.
Every member of a first stage reads the same rows, and every member of a last stage
computes the same loss, which only the leader reports. Under ZeRO-2/3 every member streams
its layers as above, over its own buckets (``LayerStream``; ``distributed.buckets``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from piebald.runtime.distributed.groups import CommGroup
from piebald.runtime.distributed.optimizer import ShardedOptimizer, StepResult
from piebald.runtime.models.loss import token_loss_sum
from piebald.runtime.models.stage_part import StagePart
from piebald.runtime.pipeline.boundary import to_compute_dtype
from piebald.runtime.pipeline.layer_stream import Island, LayerStream
from piebald.runtime.pipeline.mailbox import Mailbox, MessageKind
from piebald.runtime.pipeline.pacing import Pacer
from piebald.runtime.pipeline.rows import micro_batch_rows
from piebald.schedule.ops import (
    AllGatherParams,
    AllReduceGrads,
    Backward,
    Forward,
    GatherPassParams,
    Op,
    OptimizerStep,
    RecvActivation,
    RecvGradient,
    ReduceScatterGrads,
    ScatterPassGrads,
    SendActivation,
    SendGradient,
)
from piebald.specs.plan import Plan

__all__ = ["PipelineExecutor", "StepOutcome"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    loss_sum: float  # this rank's share of the step's mean loss (0 off the last stage)
    optimizer: StepResult
    clamped_values: int = 0  # received activation values clamped to fp16's range


@dataclass(slots=True)
class _Saved:
    """What a micro-batch's backward needs from its forward."""

    inputs: torch.Tensor | None  # the received activation (a leaf), None on stage 0
    output: torch.Tensor  # hidden states, or the weighted loss on the last stage
    islands: list[Island] | None = None  # a streamed (ZeRO-2/3) pass, layer by layer


class PipelineExecutor:
    """Runs ``ops`` (this rank's schedule) once per step on ``part``."""

    def __init__(
        self,
        *,
        plan: Plan,
        rank: int,
        ops: Sequence[Op],
        part: StagePart,
        optimizer: ShardedOptimizer,
        device: torch.device,
        wire_dtypes: dict[int, torch.dtype],
        pacer: Pacer | None = None,
        one_tag: bool = False,
        tensor_group: CommGroup | None = None,
    ) -> None:
        self.plan = plan
        self.rank = rank
        self.ops = tuple(ops)
        self.part = part
        self.optimizer = optimizer
        self.device = device
        self.wire_dtypes = wire_dtypes  # the dtype each rank sends its messages in
        self.pacer = pacer
        self.one_tag = one_tag  # every message on one tag: NCCL's in-order matching
        self.stage_index = plan.stage_of_rank[rank]
        stage = plan.stages[self.stage_index]
        self.leader = stage.leader_of(rank)  # the rank that talks to other stages
        self.is_leader = rank == self.leader
        # Several ranks split the stage: the leader shares what it receives with them.
        self.tensor = tensor_group if tensor_group is not None and tensor_group.size > 1 else None
        self.is_last = self.stage_index == plan.num_stages - 1
        self.rows = micro_batch_rows(plan)
        self.tokens_in_batch = plan.job.global_batch_size * plan.job.seq_len
        self.compute_dtype = next(part.parameters()).dtype
        streamed = [b for b in optimizer.buckets if b.streamed]
        self.stream = LayerStream(part, streamed) if streamed else None
        self._clamped = 0
        self._last_backward = max(
            (k for k, op in enumerate(self.ops) if isinstance(op, Backward)), default=-1
        )

    def _message_shape(self, micro_batch: int) -> tuple[int, ...]:
        num_rows = len(self.rows[micro_batch])
        return (num_rows, self.plan.job.seq_len, self.part.model.arch.hidden_size)

    def run_step(
        self, *, inputs: torch.Tensor, labels: torch.Tensor, lr: float | None = None
    ) -> StepOutcome:
        """One step: ``inputs``/``labels`` are the whole global batch (every rank draws it
        from (seed, step) and keeps its micro-batches' rows)."""
        mailbox = Mailbox(device=self.device, stamped=self.pacer is not None, one_tag=self.one_tag)
        saved: dict[int, _Saved] = {}
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        result: StepResult | None = None
        self._clamped = 0
        # Buckets sharded at rest but not streamed are gathered once per step (collective
        # over their group, called by every rank of it, micro-batches or not).
        self.optimizer.gather_params(streamed=False)
        for k, op in enumerate(self.ops):
            match op:
                case (
                    RecvActivation(micro_batch=j, peer=peer)
                    | RecvGradient(micro_batch=j, peer=peer)
                ):
                    kind = (
                        MessageKind.ACTIVATION
                        if isinstance(op, RecvActivation)
                        else MessageKind.GRADIENT
                    )
                    if not self.is_leader:
                        continue  # the leader receives and shares it
                    mailbox.post_receive(
                        kind,
                        micro_batch=j,
                        peer=peer,
                        shape=self._message_shape(j),
                        dtype=self.wire_dtypes[peer],
                    )
                case Forward(micro_batch=j):
                    saved[j] = self._forward(j, inputs, labels, mailbox)
                    if self.is_last and self.is_leader:  # counted once per tensor group
                        loss_sum += saved[j].output.detach()
                case SendActivation(micro_batch=j, peer=peer):
                    if self.is_leader:
                        self._send(mailbox, MessageKind.ACTIVATION, j, peer, saved[j].output)
                case Backward(micro_batch=j):
                    self._backward(j, saved[j], mailbox)
                    if self.stage_index == 0:
                        del saved[j]  # no input gradient to send: done with it
                    if k == self._last_backward:
                        self.optimizer.release_params(streamed=False)
                case SendGradient(micro_batch=j, peer=peer):
                    leaf = saved.pop(j).inputs
                    assert leaf is not None and leaf.grad is not None
                    if self.is_leader:
                        self._send(mailbox, MessageKind.GRADIENT, j, peer, leaf.grad)
                case OptimizerStep():
                    self.optimizer.release_params(streamed=False)  # without micro-batches too
                    mailbox.finish()  # every send completes before the step's collectives
                    result = self._optimizer_step(lr)
                case (
                    GatherPassParams()
                    | ScatterPassGrads()
                    | AllReduceGrads()
                    | ReduceScatterGrads()
                    | AllGatherParams()
                ):
                    pass  # once per step, see the module docstring
        if result is None:
            raise RuntimeError(f"rank {self.rank}: the schedule has no optimizer step")
        return StepOutcome(
            loss_sum=float(loss_sum.item()), optimizer=result, clamped_values=self._clamped
        )

    def evaluate(self, *, inputs: torch.Tensor, labels: torch.Tensor) -> float:
        """The summed token loss of one chunk of evaluation rows (this rank's share: 0 off
        the last stage): the step's forward passes and activation messages only, in the
        schedule's order, without gradients, pacing or optimizer step. Labels equal to
        ``IGNORED_LABEL`` (padding rows) count nothing."""
        mailbox = Mailbox(device=self.device, stamped=False, one_tag=self.one_tag)
        outputs: dict[int, torch.Tensor] = {}
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        self.optimizer.gather_params(streamed=False)
        with torch.no_grad():
            for op in self.ops:
                match op:
                    case RecvActivation(micro_batch=j, peer=peer) if self.is_leader:
                        mailbox.post_receive(
                            MessageKind.ACTIVATION,
                            micro_batch=j,
                            peer=peer,
                            shape=self._message_shape(j),
                            dtype=self.wire_dtypes[peer],
                        )
                    case Forward(micro_batch=j):
                        rows = self.rows[j]
                        if self.stage_index == 0:
                            x = inputs[rows.start : rows.stop].to(self.device)
                        else:
                            x = self._receive(mailbox, MessageKind.ACTIVATION, j)
                        if self.stream is not None:
                            output = self.stream.forward(x)[-1].output
                        else:
                            output = self.part(x)
                        if self.is_last and self.is_leader:
                            targets = labels[rows.start : rows.stop].to(self.device)
                            total += token_loss_sum(output, targets).double()
                        elif not self.is_last:
                            outputs[j] = output
                    case SendActivation(micro_batch=j, peer=peer) if self.is_leader:
                        mailbox.send(
                            MessageKind.ACTIVATION,
                            micro_batch=j,
                            peer=peer,
                            tensor=outputs.pop(j),
                        )
                    case SendActivation(micro_batch=j):
                        del outputs[j]  # a tensor-group member: its leader sends
                    case _:
                        pass  # gradients, their messages and the optimizer: training only
            mailbox.finish()
        self.optimizer.release_params(streamed=False)
        return float(total.item())

    # --- passes ---------------------------------------------------------------------------

    def _receive(self, mailbox: Mailbox, kind: MessageKind, j: int) -> torch.Tensor:
        """What micro-batch ``j``'s pass receives, in this rank's compute dtype: taken from
        the mailbox, and under tensor parallelism broadcast by the leader to its group (in
        the leader's compute dtype)."""
        if self.tensor is None:
            return self._take(mailbox, kind, j)
        if self.is_leader:
            tensor = self._take(mailbox, kind, j).contiguous()
        else:
            shape = self._message_shape(j)
            tensor = torch.empty(shape, dtype=self.wire_dtypes[self.leader], device=self.device)
        dist.broadcast(tensor, src=self.leader, group=self.tensor.process_group)
        return tensor.to(self.compute_dtype)

    def _take(self, mailbox: Mailbox, kind: MessageKind, j: int) -> torch.Tensor:
        tensor, arrival = mailbox.take(kind, micro_batch=j)
        if self.pacer is not None and arrival is not None:
            self.pacer.wait_until(arrival)
        # From a rank of another dtype: activations clamped to fp16's range (boundary.py).
        cast, clamped = to_compute_dtype(
            tensor, self.compute_dtype, clamp=kind is MessageKind.ACTIVATION
        )
        self._clamped += clamped
        return cast

    def _forward(
        self, j: int, inputs: torch.Tensor, labels: torch.Tensor, mailbox: Mailbox
    ) -> _Saved:
        rows = self.rows[j]
        leaf: torch.Tensor | None = None
        if self.stage_index == 0:
            # A copy on every device (on a GPU the batch is in host memory), so that what
            # a micro-batch holds is its own, as the memory model prices it.
            x = inputs[rows.start : rows.stop].to(self.device, copy=True)
        else:
            leaf = self._receive(mailbox, MessageKind.ACTIVATION, j).requires_grad_()
            x = leaf
        started = self.pacer.now() if self.pacer is not None else 0.0
        loss: Callable[[torch.Tensor], torch.Tensor] | None = None
        if self.is_last:
            loss = functools.partial(
                self._loss, targets=labels[rows.start : rows.stop].to(self.device, copy=True)
            )
        islands = None
        if self.stream is not None:
            islands = self.stream.forward(x, loss=loss)
            output = islands[-1].output
        else:
            output = self.part(x)
            if loss is not None:
                output = loss(output)
        if self.pacer is not None:
            self.pacer.pace(started=started, emulated_s=self.pacer.forward_s)
        return _Saved(inputs=leaf, output=output, islands=islands)

    def _loss(self, logits: torch.Tensor, *, targets: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, targets) / self.tokens_in_batch

    def _backward(self, j: int, saved: _Saved, mailbox: Mailbox) -> None:
        gradient = None if self.is_last else self._receive(mailbox, MessageKind.GRADIENT, j)
        started = self.pacer.now() if self.pacer is not None else 0.0
        if saved.islands is not None:
            assert self.stream is not None
            if gradient is None:  # the loss, scaled under fp16
                saved.islands[-1].output = self.optimizer.scale_loss(saved.output)
            self.stream.backward(saved.islands, gradient)
            saved.islands = None
        elif gradient is None:
            torch.autograd.backward(self.optimizer.scale_loss(saved.output))
        else:
            torch.autograd.backward(saved.output, grad_tensors=gradient)
        saved.output = saved.output.detach()  # free the graph now, not at the send
        if self.pacer is not None:
            self.pacer.pace(started=started, emulated_s=self.pacer.backward_s)

    def _send(
        self, mailbox: Mailbox, kind: MessageKind, j: int, peer: int, tensor: torch.Tensor
    ) -> None:
        arrival = self.pacer.arrival(peer) if self.pacer is not None else None
        mailbox.send(kind, micro_batch=j, peer=peer, tensor=tensor, arrival=arrival)

    def _optimizer_step(self, lr: float | None) -> StepResult:
        started = 0.0
        if self.pacer is not None:
            # The step's collectives (the global gradient norm among them) start when the
            # last used rank arrives; real waiting for it is not an overrun.
            started = self.pacer.latest_arrival(self.optimizer.used_group)
        result = self.optimizer.step(lr=lr)
        if self.pacer is not None:
            self.pacer.pace(started=started, emulated_s=self.pacer.step_end_s)
        return result
