"""Times executions on the device (``metrics.timings()['execute_time']``) from a thread of its
own, for a few executions of every ``config.TIME_EXECUTIONS``."""

from __future__ import annotations

import atexit
import queue
import threading
import time

import jax

from runtime import config, metrics


class ExecutionTimer:
    """Times executions on the device: a background thread waits for a timed one's check rows (an
    output nobody else holds, so donation never races with the wait) and records the time from
    its dispatch, or from the end of the previous one, to its end.

    Each wake of that thread takes the GIL from the tracing thread: timing every execution made a
    small CPU training step measurably slower (figures: benchmarks/RESULTS.md, "Execution timing").
    So it times two consecutive executions in every ``config.TIME_EXECUTIONS`` launches, and every
    one while anything listens to graph events. An execution is recorded only when its start is
    known: the previous launch was timed too, or had finished when this one was dispatched; back to
    back, that is the second of each pair."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._launches = 0
        self._untimed: jax.Array | None = None  # the previous launch's rows, if it went untimed
        atexit.register(self.stop)

    def watch(self, start: float, rows: jax.Array) -> None:
        """Called for each launch, in launch order, from the thread that launches."""
        n, self._launches = self._launches, self._launches + 1
        if n % config.TIME_EXECUTIONS > 1 and not metrics.listening():
            self._untimed = rows
            return
        previous, self._untimed = self._untimed, None
        known = previous is None or previous.is_ready()  # else it may still be running
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lazy-exec-timer", daemon=True)
            self._thread.start()
        self._queue.put((start, rows, known))

    def drain(self) -> None:
        """Wait until every execution watched so far has been timed."""
        self._queue.join()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        last = 0.0
        while (item := self._queue.get()) is not None:
            start, rows, known = item
            try:
                rows.block_until_ready()
                end = time.perf_counter()
                if known:
                    metrics.time("execute_time", end - max(start, last))
                last = end
            except Exception:  # noqa: BLE001, S110 (a failed execution raises where it is observed)
                pass
            finally:
                self._queue.task_done()
        self._queue.task_done()


TIMER = ExecutionTimer()
