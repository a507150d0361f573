"""Words for counts in what leaklab prints and reports."""

from __future__ import annotations

from collections.abc import Callable


def plural(count: int, noun: str) -> str:
    """``"1 sample"``, ``"3 samples"``: ``count`` and ``noun``, with an ``s`` unless the count is one."""
    return f"{count} {noun if count == 1 else noun + 's'}"


def listing(items: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def sentences(parts: tuple[str, ...]) -> str:
    """A report's notice from its non-empty ``parts``, each begun with a capital (the caveats begin in lowercase,
    as the commands' ``warning:`` lines print them)."""
    return " ".join(part[:1].upper() + part[1:] for part in parts if part)


def db_text(value: float | None, signed: bool = False) -> str:
    """A PSNR (or, ``signed``, a gain) in dB as the pictures caption it, one decimal; "–" where there is none
    (None or NaN: a constant true image scores none)."""
    if value is None or value != value:
        return "–"
    return f"{value:+.1f}" if signed else f"{value:.1f}"


def cosine_text(value: float | None) -> str | None:
    """An update's cosine with the true one as leaklab prints it (three significant digits, or up to seven as
    keep a cosine under 1 from reading 1, which the captions call an untouched update: 0.99999 behind σ = 1e-5;
    0.9999999 closer still); None as is."""
    if value is None:
        return None
    if abs(1 - value) < 1e-12:  # rounding of an update whose direction is whole (a clip only rescales it)
        return "1"
    text = _off_the_edges(value, lambda digits: f"{value:.{digits}g}", 3, 7, (1.0,))
    return "0.9999999" if text == "1" and value < 1 else text


def percent_text(share: float) -> str:
    """A share as a percentage, whole, or with as many decimals (up to 3) as keep one short of all or above none
    from reading 100% or 0% (2 labels wrong of 400 printed "labels 100%")."""
    return _off_the_edges(100 * share, lambda decimals: f"{100 * share:.{decimals}f}", 0, 3, (0.0, 100.0)) + "%"


def _off_the_edges(value: float, text: Callable[[int], str], digits: int, most: int, edges: tuple[float, ...]) -> str:
    """``text(digits)``, or with as many more digits (up to ``most``) as keep a ``value`` that is none of ``edges``
    from reading as one of them."""
    while float(text(digits)) in edges and value not in edges and digits < most:
        digits += 1
    return text(digits)


def beside_line(value: float, line: float, decimals: int = 2) -> str:
    """``value`` with ``decimals`` decimals, or as many more as keep it on its side of the verdicts' ``line``
    (an IoU of 0.49998, under the box's 0.5, reads 0.49998, not 0.50)."""
    text = f"{value:.{decimals}f}"
    while (float(text) >= line) != (value >= line) and decimals < 17:
        decimals += 1
        text = f"{value:.{decimals}f}"
    return text
