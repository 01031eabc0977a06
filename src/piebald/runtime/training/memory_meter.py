"""Peak bytes of live tensors on one rank during a step: what the plan's memory prediction
(without the framework reserve) is held against.

* **CUDA**: the caching allocator's own statistics (``max_memory_allocated`` after
  ``reset_peak_memory_stats``): every live tensor block, nothing reserved but unused.
* **CPU**: no allocator statistics exist, so the meter counts storages itself. A
  ``TorchDispatchMode`` sees every tensor an operator returns (``torch.empty`` included);
  a storage is counted once, when first seen, at its size, and uncounted when Python's
  weak reference to it dies (torch keeps one Python object per live storage). Resizing a
  storage in place (how ZeRO-3 frees gathered parameters) is not an operator, so
  ``UntypedStorage.resize_`` is wrapped while the meter runs. Tensors made before the
  meter started are counted by :meth:`MemoryMeter.track`. Not seen: buffers the backends
  allocate inside their own threads (gloo's staging copies).

``torch.distributed._tools.mem_tracker.MemTracker`` counts storages the same way but also
attributes them to modules, and refuses a module called more than once per iteration,
which every micro-batch does; hence this small meter. ``tests/unit/runtime/training/
test_memory_meter.py`` holds it against known allocation patterns.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from types import TracebackType
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MemoryMeter", "process_peak_bytes"]


class _StorageCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's
    """Live and peak bytes of the storages this mode has seen."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.live_bytes = 0
        self.peak_bytes = 0
        # Keyed by the C++ StorageImpl's address, valid while the storage lives.
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.host_side = False  # storages first seen now are never counted
        self._host_storages: set[int] = set()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.add(leaf)
        return out

    def add(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._sizes:
            return
        size = storage.nbytes()
        if self.host_side:
            self._host_storages.add(key)
            size = 0
        self._sizes[key] = size
        self._refs[key] = weakref.ref(storage, functools.partial(self._dropped, key))
        self._grow(size)

    def resized(self, storage: torch.UntypedStorage, old_bytes: int) -> None:
        key = storage._cdata
        if key in self._sizes and key not in self._host_storages:
            new_bytes = storage.nbytes()
            self._sizes[key] = new_bytes
            self._grow(new_bytes - old_bytes)

    def _dropped(self, key: int, _: object) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)
        self._refs.pop(key, None)
        self._host_storages.discard(key)

    def _grow(self, delta: int) -> None:
        self.live_bytes += delta
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)


def process_peak_bytes(device: torch.device) -> int:
    """What a run reports when it does not count tensors: CUDA's allocator peak since the
    process started, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryMeter:
    """Use as a context manager around the whole run (CPU: the counting mode is active
    inside it); :meth:`start_step` and :meth:`peak_bytes` bracket a step. Disabled
    (``enabled=False``), it counts nothing and :meth:`peak_bytes` is
    :func:`process_peak_bytes`."""

    def __init__(self, device: torch.device, *, enabled: bool = True) -> None:
        self.device = device
        self.enabled = enabled
        counting = enabled and device.type == "cpu"
        self._counter = _StorageCounter() if counting else None
        self._original_resize: Callable[..., Any] | None = None

    def __enter__(self) -> MemoryMeter:
        if self._counter is not None:
            self._counter.__enter__()  # type: ignore[no-untyped-call]
            self._patch_resize()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._counter is not None:
            self._restore_resize()
            self._counter.__exit__(kind, error, traceback)  # type: ignore[no-untyped-call]

    def track(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count tensors that exist already (made before the meter started)."""
        if self._counter is not None:
            for tensor in tensors:
                self._counter.add(tensor)

    @contextlib.contextmanager
    def host_side(self) -> Iterator[None]:
        """Tensors made inside (and views of them, ever) are not counted: what a GPU run
        keeps in host memory, such as the step's token batch, of which each pass copies
        its micro-batch to the device."""
        if self._counter is None:
            yield
            return
        self._counter.host_side = True
        try:
            yield
        finally:
            self._counter.host_side = False

    def live_bytes(self) -> int:
        if self._counter is not None:
            return self._counter.live_bytes
        return int(torch.cuda.memory_allocated(self.device))

    def start_step(self) -> None:
        """Forget earlier peaks: the next peak is this step's."""
        if self._counter is not None:
            self._counter.peak_bytes = self._counter.live_bytes
        elif self.enabled:
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        """The most bytes of live tensors since :meth:`start_step`."""
        if self._counter is not None:
            return self._counter.peak_bytes
        if not self.enabled:
            return process_peak_bytes(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))

    def _patch_resize(self) -> None:
        counter = self._counter
        assert counter is not None
        original = torch.UntypedStorage.resize_
        self._original_resize = original

        @wraps(original)
        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            old_bytes = storage.nbytes()
            result = original(storage, size)
            counter.resized(storage, old_bytes)
            return result

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign, assignment]

    def _restore_resize(self) -> None:
        if self._original_resize is not None:
            torch.UntypedStorage.resize_ = self._original_resize  # type: ignore[method-assign]
            self._original_resize = None
