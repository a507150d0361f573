"""Field types the configurations share."""

from typing import Annotated

from pydantic import Field

MAX_SEED = 2**32 - 1  # the widest range every generator leaklab seeds takes (ViZDoom's is 32-bit)
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description=f"0 to {MAX_SEED}")]
