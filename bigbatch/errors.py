"""The one exception type for mistakes a user can make (config, files, data).

The CLI prints it as a single ``error: ...`` line on stderr and exits with code 2,
without a traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A mistake in the user's input: the message names the key, file or line and what is expected."""
