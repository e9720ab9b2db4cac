"""Dynamic batching: many concurrent episodes, one backend call per batch.

Agent episodes run as coroutines, each awaiting one model call per turn. Calling the backend
per episode would decode one sequence at a time; the batcher instead queues the requests, and
a single worker takes everything waiting (up to `max_batch` requests, waiting at most
`max_wait_ms` after the first for others to arrive), runs ONE `backend.generate` in a thread
(`asyncio.to_thread`, so the event loop keeps serving tool calls and other episodes while the
model decodes) and resolves each caller's future with its own completions.

This is the request-level dynamic batching of inference servers (as in Triton's dynamic
batcher), not continuous batching: a batch runs to completion before the next starts, because
the backends here decode a batch in one call. Batches run one at a time, so the backend is
never called concurrently and needs no locking.

A backend that raises (which the contract forbids) gives every request of that batch
finish_reason="error" completions, logged with the traceback: missing data, not a crashed run.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from coevo.errors import CoevoError
from coevo.models.base import Backend, Completion, Request

log = logging.getLogger(__name__)


@dataclass
class _Item:
    request: Request
    future: asyncio.Future


class DynamicBatcher:
    """`await batcher.generate(request)` -> the request's `n` completions. `calls` and
    `batch_sizes` record what reached the backend (for tests and benchmarks)."""

    def __init__(self, backend: Backend, max_batch: int = 16, max_wait_ms: float = 10.0):
        if max_batch < 1:
            raise CoevoError(f"max_batch: must be >= 1, got {max_batch}")
        if max_wait_ms < 0:
            raise CoevoError(f"max_wait_ms: must be >= 0, got {max_wait_ms}")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.batch_sizes: list[int] = []
        self._queue: asyncio.Queue[_Item] | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def calls(self) -> int:
        return len(self.batch_sizes)

    async def generate(self, request: Request) -> list[Completion]:
        self._ensure_worker()
        assert self._queue is not None and self._loop is not None
        fut = self._loop.create_future()
        self._queue.put_nowait(_Item(request, fut))
        return await fut

    async def generate_many(self, requests: list[Request]) -> list[list[Completion]]:
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._worker = self._queue = self._loop = None

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        # A batcher reused under a new event loop (e.g. successive asyncio.run calls) starts
        # fresh there: queues and tasks belong to the loop that made them.
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._run(), name="coevo-batcher")

    async def _collect(self) -> list[_Item]:
        assert self._queue is not None and self._loop is not None
        batch = [await self._queue.get()]
        deadline = self._loop.time() + self.max_wait
        while len(batch) < self.max_batch:
            try:  # take whatever is already queued without waiting
                batch.append(self._queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            live = [it for it in batch if not it.future.done()]  # skip cancelled callers
            if not live:
                continue
            requests = [it.request for it in live]
            self.batch_sizes.append(len(requests))
            try:
                results = await asyncio.to_thread(self.backend.generate, requests)
                if len(results) != len(requests):
                    raise CoevoError(f"backend returned {len(results)} results for "
                                     f"{len(requests)} requests")
            except Exception as e:
                log.exception("backend %s raised inside a batch",
                              getattr(self.backend, "name", "?"))
                msg = f"{type(e).__name__}: {e}"
                results = [[Completion(text="", finish_reason="error", trainable=False,
                                       error=msg)] * r.n for r in requests]
            for it, res in zip(live, results):
                if not it.future.done():
                    it.future.set_result(res)
