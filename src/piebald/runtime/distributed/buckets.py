"""Split a rank's parameters into its flat buckets under a plan: the stage bucket, and the
tied embedding/head weight's own bucket when that weight spans stages (why:
:mod:`piebald.runtime.distributed.group_layout`).

A ZeRO-2/3 stage gets one streamed bucket per layer instead of one stage bucket
(``stage{s}.layer{i}``): its gradients are reduce-scattered and, under ZeRO-3, its
parameters gathered and released layer by layer around every pass, so what one bucket
holds at a time is what one layer needs (``cost.memory`` prices exactly that).

The executor hands over its stage part's trainable parameters with **global** names (the
same name in every plan, e.g. ``layers.7.attention.wq.weight``) and, on the first and last
stage of a tied model, the global name under which the tied weight appears in that list
(on the last stage, the head's weight listed under the embedding's global name). Buckets
come back in the order the optimizer must visit them: stage first, then tied.

Under tensor parallelism the block weights a member holds a slice of (``split_names``) get
a bucket of their own, ``stage{s}.split``, sharded over the member's data-parallel group
(the members at its position of every tensor group); the stage bucket keeps what every
member holds whole, owned by the tensor groups' leaders (``group_layout``). Under ZeRO-2/3
both are streamed per layer: ``stage{s}.layer{i}.split`` over the data-parallel group, and
``stage{s}.layer{i}`` for the layer's whole weights (norms, row-parallel biases, embedding,
head), routed (``flat_bucket``): its sums and gathers run among the leaders only, each of
which hands the gathered layer on to its tensor group.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from torch import nn

from piebald.cost.memory import STEP_CHUNK_ELEMENTS
from piebald.cost.precision import group_wire_dtype
from piebald.runtime.distributed.collectives import CollectiveMethod
from piebald.runtime.distributed.flat_bucket import FlatBucket
from piebald.runtime.distributed.group_layout import BucketPlacement
from piebald.runtime.distributed.groups import CommGroup, ProcessGroups
from piebald.runtime.dtypes import TORCH_DTYPES
from piebald.specs.devices import Dtype

__all__ = ["TIED_BUCKET", "build_buckets", "layer_of", "stage_bucket_name"]

TIED_BUCKET = "tied"


SPLIT_SUFFIX = ".split"


def stage_bucket_name(stage_index: int, layer_index: int | None = None) -> str:
    name = f"stage{stage_index}"
    return name if layer_index is None else f"{name}.layer{layer_index}"


def _step_chunk(named_params: Sequence[tuple[str, nn.Parameter]]) -> int | None:
    """The elements a stage bucket reduces and gathers at a time at the step's end: its
    largest layer, at most ``STEP_CHUNK_ELEMENTS`` (``cost.memory``); None (all at once)
    for parameters that are not model layers."""
    per_layer: dict[int, int] = {}
    for name, param in named_params:
        try:
            index = layer_of(name)
        except ValueError:
            return None
        per_layer[index] = per_layer.get(index, 0) + param.numel()
    return min(max(per_layer.values()), STEP_CHUNK_ELEMENTS) if per_layer else None


def _by_layer(
    named_params: Sequence[tuple[str, nn.Parameter]],
) -> dict[int, list[tuple[str, nn.Parameter]]]:
    by_layer: dict[int, list[tuple[str, nn.Parameter]]] = {}
    for name, param in named_params:
        by_layer.setdefault(layer_of(name), []).append((name, param))
    return by_layer


def _routing(
    groups: ProcessGroups, placement: BucketPlacement
) -> tuple[CommGroup | None, CommGroup | None]:
    """(tensor group, owners' group) of a tensor-parallel stage's streamed buckets of
    whole weights (``flat_bucket``'s routed buckets): the owners are the tensor groups'
    leaders, who are position 0 of their groups, so their data-parallel group is the
    leaders' (None on a member); (None, None) at degree 1."""
    if groups.tensor is None or groups.tensor.size == 1:
        return None, None
    owners = None if groups.rank in placement.replicas else groups.data_parallel
    return groups.tensor, owners


def layer_of(global_name: str) -> int:
    """The layer index of a global parameter name (``layers.7.attention.wq.weight``: 7)."""
    parts = global_name.split(".")
    if len(parts) < 3 or parts[0] != "layers" or not parts[1].isdigit():
        raise ValueError(f"parameter name {global_name!r}: expected 'layers.<index>.<name>'")
    return int(parts[1])


def build_buckets(
    groups: ProcessGroups,
    *,
    named_params: Sequence[tuple[str, nn.Parameter]],
    tied_name: str | None = None,
    split_names: Collection[str] = (),
    dtypes: Mapping[int, Dtype] | None = None,
    stream_layers: bool = True,
    reduce_scatter_method: CollectiveMethod = CollectiveMethod.AUTO,
    all_gather_method: CollectiveMethod = CollectiveMethod.AUTO,
) -> tuple[FlatBucket, ...]:
    """This rank's buckets (none on an idle rank). Collective over the stage group and the
    tied group; call it on every used rank. ``dtypes``: every used rank's compute dtype
    (``runtime.training.precision.rank_dtypes``; None: fp32 everywhere), which sets this
    rank's compute dtype and each bucket's wire dtype (``cost.precision``).
    ``stream_layers=False`` keeps a ZeRO-2/3 stage in one bucket, gathered and reduced once
    per step by whoever drives it (tests of the optimizer on parameters that are not
    model layers); the runtime streams. ``split_names``: the parameters this rank holds a
    tensor-parallel slice of (``models.tensor_parallel.split_stage_part``)."""
    stage_index = groups.stage_index
    if stage_index is None or groups.stage is None:
        return ()
    names = [name for name, _ in named_params]
    rest = list(named_params)
    tied_params: list[tuple[str, nn.Parameter]] = []
    if groups.tied is not None:
        if tied_name is None or tied_name not in names:
            raise ValueError(
                f"rank {groups.rank} (stage {stage_index}) holds a replica of the tied "
                f"embedding/head weight; expected tied_name to name it among its "
                f"parameters, got {tied_name!r}"
            )
        tied_params = [(n, p) for n, p in named_params if n == tied_name]
        rest = [(n, p) for n, p in named_params if n != tied_name]

    def dtype_of(rank: int) -> Dtype:
        return dtypes[rank] if dtypes is not None else Dtype.FP32

    def make(
        name: str,
        params: list[tuple[str, nn.Parameter]],
        placement: BucketPlacement,
        group: CommGroup,
        init_src_rank: int | None = None,
        streamed: bool = False,
        chunk_numel: int | None = None,
        owners: CommGroup | None = None,
        mirror: CommGroup | None = None,
    ) -> FlatBucket:
        return FlatBucket(
            name,
            named_params=params,
            placement=placement,
            group=group,
            rank=groups.rank,
            compute_dtype=TORCH_DTYPES[dtype_of(groups.rank)],
            wire_dtype=TORCH_DTYPES[group_wire_dtype(dtype_of(r) for r in group.ranks)],
            init_src_rank=init_src_rank,
            reduce_scatter_method=reduce_scatter_method,
            all_gather_method=all_gather_method,
            streamed=streamed,
            chunk_numel=chunk_numel,
            owners=owners,
            mirror=mirror,
        )

    split = [(n, p) for n, p in rest if n in split_names]
    rest = [(n, p) for n, p in rest if n not in split_names]
    buckets: list[FlatBucket] = []
    placement = groups.layout.stages[stage_index]
    sliced = groups.layout.data_parallel_of(groups.rank)
    if split and (sliced is None or groups.data_parallel is None):
        raise ValueError(
            f"rank {groups.rank}: tensor-parallel slices need a data-parallel group "
            f"(stage {stage_index} has none)"
        )
    # Every rank of the stage holds the same parameters (and every member of a
    # data-parallel group the same slices), so all agree on these buckets.
    if stream_layers and placement.zero.per_pass:
        whole = _by_layer(rest)
        slices = _by_layer(split)
        mirror, owners = _routing(groups, placement)
        if mirror is not None and len({dtype_of(r) for r in mirror.ranks}) > 1:
            # The leader broadcasts the layer in its compute dtype (a tensor group sits in
            # one node, so its GPUs are of one type).
            raise ValueError(
                f"rank {groups.rank}: tensor group {list(mirror.ranks)} computes in "
                f"{sorted({dtype_of(r).value for r in mirror.ranks})}; expected one dtype"
            )
        # Layer by layer, the whole weights' bucket before the slices', the order the
        # passes visit them in (``pipeline.layer_stream``) on every rank alike.
        for index in sorted(whole.keys() | slices.keys()):
            name = stage_bucket_name(stage_index, index)
            if index in whole:
                buckets.append(
                    make(
                        name,
                        whole[index],
                        placement,
                        groups.stage,
                        streamed=True,
                        owners=owners,
                        mirror=mirror,
                    )
                )
            if index in slices:
                assert sliced is not None and groups.data_parallel is not None
                buckets.append(
                    make(
                        name + SPLIT_SUFFIX,
                        slices[index],
                        sliced,
                        groups.data_parallel,
                        streamed=True,
                    )
                )
    else:
        if rest:
            name = stage_bucket_name(stage_index)
            chunk = _step_chunk(rest)
            buckets.append(make(name, rest, placement, groups.stage, chunk_numel=chunk))
        if split:
            assert sliced is not None and groups.data_parallel is not None
            name = stage_bucket_name(stage_index) + SPLIT_SUFFIX
            chunk = _step_chunk(split)
            buckets.append(make(name, split, sliced, groups.data_parallel, chunk_numel=chunk))
    if tied_params:
        assert groups.layout.tied is not None and groups.tied is not None
        # The embedding's initial values win: a first-stage rank broadcasts them.
        first_stage_rank = min(groups.layout.stages[0].ranks)
        buckets.append(
            make(
                TIED_BUCKET,
                tied_params,
                groups.layout.tied,
                groups.tied,
                first_stage_rank,
                chunk_numel=_step_chunk(tied_params),
            )
        )
    return tuple(buckets)
