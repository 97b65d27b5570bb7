"""A response run by the engine's own thread while its client keeps up.

A handler thread per stream woke once per token, took the interpreter lock in turn with
every other one and ran on the cores the decode step's threads were using: at 32 streams
the steps ran 10-20% slower than in `bench` with the same batch. The body is a generator
(of chunk bytes, or the Stream whose next token it needs), so the thread that runs it can
change: the engine's thread runs it right after each step's tokens are published and
writes without blocking; the first write the socket does not take whole, a failed write,
or an error hands the rest back to the handler thread, which goes on with blocking writes
as before. A slow client never holds up the engine. A whole (non-streamed) completion's
body writes nothing: it gathers the text, and its handler wakes once, to answer.
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
