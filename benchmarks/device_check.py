"""One prepared run for a lent GPU: piebald's runtime on it, against piebald's own prices.

No GPU has been lent to this project so far. What the cost model's fidelity lacks most
is piebald's own runtime timed on a real GPU, kernel by kernel and step by step, beside
the cost model's prices for the same work: the published runs it is measured against used other
frameworks' kernels. The device tool lends one GPU for 15 minutes a task (starts
included), so this does all of it in one call of a few minutes:

1. ``gpu.txt``: the GPU as nvidia-smi and torch see it;
2. ``calibration.txt``: ``benchmarks/calibration.py`` on the GPU -- the runtime's
   embedding, block and head of llama-3-8b (sequences of 2,048 and 8,192 tokens) and
   gpt2-xl (1,024) timed per pass and micro-batch size (``piebald profile compute``),
   against the analytic prices of the GPU's catalog entry, before and after fitting;
   ``profiles.tgz``: that profile DB, to unpack into ``benchmarks/profiles/<gpu>/``;
3. ``kernels.txt``: ``benchmarks/kernel_breakdown.py`` for a llama-3-8b block at 8,192
   tokens and a gpt2-xl block at 8 x 1,024: device time of the GEMMs, flash attention,
   the memory-bound kernels and the gaps between kernels, beside the cost model's terms;
4. ``train-<model>.json``: one-GPU training under torchrun (NCCL, the GPU's native
   dtype) of gpt2 at 1,024 tokens and llama-3.2-1b at 2,048, planned for a one-GPU
   cluster of the detected type: measured tokens/s and peak memory beside the plan's;
5. ``device-check.log``: every command with its output.

A step that fails is logged and the rest still run. Run it from the repository root:

    python3 benchmarks/device_check.py [--out DIR] [--device cuda|cpu] [--quick]

``--out`` defaults to ``$OUT`` (the device tool's folder; at most 8 files come back).
``--device cpu --quick`` runs the same steps here on tiny shapes, to check the script
before spending device time. The device image has torch 2.11: the profiler and a
one-rank run work there (checked on CPU with torch 2.11); runs of several ranks need the
collectives of 2.13.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 240  # one command; the whole check is meant to end well inside one call


@dataclass(frozen=True, slots=True, kw_only=True)
class Shapes:
    """What to time and to train: (model, sequence length, micro-batch sizes) profiled, the
    blocks broken down kernel by kernel, and (model, sequence length, global batch)
    trained, with the steps of each run."""

    profiled: tuple[tuple[str, int, str], ...]
    broken_down: tuple[tuple[str, int, int], ...]  # (model, sequence, micro-batch size)
    trained: tuple[tuple[str, int, int], ...]
    steps: int


FULL = Shapes(
    profiled=(
        ("llama-3-8b", 2048, "1,2,4"),
        ("llama-3-8b", 8192, "1,2"),
        ("gpt2-xl", 1024, "1,2,4,8"),
    ),
    broken_down=(("llama-3-8b", 8192, 1), ("gpt2-xl", 1024, 8)),
    trained=(("gpt2", 1024, 32), ("llama-3.2-1b", 2048, 16)),
    steps=8,
)
QUICK = Shapes(
    profiled=(("tiny", 32, "1,2"),),
    broken_down=(("tiny", 64, 2),),
    trained=(("tiny", 64, 8),),
    steps=2,
)


class Log:
    """Every command and its output, appended to ``device-check.log``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def run(
        self, name: str, command: list[str], *, cwd: Path = ROOT
    ) -> subprocess.CompletedProcess[str] | None:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            self.write(f"== {name}: {' '.join(command)}\n{error}\n")
            print(f"{name}: failed ({error})", flush=True)
            return None
        elapsed = time.perf_counter() - started
        self.write(
            f"== {name} (rc {done.returncode}, {elapsed:.0f} s): {' '.join(command)}\n"
            f"{done.stdout}{done.stderr}\n"
        )
        print(f"{name}: rc {done.returncode} in {elapsed:.0f} s", flush=True)
        return done

    def write(self, text: str) -> None:
        with self.path.open("a") as log:
            log.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "device-check")))
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a check here)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = QUICK if args.quick else FULL
    log = Log(args.out / "device-check.log")
    gpu_type = describe_gpu(args.out / "gpu.txt", device=args.device, log=log)
    with tempfile.TemporaryDirectory(prefix="piebald-device-check-") as scratch:
        db = Path(scratch) / "profiles"
        calibrate(db, out=args.out, device=args.device, shapes=shapes, log=log)
        break_down(out=args.out, device=args.device, shapes=shapes, log=log)
        for model, seq_len, global_batch in shapes.trained:
            train(
                model,
                seq_len=seq_len,
                global_batch=global_batch,
                steps=shapes.steps,
                gpu_type=gpu_type,
                device=args.device,
                scratch=Path(scratch),
                out=args.out,
                log=log,
            )
    print(f"results in {args.out}: {', '.join(sorted(p.name for p in args.out.iterdir()))}")
    return 0


def describe_gpu(path: Path, *, device: str, log: Log) -> str:
    """Write what the GPU is to ``path``; return its catalog type (H100-SXM on a CPU check,
    whose plans are then an H100's)."""
    lines: list[str] = []
    if shutil.which("nvidia-smi"):
        query = "--query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version"
        done = log.run("nvidia-smi", ["nvidia-smi", query, "--format=csv"])
        if done is not None:
            lines.append(done.stdout.strip())
    code = (
        "import torch; from piebald.profiler.device_map import catalog_name\n"
        "print(torch.__version__)\n"
        "if torch.cuda.is_available():\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    print(p.name, p.total_memory, p.multi_processor_count)\n"
        "    print(catalog_name(p.name, memory_bytes=p.total_memory))\n"
    )
    done = log.run("torch", [sys.executable, "-c", code])
    reported = done.stdout.strip().splitlines() if done is not None and done.returncode == 0 else []
    lines += reported
    path.write_text("\n".join(lines) + "\n")
    if device == "cuda" and len(reported) >= 3 and reported[-1] != "None":
        return reported[-1]
    return "H100-SXM"


def calibrate(db: Path, *, out: Path, device: str, shapes: Shapes, log: Log) -> None:
    """Profile every shape into ``db``, report measured against analytic, pack the DB."""
    script = str(ROOT / "benchmarks" / "calibration.py")
    for model, seq_len, sizes in shapes.profiled:
        log.run(
            f"profile {model} s{seq_len}",
            [
                sys.executable, script, "--device", device, "--models", model,
                "--seq-lens", str(seq_len), "--micro-batch-sizes", sizes,
                "--rounds", "1", "--repeats", "5", "--out", str(db),
            ],
        )  # fmt: skip
    if not db.is_dir():
        return
    done = log.run("calibration", [sys.executable, script, "--profiles", str(db)])
    if done is not None:
        (out / "calibration.txt").write_text(done.stdout + done.stderr)
    with tarfile.open(out / "profiles.tgz", "w:gz") as archive:
        archive.add(db, arcname="profiles")


def break_down(*, out: Path, device: str, shapes: Shapes, log: Log) -> None:
    """Each block's kernels beside the cost model's terms, one after another in
    ``kernels.txt``."""
    script = str(ROOT / "benchmarks" / "kernel_breakdown.py")
    tables: list[str] = []
    for model, seq_len, size in shapes.broken_down:
        done = log.run(
            f"kernels {model} s{seq_len}",
            [
                sys.executable, script, "--model", model, "--seq-len", str(seq_len),
                "--micro-batch-size", str(size), "--device", device,
            ],
        )  # fmt: skip
        if done is not None:
            tables.append(done.stdout)
    if tables:
        (out / "kernels.txt").write_text("\n".join(tables))


def train(
    model: str,
    *,
    seq_len: int,
    global_batch: int,
    steps: int,
    gpu_type: str,
    device: str,
    scratch: Path,
    out: Path,
    log: Log,
) -> None:
    """Plan ``model`` for one GPU of ``gpu_type`` and train it for ``steps`` under torchrun;
    its run summary (measured and predicted tokens/s and memory) to ``train-<model>.json``."""
    cluster = scratch / f"one-{model}.yaml"
    cluster.write_text(
        f"name: one-{gpu_type}\nnodes:\n"
        f"  - {{name: gpu, count: 1, gpu: {gpu_type}, gpus_per_node: 1, intra_link: 900GB/s}}\n"
    )
    plan = scratch / f"plan-{model}.json"
    planned = log.run(
        f"plan {model}",
        [
            sys.executable, "-m", "piebald", "plan", "--cluster", str(cluster), "--model", model,
            "--global-batch", str(global_batch), "--seq-len", str(seq_len),
            "--out", str(plan), "--force",
        ],
    )  # fmt: skip
    if planned is None or planned.returncode != 0:
        return
    trained = log.run(
        f"train {model}",
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "1", "-m", "piebald", "train", "--plan", str(plan), "--device", device,
            "--steps", str(steps), "--json",
        ],
    )  # fmt: skip
    if trained is None or trained.returncode != 0:
        return
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    (out / f"train-{model}.json").write_text(json.dumps(summary, indent=1) + "\n")
    measured, predicted = summary["tokens_per_s"], summary["predicted_tokens_per_s"]
    memory = summary["memory"]["0"]
    print(
        f"  {model}: {measured:,.0f} tokens/s measured, {predicted:,.0f} predicted "
        f"({measured / predicted:.2f}); memory {memory['measured_bytes'] / 2**30:.2f} GiB "
        f"measured, {memory['predicted_bytes'] / 2**30:.2f} GiB predicted"
    )


if __name__ == "__main__":
    sys.exit(main())
