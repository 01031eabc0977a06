"""Asynchronous point-to-point messages between stages: activations forward, their gradients
backward, each matched by a tag unique to (kind, micro-batch) within the step.

Receives are posted early (the schedule keeps two posted from each neighbouring stage) and
waited on only by the operation that needs them; sends are posted after the pass that makes
them and waited on at the end of the step, so no rank ever blocks on a peer except for an
input it is about to use. A send's payload is released before the step ends where the
rank can tell that the send has completed: an activation's once its gradient comes back
(the next stage ran the forward, so it had received it), and any send that reports
itself completed (NCCL does, from its CUDA event) whenever the rank sends or takes a
message. Held all step, sends would add two activations' worth of memory per micro-batch.
That is the execution model under which the schedule generator proves its lists
deadlock-free. Gloo's sends report completion only once waited on (``is_completed`` stays
false and ``get_future`` is not implemented, checked on torch 2.13), and waiting on the
main thread could block on a peer that is itself waiting, so on gloo one background thread
per mailbox waits on each send in turn and marks it done; the payload is then released as
on NCCL (``Work.wait`` drops the GIL while it blocks).

Gloo matches messages by tag. NCCL ignores tags and matches the messages of one (sender,
receiver) pair in the order both sides post them; that order agrees too: between a rank of
stage s and one of stage s+1 activations flow one way and gradients the other, and both
ends post each kind in ascending micro-batch order (every rank runs its forwards, and its
backwards, in ascending micro-batch order; see ``piebald.schedule.build``).
``Mailbox(one_tag=True)`` puts every message on tag 0, so gloo matches them as NCCL does,
in posting order per pair; the equivalence tests run that way too, so this argument is
tested on CPU. The NCCL path itself has not run yet: no GPU was available when it was
written.

Under emulation each message is followed by a one-element float64 "stamp" message: the
time (``time.monotonic``, one clock for every process of the machine) at which the
emulated link delivers it, so the receiver can wait until then.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.distributed as dist

__all__ = ["Mailbox", "MessageKind", "message_tag"]


class MessageKind(IntEnum):
    ACTIVATION = 0
    GRADIENT = 1


_TAGS_PER_MICRO_BATCH = 4  # activation, its stamp, gradient, its stamp


def message_tag(kind: MessageKind, micro_batch: int, *, stamp: bool = False) -> int:
    return micro_batch * _TAGS_PER_MICRO_BATCH + 2 * int(kind) + int(stamp)


@dataclass(slots=True)
class _Posted:
    work: dist.Work
    tensor: torch.Tensor
    stamp_work: dist.Work | None
    stamp: torch.Tensor | None
    waited: Future[None] | None = None  # gloo sends: the background wait

    def completed(self) -> bool:
        if self.waited is not None:
            return self.waited.done()
        stamp_done = self.stamp_work is None or self.stamp_work.is_completed()
        return self.work.is_completed() and stamp_done


class Mailbox:
    """One rank's posted receives and in-flight sends for one step."""

    def __init__(self, *, device: torch.device, stamped: bool, one_tag: bool = False) -> None:
        self.device = device
        self.stamped = stamped
        self.one_tag = one_tag  # NCCL's matching: in posting order per (sender, receiver)
        self._receives: dict[tuple[MessageKind, int], _Posted] = {}
        self._sends: dict[tuple[MessageKind, int], _Posted] = {}
        # Started on the first send (a rank that sends nothing starts no thread).
        self._waiter: _SendWaiter | None = None
        self._waits_in_background = dist.get_backend() == "gloo"

    def post_receive(
        self,
        kind: MessageKind,
        *,
        micro_batch: int,
        peer: int,
        shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> None:
        key = (kind, micro_batch)
        if key in self._receives:
            raise RuntimeError(f"receive of {kind.name.lower()} {micro_batch} posted twice")
        tensor = torch.empty(shape, dtype=dtype, device=self.device)
        work = dist.irecv(tensor, src=peer, tag=self._tag(kind, micro_batch))
        assert work is not None
        stamp_work, stamp = None, None
        if self.stamped:
            stamp = torch.empty(1, dtype=torch.float64)
            stamp_work = dist.irecv(stamp, src=peer, tag=self._tag(kind, micro_batch, stamp=True))
        self._receives[key] = _Posted(work=work, tensor=tensor, stamp_work=stamp_work, stamp=stamp)

    def _tag(self, kind: MessageKind, micro_batch: int, *, stamp: bool = False) -> int:
        return 0 if self.one_tag else message_tag(kind, micro_batch, stamp=stamp)

    def take(self, kind: MessageKind, *, micro_batch: int) -> tuple[torch.Tensor, float | None]:
        """Wait for a posted receive: (the tensor, its emulated arrival time or None)."""
        self._release_sent()
        posted = self._receives.pop((kind, micro_batch))
        posted.work.wait()
        if kind is MessageKind.GRADIENT:  # the activation it answers has been received
            self._complete(self._sends.pop((MessageKind.ACTIVATION, micro_batch), None))
        arrival: float | None = None
        if posted.stamp_work is not None and posted.stamp is not None:
            posted.stamp_work.wait()
            arrival = float(posted.stamp.item())
        return posted.tensor, arrival

    def send(
        self,
        kind: MessageKind,
        *,
        micro_batch: int,
        peer: int,
        tensor: torch.Tensor,
        arrival: float | None = None,
    ) -> None:
        payload = tensor.detach().contiguous()
        work = dist.isend(payload, dst=peer, tag=self._tag(kind, micro_batch))
        assert work is not None
        stamp_work, stamp = None, None
        if self.stamped:
            if arrival is None:
                raise ValueError("an emulated send needs its arrival time")
            stamp = torch.tensor([arrival], dtype=torch.float64)
            stamp_work = dist.isend(stamp, dst=peer, tag=self._tag(kind, micro_batch, stamp=True))
        # Keep the payload alive until the send completes.
        self._release_sent()
        posted = _Posted(work=work, tensor=payload, stamp_work=stamp_work, stamp=stamp)
        if self._waits_in_background:
            if self._waiter is None:
                self._waiter = _SendWaiter()
            posted.waited = self._waiter.submit(work, stamp_work)
        self._sends[kind, micro_batch] = posted

    def _release_sent(self) -> None:
        """Drop the payloads of the sends that report themselves completed."""
        for key, posted in list(self._sends.items()):
            if posted.completed():
                self._complete(self._sends.pop(key))

    @staticmethod
    def _complete(posted: _Posted | None) -> None:
        """Wait for a send (so an error surfaces here, on the rank's own thread)."""
        if posted is None:
            return
        if posted.waited is not None:
            posted.waited.result()
            return
        _wait_both(posted.work, posted.stamp_work)

    @property
    def sends_in_flight(self) -> int:
        """Sends posted whose payload is still held."""
        return len(self._sends)

    def finish(self) -> None:
        """Complete every send of the step; every receive must have been taken."""
        if self._receives:
            left = sorted((kind.name.lower(), j) for kind, j in self._receives)
            raise RuntimeError(f"receives posted but never used this step: {left[:4]}")
        for posted in self._sends.values():
            self._complete(posted)
        self._sends.clear()
        if self._waiter is not None:
            self._waiter.stop()
            self._waiter = None


def _wait_both(work: dist.Work, stamp_work: dist.Work | None) -> None:
    work.wait()
    if stamp_work is not None:
        stamp_work.wait()


class _SendWaiter:
    """A daemon thread that waits on gloo sends in the order they were posted. A daemon,
    so that a rank failing mid-step exits without waiting on sends nobody will receive."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[dist.Work, dist.Work | None, Future[None]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gloo-send-waiter", daemon=True)
        self._thread.start()

    def submit(self, work: dist.Work, stamp_work: dist.Work | None) -> Future[None]:
        done: Future[None] = Future()
        self._queue.put((work, stamp_work, done))
        return done

    def stop(self) -> None:
        """End the thread once every submitted send has been waited on."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            work, stamp_work, done = item
            try:
                _wait_both(work, stamp_work)
            except BaseException as error:  # re-raised on the rank's thread by _complete
                done.set_exception(error)
            else:
                done.set_result(None)
            # A work holds its tensor: drop it now, not when the next send arrives.
            del item, work, stamp_work, done
