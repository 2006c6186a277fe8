"""The change feed the recorder bumps and waiting requests block on."""
from __future__ import annotations

import threading

from backend.changes import ChangeFeed


def test_wait_returns_the_new_version_after_a_bump():
    feed = ChangeFeed()
    seen = feed.version
    threading.Timer(0.1, feed.bump).start()
    assert feed.wait(seen, timeout=30) == seen + 1


def test_wait_times_out_with_the_same_version_and_sees_earlier_bumps_at_once():
    feed = ChangeFeed()
    assert feed.wait(feed.version, timeout=0.05) == 0
    feed.bump()
    assert feed.wait(0, timeout=30) == 1  # the bump came before the wait: no blocking
