"""The ``leaklab`` command line (typer). It only parses options and calls ``leaklab.experiments``.

Every command turns a user mistake (:class:`~leaklab.errors.LeaklabError`, or an option value that
the pydantic configs reject) into one line ``error: ...`` on stderr and exit code 2; output folders
are written atomically, so nothing is left half-written in ``--out``. Long work shows a rich
progress bar on stderr when it is a terminal. Importing the command line loads no torch: options are
checked while they are parsed, and each command imports what it runs.

Modules: :mod:`~leaklab.cli.app` (the application, its groups and the error guard),
:mod:`~leaklab.cli.options` (option callbacks and shared options), :mod:`~leaklab.cli.progress`, and the
commands by subject: :mod:`~leaklab.cli.images`, :mod:`~leaklab.cli.rooms`, :mod:`~leaklab.cli.reproduce`,
:mod:`~leaklab.cli.mechanisms`, :mod:`~leaklab.cli.planning` (imported here in the order ``leaklab --help`` lists them).
"""

from leaklab.cli import images, rooms, reproduce, mechanisms, planning  # noqa: F401  (they register their commands)
from leaklab.cli.app import app

__all__ = ["app"]
