"""Time one layer of each kind (embedding, one block, norm + head) forward and backward.

Imports torch: only the CLI's ``profile compute`` and tests load this module.

For each distinct layer kind and micro-batch size the layer alone is built as a one-layer
stage part (``build_stage_part(model, layer_start=i, layer_end=i + 1)``), so a 70B model's
block is profiled on one GPU without the rest of the model. One iteration is what a
pipeline stage does with a micro-batch: forward from an input of the stage's shape (token
ids for the embedding, hidden states that need a gradient otherwise) and, for the head,
the summed token loss; then backward (from the loss, or from a random output gradient as
if it came from the next stage), accumulating into the parameters' ``.grad``. After
``num_warmup`` iterations, ``num_repeats`` are timed -- CUDA events around each pass on a
GPU; on a CPU the thread's CPU time (``time.thread_time``) when torch computes on one
thread, else the wall clock (``time.perf_counter``) -- and the median is kept. With one
thread every kernel, forward and backward (autograd runs CPU backward on the calling
thread), runs on the timing thread, so its CPU time is the pass's time on a core of its
own: time the OS gives to other processes on a shared machine does not count, which on a
loaded two-core box otherwise inflates single passes by 1.5-2x at random. Every pass
starts with cold caches (see ``_Timer``), as it does in training. Blocks are timed
again under full and under selective recompute (activation checkpointing): the backward
runs again what the forward did not keep.

Memory: ``activation_bytes`` sums the storages the forward saves for the backward
(``torch.autograd.graph.saved_tensors_hooks``, each storage once, parameters excluded).
Under selective recompute torch keeps what the policy saves in a cache of its own, which
those hooks do not see: there the runtime's memory meter counts what the block's forward
leaves alive (``_kept_bytes``).
``peak_memory_bytes`` is the CUDA allocator's peak over a forward and backward on a GPU;
on a CPU, where no allocator keeps statistics, it is parameters + gradients + activations.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from piebald.cost.profiled_curve import distinct_layers
from piebald.profiler.device_map import device_type_name
from piebald.profiler.keys import ComputeKey, layer_signature
from piebald.profiler.records import ComputeProfile, DeviceInfo, LayerTiming, Provenance
from piebald.runtime.dtypes import TORCH_DTYPES
from piebald.runtime.models import StagePart, build_stage_part, token_loss_sum
from piebald.runtime.training.memory_meter import MemoryMeter
from piebald.specs.devices import Dtype, builtin_catalog
from piebald.specs.model import LayerKind, ModelSpec
from piebald.specs.recompute import Recompute

__all__ = ["cpu_clock_name", "detect_device", "profile_compute"]

log = logging.getLogger(__name__)


Progress = Callable[[float, str], None]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _cpu_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1.0 * 2**30


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_clock_name() -> str:
    """The clock CPU passes are timed with: the thread's CPU time when torch computes on
    one thread (all the work is on the timing thread), else the wall clock."""
    return "thread_time" if torch.get_num_threads() == 1 else "perf_counter"


_CPU_CLOCKS: dict[str, Callable[[], float]] = {
    "thread_time": time.thread_time,
    "perf_counter": time.perf_counter,
}


def _rate_probe(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """(large-GEMM FLOP/s, large-copy bytes/s) measured in ``dtype`` on ``device``: what a
    custom device type in a cluster file can declare for a device the catalog lacks."""
    n = 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    source = torch.empty(16 * 2**20, device=device, dtype=torch.float32)
    # Into a buffer allocated once: ``source.clone()`` would time a fresh 64 MiB allocation
    # each call, which on a CPU is page faults (the kernel zeroing every new page), not
    # copying -- 2.4 GB/s measured on a 19 GB/s core (issue 15's CPU fidelity check).
    destination = torch.empty_like(source)

    clock = time.perf_counter if device.type == "cuda" else _CPU_CLOCKS[cpu_clock_name()]

    def best_of(action: Callable[[], object], repeats: int = 5) -> float:
        action()
        times = []
        for _ in range(repeats):
            _synchronize(device)
            start = clock()
            action()
            _synchronize(device)
            times.append(clock() - start)
        return min(times)

    matmul_s = best_of(lambda: a @ b)
    copy_s = best_of(lambda: destination.copy_(source))
    copied_bytes = 2.0 * source.numel() * source.element_size()  # read + write
    return 2.0 * n**3 / matmul_s, copied_bytes / copy_s


def detect_device(device: torch.device, dtype: Dtype, *, name: str | None = None) -> DeviceInfo:
    """What ``device`` is: its catalog type if known, else its reported name with measured
    memory, GEMM rate and copy rate. ``name`` overrides the key name (tests fake machines)."""
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        reported, memory_bytes = properties.name, float(properties.total_memory)
        found, in_catalog = device_type_name(reported, memory_bytes=memory_bytes)
    else:
        reported, memory_bytes = _cpu_name(), _cpu_memory_bytes()
        found, in_catalog = "cpu", False
    matmul_flops, copy_bytes_per_s = _rate_probe(device, TORCH_DTYPES[dtype])
    return DeviceInfo(
        name=name or found,
        reported_name=reported,
        # A name given is a catalog type only if the catalog has it (the CLI refuses
        # catalog names the device is not).
        in_catalog=in_catalog if name is None else name in builtin_catalog(),
        memory_bytes=memory_bytes,
        matmul_flops=matmul_flops,
        copy_bytes_per_s=copy_bytes_per_s,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Pass:
    forward_s: float
    backward_s: float


def _last_level_cache_bytes(device: torch.device) -> int:
    """The largest cache in front of ``device``'s memory: the GPU's L2, or the CPU's
    last-level cache as sysfs reports it; 0 where unknown."""
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        return int(getattr(properties, "L2_cache_size", 0))
    largest = 0
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text(encoding="utf-8").strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            largest = max(largest, int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return largest


_DEFAULT_FLUSH_BYTES = 256 * 2**20  # where the cache size is unknown (Triton's choice)


class _Timer:
    """Forward and backward durations of one iteration: CUDA events on a GPU; on a CPU the
    clock :func:`cpu_clock_name` chooses.

    Each pass starts with cold caches: a buffer twice the last-level cache is written just
    before it, untimed (as Triton's ``do_bench`` flushes the L2 before every repetition).
    In training a layer's pass follows other layers' passes that have evicted its weights,
    its activations and the framework's own code and data; timing one layer in a tight
    loop instead keeps them cached, which flatters small layers, and makes a pass depend
    on what its own other pass streamed (gpt2's embedding forward after a backward that
    writes a 154 MB table gradient, tiny's after one that writes 64 KB).
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.clock = _CPU_CLOCKS[cpu_clock_name()]
        cache_bytes = _last_level_cache_bytes(device)
        flush_bytes = 2 * cache_bytes if cache_bytes else _DEFAULT_FLUSH_BYTES
        self.flush_buffer = torch.empty(flush_bytes, dtype=torch.uint8, device=device)

    def flush(self) -> None:
        self.flush_buffer.zero_()

    def run(
        self, forward: Callable[[], torch.Tensor], backward: Callable[[torch.Tensor], None]
    ) -> _Pass:
        if self.cuda:
            events = [
                torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                for _ in range(4)
            ]
            self.flush()
            events[0].record()
            out = forward()
            events[1].record()
            self.flush()
            events[2].record()
            backward(out)
            events[3].record()
            torch.cuda.synchronize(self.device)
            return _Pass(
                forward_s=events[0].elapsed_time(events[1]) / 1e3,
                backward_s=events[2].elapsed_time(events[3]) / 1e3,
            )
        self.flush()
        start_s = self.clock()
        out = forward()
        forward_s = self.clock() - start_s
        self.flush()
        start_s = self.clock()
        backward(out)
        return _Pass(forward_s=forward_s, backward_s=self.clock() - start_s)


def _saved_bytes(forward: Callable[[], torch.Tensor], parameters: set[int]) -> float:
    """Bytes of the storages the forward saves for backward, each once, weights excluded."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = forward()
    del out
    return float(sum(storages.values()))


def _kept_bytes(part: StagePart, *, index: int, inputs: torch.Tensor) -> float:
    """Bytes a block's forward leaves alive for its backward, counted by the runtime's
    memory meter: its input (the checkpoint holds it) and what it keeps beyond, not its
    output (the next layer's input) nor the rotary tables (the part's blocks share them)."""
    rope = part.rope(inputs)
    meter = MemoryMeter(inputs.device)
    gc.collect()  # tensors of earlier passes die now, not inside the count
    with meter:
        meter.track([inputs, *part.parameters(), *(rope or ())])
        before = meter.live_bytes()
        out = part.run_layer(index, inputs, rope)
        kept = meter.live_bytes() - before - out.untyped_storage().nbytes()
        del out
    return float(kept + inputs.untyped_storage().nbytes())


_Measured = tuple[_Pass, float, float]


def _time_layer(
    model: ModelSpec,
    part: StagePart,
    *,
    index: int,
    micro_batch_size: int,
    seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
    recompute: Recompute,
    num_warmup: int,
    num_repeats: int,
    seed: int,
) -> _Measured:
    """(median forward and backward time, activation bytes, peak memory bytes)."""
    part.recompute = recompute
    generator = torch.Generator(device="cpu").manual_seed(seed)
    kind = model.layers[index].kind
    arch = model.arch
    shape = (micro_batch_size, seq_len)
    if kind is LayerKind.EMBEDDING:
        inputs = torch.randint(0, arch.vocab_size, shape, generator=generator).to(device)
    else:
        hidden = torch.randn((*shape, arch.hidden_size), generator=generator)
        inputs = hidden.to(device=device, dtype=dtype).requires_grad_(True)
    labels = torch.randint(0, arch.vocab_size, shape, generator=generator).to(device)
    if kind is not LayerKind.HEAD:
        out_gradient = torch.randn((*shape, arch.hidden_size), generator=generator)
        out_gradient = out_gradient.to(device=device, dtype=dtype)

    def forward() -> torch.Tensor:
        out = part(inputs)
        return token_loss_sum(out, labels) if kind is LayerKind.HEAD else out

    def backward(out: torch.Tensor) -> None:
        if kind is LayerKind.HEAD:
            out.backward()  # type: ignore[no-untyped-call]
        else:
            out.backward(out_gradient)  # type: ignore[no-untyped-call]

    timer = _Timer(device)
    passes = []
    for iteration in range(num_warmup + num_repeats):
        if inputs.requires_grad:
            inputs.grad = None
        timed = timer.run(forward, backward)
        if iteration >= num_warmup:
            passes.append(timed)
    del timer  # its cache-flush buffer must not count in the peak memory below
    parameters = {p.untyped_storage().data_ptr() for p in part.parameters()}
    if recompute is Recompute.SELECTIVE:
        # Selective recompute keeps what its policy saves in a cache of its own, where
        # saved-tensor hooks do not see it.
        activation_bytes = _kept_bytes(part, index=index, inputs=inputs)
    else:
        activation_bytes = _saved_bytes(forward, parameters)
    state_bytes = float(
        sum(2 * p.numel() * p.element_size() for p in part.parameters())  # weights + grads
    )
    if device.type == "cuda":
        _synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        backward(forward())
        _synchronize(device)
        peak_bytes = float(torch.cuda.max_memory_allocated(device))
    else:
        peak_bytes = state_bytes + activation_bytes
    median = _Pass(
        forward_s=statistics.median(p.forward_s for p in passes),
        backward_s=statistics.median(p.backward_s for p in passes),
    )
    return median, activation_bytes, peak_bytes


def profile_compute(
    model: ModelSpec,
    *,
    seq_len: int,
    micro_batch_sizes: tuple[int, ...],
    dtype: Dtype,
    device: str = "cpu",
    num_warmup: int = 2,
    num_repeats: int = 5,
    device_name: str | None = None,
    progress: Progress | None = None,
    seed: int = 0,
) -> tuple[ComputeProfile, ...]:
    """One compute profile per distinct layer kind of ``model`` (see the module docstring)."""
    if seq_len > model.arch.max_seq_len:
        raise ValueError(
            f"seq_len {seq_len} exceeds {model.name}'s max_seq_len {model.arch.max_seq_len}"
        )
    torch_device = torch.device(device)
    torch_dtype = TORCH_DTYPES[dtype]
    info = detect_device(torch_device, dtype, name=device_name)
    provenance = Provenance(
        host=socket.gethostname(),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch_version=torch.__version__,
        timer="cuda-events" if torch_device.type == "cuda" else cpu_clock_name(),
        num_warmup=num_warmup,
        num_repeats=num_repeats,
    )
    sizes = tuple(sorted(set(micro_batch_sizes)))
    layers = distinct_layers(model)
    steps = len(layers) * len(sizes)
    profiles = []
    done = 0
    for layer in layers:
        part = build_stage_part(
            model,
            layer_start=layer.index,
            layer_end=layer.index + 1,
            dtype=torch_dtype,
            device=torch_device,
        )
        part.train()
        timings = []
        for size in sizes:
            if progress is not None:
                progress(done / steps, f"{layer.kind} micro-batch {size}")

            def measure(
                recompute: Recompute,
                index: int = layer.index,
                size: int = size,
                part: StagePart = part,
            ) -> _Measured:
                return _time_layer(
                    model,
                    part,
                    index=index,
                    micro_batch_size=size,
                    seq_len=seq_len,
                    dtype=torch_dtype,
                    device=torch_device,
                    recompute=recompute,
                    num_warmup=num_warmup,
                    num_repeats=num_repeats,
                    seed=seed,
                )

            plain, activation_bytes, peak_bytes = measure(Recompute.NONE)
            recompute_s: float | None = None
            recompute_bytes: float | None = None
            selective_s: float | None = None
            selective_bytes: float | None = None
            if layer.kind is LayerKind.BLOCK:
                again, recompute_bytes, _ = measure(Recompute.FULL)
                recompute_s = again.backward_s
                kept, selective_bytes, _ = measure(Recompute.SELECTIVE)
                selective_s = kept.backward_s
            timings.append(
                LayerTiming(
                    micro_batch_size=size,
                    forward_s=plain.forward_s,
                    backward_s=plain.backward_s,
                    backward_recompute_s=recompute_s,
                    activation_bytes=activation_bytes,
                    activation_recompute_bytes=recompute_bytes,
                    peak_memory_bytes=peak_bytes,
                    backward_selective_s=selective_s,
                    activation_selective_bytes=selective_bytes,
                )
            )
            done += 1
            log.info("profiled %s micro-batch %d: %s", layer.kind, size, timings[-1])
        profiles.append(
            ComputeProfile(
                key=ComputeKey(
                    device=info.name,
                    signature=layer_signature(model.arch, layer.kind),
                    seq_len=seq_len,
                    dtype=dtype,
                ),
                layer_kind=layer.kind,
                model=model,
                device_info=info,
                timings=tuple(timings),
                provenance=provenance,
            )
        )
    if progress is not None:
        progress(1.0, "done")
    return tuple(profiles)
