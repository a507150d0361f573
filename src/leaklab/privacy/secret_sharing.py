"""Additive secret sharing and the secure n-party sum of seed 003 (Gohari, thesis 2023), chapter 4, Sec. 4.3.2:
the aggregation layer of the privacy-engineered value factorisations (PE-VDN, PE-QMIX, PE-QTRAN).

* Fixed-point encoding (eqs. 4.11-4.12): enc(x) = int(10^precision x) mod p; dec(y) = y / 10^precision for
  y <= p / 2, else (y - p) / 10^precision. A sum is exact to 10^-precision per term while |sum| 10^precision < p / 2.
* Sharing over Z_p: share(s) = (r_1, ..., r_n) with r_1..r_{n-1} uniform on Z_p and r_n = s - sum r_i mod p;
  reconstruct(shares) = sum mod p. Any n - 1 shares are uniform and independent of s.
* :func:`secure_sum`, the three-step protocol: every agent shares its secret and sends share j to agent j; every
  agent adds the shares it received and broadcasts that sum; everyone adds the broadcasts. Only the total is
  revealed. With n = 2 it hides nothing: the total minus one's own secret is the other's (the thesis' 3m has 3
  agents); with n >= 3 it reveals the sum of the others' secrets.

Defaults as the authors' code: p = 2^31 - 1, precision 5 (so |sum| must stay below about 10,737). Arithmetic is in
int64 (the authors' int32 casts can overflow when shares are summed); p is at most 2^62 so that no sum of two
residues overflows. The shares come from ``rng``: a deployment draws it from a secure source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from leaklab.errors import LeaklabError

__all__ = ["SecureSum", "FIELD", "PRECISION", "encode", "decode", "share", "reconstruct", "secure_sum"]

FIELD = 2 ** 31 - 1
PRECISION = 5
MAX_FIELD = 2 ** 62


def _check_field(p: int, precision: int) -> None:
    if not (isinstance(p, (int, np.integer)) and 2 < p <= MAX_FIELD and isinstance(precision, (int, np.integer))
            and 0 <= precision <= 15):
        raise LeaklabError(f"the field size p is a whole number in (2, 2^62] and the precision 0 to 15 digits "
                           f"(got {p!r}, {precision!r})")


def encode(x: Any, p: int = FIELD, precision: int = PRECISION) -> np.ndarray:
    """Eq. 4.11: int(10^precision x) mod p, elementwise (int64); values whose encoding would wrap are refused."""
    _check_field(p, precision)
    scaled = np.trunc(np.asarray(x, dtype=float) * 10.0 ** precision)
    if not np.isfinite(scaled).all() or np.abs(scaled).max(initial=0) >= p / 2:
        raise LeaklabError(f"a value is too large to encode: |x| 10^{precision} must stay below p / 2 = {p // 2}")
    return np.mod(scaled.astype(np.int64), p)


def decode(y: Any, p: int = FIELD, precision: int = PRECISION) -> np.ndarray:
    """Eq. 4.12: y / 10^precision for y <= p / 2, (y - p) / 10^precision above."""
    _check_field(p, precision)
    y = np.asarray(y, dtype=np.int64)
    return np.where(y <= p // 2, y, y - p).astype(float) / 10.0 ** precision


def share(secret: Any, parties: int, rng: np.random.Generator, p: int = FIELD) -> np.ndarray:
    """Shares of an encoded ``secret`` (int64 residues, any shape) for ``parties`` agents: ``[parties, *shape]``."""
    if not (isinstance(parties, int) and parties >= 2):
        raise LeaklabError(f"secret sharing needs 2 parties or more (got {parties!r})")
    s = np.asarray(secret, dtype=np.int64)
    if s.size and (s.min() < 0 or s.max() >= p):
        raise LeaklabError("a secret to share is an encoded residue in [0, p)")
    shares = rng.integers(0, p, size=(parties - 1, *s.shape), dtype=np.int64)
    last = s.copy()
    for r in shares:
        last = np.mod(last - r, p)
    return np.concatenate([shares, last[None]])


def reconstruct(shares: Any, p: int = FIELD) -> np.ndarray:
    """The secret from all its shares: their sum mod p (added one at a time, so that int64 never overflows)."""
    total = np.zeros(np.asarray(shares).shape[1:], dtype=np.int64)
    for r in np.asarray(shares, dtype=np.int64):
        total = np.mod(total + r, p)
    return total


@dataclass(frozen=True)
class SecureSum:
    """A secure sum's result ``total`` (decoded) and every message sent: ``shares[i, j]`` went from agent i to agent
    j (peer to peer), ``broadcasts[j]`` is agent j's sum of what it received (public)."""

    total: np.ndarray
    shares: np.ndarray
    broadcasts: np.ndarray


def secure_sum(values: Any, rng: np.random.Generator, p: int = FIELD, precision: int = PRECISION) -> SecureSum:
    """The n-party secure sum of ``values[i]`` (agent i's secret, any shape; n >= 2 agents on the first axis)."""
    values = np.asarray(values, dtype=float)
    if values.ndim < 1 or values.shape[0] < 2:
        raise LeaklabError("a secure sum needs the secrets of 2 agents or more (the first axis)")
    encoded = encode(values, p, precision)
    total_bound = np.abs(np.trunc(values * 10.0 ** precision)).sum(axis=0).max(initial=0)
    if total_bound >= p / 2:
        raise LeaklabError(f"the sum may wrap: |sum| 10^{precision} must stay below p / 2 = {p // 2}")
    shares = np.stack([share(e, len(values), rng, p) for e in encoded])  # [sender, receiver, ...]
    broadcasts = np.stack([reconstruct(shares[:, j], p) for j in range(len(values))])
    return SecureSum(decode(reconstruct(broadcasts, p), p, precision), shares, broadcasts)
