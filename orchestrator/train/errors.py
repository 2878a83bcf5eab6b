"""A user's error raised inside a Ray worker or task, found again behind Ray's wrappers,
so that the CLI reports it as the one line it is (exit 2) instead of a Ray traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from placement.errors import UserError


@contextlib.contextmanager
def user_errors_raised(*ray_errors: type[BaseException]) -> Iterator[None]:
    """Turn a `ray_errors` exception that holds a user's error into that error; any
    other failure stays as it is (it is not the user's fault)."""
    try:
        yield
    except ray_errors as err:
        found = user_error_in(err)
        if found is None:
            raise
        raise found from None


def user_error_in(error: BaseException) -> UserError | None:
    """The first `UserError` inside `error`: Ray Train's WorkerGroupError (one failure
    per rank, each a UserExceptionWithTraceback around the raised exception), its
    ControllerError, a RayTaskError of a task or Tune trial (`cause`), or a chained
    exception. None when the failure is not the user's (a bug, a crash)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        # A RayTaskError is also an instance of its cause's class, but its message is
        # the remote traceback: the cause is the error itself.
        cause = getattr(e, "cause", None)
        if isinstance(cause, BaseException):
            todo.append(cause)
            continue
        if isinstance(e, UserError):
            return e
        todo.extend(getattr(e, "worker_failures", {}).values())
        # Ray Train keeps the worker's exception in UserExceptionWithTraceback's
        # `_base_exc`; no public attribute gives it.
        todo.extend(getattr(e, name, None) for name in
                    ("_base_exc", "controller_failure", "__cause__", "__context__"))
    return None
