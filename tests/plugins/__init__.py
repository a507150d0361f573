"""Importable stand-ins for a user's own code (e.g. `--model-class tests.plugins.narrow_net:NarrowNet`)."""
