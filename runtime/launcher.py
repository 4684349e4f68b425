"""The launch thread: executables are called from a thread of their own, off the tracing thread.

Calling an XLA executable takes milliseconds of host time with the GIL released: the runtime's
dispatch of its kernels on a GPU (figures: benchmarks/RESULTS.md, "Launch thread"). Called from the
thread that traces, that time is taken from tracing the next step. So launches go to one thread, in
order, and an asynchronous barrier (``mark_step``) returns as soon as its call has begun: its
results are ``Deferred`` until the call returns, and whatever reads them (a later launch, a transfer
to the host) waits for that.

The barrier waits for the call to begin because the launch thread needs the GIL to begin it, and a
tracing thread does not give it up: each of its many short releases (PyTorch's, ours) restarts the
interpreter's wait before it forces a switch, so a queued call began only once tracing stopped,
while the device idled (``benchmarks/launch_timeline.py`` shows each step's timeline). Once the
call has begun, the tracing thread goes on while the call runs with the GIL released.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class Launch:
    """One executable call, queued or done: its outputs, or the error it raised."""

    __slots__ = ("_finished", "_queued", "_running", "error", "outputs", "seconds")

    def __init__(self) -> None:
        # Held from here until the call returns: waiting is taking it (an Event's condition
        # variable costs microseconds to make, and a launch is made every step).
        self._running = threading.Lock()
        self._running.acquire()
        self._queued = threading.Lock()  # held from here until the call begins
        self._queued.acquire()
        self._finished = False
        self.outputs: tuple = ()
        self.error: BaseException | None = None
        self.seconds = 0.0  # how long the call took

    def run(self, call: Callable[[], tuple]) -> None:
        self._queued.release()
        start = time.perf_counter()
        try:
            self.outputs = call()
        except BaseException as e:  # noqa: BLE001 (raised where the results are read)
            self.error = e
        finally:
            self.seconds = time.perf_counter() - start
            self._finished = True
            self._running.release()

    def done(self) -> bool:
        return self._finished

    def wait(self) -> tuple:
        """The outputs, once the call has returned (raises its error)."""
        if self.wait_quietly() is not None:
            raise self.error
        return self.outputs

    def wait_quietly(self) -> BaseException | None:
        """Wait for the call to return; its error, if it raised one."""
        if not self._finished:
            with self._running:  # taken once the call has returned, then given back at once
                pass
        return self.error


class Deferred:
    """Output ``index`` of a launch that may still be queued: the payload of a device-data leaf
    until it is read (``resolve``)."""

    __slots__ = ("index", "launch")

    def __init__(self, launch: Launch, index: int) -> None:
        self.launch = launch
        self.index = index

    def __repr__(self) -> str:
        state = "failed" if self.launch.error else "done" if self.launch.done() else "queued"
        return f"Deferred(output {self.index}, {state})"


class Staged:
    """A small host array bound for a device: the payload of a device-data leaf that no program
    has taken yet. ``resolve`` uploads it once (``put``); a read gets ``host`` itself, so a
    value that travels from the host to be read back (an input check's flag, a token id) never
    travels."""

    __slots__ = ("buffer", "host", "put")

    def __init__(self, host: Any, put: Callable[[], Any]) -> None:
        self.host = host  # read-only: readers copy it
        self.put = put
        self.buffer: Any = None

    @property
    def shape(self) -> tuple:
        return self.host.shape

    def __repr__(self) -> str:
        where = "uploaded" if self.buffer is not None else "on the host"
        return f"Staged({self.host.dtype}{list(self.host.shape)}, {where})"


def resolve(value: Any) -> Any:
    """The device buffer behind a payload: waits for a ``Deferred`` one's launch, uploads a
    ``Staged`` one.

    >>> resolve(3)
    3
    """
    kind = type(value)
    if kind is Deferred:
        return value.launch.wait()[value.index]
    if kind is Staged:
        if value.buffer is None:
            value.buffer = value.put()
        return value.buffer
    return value


def failed(value: Any) -> bool:
    """Whether ``value`` is the output of a launch that raised (it has no buffer)."""
    return type(value) is Deferred and value.launch.done() and value.launch.error is not None


def is_ready(value: Any) -> bool:
    """Whether reading ``value`` would not wait for a launch (its device work may still run)."""
    return type(value) is not Deferred or value.launch.done()


class Launcher:
    """Calls executables, one at a time, in the order they were submitted: from a thread of its
    own when ``threaded``, else at once."""

    def __init__(self) -> None:
        self.threaded: bool | None = None  # decided by the runtime before the first launch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last: Launch | None = None
        self._lock = threading.Lock()
        self.interrupted: KeyboardInterrupt | None = None  # see _hand_over
        atexit.register(self.stop)
        # A forked child has no launch thread, whatever its parent had: it starts its own.
        os.register_at_fork(after_in_child=self._forget)

    def submit(self, call: Callable[[], tuple], n_outputs: int) -> tuple[Launch, list]:
        """Launch ``call`` (it reads its arguments with ``resolve``); returns the launch and its
        ``n_outputs`` outputs: ``Deferred`` ones when threaded, else the call's own."""
        launch = Launch()
        if not self.threaded:
            launch.run(call)
            return launch, list(launch.wait())
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lazy-launch", daemon=True)
                self._thread.start()
            self._last = launch
            self._queue.put((launch, call))
        self._hand_over(launch)
        return launch, [Deferred(launch, i) for i in range(n_outputs)]

    def _hand_over(self, launch: Launch) -> None:
        """Wait until the launch thread begins ``launch``, which gives it the GIL (the module's
        docstring). The call runs whatever happens, with the buffers it was given (donated ones
        included), so its results must reach their storages: an interrupt (Ctrl-C) while waiting
        is kept for ``take_interrupt`` instead of abandoning them."""
        while True:
            try:
                with launch._queued:
                    return
            except KeyboardInterrupt as e:
                self.interrupted = e

    def take_interrupt(self) -> KeyboardInterrupt | None:
        """The interrupt a hand-over kept since the last call, if any."""
        interrupted, self.interrupted = self.interrupted, None
        return interrupted

    def drain(self) -> None:
        """Wait until every launch submitted so far has returned (errors stay with them)."""
        last = self._last
        if last is not None:
            last.wait_quietly()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _forget(self) -> None:
        self._queue, self._thread, self._last = queue.SimpleQueue(), None, None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            launch, call = item
            launch.run(call)
