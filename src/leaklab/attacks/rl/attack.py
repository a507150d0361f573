"""QGI and RGI (seed 000, section IV, Fig. 2): ``qgi(view, update, config)`` / ``rgi(...)``.

What each mode recovers exactly (``RoomReconstruction.exact``):

* exact, batch 1: action, box, Q̂, Q (QGI), probabilities, action, reward (RGI); images by
  optimisation against the exact conv features and gradients (:mod:`leaklab.attacks.rl.exact`).
* exact, batch 2 (QGI): the actions (eq. 7, as a set); when they differ, each sample's error at the
  output is known, which separates every Linear layer's input sample by sample
  (:func:`~leaklab.attacks.rl.exact.separated_vectors`): box, features, Q̂ and Q exact; the images
  by the exact mode's image stage, each against its own features, together against the last
  convolutions' gradients. The same action twice (behind noise, eq. 7's second action an entry of the
  noise) leaves the output errors dependent; the last hidden layer's rows still tell the samples apart
  (:func:`~leaklab.attacks.rl.same_action.same_action_errors`), and where they do not, box and images come
  from the paper's two stages (a second action within the noise is read as no sample's,
  :func:`~leaklab.attacks.rl.same_action.exact_dqn_errors`). Where one sample's TD error is under a defense's
  noise, the other is read as a single sample (:func:`~leaklab.attacks.rl.exact.dominant_sample`), the hidden
  one left at the no-information start, nothing claimed exact where the other still shows in the last layer or
  ``head.0`` (a blend of the two, :func:`~leaklab.attacks.rl.exact.blended`).
* exact, batch 2 (RGI): both samples' errors at the output from the last layer alone
  (:func:`~leaklab.attacks.rl.exact.reinforce_batch_errors`), then as QGI's batch 2: box, features,
  probabilities exact; each sample's action and reward by IV-D's rules on its own error. Where one
  sample's gradient is under a defense's noise (a zero return sends only its small entropy term) and
  the last layer does not separate them, the other sample as a single one
  (:func:`~leaklab.attacks.rl.exact.dominant_sample`; nothing claimed exact for a blend, as QGI's; no reward: two
  samples of one state send their errors summed in one sample's form, and behind noise the sum of two of one
  action reads as one sample's beside a zero return's entropy term). An untouched
  split whose ``head.0`` fit leaves more than :data:`~leaklab.attacks.rl.exact.SPLIT_SLACK` times its best
  rank-2 fit's residual (a wrong split) goes to the paper's stages.
* exact, behind clipping that may have scaled the update (:func:`_clipping`): every ratio of the gradient as
  before; QGI's target not claimed (its size is lost); RGI's reward, behind clipping alone, with the scale fitted
  to the known entropy part (:func:`~leaklab.attacks.rl.rules.clipped_scale`; claimed where the fit's uncertainty
  is under :data:`~leaklab.attacks.rl.rules.SCALE_EXACT`, never where α = 0 or with fewer than 5 actions), behind
  clipping among other steps not claimed.
* paper: the actions (eq. 7); everything else by optimisation and the rules of IV-C/IV-D (RGI: one
  sample).
"""

from __future__ import annotations

import math
import time
from dataclasses import fields, replace

import torch

from leaklab.attacks.rl.config import RoomAttackConfig, RoomReconstruction
from leaklab.attacks.rl.exact import (ExactState, blended, cosine_estimable, dominant_sample, exact_images,
                                      exact_vectors, reinforce_batch_errors, separated_vectors, update_feature_cosine)
from leaklab.attacks.rl.image_convs import attack_network
from leaklab.attacks.rl.images import start_images
from leaklab.attacks.rl.network import trace
from leaklab.attacks.rl.optim import Progress
from leaklab.attacks.rl.paper import PaperState, last_layer_input, last_layer_norm_ratio, paper_state
from leaklab.attacks.rl.rules import (SCALE_EXACT, clipped_scale, dqn_actions, dqn_target_exact,
                                      dqn_target_paper, error_directions, reinforce_action_reward)
from leaklab.attacks.rl.same_action import exact_dqn_errors
from leaklab.defenses.updates import Clip, parse_defense
from leaklab.errors import LeaklabError, NoSignal
from leaklab.models.perception import PerceptionNet, PerceptionSpec
from leaklab.threat import ClientUpdate, ServerView


def max_batch(loss: str, mode: str) -> int:
    """The most transitions an update of ``loss`` may hold for the attack in ``mode``: two for QGI
    (IV-C1's action rule reads a batch of two) and for exact-mode RGI, one for paper-mode RGI (IV-D)."""
    return 1 if loss == "reinforce" and mode != "exact" else 2


def _check(view: ServerView, update: ClientUpdate, loss: str, cfg: RoomAttackConfig
           ) -> tuple[PerceptionNet, dict[str, torch.Tensor], int]:
    if not isinstance(view.spec, PerceptionSpec):
        raise LeaklabError("room attacks need a perception network view (seed 000); build it with make_view")
    meta = update.metadata
    if meta != view.metadata:  # what the attack reads (the loss, α, the batch) must be what the client sent
        differ = ", ".join(f"{k} {v!r} against {getattr(meta, k)!r}" for k, v in view.metadata.model_dump().items()
                           if v != getattr(meta, k))
        raise LeaklabError(f"the view declares another update than the one attacked ({differ}: the view's against "
                           "the update's)")
    if meta.kind != "fedsgd":
        raise LeaklabError(f"this attack reads a FedSGD update (one gradient); the update is {meta.kind}")
    if meta.loss != loss:
        raise LeaklabError(f"this attack reads an update of the {loss!r} loss; the update's loss is {meta.loss!r} "
                           f"(use {'rgi' if loss == 'dqn_mse' else 'qgi'}?)")
    if view.batch_size > max_batch(loss, cfg.mode):  # the capability to know it, checked
        raise LeaklabError(f"batch size {meta.batch_size} is not supported; this attack handles at most "
                           f"{max_batch(loss, cfg.mode)}")
    if cfg.objective != "error_direction" and loss != "dqn_mse":
        raise LeaklabError("the dlg/inverting ablations are QGI objectives (Table II)")
    update.validate_against(view.model)
    device = next(view.model.parameters()).device
    grads = {k: v.detach().float().to(device) for k, v in update.tensors.items()}
    net = attack_network(view.model)  # a copy: the caller's model stays as it was
    if not meta.train_mode:  # the client's forward in eval mode (a user's BatchNorm on its running statistics)
        net.eval()
    return net, grads, meta.batch_size


CLIP_BOUND = 1e-5  # an update's norm within this fraction under its clipping bound is taken as clipped
CLIP_ALONE, CLIP_AMONG = "alone", "among other steps"  # _clipping's answers


def _clipping(view: ServerView, update: ClientUpdate) -> str | None:
    """How a clipping the update declares may have scaled it by a factor the server does not know (leaklab's):
    :data:`CLIP_ALONE` where its defense is clipping alone and its norm the smallest bound (within ``CLIP_BOUND``,
    or 16 rounding steps of its least precise dtype: float16's rounding left a clipped norm 8.5e-4 under it);
    :data:`CLIP_AMONG` where other steps (noise, pruning) go with it, so that whether it bound cannot be told;
    None where it declares none, or clipping alone that did not bind. Every ratio of the gradient survives the
    factor, its size does not: QGI's target, read off the error's size, is not exact behind either, and RGI's
    reward is read with the factor fitted behind clipping alone (:func:`~leaklab.attacks.rl.rules.clipped_scale`),
    not claimed behind clipping among other steps. Read only where the view grants the defense
    (``knows_defense``): an update that names its own was read whatever the view withheld."""
    steps = parse_defense(update.defense if view.capabilities.knows_defense else None).steps
    if not any(isinstance(step, Clip) for step in steps):
        return None
    if not all(isinstance(step, Clip) for step in steps):
        return CLIP_AMONG
    slack = max(CLIP_BOUND, *(16 * torch.finfo(t.dtype).eps for t in update.tensors.values()))
    norm = math.sqrt(sum(float(t.double().square().sum()) for t in update.tensors.values()))
    return CLIP_ALONE if norm >= min(step.c for step in steps) * (1 - slack) else None


def _last_bias(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return grads[f"head.{len(net.head) - 1}.bias"].double()


def _outputs(net: PerceptionNet, last_input: torch.Tensor) -> torch.Tensor:
    last = net.head[len(net.head) - 1]
    return last_input.double() @ last.weight.detach().double().T + last.bias.detach().double()


def _exact_read(net: PerceptionNet, grads: dict[str, torch.Tensor], errors: torch.Tensor | None, batch: int,
                hidden: torch.Tensor | None = None) -> tuple[ExactState | None, int, bool]:
    """Exact mode's closed forms of an update, how many of its samples they read and whether they read a blend of
    two (then nothing is claimed exact, :func:`~leaklab.attacks.rl.exact.blended`): one sample's
    (:func:`~leaklab.attacks.rl.exact.exact_vectors`); a batch's, separated by its samples' ``errors`` at the
    output, or ``hidden`` at the last hidden layer's output where the output's do not separate them
    (:func:`~leaklab.attacks.rl.exact.separated_vectors`); else, where one sample's gradient stands
    above the noise and the other's is under it (:func:`~leaklab.attacks.rl.exact.dominant_sample`), that
    one's alone; ``(None, batch, False)`` where none (the paper's stages then run)."""
    if batch == 1:
        return exact_vectors(net, grads), 1, False
    st = None if errors is None else separated_vectors(net, grads, errors, hidden)
    if st is None and dominant_sample(net, grads):
        return exact_vectors(net, grads), 1, blended(net, grads)
    return st, batch, False


def _images_and_state(net, grads, errors, actions, cfg, progress, batch, st):
    """``(box, images, last-layer input, paper state or None, iterations, exact names, feature cosine)``: exact
    mode's image stage on its closed forms ``st`` (:func:`_exact_read`), the paper's stages where that is None;
    the features' estimated cosine (exact mode's reading; paper mode reads one sample's apart, not a batch's).

    Where that estimate is 0 for every sample read (the noise read on its corrected features at least their own
    norm, or ``head.0``'s bias gradient no larger than its noise: :func:`~leaklab.attacks.rl.exact.noised_features`;
    noise is all the update shows of the features), exact mode runs no image stage and returns the
    no-information start, 0 iterations (exact method version 27, leaklab's). Its 2,000 steps
    fitted noise there: no image of 75 such updates (QGI and RGI, S1 and S2, on all five networks, behind Gaussian
    noise of σ = 0.1 and 0.3, Laplace noise of scale 0.3, DP-SGD at ε = 8, pruning or top-k with noise) nor of 127
    attacks in sessions 65-69's audits (``wide-rgb``, σ = 0.001 to 3, ε = 1 to 100) showed its room (3 dB over
    the constant image; the best +0.43 dB; docs/reproductions.md, "No image stage where the features read as
    noise"); in the default audit those attacks (27 of 60) took a third of its attack time. Not reached: a batch of
    two exact mode does not read (the paper's stages), an update behind heavy pruning (no estimate)."""
    estimable = cosine_estimable(grads)  # not behind heavy pruning
    if st is not None:
        read = st.cosine() if estimable else None
        names = ("box",) * st.box_read + ("features",)
        if read == 0.0:
            images = start_images(net.spec, len(st.features), cfg.seed, st.features.device)
            return st.box, images, st.last_input, None, 0, names, read
        images, activations = exact_images(net, grads, st, cfg, progress)
        return st.box, images, st.last_input, None, cfg.iterations, names + activations, read
    st = paper_state(net, grads, errors, actions, cfg, progress)
    with torch.no_grad():
        last_input = trace(net, st.features, st.box).linear[-1][1]
    read = update_feature_cosine(net, grads) if batch == 1 and estimable else None
    return st.box, st.images, last_input, st, st.iterations, (), read


def _starts(st: PaperState | None) -> int:
    return 0 if st is None else st.stage1_starts


def _nothing(net: PerceptionNet, batch: int, cfg: RoomAttackConfig, algorithm: str) -> RoomReconstruction:
    """What the server holds when the update lacks a gradient the attack reads (:class:`NoSignal`):
    the image stage's start, a zero box, action 0, zero Q-values or reward and uniform
    probabilities; nothing exact. Scored like any reconstruction, it shows that nothing leaked."""
    spec = net.spec
    zeros = torch.zeros(batch, dtype=torch.float64)
    common = dict(images=start_images(spec, batch, cfg.seed, next(net.parameters()).device),
                  box=torch.zeros(batch, spec.box_dim), action=torch.zeros(batch, dtype=torch.long),
                  read=torch.zeros(batch, dtype=torch.bool), iterations=0, seconds=0.0, no_signal=True)
    if algorithm == "qgi":
        rec = RoomReconstruction(**common, q_pred=zeros, q_target=zeros.clone())
    else:
        rec = RoomReconstruction(**common, probs=torch.full((batch, spec.num_actions), 1 / spec.num_actions),
                                 reward=zeros, action_identified=torch.zeros(batch, dtype=torch.bool))
    return rec.to(next(net.parameters()).device)


def qgi(view: ServerView, update: ClientUpdate, config: RoomAttackConfig | None = None,
        progress: Progress | None = None) -> RoomReconstruction:
    """Deep Q-learning Gradient Inversion of one FedSGD update of the DQN loss (batch 1 or 2; in exact mode,
    where one sample's gradient is under the noise and the other's stands above it, that one read alone and
    the other left at the no-information start, as :func:`rgi` does)."""
    cfg = config or RoomAttackConfig()
    net, grads, batch = _check(view, update, "dqn_mse", cfg)
    try:
        return _qgi(net, grads, batch, cfg, _clipping(view, update) is not None, progress)
    except NoSignal:
        return _nothing(net, batch, cfg, "qgi")


def _qgi(net: PerceptionNet, grads: dict[str, torch.Tensor], batch: int, cfg: RoomAttackConfig, clipped: bool,
         progress: Progress | None) -> RoomReconstruction:
    start = time.perf_counter()
    gb = _last_bias(net, grads)
    if cfg.mode == "exact":
        taken, errors, hidden = exact_dqn_errors(net, grads, batch)
    else:
        taken = dqn_actions(gb, batch)
        errors, hidden = error_directions(gb, taken), None
    state, read_batch, blend = (_exact_read(net, grads, errors, batch, hidden) if cfg.mode == "exact"
                                else (None, batch, False))
    actions = taken[:read_batch]
    noise_entry = cfg.mode == "exact" and errors is None  # the second action an entry of the noise (exact_dqn_errors)
    if read_batch < batch or errors is None:  # the largest entry's read alone, or the paper's stages read eq. 7's
        errors = error_directions(gb, actions)
    box, images, last_input, st, iterations, exact, read = _images_and_state(
        net, grads, errors, actions, cfg, progress, read_batch, state)
    if "features" in exact:  # the last layer's input is exact too
        q_pred = _outputs(net, last_input).gather(1, actions.view(-1, 1)).squeeze(1)
        q_target = dqn_target_exact(q_pred, errors.gather(1, actions.view(-1, 1)).squeeze(1), batch)
        exact += (("action",) if read_batch == batch else ()) + ("q_pred",) + (() if clipped else ("q_target",))
    else:
        if st is not None and cfg.objective != "error_direction":
            actions = st.actions
        q_pred = _outputs(net, last_input).gather(1, actions.view(-1, 1)).squeeze(1)
        if st is not None and st.q_target is not None:
            q_target = st.q_target
        else:
            ratio = last_layer_norm_ratio(net, grads, last_input, actions, batch)
            q_target = dqn_target_paper(q_pred, gb, actions, ratio)
        # eq. 7's rule, but one non-zero entry for two samples is one action twice or a TD error of exactly 0, and
        # an entry of the noise is no sample's action
        distinct = len(set(actions.tolist())) == len(actions)
        exact += ("action",) if cfg.action == "rule" and distinct and not noise_entry else ()
    rec = RoomReconstruction(images=images.clamp(0, 1), box=box.float(), action=actions,
                             iterations=iterations, seconds=time.perf_counter() - start,
                             q_pred=q_pred, q_target=q_target, exact=() if blend else exact,
                             stage1_starts=_starts(st), feature_cosine=read)
    if read_batch == batch:
        return rec
    # the other sample's action still by eq. 7: the next entry of the bias gradient (a guess under the noise)
    return _with_unread(rec, replace(_nothing(net, batch - read_batch, cfg, "qgi"), action=taken[read_batch:]))


def rgi(view: ServerView, update: ClientUpdate, config: RoomAttackConfig | None = None,
        progress: Progress | None = None) -> RoomReconstruction:
    """REINFORCE Gradient Inversion of one FedSGD update of the REINFORCE loss (batch 1; batch 2 in
    exact mode: both samples where the last layer separates them, else, where one sample's gradient is under
    the noise and the other's stands above it (:func:`~leaklab.attacks.rl.exact.dominant_sample`), that one
    read as a single sample's and the other left at the no-information start)."""
    cfg = config or RoomAttackConfig()
    net, grads, batch = _check(view, update, "reinforce", cfg)
    try:
        return _rgi(net, grads, batch, cfg, update.metadata.entropy_weight, _clipping(view, update), progress)
    except NoSignal:
        return _nothing(net, batch, cfg, "rgi")


def _rgi(net: PerceptionNet, grads: dict[str, torch.Tensor], batch: int, cfg: RoomAttackConfig,
         entropy_weight: float, clipping: str | None, progress: Progress | None) -> RoomReconstruction:
    start = time.perf_counter()
    gb = _last_bias(net, grads)
    if float(gb.abs().max()) == 0.0:
        raise NoSignal("the last bias gradient is all zero; no action or reward can be read")
    errors = gb.unsqueeze(0) if batch == 1 else reinforce_batch_errors(net, grads)
    state, read_batch, blend = (_exact_read(net, grads, errors, batch) if cfg.mode == "exact"
                                else (None, batch, False))
    if read_batch < batch:  # the other sample is under the noise: this one read alone
        errors = gb.unsqueeze(0)
    elif errors is None:
        raise NoSignal("the last layer does not separate the batch's two samples")
    box, images, last_input, st, iterations, exact, read = _images_and_state(
        net, grads, errors, torch.zeros(read_batch, dtype=torch.long, device=gb.device), cfg, progress, read_batch,
        state)
    if cfg.mode == "paper":  # IV-D step 1: the probabilities from the last layer alone
        last_input = last_layer_input(net, grads, errors, cfg)
    probs = torch.softmax(_outputs(net, last_input), 1)
    # each sample's own bias gradient (the batch's is the mean) through eq. 8 and 9, a clipped one's rescaled
    own = batch * errors
    fits = [clipped_scale(own[b], probs[b], entropy_weight) if clipping == CLIP_ALONE and cfg.mode == "exact"
            else (1.0, 0.0 if clipping is None else math.inf) for b in range(read_batch)]
    own = own / own.new_tensor([fit[0] if fit else 1.0 for fit in fits]).unsqueeze(1)
    scale = float(own.norm(dim=1).max())
    action, reward, identified = (torch.cat(parts) for parts in zip(
        *(reinforce_action_reward(own[b], probs[b], entropy_weight, scale, state is not None and state.untouched)
          for b in range(read_batch))))
    if "features" in exact:  # the action only where the update has a policy-gradient part, the reward unless
        # two actions leave it open (:func:`reinforce_action_reward`)
        # a batch read as one sample may be two of one state, their errors summed (not a reward of either): behind
        # noise that reads as one sample beside a zero return's entropy term alike
        scaled = all(fit and fit[1] <= SCALE_EXACT for fit in fits)
        exact += (("probs",) + (("reward",) if net.spec.num_actions > 2 and scaled and read_batch == batch else ())
                  + (("action",) if bool(identified.all()) and read_batch == batch else ()))
    rec = RoomReconstruction(images=images.clamp(0, 1), box=box.float(), action=action,
                             iterations=iterations, seconds=time.perf_counter() - start,
                             probs=probs, reward=reward, action_identified=identified, exact=() if blend else exact,
                             stage1_starts=_starts(st), feature_cosine=read)
    return rec if read_batch == batch else _with_unread(rec, _nothing(net, batch - read_batch, cfg, "rgi"))


def _with_unread(rec: RoomReconstruction, unread: RoomReconstruction) -> RoomReconstruction:
    """A batch's reconstruction of which only ``rec``'s samples were read: ``unread``'s (:func:`_nothing`) follow
    them, and the features' estimated cosine is the batch's mean, 0 for the unread ones."""
    batch = len(rec.images) + len(unread.images)
    rec = replace(rec, read=torch.ones(len(rec.images), dtype=torch.bool, device=rec.images.device))
    return replace(rec, **{f.name: torch.cat([getattr(rec, f.name), getattr(unread, f.name)]) for f in fields(rec)
                           if isinstance(getattr(rec, f.name), torch.Tensor)},
                   feature_cosine=None if rec.feature_cosine is None else rec.feature_cosine * len(rec.images) / batch)
