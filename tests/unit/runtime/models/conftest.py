"""Model tests run torch with one intra-op thread: on the shared 2-core machine, torch's
default two spinning threads competing with other processes made the training test run
about 15 times slower (138 s against 9 s, measured under a load average of 5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
