"""The defense levels the room audit suggests auditing next: where the leaks stop between the levels it
tested, or beyond them (``results.json`` ``summary.next_levels``; the report and the command print them).

A defense family's levels are ordered by strength (Gaussian noise: σ, larger is stronger; one DP-SGD
step: ε, smaller is stronger). Per family, with ``leaks`` the verdict of each tested level:

* a level that leaks below a stronger one that does not: two levels between them, a third and two
  thirds of the way on a log scale;
* every level leaks: two stronger ones, √10 and 10 times the strongest's strength;
* no level leaks: two weaker ones, √10 and 10 times weaker than the weakest.

Each suggestion is rounded to 1, 2, 3 or 5 times a power of ten (a level a user would type), and one
already tested, or outside the bracket it should narrow, is dropped: a bracket of adjacent round levels
gets none. The bracket itself (the strongest level that leaks, the weakest stronger one that does not)
is where the leaks stop (:func:`leaks_stop`). The verdicts may come from several audits of the same
rooms, network and attacks (``leaklab audit --earlier``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from leaklab.fields import MAX_NOISE_SCALE

ROUND_MANTISSAS = (1, 2, 3, 5)


def _round_level(x: float) -> float:
    """The nearest (on a log scale) of 1, 2, 3 or 5 times a power of ten."""
    k = math.floor(math.log10(x))
    candidates = [m * float(f"1e{e}") for e in (k, k + 1) for m in ROUND_MANTISSAS]  # 1e309: inf, not OverflowError
    return float(f"{min(candidates, key=lambda c: abs(math.log(c / x))):.1g}")


def _bracket(tested: dict[float, bool]) -> tuple[float | None, float | None]:
    """The strongest strength (larger: stronger) in ``tested`` (strength -> leaks) that leaks and the
    weakest stronger one that does not; None for either that is missing."""
    leaky = [s for s, leaks in tested.items() if leaks]
    if not leaky:
        return None, None
    lo = max(leaky)
    return lo, min((s for s, leaks in tested.items() if not leaks and s > lo), default=None)


def _next_strengths(tested: dict[float, bool]) -> tuple[list[float], tuple[float, float]]:
    """Suggested strengths (larger: stronger) from ``tested`` (strength -> leaks), and the open interval
    they must fall in."""
    lo, hi = _bracket(tested)
    if lo is None:
        weakest = min(tested)
        return [weakest / math.sqrt(10), weakest / 10], (0.0, weakest)
    if hi is None:
        return [lo * math.sqrt(10), lo * 10], (lo, math.inf)
    return [lo ** (2 / 3) * hi ** (1 / 3), lo ** (1 / 3) * hi ** (2 / 3)], (lo, hi)


def _suggest(tested: dict[float, bool], strength: Callable[[float], float], largest: float) -> list[float]:
    """Round levels to audit next for one family; ``strength`` maps a level to its strength and back
    (an involution: σ -> σ, ε -> 1/ε); none over ``largest``, the largest level an audit takes (σ's cap; 1e300
    for ε: beyond the tested ones, 1e308's suggestion overflowed, after every attack)."""
    if not tested:
        return []
    strengths, (lo, hi) = _next_strengths({strength(level): leaks for level, leaks in tested.items()})
    levels = {_round_level(level) for s in strengths if 0 < (level := strength(s)) <= largest}
    return sorted(level for level in levels if level not in tested and lo < strength(level) < hi)


def next_levels(gaussian: dict[float, bool], dpsgd: dict[float, bool]) -> dict[str, list[float]]:
    """The Gaussian σ and DP-SGD ε levels to audit next, from each tested level's verdict (level ->
    leaks); both empty lists when the family was not tested."""
    return {"gaussian_sigmas": _suggest(gaussian, lambda s: s, MAX_NOISE_SCALE),
            "dp_epsilons": _suggest(dpsgd, lambda e: 1 / e, 1e300)}


def leaks_stop(gaussian: dict[float, bool], dpsgd: dict[float, bool]) -> dict[str, list[float]]:
    """Per family, the strongest tested level that leaks and the weakest stronger one that does not
    (``[σ, σ']``, ``[ε, ε']``): the leaks stop between them; an empty list where the levels bracket no
    such step (none leaks, or every level stronger than a leaky one leaks too)."""
    out = {}
    for key, tested, strength in (("gaussian_sigma", gaussian, lambda s: s), ("dp_epsilon", dpsgd, lambda e: 1 / e)):
        level = {strength(t): t for t in tested}
        lo, hi = _bracket({strength(t): leaks for t, leaks in tested.items()}) if tested else (None, None)
        out[key] = [level[lo], level[hi]] if hi is not None else []
    return out


def leaks_stop_text(stops: dict[str, list[float]]) -> str:
    """One sentence naming where the leaks stop (:func:`leaks_stop`); "" where no level brackets it."""
    parts = [f"between {family} {symbol} = {pair[0]:g} (leaks) and {symbol} = {pair[1]:g} (nothing leaks)"
             for family, symbol, pair in (("Gaussian noise", "σ", stops["gaussian_sigma"]),
                                          ("one DP-SGD step at", "ε", stops["dp_epsilon"])) if pair]
    return f"The leaks stop {' and '.join(parts)}." if parts else ""


def next_levels_text(levels: dict[str, list[float]]) -> str:
    """One sentence naming the options that audit the suggested levels; "" when there are none."""
    options = [f"{flag} {','.join(f'{v:g}' for v in levels[key])}"
               for flag, key in (("--sigmas", "gaussian_sigmas"), ("--epsilons", "dp_epsilons")) if levels[key]]
    if not options:
        return ""
    return (f"To pin down where the leaks stop, audit next with `{' '.join(options)}` (levels between the "
            "strongest tested that leaks and the weakest that does not, or beyond them).")
