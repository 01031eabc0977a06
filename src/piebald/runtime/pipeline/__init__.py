"""The pipeline executor: one rank's operations for a step (from the simulator's schedule
generator, ``piebald.schedule.build``) run on torch.distributed, with asynchronous
point-to-point transfers between stages of any sizes and, under emulation, each operation
paced to the time the cost model gives it on the emulated GPU."""

from piebald.runtime.pipeline.executor import PipelineExecutor, StepOutcome
from piebald.runtime.pipeline.pacing import Pacer
from piebald.runtime.pipeline.rows import micro_batch_rows

__all__ = ["Pacer", "PipelineExecutor", "StepOutcome", "micro_batch_rows"]
