"""DynamicBatcher: concurrent coroutine requests become few backend calls, and each caller
gets its own completions back."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from coevo.errors import CoevoError
from coevo.models.base import Completion, Request, Sampling
from coevo.models.batching import DynamicBatcher


class CountingBackend:
    """Answers each request with its own prompt text (so misrouting is visible), records every
    call and the thread it ran in, and can be slowed down or made to raise."""

    name = "counting"
    tokenizer = None

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.calls: list[list[str]] = []
        self.threads: list[str] = []
        self.delay, self.fail = delay, fail

    def generate(self, requests: list[Request]) -> list[list[Completion]]:
        self.calls.append([r.messages[0]["content"] for r in requests])
        self.threads.append(threading.current_thread().name)
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("device lost")
        return [[Completion(text=f"{r.messages[0]['content']}#{j}", trainable=False)
                 for j in range(r.n)] for r in requests]


def req(text: str, n: int = 1) -> Request:
    return Request(messages=[{"role": "user", "content": text}], n=n,
                   sampling=Sampling(max_new_tokens=4))


def test_sixteen_concurrent_requests_share_one_call():
    backend = CountingBackend()
    batcher = DynamicBatcher(backend, max_batch=16, max_wait_ms=50)

    async def episode(i: int) -> list[Completion]:
        await asyncio.sleep(0.001 * (i % 4))  # arrivals spread over a few ms
        return await batcher.generate(req(f"task{i}", n=1 + i % 3))

    async def main():
        return await asyncio.gather(*(episode(i) for i in range(16)))

    results = asyncio.run(main())
    assert 1 <= len(backend.calls) <= 2
    assert sum(len(c) for c in backend.calls) == 16
    for i, comps in enumerate(results):
        assert [c.text for c in comps] == [f"task{i}#{j}" for j in range(1 + i % 3)]
    assert batcher.calls == len(backend.calls)
    assert all(name != threading.main_thread().name for name in backend.threads)


def test_max_batch_caps_each_call():
    backend = CountingBackend()
    batcher = DynamicBatcher(backend, max_batch=8, max_wait_ms=20)

    async def main():
        return await batcher.generate_many([req(f"r{i}") for i in range(20)])

    results = asyncio.run(main())
    assert [len(c) for c in backend.calls] == [8, 8, 4]
    assert [r[0].text for r in results] == [f"r{i}#0" for i in range(20)]


def test_requests_arriving_during_a_call_form_the_next_batch():
    backend = CountingBackend(delay=0.15)
    batcher = DynamicBatcher(backend, max_batch=16, max_wait_ms=5)

    async def main():
        first = asyncio.ensure_future(batcher.generate(req("early")))
        await asyncio.sleep(0.05)  # the first call is now running in its thread
        t = time.perf_counter()
        later = await asyncio.gather(*(batcher.generate(req(f"late{i}")) for i in range(5)))
        # The loop stayed free while the backend slept: these were queued, not blocked.
        return await first, later, time.perf_counter() - t

    first, later, _ = asyncio.run(main())
    assert backend.calls == [["early"], [f"late{i}" for i in range(5)]]
    assert first[0].text == "early#0" and [c[0].text for c in later][-1] == "late4#0"


def test_single_request_is_not_held_much_past_max_wait():
    backend = CountingBackend()
    batcher = DynamicBatcher(backend, max_batch=16, max_wait_ms=30)

    async def main():
        t = time.perf_counter()
        out = await batcher.generate(req("alone"))
        return out, time.perf_counter() - t

    out, seconds = asyncio.run(main())
    assert out[0].text == "alone#0"
    assert 0.025 <= seconds < 0.5


def test_raising_backend_gives_error_completions_to_every_caller():
    batcher = DynamicBatcher(CountingBackend(fail=True), max_batch=4, max_wait_ms=10)

    async def main():
        return await batcher.generate_many([req("a", n=2), req("b")])

    results = asyncio.run(main())
    assert [len(r) for r in results] == [2, 1]
    assert all(c.finish_reason == "error" and "device lost" in c.error
               for r in results for c in r)


def test_batcher_survives_successive_event_loops_and_cancelled_callers():
    backend = CountingBackend(delay=0.05)
    batcher = DynamicBatcher(backend, max_batch=4, max_wait_ms=5)
    assert asyncio.run(batcher.generate(req("one")))[0].text == "one#0"

    async def main():
        doomed = asyncio.ensure_future(batcher.generate(req("cancelled")))
        kept = asyncio.ensure_future(batcher.generate(req("kept")))
        await asyncio.sleep(0)
        doomed.cancel()
        out = await kept
        await batcher.aclose()
        return out

    assert asyncio.run(main())[0].text == "kept#0"
    assert all("cancelled" not in call for call in backend.calls)


def test_bad_settings_are_clear_errors():
    with pytest.raises(CoevoError, match="max_batch"):
        DynamicBatcher(CountingBackend(), max_batch=0)
    with pytest.raises(CoevoError, match="max_wait_ms"):
        DynamicBatcher(CountingBackend(), max_wait_ms=-1)
