"""The rooms of the active-perception environment: ViZDoom maps with one target object each.

Seed 000 ("Your Room is not Private", section V "Experimental setup") collects observations in
AI2-THOR rooms; AI2-THOR cannot run here, so leaklab uses rooms of the Freedoom maps that ship with
ViZDoom. Each layout names a map and a static decoration in it (a column, a lamp, a tree, ...) that
plays the role of the target object of the section III "Active Perception Task". The spots were
picked among all decorations of the Freedoom maps for bright surroundings (mean raw frame value
above 70 of 255 when facing the target from where it was picked; from the environment's start poses a review
measured 62 to 100) and for being reachable: the room around the target is
open enough to sample start poses that see it.
"""

import re
from dataclasses import dataclass
from typing import Annotated, Optional

from pydantic import AfterValidator

from leaklab.errors import LeaklabError


@dataclass(frozen=True)
class Layout:
    """One room: ``map`` of ``wad`` and the target decoration (its class and map position)."""

    name: str
    wad: str  # a file in the vizdoom package folder
    map: str
    target: str  # the decoration's class name, as ViZDoom's labels buffer reports it
    x: float
    y: float


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("e1m1-stalactite", "freedoom1.wad", "E1M1", "Stalagtite", 3008, 2288),
        Layout("e1m2-torch-tree", "freedoom1.wad", "E1M2", "TorchTree", 1008, -3592),
        Layout("e1m3-column", "freedoom1.wad", "E1M3", "Column", -1976, 1656),
        Layout("e1m9-column", "freedoom1.wad", "E1M9", "Column", 160, 1824),
        Layout("e2m3-heart-column", "freedoom1.wad", "E2M3", "HeartColumn", 1408, 1152),
        Layout("e2m4-column", "freedoom1.wad", "E2M4", "Column", 1824, 560),
        Layout("e2m6-column", "freedoom1.wad", "E2M6", "Column", -912, 272),
        Layout("e3m5-stalactite", "freedoom1.wad", "E3M5", "Stalagtite", 944, 1968),
        Layout("e3m9-candelabra", "freedoom1.wad", "E3M9", "Candelabra", 3040, -2648),
        Layout("e4m2-torch-tree", "freedoom1.wad", "E4M2", "TorchTree", 1184, -2672),
        Layout("e4m7-tech-pillar", "freedoom1.wad", "E4M7", "TechPillar", -4256, -864),
        Layout("e4m8-candelabra", "freedoom1.wad", "E4M8", "Candelabra", 5632, -736),
        Layout("map07-stalactite", "freedoom2.wad", "MAP07", "Stalagtite", -640, -768),
        Layout("map09-tech-lamp", "freedoom2.wad", "MAP09", "TechLamp2", -3000, 1296),
        Layout("map18-column", "freedoom2.wad", "MAP18", "Column", -240, -560),
        Layout("map19-tech-pillar", "freedoom2.wad", "MAP19", "TechPillar", -16, 288),
        Layout("map23-tech-lamp", "freedoom2.wad", "MAP23", "TechLamp", 596, 3692),
    )
}


def check_layouts(names: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """``names`` as a tuple if each is a layout, named once; None (every layout) stays None. An empty
    tuple, an unknown or a repeated name is a :class:`LeaklabError`."""
    if names is None:
        return None
    names = tuple(names)
    if not names:
        raise LeaklabError("no room layout named; name at least one, or leave the layouts unset for all")
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        raise LeaklabError(f"unknown room layout {unknown[0]!r}; choose from {', '.join(LAYOUTS)}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise LeaklabError(f"the layouts name {', '.join(twice)} more than once; name each room once")
    return names


# a configuration's room layouts, checked by :func:`check_layouts`; None: every layout
LayoutNames = Annotated[Optional[tuple[str, ...]], AfterValidator(check_layouts)]


def layouts_arg(value: str | None) -> tuple[str, ...] | None:
    """``--layouts``: a count (the first N layouts) or comma-separated names (:func:`check_layouts`);
    None or empty: every layout (None)."""
    if value in (None, ""):
        return None
    if re.fullmatch(r"[+-]?[0-9]+", value.strip()):  # a count, not a room's name
        count = int(value)
        if not 1 <= count <= len(LAYOUTS):
            raise LeaklabError(f"there are {len(LAYOUTS)} room layouts; give a count from 1 to {len(LAYOUTS)}")
        return tuple(LAYOUTS)[:count]
    return check_layouts(tuple(v.strip() for v in value.split(",") if v.strip()))
