"""The Writer runs each due pump on one thread at a time: one due pump inline, several on
its own thread while the caller goes on; a finished pump leaves the set; stop leaves the
rest to their handlers."""

from __future__ import annotations

import threading
import time

from compress.serve.pump import Writer


class FakePump:
    """Records the threads it runs on and whether two ever ran it at once."""

    def __init__(self, runs_left: int, delay: float = 0.0):
        self.runs_left, self.delay = runs_left, delay
        self.threads: list[str] = []
        self.overlap = False
        self.streams: list = []
        self._running = threading.Lock()

    def run(self) -> bool:
        if not self._running.acquire(blocking=False):
            self.overlap = True
            return True
        try:
            self.threads.append(threading.current_thread().name)
            time.sleep(self.delay)
            self.runs_left -= 1
            return self.runs_left > 0
        finally:
            self._running.release()


def _settle(writer: Writer) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with writer._cond:
            if not writer._due and not writer._busy:
                return
        time.sleep(0.001)
    raise AssertionError("the writer did not finish its pumps")


def test_one_due_pump_runs_inline_and_several_run_on_the_writers_thread():
    a, b, c = FakePump(100), FakePump(100), FakePump(100)
    writer = Writer({a, b, c})
    writer.start()
    try:
        writer.run({a})
        assert a.threads == [threading.current_thread().name]
        t = time.perf_counter()
        b.delay = c.delay = 0.05
        writer.run({b, c})
        assert time.perf_counter() - t < 0.05  # handed over: the caller did not wait
        _settle(writer)
        assert b.threads == c.threads == ["llmpress-writer"]
    finally:
        writer.stop()
    assert not writer.thread.is_alive()


def test_a_pump_never_runs_on_two_threads_and_finished_ones_leave():
    pumps = [FakePump(runs_left=5, delay=0.0005) for _ in range(6)]
    attached = set(pumps)
    writer = Writer(attached)
    writer.start()
    try:
        for i in range(2000):  # one due (inline unless the writer is busy) or several
            if not attached:
                break
            due = {pumps[i % 6]} if i % 3 else set(pumps[i % 6 :])
            writer.run({p for p in due if p in attached})  # queued twice: run once
            time.sleep(0.0002)
        _settle(writer)
    finally:
        writer.stop()
    assert not any(p.overlap for p in pumps)
    assert [p.runs_left for p in pumps] == [0] * 6  # each ran until it said it was finished
    assert not attached  # and then left the set, never to run again
    assert "llmpress-writer" in {t for p in pumps for t in p.threads}


def test_stop_finishes_the_pump_being_written_and_leaves_the_queue():
    slow, queued = FakePump(100, delay=0.2), FakePump(100)
    writer = Writer({slow, queued})
    writer.start()
    writer.run({slow, FakePump(100)})  # several: to the writer's thread
    time.sleep(0.05)
    writer.run({queued})  # the writer is busy: queued, never inline beside it
    assert queued.threads == []
    writer.stop()
    assert not writer.thread.is_alive()
    assert len(slow.threads) == 1 and not slow.overlap


def test_unthreaded_runs_every_pump_inline():
    """The way serve_writer.py compares against: every due pump on the caller's thread."""
    pumps = {FakePump(100), FakePump(100), FakePump(100)}
    writer = Writer(pumps, threaded=False)
    writer.start()
    try:
        writer.run(set(pumps))
        assert all(p.threads == [threading.current_thread().name] for p in pumps)
    finally:
        writer.stop()
