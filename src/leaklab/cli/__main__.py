"""``python -m leaklab.cli``: the ``leaklab`` command."""

from leaklab.cli import app

app()
