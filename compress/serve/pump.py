"""A response run by the engine's side (its thread, or its Writer's) while its client keeps up.

A handler thread per stream woke once per token, took the interpreter lock in turn with
every other one and ran on the cores the decode step's threads were using: at 32 streams
the steps ran 10-20% slower than in `bench` with the same batch. The body is a generator
(of chunk bytes, or the Stream whose next token it needs), so the thread that runs it can
change: the engine's side runs it right after each step's tokens are published and
writes without blocking; the first write the socket does not take whole, a failed write,
or an error hands the rest back to the handler thread, which goes on with blocking writes
as before. A slow client never holds up the engine. A whole (non-streamed) completion's
body writes nothing: it gathers the text, and its handler wakes once, to answer.

The pumps run on a Writer's thread, beside the engine's next step, whenever more than one
is due. A write to a loopback socket costs about 45 us in the kernel, so 32 streams'
events took 1.5-2 ms of a 20-25 ms decode step on the engine's thread, 7% of a served
run. The steps leave a core idle about 8% of the time (Python between the kernels, the
OpenMP workers' waits), and the writes fit there (benchmarks/serve_writer.py: the two
ways alternating in one server). A single due pump is written inline: one event gains
nothing from a thread's wake-up.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator


class Pump:
    def __init__(self, body: Iterator, sock: socket.socket, streams: list):
        self.body, self.fd, self.streams = body, sock.fileno(), streams
        self.left = b""  # the part of an item the socket did not take
        self.error: Exception | None = None  # a failed write (the client left) or a bug
        self.done = False  # the whole body is written
        self.handed = threading.Event()  # the engine's thread is finished with it

    @staticmethod
    def usable(sock: socket.socket) -> bool:
        """The engine may write to it: a socket with a timeout never blocks a write."""
        return sock.gettimeout() is not None

    def run(self) -> bool:
        """On the engine's thread: write what the body has now. True when it waits for
        tokens (an item that is not bytes: run it again after the next step); False when
        it is finished here."""
        try:
            for item in self.body:
                if not isinstance(item, bytes):
                    return True
                try:
                    n = os.write(self.fd, item)
                except BlockingIOError:
                    n = 0
                if n < len(item):
                    self.left = item[n:]
                    break
            else:
                self.done = True
        except Exception as e:
            self.error = e
        self.release()
        return False

    def release(self) -> None:
        """Back to the handler thread (also when the engine stops)."""
        self.handed.set()


class Writer:
    """Runs due pumps, each on one thread at a time: on a thread of its own while the engine
    steps on, or inline (the caller's thread) when only one is due and nothing is queued
    or being written here."""

    def __init__(self, pumps: set[Pump], threaded: bool = True):
        self.pumps = pumps  # the attached ones (the scheduler's set; finished ones leave it)
        self.threaded = threaded  # False: every pump inline (benchmarks/serve_writer.py)
        self._due: set[Pump] = set()
        self._busy = False  # this thread is running pumps it took
        self._stop = False
        self._cond = threading.Condition()
        self.thread = threading.Thread(target=self._loop, name="llmpress-writer", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def run(self, due: set[Pump]) -> None:
        """Write the new events of `due` (from the engine's thread, the only one that
        calls this: a pump is never inline while this thread has it)."""
        if not due:
            return
        with self._cond:
            inline = (len(due) == 1 or not self.threaded) and not self._busy and not self._due
            if not inline:
                self._due |= due
                self._cond.notify()
        if inline:
            self._run(due)

    def stop(self) -> None:
        """Finish the pumps being written; those still queued are left to their handlers."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self.thread.is_alive():
            self.thread.join()

    def _run(self, due: set[Pump]) -> None:
        for pump in due:
            if pump in self.pumps and not pump.run():
                self.pumps.discard(pump)
                for s in pump.streams:
                    s.pump = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._due and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                due, self._due, self._busy = self._due, set(), True
            try:
                self._run(due)
            finally:
                with self._cond:
                    self._busy = False
