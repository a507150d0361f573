"""Reinforcement-learning environments; importing registers ``leaklab/ActivePerception-v0``.

The active-perception task of seed 000 ("Your Room is not Private", section III), see
:mod:`leaklab.rl.envs.active_perception`.
"""

import gymnasium

from leaklab.rl.envs.active_perception import ACTIONS, ActivePerceptionEnv
from leaklab.rl.envs.layouts import LAYOUTS, Layout

ENV_ID = "leaklab/ActivePerception-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="leaklab.rl.envs.active_perception:ActivePerceptionEnv",
                       kwargs={"layout": next(iter(LAYOUTS))})  # gymnasium.make(ENV_ID, layout=...) for another

__all__ = ["ACTIONS", "ENV_ID", "LAYOUTS", "ActivePerceptionEnv", "Layout"]
