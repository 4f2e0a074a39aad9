"""User-facing errors: the CLI prints ``str(error)`` as one line and exits with status 2."""


class UserError(Exception):
    """A problem the user can fix (bad file, bad flag, bad policy); never shown as a traceback."""
