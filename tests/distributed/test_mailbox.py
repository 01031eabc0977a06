"""The pipeline's mailbox on gloo: messages arrive intact, and an activation's payload is
released once its gradient comes back, before the step ends (held all step, a rank's sends
would add up to two activations of memory per micro-batch, which the memory estimate
does not count). Releasing sends that report completion works on NCCL only (gloo's report
it only once waited on), and no GPU runs these tests."""

from __future__ import annotations

import dist_workers
import pytest
from dist_harness import run_ranks

pytestmark = pytest.mark.distributed


def test_completed_sends_release_their_payloads() -> None:
    run_ranks(dist_workers.mailbox_releases_sends, 2)


def test_one_tag_matches_in_posting_order_like_nccl() -> None:
    run_ranks(dist_workers.mailbox_one_tag_matches_in_posting_order, 2)
