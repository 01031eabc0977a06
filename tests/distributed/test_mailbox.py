"""The pipeline's mailbox on gloo: messages arrive intact, and an activation's payload is
released once its gradient comes back, before the step ends (held all step, a rank's sends
would add up to two activations of memory per micro-batch, which the memory estimate
does not count), and any send once done: on gloo, whose sends report completion only once
waited on, through the mailbox's waiter thread; on NCCL from the send's CUDA event, which
no GPU has run here yet."""

from __future__ import annotations

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_completed_sends_release_their_payloads() -> None:
    run_ranks(dist_workers.mailbox_releases_sends, 2)


def test_one_tag_matches_in_posting_order_like_nccl() -> None:
    run_ranks(dist_workers.mailbox_one_tag_matches_in_posting_order, 2)


def test_gloo_sends_release_once_done() -> None:
    run_ranks(dist_workers.mailbox_gloo_sends_release_once_done, 2)
