"""Training runs: under a plan on torch.distributed (``run_rank``, one call per rank), on
emulated clusters of CPU processes (``emulate``), or in one process as the reference every
plan must reproduce (``train_reference``)."""

from piebald.runtime.training.config import TrainConfig
from piebald.runtime.training.emulate import emulate
from piebald.runtime.training.metrics import RunSummary, StepMetrics
from piebald.runtime.training.rank_worker import run_rank
from piebald.runtime.training.reduced import DEFAULT_MAX_EMULATED_PARAMS, reduced_width_model
from piebald.runtime.training.reference import train_reference

__all__ = [
    "DEFAULT_MAX_EMULATED_PARAMS",
    "RunSummary",
    "StepMetrics",
    "TrainConfig",
    "emulate",
    "reduced_width_model",
    "run_rank",
    "train_reference",
]
