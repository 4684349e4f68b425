"""Errors a step reports after its barrier returned: a failed asynchronous launch, and the runtime
checks (an out-of-range index, an integer division by zero) of dispatched executions. Each is
raised once, at the barrier that looks: ``check_errors``."""

from __future__ import annotations

import jax
import numpy as np

from runtime.launcher import Launch, failed, is_ready, resolve

# Asynchronous launches whose failure, if any, no barrier has raised yet.
_launched: list[Launch] = []
# Runtime checks of dispatched executions nobody has looked at yet: (device rows, error builders).
_unchecked: list[tuple[jax.Array, list]] = []


def launched(launch: Launch) -> None:
    """An asynchronous launch, whose failure a later ``check_errors`` raises."""
    _launched.append(launch)


def dispatched(rows: jax.Array, errors: list, wait: bool) -> None:
    """An execution's check rows and how to build each row's error (program.py): raised now, or
    with ``wait`` False by a later ``check_errors``."""
    _unchecked.append((rows, errors))
    if wait:
        check_errors()


def check_errors(wait: bool = True) -> None:
    """Raise the first error an asynchronous step reported: a failed launch, or a runtime check
    (out-of-range index, division by zero). Each is raised once.

    With ``wait=False`` launches and executions still running are left for a later call."""
    launches = list(_launched)
    _launched.clear()
    for i, launch in enumerate(launches):
        if not wait and not launch.done():
            _launched.extend(launches[i:])
            break
        if launch.wait_quietly() is not None:
            _launched.extend(launches[i + 1 :])
            raise launch.error
    pending = list(_unchecked)
    _unchecked.clear()
    for i, (rows, errors) in enumerate(pending):
        if failed(rows):
            continue  # the failed launch itself was raised
        if not wait and not (is_ready(rows) and resolve(rows).is_ready()):
            _unchecked.append(pending[i])
            continue
        values = np.asarray(resolve(rows))
        for (bad, index), (bound, dim, size) in zip(values.tolist(), errors):
            if bad:
                raise bound.error(index, dim, size)
