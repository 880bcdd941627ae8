"""What privzo refuses, as opposed to what crashes: one base class, ``Refusal``, that every refusal derives
from, with the built-in type callers expect mixed in (as Prefect's own exceptions do). It stands on the
ground floor (the standard library only), so that every room's refusals derive from it: a bad spec's here,
the runtime's, the ledger's, the record's and a run's.

A refusal is an expected outcome: a budget or ledger that will not take the run, a locked run, a bad spec,
and any ValueError or FileNotFoundError raised while a run checks its input before its first private step
(a spec that does not fit its data, a resume or a start model that does not fit). The command line prints
its first line; a flow run ends Failed with that line as its message, is not retried (it would be refused
again), and logs no traceback (``not_refused`` and ``quiet_refusals`` are the hooks a flow gives Prefect;
they name its loggers and its retry condition's arguments, and import nothing of it). An error once training
runs is a crash and keeps its traceback."""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Dict


class Refusal(Exception):
    """The base of every refusal."""


class RuntimeRefusal(Refusal, RuntimeError):
    """A refusal where callers expect a RuntimeError (the ledger's, a locked run)."""


class ValueRefusal(Refusal, ValueError):
    """A refusal where callers expect a ValueError (a spec that cannot run)."""


INPUT_ERRORS = (ValueError, FileNotFoundError)
_INPUT_REFUSALS: Dict[type, type] = {}


def _refusal_of(kind: type) -> type:
    """The refusal form of error type ``kind``: a subclass of both (made once per type)."""
    refused = _INPUT_REFUSALS.get(kind)
    if refused is None:
        # its own __reduce__ first: the error type's (OSError has one) would pickle the class made here by name
        refused = _INPUT_REFUSALS[kind] = type(kind.__name__, (kind, InputRefusal), {
            "__module__": kind.__module__, "__qualname__": kind.__qualname__, "__reduce__": InputRefusal.__reduce__})
    return refused


def _rebuilt(kind: type, args: tuple, state: dict) -> BaseException:
    """An ``InputRefusal`` unpickled (a Prefect state's data, a result sent to another process)."""
    refused = _refusal_of(kind)
    out = refused.__new__(refused, *args)
    out.args = args
    state = dict(state)
    if isinstance(out, OSError):  # errno, strerror and filename live in OSError's own fields
        out.errno, out.strerror, out.filename = state.pop("_os_fields", (None, None, None))
    out.__dict__.update(state)
    return out


class InputRefusal(Refusal):
    """An input error raised where a run checks its input (``checking_input``), as a refusal: an instance of a
    subclass of both this and the error's own type, so a caller that catches the error's type still does."""

    @staticmethod
    def of(err: BaseException) -> BaseException:
        """``err`` as the same error of its refusal type: its arguments, attributes, cause and traceback."""
        state = dict(err.__dict__)
        if isinstance(err, OSError):
            state["_os_fields"] = (err.errno, err.strerror, err.filename)
        out = _rebuilt(type(err), err.args, state)
        out.__cause__, out.__context__ = err.__cause__, err.__context__
        return out.with_traceback(err.__traceback__)

    def __reduce__(self):
        # by its error type (the refusal form is made again on loading), not by the class made at run time
        kind = next(k for k in type(self).__mro__[1:] if not issubclass(k, InputRefusal))
        state = dict(self.__dict__)
        if isinstance(self, OSError):
            state["_os_fields"] = (self.errno, self.strerror, self.filename)
        return _rebuilt, (kind, self.args, state)


def is_refusal(err: Any) -> bool:
    """A ``Refusal``: the ledger's, a locked run, a bad spec, or an input error raised where a run checks its
    input (``checks_input``)."""
    return isinstance(err, Refusal)


def refusal_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


@contextlib.contextmanager
def checking_input():
    """Input errors raised inside are refusals: a ValueError from a loader or a planner says what of the
    input is wrong, not that privzo crashed. Each is raised again as its ``InputRefusal`` form, which is
    still of its own type (callers and tests catch it)."""
    try:
        yield
    except INPUT_ERRORS as err:
        if isinstance(err, Refusal):
            raise
        raise InputRefusal.of(err) from err.__cause__


def checks_input(fn):
    """A task that checks the run's input before any private step: its input errors are refusals."""
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        with checking_input():
            return fn(*args, **kwargs)
    return checked


def not_refused(_task, _task_run, state) -> bool:
    """Prefect's retry condition: a refused task is not retried."""
    return not is_refusal(getattr(state, "data", None))


class _RefusalsWithoutTracebacks(logging.Filter):
    """Prefect logs every exception that ends a task or flow run with its traceback, in the terminal and in
    the UI (its API handler sits on these loggers); a refusal's own line is the flow run's state message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and is_refusal(record.exc_info[1]))


def quiet_refusals() -> None:
    """Install the filter on Prefect's run loggers, once (called as a training flow starts, not on import)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RefusalsWithoutTracebacks) for f in logger.filters):
            logger.addFilter(_RefusalsWithoutTracebacks())
