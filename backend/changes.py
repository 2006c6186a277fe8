"""A change counter the recorder bumps after each write, so API requests can wait for news.

`GET /api/sweeps/{id}?wait_s=N` waits on it instead of making the client poll. It only sees writes
of the recorder in this process; waiters still re-read the database every WAIT_RECHECK_S
(backend/routes/sweeps.py), so writes made elsewhere (another API process's recorder, a retry or a
cancel) are seen within that time. Each held request occupies one of the server's worker threads.
"""
from __future__ import annotations

import threading


class ChangeFeed:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0

    def bump(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the version moves past `seen` or `timeout` seconds pass; returns the version."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, timeout=max(timeout, 0.0))
            return self.version
