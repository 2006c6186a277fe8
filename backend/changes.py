"""A change counter the recorder bumps after each write, so API requests can wait for news.

`GET /api/sweeps/{id}?wait_s=N` waits on it instead of making the client poll. The wait is async:
a held request costs no server thread and no database connection (each re-read opens a session
and closes it). It only sees writes of the recorder in this process; waiters still re-read the
database every WAIT_RECHECK_S (backend/routes/sweeps.py), so writes made elsewhere (another API
process's recorder, a retry or a cancel) are seen within that time. `WaiterLimit` caps how many
requests are held at once (BENCHLAB_MAX_WAITERS; more answer 429).
"""
from __future__ import annotations

import asyncio
import threading


class ChangeFeed:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._async: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        self.version = 0

    def bump(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()
            waiters, self._async = self._async, set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(None))

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the version moves past `seen` or `timeout` seconds pass; returns the version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=max(timeout, 0.0))
            return self.version

    async def wait_async(self, seen: int, timeout: float) -> int:
        """The same, without a thread: the event loop is woken by the recorder's bump."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        entry = (loop, fut)
        with self._cond:
            if self.version != seen:
                return self.version
            self._async.add(entry)
        try:
            await asyncio.wait_for(fut, max(timeout, 0.0))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._cond:
                self._async.discard(entry)
        return self.version


class WaiterLimit:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def try_acquire(self) -> bool:
        with self._lock:
            if self.held >= self.limit:
                return False
            self.held += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.held -= 1
