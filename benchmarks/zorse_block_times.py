"""The Zorse authors' measured block times (benchmarks/data/zorse_layer_times.yaml) as
piebald inputs.

Each row is one transformer block's forward and backward of one micro-batch on one GPU type
in one dtype (Zorse's ``utils/runtime_estimator``: the sum of GPU kernel times under
torch.profiler, autocast over fp32 parameters; the file's ``measurement`` field). Only the
Llama rows are read -- the data's GPT blocks run unfused attention over many small heads,
which piebald does not run -- and only those the conversion marked ``use`` (no typed-in
values, no curve that drops as the micro-batch grows).

Every fourth micro-batch size (4, 8, 12, 16) is held back: the catalog's fractions are
fitted on the other rows (``benchmarks/block_times.py``) and judged on these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from piebald.profiler.block_fit import BlockTime
from piebald.specs.cluster_yaml import read_yaml
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.fields import Fields
from piebald.specs.model import Family, LayerKind, ModelArch, ModelSpec

__all__ = ["ZORSE_YAML", "ZorseRow", "is_held_out", "load_rows"]

ZORSE_YAML = Path(__file__).parent / "data" / "zorse_layer_times.yaml"
# The data's GPU names that its conversion left out of piebald's catalog but the catalog
# now has; the rest carry their catalog name in the row.
_CATALOG_NAME = {"h100-nvl": "H100-NVL"}
HELD_OUT_EVERY = 4  # micro-batch sizes 4, 8, 12, 16


def is_held_out(micro_batch_size: int) -> bool:
    """Whether a row of this micro-batch size is held back from the fit."""
    return micro_batch_size % HELD_OUT_EVERY == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ZorseRow:
    """One usable Llama row: the block time piebald prices (the data's v100-pciex16 and
    v100x16 both on the catalog's V100-16GB)."""

    time: BlockTime

    @property
    def held_out(self) -> bool:
        return is_held_out(self.time.micro_batch_size)

    @property
    def shape_key(self) -> tuple[Dtype, int, int]:
        """What two GPUs' rows must share to be compared: dtype, sequence, micro-batch."""
        return (self.time.dtype, self.time.seq_len, self.time.micro_batch_size)


def _block(row: Fields) -> ModelSpec:
    arch = ModelArch(
        family=Family.LLAMA,
        num_blocks=1,
        hidden_size=row.integer("hidden", minimum=1),
        num_heads=row.integer("heads", minimum=1),
        num_kv_heads=row.integer("kv_heads", minimum=1),
        ffn_hidden_size=row.integer("ffn", minimum=1),
        vocab_size=32000,  # the block does not see it
        max_seq_len=4096,
        tie_embeddings=False,
    )
    return ModelSpec(name=row.string("model"), arch=arch)


def load_rows(path: Path = ZORSE_YAML) -> list[ZorseRow]:
    """Every usable Llama row of ``path``, priced on the built-in catalog's devices; a row
    whose GPU the catalog lacks is an error naming it."""
    devices = builtin_catalog()
    top = Fields(read_yaml(path), source=str(path))
    models: dict[str, ModelSpec] = {}
    rows: list[ZorseRow] = []
    for row in top.sub_list("rows", non_empty=True):
        if row.string("activation") != "swiglu" or row.raw("use") is not True:
            continue
        name = _CATALOG_NAME.get(row.string("gpu"), row.string("catalog"))
        if name not in devices:
            raise row.error("catalog", name, "a GPU type of the catalog")
        model = models.setdefault(row.string("model"), _block(row))
        layer = next(layer for layer in model.layers if layer.kind is LayerKind.BLOCK)
        time = BlockTime(
            device=devices[name],
            dtype=Dtype(row.choice("dtype", ["fp16", "bf16", "fp32"])),
            layer=layer,
            seq_len=row.integer("seq_len", minimum=1),
            micro_batch_size=row.integer("mbs", minimum=1),
            forward_s=row.number("forward_ms", strictly_positive=True) / 1e3,
            backward_s=row.number("backward_ms", strictly_positive=True) / 1e3,
        )
        rows.append(ZorseRow(time=time))
    return rows
