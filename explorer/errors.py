"""Errors that the command line turns into one clear line and exit code 2."""


class UserError(Exception):
    """Bad input from a user: the message is one line that says what is wrong and what to do."""


class BelowMinimum(UserError):
    """A budget under the least peak known (explorer.units.below_minimum words it)."""


class OtherStep(UserError):
    """A profile made for another step than the planner's: other graphs, or another loss
    around them (the command line names both steps)."""


class RematError(RuntimeError):
    """A schedule that cannot be used with this model: the message says why and what to do."""


class RematWarning(UserWarning):
    """Something the tool goes on with that may not hold as planned: said once, with what to
    do (a plan carried over to a graph it was not made for, a step that runs a graph more
    often than planned or starts with gradients the plan does not hold, a profile saved by an
    older version)."""


class Cancelled(Exception):
    """Long work stopped because its CancelToken was set."""


def message_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name if it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def first_line(exc: BaseException) -> str:
    """An exception's type and the first line of its message, to quote it in one line."""
    if not str(exc).strip():
        return type(exc).__name__
    return f"{type(exc).__name__}: {message_line(exc)}"
