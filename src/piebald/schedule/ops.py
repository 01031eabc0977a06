"""The operations of one training step, as a runtime (and the simulator) executes them.

A rank's schedule is a list of these, in issue order. The executor walks the list:

- compute operations (``Forward``, ``Backward``, ``OptimizerStep``) run on the rank's compute
  stream and block the walk until they are done; each first waits for its inputs (the
  matching receive, the pass's parameter gather, or, for the optimizer step, every
  data-parallel operation issued before it);
- point-to-point operations (``SendActivation``, ``RecvActivation``, ``SendGradient``,
  ``RecvGradient``) are posted asynchronously (isend/irecv); a transfer moves once both ends
  are posted. Every send has exactly one receive on the peer with the same
  (kind, micro-batch, sender, receiver) key;
- data-parallel operations run in issue order on the rank's data-parallel channel and do
  not block the walk. Per-pass ZeRO traffic (``GatherPassParams``, ``ScatterPassGrads``)
  streams layer by layer alongside its pass (the runtime's ``LayerStream``): a pass may
  start once its gather has started and ends no earlier than the gather; a
  reduce-scatter, posted before its backward, runs as the backward goes. The ranks of such
  a stage run equal micro-batch counts in one pass pattern (``specs.plan``), so their
  per-layer collectives meet in lockstep; the simulator prices each rank's share on its
  own channel, which for a stage whose ranks make the same passes differs from the
  lockstep only by how long the faster ranks wait inside each pass. Once-per-step
  collectives (``AllReduceGrads``, ``ReduceScatterGrads``, ``AllGatherParams``) are
  synchronised over the rank's data-parallel group (the stage's ranks at tensor-parallel
  degree 1, ``Stage.data_parallel_group``): they start when every member has reached them.

A tensor group's members (tensor-parallel degree > 1) run the same passes of the same
micro-batches together: a pass starts once every member has reached it, and it includes
the group's all-reduces and the leader's broadcast of the input it received
(``cost.rank_pass``). Only the leader sends and receives between stages; a follower's list
has no point-to-point operations (``schedule.build``).

The list (one concept per class, all frozen, hashable):

=====================  ==========  =========================================================
operation              runs on     meaning
=====================  ==========  =========================================================
Forward(j, s)          compute     forward pass of micro-batch j through stage s's layers
Backward(j, s)         compute     backward pass of micro-batch j (recompute included)
SendActivation(j, r)   p2p         send j's output activation to rank r of the next stage
RecvActivation(j, r)   p2p         receive j's input activation from rank r
SendGradient(j, r)     p2p         send the gradient of j's input to rank r of the previous stage
RecvGradient(j, r)     p2p         receive the gradient of j's output from rank r
GatherPassParams(j,p)  dp channel  ZeRO-3: gather each layer's parameters for pass p of j
ScatterPassGrads(j)    dp channel  ZeRO-2/3: reduce-scatter j's gradients as B(j) makes them
AllReduceGrads(s)      dp, group   replicated stage: all-reduce the accumulated gradients
ReduceScatterGrads(s)  dp, group   ZeRO-1: uneven reduce-scatter of the accumulated gradients
OptimizerStep(s)       compute     update the owned shard (all of it when replicated)
AllGatherParams(s)     dp, group   ZeRO-1/2: uneven all-gather of the updated parameters
=====================  ==========  =========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "COMPUTE_OPS",
    "GROUP_OPS",
    "P2P_OPS",
    "AllGatherParams",
    "AllReduceGrads",
    "Backward",
    "Forward",
    "GatherPassParams",
    "GroupOp",
    "Op",
    "OptimizerStep",
    "Pass",
    "RecvActivation",
    "RecvGradient",
    "ReduceScatterGrads",
    "ScatterPassGrads",
    "SendActivation",
    "SendGradient",
    "describe_op",
    "most_in_flight",
]


class Pass(StrEnum):
    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    micro_batch: int
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Backward:
    micro_batch: int
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SendActivation:
    micro_batch: int
    peer: int  # the receiving rank


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvActivation:
    micro_batch: int
    peer: int  # the sending rank


@dataclass(frozen=True, slots=True, kw_only=True)
class SendGradient:
    micro_batch: int
    peer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RecvGradient:
    micro_batch: int
    peer: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherPassParams:
    micro_batch: int
    for_pass: Pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ScatterPassGrads:
    micro_batch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AllReduceGrads:
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReduceScatterGrads:
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerStep:
    stage: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AllGatherParams:
    stage: int


GroupOp = AllReduceGrads | ReduceScatterGrads | AllGatherParams
Op = (
    Forward
    | Backward
    | SendActivation
    | RecvActivation
    | SendGradient
    | RecvGradient
    | GatherPassParams
    | ScatterPassGrads
    | AllReduceGrads
    | ReduceScatterGrads
    | OptimizerStep
    | AllGatherParams
)
COMPUTE_OPS = (Forward, Backward, OptimizerStep)
P2P_OPS = (SendActivation, RecvActivation, SendGradient, RecvGradient)
GROUP_OPS = (AllReduceGrads, ReduceScatterGrads, AllGatherParams)


def describe_op(op: Op) -> str:
    """Short human name: ``F3``, ``B3``, ``send act 3 -> 5``, ``all-reduce``."""
    match op:
        case Forward(micro_batch=j):
            return f"F{j}"
        case Backward(micro_batch=j):
            return f"B{j}"
        case SendActivation(micro_batch=j, peer=peer):
            return f"send act {j} -> {peer}"
        case RecvActivation(micro_batch=j, peer=peer):
            return f"recv act {j} <- {peer}"
        case SendGradient(micro_batch=j, peer=peer):
            return f"send grad {j} -> {peer}"
        case RecvGradient(micro_batch=j, peer=peer):
            return f"recv grad {j} <- {peer}"
        case GatherPassParams(micro_batch=j, for_pass=for_pass):
            return f"gather {for_pass.value[0].upper()}{j}"
        case ScatterPassGrads(micro_batch=j):
            return f"scatter {j}"
        case AllReduceGrads():
            return "all-reduce"
        case ReduceScatterGrads():
            return "reduce-scatter"
        case OptimizerStep():
            return "optimizer"
        case AllGatherParams():
            return "all-gather"


def most_in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches a rank holds activations of at once when it runs ``ops``:
    forwards run minus backwards run, at its highest. A 1F1B rank often holds fewer than
    its in-flight budget (``cost.in_flight.stage_in_flight``, a bound the schedule keeps),
    because a gradient comes back before the budget is reached."""
    held = most = 0
    for op in ops:
        if isinstance(op, Forward):
            held += 1
            most = max(most, held)
        elif isinstance(op, Backward):
            held -= 1
    return most
