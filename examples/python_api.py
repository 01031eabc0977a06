"""piebald from Python, step by step: describe a cluster, a model and a job; plan; check the
plan in the simulator; compare strategies; save the plan for ``piebald train``.

Runs in seconds without torch:  python examples/python_api.py [OUT_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import piebald
from piebald.examples import example_path

# 1. Describe: a cluster file, a model (a preset, or a Hugging Face config), a job.
cluster = piebald.load_cluster(example_path())  # the lab-mix example: 6 GPUs of 3 kinds
model = piebald.load_model("gpt2")
job = piebald.build_job(global_batch=16, seq_len=512, precision="bf16")
print(
    f"{model.name} ({model.num_params / 1e6:.0f}M parameters) on {cluster.name} "
    f"({cluster.num_gpus} GPUs), {job.global_batch_size} x {job.seq_len} tokens per step"
)

# 2. Plan: the fastest plan that fits every GPU's memory.
plan = piebald.plan(cluster, model, job)
assert plan.predicted is not None
print(
    f"plan: {len(plan.stages)} stage(s), predicted {plan.predicted.step_time_s * 1e3:.1f} ms "
    f"per step, {plan.predicted.tokens_per_s:,.0f} tokens/s"
)
for index, stage in enumerate(plan.stages):
    print(
        f"  stage {index}: ranks {list(stage.ranks)}, layers {stage.layer_start}-"
        f"{stage.layer_end - 1}, micro-batch {list(stage.micro_batch_size)}, "
        f"ZeRO {stage.zero}"
    )

# 3. Simulate: execute one step event by event and compare with the prediction.
result = piebald.simulate(plan)
print(
    f"simulated {result.step_time_s * 1e3:.1f} ms (simulated / predicted = "
    f"{result.step_time_s / plan.predicted.step_time_s:.3f}), bubble "
    f"{result.bubble_fraction:.1%}"
)

# 4. Compare: piebald against the baselines, each as modelled, under one cost model.
comparison = piebald.compare(cluster, model, job)
for row in comparison.rows:
    speed = f"{row.tokens_per_s:10,.0f} tokens/s" if row.feasible else "  infeasible"
    print(f"  {row.strategy:10} {speed}  {row.reason[:60]}")

# 5. Save: the plan file ``piebald simulate``, ``explain`` and ``train --plan`` read.
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
path = out / "gpt2-lab-mix.json"
piebald.save_plan(plan, path, overwrite=True)
assert piebald.load_plan(path) == plan
print(f"plan written to {path}")
