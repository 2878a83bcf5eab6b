"""The exception users see: the CLI turns it into one line and exit status 2."""


class UserError(ValueError):
    """Bad input from a user; its message names the problem and the fix."""
