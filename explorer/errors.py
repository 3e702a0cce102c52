"""Errors that the command line turns into one clear line and exit code 2."""


class UserError(Exception):
    """Bad input from a user: the message is one line that says what is wrong and what to do."""


class Cancelled(Exception):
    """Long work stopped because its CancelToken was set."""
