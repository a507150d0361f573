"""Configuration and result of the room attacks QGI and RGI (seed 000, section IV).

``mode="paper"`` is section IV as written: optimisation-based state reconstruction in two stages
(IV-A) on the error-direction surrogate (IV-B, eq. 6), rule-based action and supervision signal
(IV-C, IV-D). ``mode="exact"`` (leaklab's default) recovers every linear layer's input analytically,
hence the box, the predicted and target Q-values, the probabilities and the reward exactly, and then
reconstructs the images against the exactly known convolutional features.

``objective`` and ``multimodal`` are the ablations of section V-C (paper mode only):
``"error_direction"`` is eq. 6; ``"dlg"`` matches gradients of the true objective J by squared
error with the target Q-value (and, with ``action="optimised"``, the action) optimised jointly;
``"inverting"`` matches by cosine with J, rule-based action and optimised target Q-value (Table II).
``multimodal="joint"`` optimises the box and the images together instead of in two stages (Fig. 4).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from leaklab.fields import Seed
from leaklab.names import ROOM_MODE_NAMES


EXACT_ONLY = ("tv_final", "feature_weight", "gradient_weight", "layerwise")  # fields the paper mode never reads
# Per mode, raised whenever a change alters what the room attacks compute for the same configuration,
# so that ``leaklab reproduce`` does not reuse results of an earlier method; results that record none
# are version 1 (exact mode's 2: the layerwise stage; 3: its activations' zeros read off the solve's
# noise, up to 6 fresh factorisations in its solve, and a failed stream keeping stage 1's feature match;
# 4: up to 12 fresh factorisations in 30 rounds; 5: the RGB frame's TV on luma and chroma, colour_tv;
# 6: a stream whose last convolution's weight gradient alone determines its penultimate activations takes
# them from it, ``wide-rgb``'s RGB stream and ``nature``'s two, where ``small``'s, ``stacked``'s and ``deep``'s
# streams compute what they did on 5; 7: the layerwise solve allows for the rounding of an error summed in
# another order than the client's, as on a GPU, and, where the weight gradient determines the activations,
# for the rounding of the client's own arithmetic (TF32), leaving every stream of 6 + 6 ``small`` and 48 + 3
# ``wide-rgb`` frames on this host bit for bit as on 6, and 93 of 96 ``nature`` QGI frames (the other 3
# within 0.002 dB; 8: the convolutions on the full-resolution images computed by space-to-depth,
# :mod:`leaklab.attacks.rl.image_convs`, and the TV prior's gradient in closed form, ``modality_tv``: the
# same functions in another rounding; 9: on a defended update the box fitted to every Linear layer it
# feeds, :mod:`leaklab.attacks.rl.box_fit`, an untouched update's results unchanged; 10: on a defended
# update the images' TV prior ends no lower than the features' noise ratio, ``exact.tv_schedule``, an untouched
# update's results unchanged; 11: on a defended update the conv features read off ``head.0`` corrected for the
# shrinking that the bias gradient's noise causes, ``exact.noised_features``, an untouched update's results
# unchanged; 12: on a defended update the TV floor scaled by the image's pixels per conv feature,
# ``exact.tv_schedule``, an untouched update's results unchanged; 13: a batch of two behind noise read with
# the noise in view, its ReLU supports sample by sample, RGI's ends of the line with the noise's slack,
# its boxes fitted (``box_fit.fitted_batch_box``) and its features' noise ratio read,
# ``exact.separated_vectors``, and RGI's one sample above the noise read alone where the other is under it
# (``exact.dominant_sample``), one sample's and an untouched batch's results unchanged; 14: a batch of two
# behind noise holds its ReLU zeros to each sample's noise std, ``exact.read_noise``, and RGI steps to the ends
# of its line until they stop moving, ``exact._noisy_ends``, one sample's and an untouched batch's results
# unchanged; 15: QGI reads a batch's one sample above the noise alone as RGI does, and neither reads a batch
# whose head.0 shows a second sample behind a last layer of one sample's form (the same action: a blend),
# ``exact.dominant_sample``, one sample's and an untouched batch's results unchanged; 16: a batch's images each
# weigh as one sample alone, their feature match over their own features' norm and their TV floor from their
# own noise ratio, ``exact._feature_match``, ``exact._prior``, one sample's results unchanged; 17: RGI's batch
# of two reads the ends of its last layer's line with the noise's slack also where that layer shows no noise (float32's
# rounding), ``exact.reinforce_batch_errors``, one sample's and every QGI result unchanged; 18: an untouched batch's
# ReLU supports read against each sample's own rounding, ``exact.relu_open``, and its boxes fitted as a defended
# batch's, ``box_fit.fitted_batch_box``, one sample's and those of every batch whose last layer shows noise
# unchanged; 19: a batch whose second sample is within 10 times of noise too weak for the last layer's test
# reads its other sample alone, ``exact.dominant_sample``, only such batches' results changed; 20: an untouched
# DQN batch of two with the same action separated by its last hidden layer's rows, ``same_action_errors`` (then in
# ``exact``), only such batches' results changed; 21: such a batch behind noise, whose second action by eq. 7 is an
# entry of the noise, separated by a parallelogram fitted to those rows, ``same_action._fitted_points``, and such an
# entry read as no sample's error where they do not separate, ``same_action.exact_dqn_errors``, only such batches'
# results changed; 22: a batch read as one sample whose last layer or head.0 shows the other's part over the noise
# claims nothing exact (a blend), ``exact.blended``, every reconstruction unchanged, and a batch whose split leaves
# head.0 a residual far over its trailing part where the last layer shows no noise is not read in closed form
# (RGI's line past a sample whose ReLU support nests in the other's: a wrong split), ``exact._trailing_part``, the
# captured batches unchanged; 23: behind a clipping defense that may have scaled the update QGI claims no exact
# target, and behind clipping alone at its bound RGI reads the reward with the factor fitted, ``rules.clipped_scale``,
# behind clipping among other steps claims none, ``attack._clipping``, and an untouched RGI batch read as one sample
# (two of one state) claims no reward, and an untouched DQN batch reads a second action however small its error
# (eq. 7, ``rules.dqn_actions``), every other update's results unchanged; 24: an RGI batch read as one sample claims
# no reward (behind noise two of one state and one action read so), every reconstruction unchanged; 25 (and paper
# mode's 6): an update the client computed in eval mode (``train_mode`` false) attacked through the network in eval
# mode, a user's BatchNorm on its running statistics (a captured one: 9.5 dB against 29.8 at 2,000 iterations);
# RGI's reward of a policy sure of its action (1 − p_a under 0.1) read off the other entries,
# ``rules.CONFIDENT``; no features' cosine estimated behind heavy pruning, ``exact.cosine_estimable``; a DQN batch
# whose last bias gradient holds one non-zero entry claims no action; a box.0 without gradient (top-k) fitted from
# 0 to the layers after it, ``exact.exact_vectors``, every other update's results unchanged); 26: the box's
# Gauss–Newton fit stops where no step along its direction lowers the loss (a ReLU's kink behind heavy noise)
# instead of taking a 1e-6 step uphill and trying again to its 50th step, ``box_fit._fit``: 9 of the default
# audit's 60 boxes moved by at most 3e-8, every fit that never stalled unchanged; and a DQN batch of two whose
# second action is an entry of the noise (``same_action.exact_dqn_errors``) claims no exact action from the
# paper's stages that attack it, ``attack._qgi``, every reconstruction unchanged; 27: no image stage where
# the features' estimated cosine is 0 (noise is all the update shows of them): the rows score the no-information
# start at 0 iterations, ``attack._images_and_state``, every other update's results unchanged;
# paper mode's 2:
# stage 1 starts again when its match ends under a cosine of 0.999; 3: the image convolutions as exact mode's 8;
# 4: a single sample's update read for the features it lets through, ``exact.update_feature_cosine``, as exact
# mode reads it, the reconstruction unchanged to the bit; 5: an untouched DQN batch of two reads a second action
# however small its error, as exact mode's 23, every other update's results unchanged; 6: as exact mode's 25).
# Summing stage 1's feature match stream by stream (session 10) left every result bit-identical: the
# images' gradient does not depend on how the loss's terms are grouped.
# The bordered factor kept in blocks (session 12) solves in another order: its float64 activations
# move by ~1e-14 and came out the same in float32, so all 16 rows of 8 S1 and 8 S2 QGI attacks did.
METHOD_VERSION = {"exact": 27, "paper": 6}


class RoomAttackConfig(BaseModel):
    """Every field has a working default; ``iterations`` counts image-stage (stage 2) steps."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal[ROOM_MODE_NAMES] = "exact"
    iterations: int = Field(default=2000, ge=1, le=1_000_000)
    stage1_iterations: int = Field(default=2000, ge=1, le=1_000_000, description="paper mode, IV-A stage 1")
    lr: float = Field(default=0.1, gt=0, description="Adam step size of the image stage")
    stage1_lr: float = Field(default=0.1, gt=0)
    stage1_restarts: int = Field(default=2, ge=0, le=100, description="paper mode, ours: fresh starts of "
                                 "stage 1 when the error direction's match of one sample's exact gradient "
                                 "ends under a cosine of 0.999")
    tv_weight: float = Field(default=0.1, ge=0, description="lambda of L_img (IV-A); 0.1 in section V")
    tv_final: float = Field(default=0.003, gt=0, description="exact mode: λ decays geometrically to this "
                            "(behind noise to the features' noise ratio where that is higher)")
    feature_weight: float = Field(default=1.0, ge=0, description="exact mode: weight of the feature match")
    gradient_weight: float = Field(default=1.0, ge=0,
                                   description="exact mode: weight of the last-convolution gradient match")
    layerwise: bool = Field(default=True, description="exact mode: recover each stream's penultimate "
                            "activations exactly and match them and the convolution before")
    objective: Literal["error_direction", "dlg", "inverting"] = "error_direction"
    action: Literal["rule", "optimised"] = "rule"
    multimodal: Literal["separate", "joint"] = "separate"
    seed: Seed = 0

    @model_validator(mode="after")
    def _ablations_where_they_apply(self) -> "RoomAttackConfig":
        if self.mode == "exact" and (self.objective, self.action, self.multimodal) != \
                ("error_direction", "rule", "separate"):
            raise ValueError("objective, action and multimodal are paper-mode ablations (section V-C); "
                             "exact mode takes the defaults")
        if self.mode == "paper":
            tuned = [k for k in EXACT_ONLY if getattr(self, k) != type(self).model_fields[k].default]
            if tuned:
                one = len(tuned) == 1
                what = ("is an exact-mode setting", "it") if one else ("are exact-mode settings", "them")
                raise ValueError(f"{', '.join(tuned)} {what[0]}; paper mode (section IV as written) "
                                 f"does not read {what[1]}")
        if self.objective == "error_direction" and self.action == "optimised":
            raise ValueError("action='optimised' needs objective 'dlg' or 'inverting': the error "
                             "direction (eq. 6) takes the action from the rule")
        return self


@dataclass
class RoomReconstruction:
    """What QGI/RGI recovered from one client update (``B`` samples).

    ``images`` are the network's image input in pixel units ``[B, C, 150, 150]`` clipped to [0, 1]
    (S1: RGB then depth; S2: depth); ``box`` is ``[B, 4]`` in the network's box frame. QGI fills
    ``q_pred`` (the predicted Q-value of the taken action) and ``q_target``; RGI fills ``probs``
    ``[B, A]``, ``reward`` and ``action_identified`` (False where the update has no policy-gradient
    part, a zero return, so holds no trace of the action: ``action`` is then a guess; on a noised
    update the noise passes for such a part). ``exact`` names what the mode recovered in
    closed form (none for a batch read as one sample whose other still shows: a blend,
    :func:`~leaklab.attacks.rl.exact.blended`). ``no_signal``: the attack read nothing off the update (an
    all-zero bias gradient, e.g. after pruning, or a batch of two the last layer does not separate), so the
    reconstruction is the attack's no-information start.
    ``feature_cosine``: the estimate, from the update alone, of the cosine between the conv features read
    off it in closed form and the client's (:func:`~leaklab.attacks.rl.exact.feature_cosine`; 1 on an
    untouched update; in paper mode too, :func:`~leaklab.attacks.rl.exact.update_feature_cosine`; a batch's:
    the mean of its samples'); None where it was not read (a batch of two in paper mode, no signal).
    ``read`` ``[B]`` (bool): which samples the attack read, None where it read all; an unread sample (no signal,
    or the one a noised batch hides, :func:`~leaklab.attacks.rl.exact.dominant_sample`) is the no-information
    start, whose zero box is no box read, and scores box IoU 0 even where its target is out of view, and no Q or
    reward error (NaN).
    """

    images: torch.Tensor
    box: torch.Tensor
    action: torch.Tensor
    iterations: int
    seconds: float
    q_pred: torch.Tensor | None = None
    q_target: torch.Tensor | None = None
    probs: torch.Tensor | None = None
    reward: torch.Tensor | None = None
    action_identified: torch.Tensor | None = None
    read: torch.Tensor | None = None  # [B] bool: the samples the attack read (None: all)
    exact: tuple[str, ...] = ()
    no_signal: bool = False  # the attack read nothing off the update: nothing was recovered
    stage1_starts: int = 0  # paper mode: how many times stage 1 started (``iterations`` counts one start)
    feature_cosine: float | None = None  # the read features' cosine with the client's, estimated

    def to(self, device: torch.device | str) -> "RoomReconstruction":
        """The same reconstruction with every tensor on ``device``."""
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})
