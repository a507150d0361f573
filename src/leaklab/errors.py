"""The one exception type for user mistakes.

Anything a user can get wrong (a bad file, an unknown name, a shape that does not fit the model)
raises :class:`LeaklabError` with a one-line message that names the problem and the fix. The CLI
prints that line and exits with code 2; no traceback is shown for such errors.
"""


class LeaklabError(ValueError):
    """A user-facing error: one line naming the problem and how to fix it."""


class NoSignal(LeaklabError):
    """The update lacks a gradient an attack step reads (an all-zero bias gradient, e.g. after a
    pruning defense): the room attacks then report that they recovered nothing instead of failing."""
