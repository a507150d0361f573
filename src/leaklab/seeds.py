"""One seed, one independent random stream per purpose.

A run's ``--seed`` fixes every random draw it makes, so that the same seed gives the same numbers. The draws
for different purposes must still not come from one stream. The server initialises the model from the seed,
so a defense's noise drawn from that same stream could be regenerated from the weights it sent and subtracted
(behind ``gaussian:0.1`` the clean gradient came back to 1.5e-8; behind ``prune:`` the kept entries were those
whose initial weight was not negative). DP-SGD's batch sampling and its noise drawn from one stream correlate
(0.63 between one sample being in a batch and the noise at another's coordinate, 10 samples at rate 1/3), and
the mechanism is then not the subsampled Gaussian the accountant analyses.

The model's initial weights (and the draws of ordinary training) use the seed itself; a defense and DP-SGD
draw from their own streams, :func:`generator` of the seed, the purpose and an index such as the update's. The
streams are seeded by the CRC-32 of their joint text (31 bits), so they are fixed across hosts and Python runs;
two seeds far apart can share one (91,627 and 14,757,806 do for the defense; a review found no two purposes or
updates of one seed sharing one). An
attack's own random start follows the attack's seed (``--seed``), which is the capture's when one command does
both: it then starts from the initialisation's draws, which the server knows anyway.

These streams make measurements repeatable; they are not a secure source. Whoever knows or guesses the seed
regenerates every draw. Without a seed (None) a stream is seeded from the operating system's entropy, so the
server cannot replay it from the model's seed; a deployment draws its noise from a cryptographic generator
(opacus' ``secure_mode``).
"""

from __future__ import annotations

import secrets
import zlib

import torch

__all__ = ["AUGMENT", "DEFENSE", "DP_BATCHES", "DP_NOISE", "generator", "stream_seed"]

DEFENSE = "defense"  # a client's defense chain on its update (noise, pruning's draws)
DP_BATCHES = "dp-batches"  # DP-SGD's Poisson sampling of its batches
DP_NOISE = "dp-noise"  # DP-SGD's noise on the clipped sum
AUGMENT = "augment"  # an ATS client's augmentation draws (crops, flips, chains, signs)


def stream_seed(*parts: object) -> int:
    """A 31-bit seed fixed by ``parts`` (their text joined by ``/``), e.g. (seed, purpose, index)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


def generator(seed: int | None, purpose: str, *index: int) -> torch.Generator:
    """A torch generator for ``purpose`` (:data:`DEFENSE`, :data:`DP_BATCHES`, :data:`DP_NOISE`, :data:`AUGMENT`)
    under ``seed``,
    independent of the model's initialisation by ``seed`` and of the other purposes' streams; ``seed`` None: one
    seeded from the operating system's entropy, another at every call."""
    if seed is None:
        return torch.Generator().manual_seed(secrets.randbits(63))
    return torch.Generator().manual_seed(stream_seed(seed, purpose, *index))
