"""One torchrun worker of an elastic run, as ``piebald train --plan P --elastic`` runs it,
through :func:`piebald.api.train` (what the CLI calls): the tests start it under torchrun
(``python elastic_driver.py --plan ... --node-name NODE``, or ``PIEBALD_NODE=NODE`` in the
environment as ``piebald launch --elastic`` sets it: torchrun's parser refuses a
``--node`` after the script, taking it for its own ``--node-rank``).

``--pace WORLD=SECONDS,...`` sleeps after each step line of the plan's leader, by torchrun's
world size, so that a test can act between steps (kill a node, start it again)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from piebald.api.training import train
from piebald.runtime.distributed.optimizer import OptimizerConfig
from piebald.runtime.training.config import TrainConfig


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--node-name")  # torchrun refuses a --node after the script
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--metrics", type=Path)
    parser.add_argument("--collective-timeout", type=float, default=300.0)
    parser.add_argument("--pace", default="")
    args = parser.parse_args(argv)
    pace = {
        int(world): float(seconds)
        for world, seconds in (item.split("=") for item in args.pace.split(",") if item)
    }
    pause_s = pace.get(int(os.environ["WORLD_SIZE"]), 0.0)

    def print_line(line: str) -> None:
        print(line, flush=True)
        if line.startswith("step "):
            time.sleep(pause_s)

    config = TrainConfig(
        steps=args.steps,
        seed=args.seed,
        optimizer=OptimizerConfig(lr=args.lr),
        device="cpu",
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        # Every start but the first finds the metrics file: an elastic run appends to it.
        resume=args.checkpoint_dir is not None,
        metrics_path=args.metrics,
        timeout_s=args.collective_timeout,
        elastic=True,
        node=args.node_name,
    )
    train(args.plan, config=config, device="cpu", print_line=print_line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
