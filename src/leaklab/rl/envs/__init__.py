"""Reinforcement-learning environments; importing registers ``leaklab/ActivePerception-v0``.

The active-perception task of seed 000 ("Your Room is not Private", section III), see
:mod:`leaklab.rl.envs.active_perception`. The environment itself (ViZDoom, torch) loads on first use
of ``ACTIONS`` or ``ActivePerceptionEnv``, so that the command line can check ``--layouts`` against
:mod:`leaklab.rl.envs.layouts` without it.
"""

from typing import Any

import gymnasium

from leaklab.rl.envs.layouts import LAYOUTS, Layout

ENV_ID = "leaklab/ActivePerception-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="leaklab.rl.envs.active_perception:ActivePerceptionEnv",
                       kwargs={"layout": next(iter(LAYOUTS))})  # gymnasium.make(ENV_ID, layout=...) for another

__all__ = ["ACTIONS", "ENV_ID", "LAYOUTS", "ActivePerceptionEnv", "Layout"]


def __getattr__(name: str) -> Any:
    if name in ("ACTIONS", "ActivePerceptionEnv"):
        from leaklab.rl.envs import active_perception

        return getattr(active_perception, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
