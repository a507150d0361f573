"""Configuration of a gradient-inversion attack (every field has a working default): the objectives
and priors of seed 001 (L2/DLG, L1, cosine/Inverting Gradients, its Bayes-optimal adversary), and the image step
of seed 004's two-step attack (:class:`FeatureInversionConfig`). Free of torch, so that the command line reads the
defaults without loading it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leaklab.fields import Seed
from leaklab.names import LAYER_WEIGHTING_NAMES, OBJECTIVE_NAMES, PRIOR_NAMES

# The image attacks' method version: raised whenever what an image attack computes for the same case and config
# changes (a saved result keyed without it was reused across such changes: a Bayes Table 2 cell computed before the
# tiny-noise fix of session 53 read 5.53 dB where the landed code reads 6.32). 1: session 54's code.
INVERSION_METHOD_VERSION = 1


class InversionConfig(BaseModel):
    """An optimisation-based inversion: seed 001 Algorithm 1 and the attacks it generalises.

    ``priors`` maps prior names to weights ``beta``. With ``prior_scale="relative"`` (the default) a
    weight is relative: at the starting images the prior's gradient has ``beta`` times the norm of the
    data term's gradient, which makes one ``beta`` meaningful across objectives whose natural scales
    differ by orders of magnitude. ``prior_scale="absolute"`` uses ``beta`` as given (eq. 3 with beta).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    objective: Literal[OBJECTIVE_NAMES] = "cosine"
    optimizer: Literal["adam", "lbfgs"] = "adam"
    iterations: int = Field(default=2000, ge=1, le=1_000_000)
    lr: float = Field(default=0.1, gt=0, le=1e4)
    schedule: Literal["cosine", "exp", "step", "constant"] = "cosine"
    lr_decay: float = Field(default=0.01, gt=0, le=1, description="exp: final lr / initial lr")
    signed_gradients: bool = False
    lbfgs_inner: int = Field(default=20, ge=1, le=100, description="L-BFGS inner iterations per step")
    priors: dict[str, float] = Field(default_factory=lambda: {"tv": 0.2})
    prior_scale: Literal["relative", "absolute"] = "relative"
    layer_weighting: Literal[LAYER_WEIGHTING_NAMES] = "none"
    drop: list[str] = Field(default_factory=list, max_length=1000, description=(
        "parameter tensors left out of the data term, e.g. classifier.0.weight: seed 001's attack on Soteria drops "
        "the defended layer's gradient (the layer-wise Gaussian of appendix A.5, eq. 6)"))
    restarts: int = Field(default=1, ge=1, le=64)
    mc_samples: int = Field(default=1, ge=1, le=64, description="k of Algorithm 1")
    mc_radius: float = Field(default=0.0, ge=0, le=1e4, description="delta of Algorithm 1 (L2, pixel units)")
    init: Literal["gaussian", "uniform", "mean"] = "gaussian"
    clamp: bool = True
    precision: Literal["fp32", "bf16"] = "fp32"
    seed: Seed = 0

    @model_validator(mode="after")
    def _monte_carlo_needs_a_ball(self) -> "InversionConfig":
        # Algorithm 1's k points are drawn in the delta-ball around the iterate, in the Adam loop
        if self.mc_samples > 1 and self.mc_radius == 0:
            raise ValueError("mc_samples (--mc-samples) > 1 draws points in the ball of radius mc_radius "
                             "(--mc-radius): give mc_radius > 0 (with 0 the points coincide)")
        if self.optimizer == "lbfgs" and (self.mc_samples > 1 or self.mc_radius > 0):
            raise ValueError("Algorithm 1's Monte-Carlo points (mc_samples, mc_radius: --mc-samples, --mc-radius) "
                             "need the adam optimizer")
        return self

    @model_validator(mode="after")
    def _settings_that_apply(self) -> "InversionConfig":
        """Refuse a setting the attack would record but not apply: a layer weighting or dropped tensors of the Bayes
        objective (the likelihood weighs every entry), clamping L-BFGS's iterates (only Adam's are clamped; both
        reconstructions are clipped to [0, 1] at the end); L-BFGS's default ``clamp`` is taken as False; Adam's
        schedule, its decay and signed steps with L-BFGS, L-BFGS's inner iterations with Adam, a decay without the exp
        schedule (written to results.json, the reconstructions the same bit for bit)."""
        if self.objective == "bayes" and self.layer_weighting != "none":
            raise ValueError("the bayes objective weighs every entry by the defense's likelihood: layer_weighting "
                             "applies to l2, l1 and cosine")
        if self.objective == "bayes" and self.drop:
            raise ValueError("the bayes objective's likelihood covers the whole update: drop applies to l2, l1 and "
                             "cosine (seed 001's eq. 6, a layer-wise Gaussian, is l2 over the tensors kept)")
        if self.optimizer == "lbfgs" and self.clamp:
            if "clamp" in self.model_fields_set:
                raise ValueError("clamp applies to adam's iterates: L-BFGS runs unclamped (its reconstruction is "
                                 "clipped to [0, 1] at the end); give clamp false")
            self.clamp = False
        # set to other than its default (a config dumped from a run's results.json sets every field, as they were)
        given = {f for f in self.model_fields_set if getattr(self, f) != type(self).model_fields[f].default}
        unused = [f for f in ("schedule", "lr_decay", "signed_gradients") if f in given] \
            if self.optimizer == "lbfgs" else ["lbfgs_inner"] if "lbfgs_inner" in given else []
        if unused:
            raise ValueError(f"{' and '.join(unused)} {'apply' if len(unused) > 1 else 'applies'} to "
                             f"{'adam' if self.optimizer == 'lbfgs' else 'lbfgs'}, not to {self.optimizer}")
        if "lr_decay" in given and self.schedule != "exp":
            raise ValueError(f"lr_decay is the exp schedule's final lr / initial lr; the {self.schedule} schedule "
                             "takes none")
        return self

    @field_validator("drop")
    @classmethod
    def _once_each(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(value))

    @field_validator("priors")
    @classmethod
    def _known_priors(cls, value: dict[str, float]) -> dict[str, float]:
        for name, beta in value.items():
            if name not in PRIOR_NAMES:
                raise ValueError(f"unknown prior {name!r}; choose from {', '.join(PRIOR_NAMES)}")
            if not 0 <= beta <= 1e6:
                raise ValueError("prior weights must lie in [0, 1e6]")
        return {k: v for k, v in value.items() if v > 0}


class FeatureInversionConfig(BaseModel):
    """Step 2 of seed 004's attack, images from features (section 5.3; :mod:`.features`), with leaklab's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    iterations: int = Field(default=1000, ge=1, le=100_000, description="Adam steps (the paper: 5,000)")
    lr: float = Field(default=0.1, gt=0, le=10, description="Adam's initial learning rate, annealed to 0")
    tv: float = Field(default=0.03, ge=0, le=100, description="weight of the mean total variation (0.03: the best "
                                                              "of 0, 0.03 and 0.3 on exact MNIST features)")
    restarts: int = Field(default=5, ge=1, le=64, description="random starts; the lowest loss is kept")
    seed: Seed = 0
