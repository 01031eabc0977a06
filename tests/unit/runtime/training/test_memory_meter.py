"""The CPU memory meter against allocation patterns whose live bytes are known exactly."""

from __future__ import annotations

import torch

from piebald.runtime.training.memory_meter import MemoryMeter

MB = 1_000_000


def test_counts_allocations_frees_views_and_resizes() -> None:
    resident = torch.zeros(MB // 4)  # 1 MB made before the meter starts
    with MemoryMeter(torch.device("cpu")) as meter:
        meter.track([resident])
        assert meter.live_bytes() == MB
        meter.start_step()
        a = torch.empty(2 * MB // 4)  # +2 MB
        view = a[: MB // 8]  # a view: no new storage
        b = torch.ones(MB // 4, dtype=torch.float16)  # +0.5 MB
        assert meter.live_bytes() == 3.5 * MB
        del a  # the view keeps the storage alive
        assert meter.live_bytes() == 3.5 * MB
        del view  # now it dies
        assert meter.live_bytes() == 1.5 * MB
        c = torch.empty(MB // 4)  # +1 MB
        c.untyped_storage().resize_(0)  # how ZeRO-3 frees gathered parameters
        assert meter.live_bytes() == 1.5 * MB
        c.untyped_storage().resize_(MB)
        assert meter.live_bytes() == 2.5 * MB
        assert meter.peak_bytes() == 3.5 * MB
        meter.start_step()  # a new step forgets the old peak
        assert meter.peak_bytes() == 2.5 * MB
        del b, c
    assert torch.UntypedStorage.resize_ is not None  # restored, still callable


def test_counts_autograd_saved_tensors_and_gradients() -> None:
    weight = torch.nn.Parameter(torch.randn(256, 256))  # 256 KiB
    x = torch.randn(64, 256)
    with MemoryMeter(torch.device("cpu")) as meter:
        meter.track([weight, x])
        meter.start_step()
        baseline = meter.live_bytes()
        y = (x @ weight).relu()  # mm saves x and weight, relu its output: only y is new
        assert meter.live_bytes() - baseline == y.numel() * 4
        assert meter.peak_bytes() - baseline == 2 * y.numel() * 4  # x @ w and y, at once
        y.sum().backward()
        assert weight.grad is not None
        del y
        # The gradient (256 KiB) stays; the graph's buffers are gone.
        assert meter.live_bytes() - baseline == weight.numel() * 4
        assert meter.peak_bytes() - baseline >= weight.numel() * 4 + 64 * 256 * 4


def test_host_side_tensors_and_their_views_are_never_counted() -> None:
    """The step's token batch stays in host memory on a GPU: made under ``host_side`` it
    is not counted, nor are slices of it; a copy of a slice is."""
    with MemoryMeter(torch.device("cpu")) as meter:
        with meter.host_side():
            batch = torch.zeros(MB // 8, dtype=torch.int64)  # 1 MB
        assert meter.live_bytes() == 0
        rows = batch[: MB // 16]  # a view: still the host's
        assert meter.live_bytes() == 0
        copied = rows.to("cpu", copy=True)  # 0.5 MB of the rank's own
        assert meter.live_bytes() == MB // 2
        del rows, copied
        assert meter.live_bytes() == 0
        del batch
