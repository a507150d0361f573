"""leaklab's exact room attack (``mode="exact"``; seed 000's QGI and RGI, section IV, with every Linear
layer's input read in closed form): one sample, or a batch the output errors separate.

Every Linear layer with a bias gives its input exactly: ``dW = delta h^T`` and ``db = delta``, so
``h = db^T dW / ||db||^2`` (:func:`leaklab.attacks.inversion.analytic.linear_input`). That yields the
box (input of ``box.0``), the convolutional features ``f`` (first part of ``head.0``'s input) and the
last layer's input, hence ``Q̂ = W_last h + b_last`` exactly (behind noise the features are corrected for
the shrinking the bias gradient's noise causes, :func:`noised_features`). The error at the features is known too:
``g_f = (W_head0^T db_head0)[:F]``. A batch whose samples' errors at the output are known (QGI with
distinct actions; RGI, whose two errors the last layer gives, :func:`reinforce_batch_errors`) gives
the same vectors sample by sample (:func:`separated_vectors`), and its images are reconstructed
together by the same stages but the layerwise one.

The images minimise ``w_f ||conv(x) − f||^2 / ||f||^2 + w_g Σ_l ||∇_{W_l} J̃(x) − G_l||^2 / ||G_l||^2
+ λ_t TV(x)`` (TV per modality, RGB's on luma and chroma, :func:`leaklab.attacks.rl.images.modality_tv`)
from IV-A's Gaussian start with Adam and cosine annealing, pixels clamped to [0, 1]; ``λ_t`` decays
geometrically from ``tv_weight`` to ``tv_final`` (a strong prior first removes the start's noise, a
weak one last stops biasing the edges), behind noise to no less than the features' noise ratio read
off the update times the image's pixels per conv feature (:func:`tv_schedule`). The middle term is
eq. 6's error-direction surrogate moved to the convolution branch, ``J̃(x) = g_f^T conv(x)``, whose
weight gradient equals the client's at the true images. It is matched only for the last convolution of
each modality stream (:func:`exact_streams`, weight ``gradient_weight``), where the error is known
exactly (``g_f`` through the ReLU of the known features): the term is a quadratic in the stream's
penultimate activations, 9,216 more equations (``small``, RGB) beside the 7,200 features. Its weight ramps up
linearly from 0 over the run: at full weight from the noisy start it stalls short runs (smooth
synthetic rooms, 300 steps: +2.0 dB over the constant baseline, +9.7 without the term, +13.0 with
the ramp). It is used only on an untouched update (:func:`untouched`): it matches the observed
gradient entry by entry, and even Gaussian noise of σ = 1e-7 turns it against the images (S2, 4
frames: depth below the constant baseline on 3). On 8 real S1 frames, 2,000 steps, full weight
throughout: RGB +1.4 dB and depth +5.3 dB raw over the feature match alone (4 of them with the ramp:
the same within 0.2 dB). Matching earlier layers' gradients through the current images diverges
(their errors pass the ReLU masks of the current, wrong images: RGB and depth fell below the constant
baseline on 2 frames, even from a good start).

The layerwise stage goes one layer down with exact errors instead. After a quarter of the run, each
stream's penultimate activations are recovered in closed form
(:func:`leaklab.attacks.rl.layerwise.penultimate_activations`, the current images giving the
starting support); where that succeeds, the error at the convolution before is exact too (the last
convolution's error through its transpose and the recovered activations' ReLU), and the rest of the
run matches those activations and that convolution's weight gradient (8,192 equations on its input
for ``small``'s RGB stream) instead of the features and the last convolution's gradient, from the
current images, with the TV decay and the gradient ramp started again. Restarting TV at 0.3 of
``tv_weight`` instead sent depth below the constant baseline on 2 of 48 S1 frames (-1.6 dB; +22.6
and +14.6 with the full restart, +18.1 and +12.4 without the stage). On 5 S1 frames (session 8,
500 + 1,500 steps against 2,000 of stage 1 alone): RGB +6.48 dB over the constant baseline against
+4.84, depth +23.7 against +20.4, better on every frame in both; docs/reproductions.md has the 48.
Runs under ``LAYERWISE_ITERATIONS`` skip it: a quarter of 300 steps leaves too rough a start (smooth
synthetic S2 room, with the decay restarted at 0.3: 8.4 dB over the baseline with it against 13.1
without; 28.1 against 23.2 at 1,000 steps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.grad import conv2d_weight

from leaklab.attacks.inversion.analytic import linear_input, rank_one_residual
from leaklab.attacks.rl.box_fit import fitted_batch_box, fitted_box
from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.images import modality_tv, start_images
from leaklab.attacks.rl.layerwise import ZERO, penultimate_activations
from leaklab.attacks.rl.network import linear_names
from leaklab.attacks.rl.optim import Progress, adam
from leaklab.errors import NoSignal
from leaklab.models.perception import ModalityStreams, PerceptionNet, conv_feature_count, plain_conv


@dataclass
class ExactState:
    """The vectors exact mode reads in closed form, one row per sample (float64), and what the image
    stage needs besides: the loss gradient at the conv features and whether the update is the
    samples' exact gradient (:func:`untouched`)."""

    box: torch.Tensor  # [B, 4]
    features: torch.Tensor  # [B, F]
    last_input: torch.Tensor  # [B, H]
    feature_errors: torch.Tensor  # [B, F]
    untouched: bool
    feature_noise: tuple[float, ...]  # each sample's features' noise-to-signal ratio read off the update
    # (noised_features; a batch's through read_noise)
    box_read: bool = True  # False: no layer the box feeds told it (an untouched update whose box.0 is all dead)

    def cosine(self) -> float:
        """The mean over the samples of their features' :func:`feature_cosine`, read off the update alone."""
        return sum(map(feature_cosine, self.feature_noise)) / len(self.feature_noise)


def exact_vectors(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> ExactState:
    """One sample: the inputs of ``box.0``, ``head.0`` and the last layer from their gradients; on a
    defended update (not :func:`untouched`) the box fitted to every layer it feeds
    (:func:`~leaklab.attacks.rl.box_fit.fitted_box`) and the conv features corrected for the noise
    (:func:`noised_features`). Where ``box.0``'s bias gradient is all zero (top-k pruning keeps none of its
    small entries), the box is fitted from 0 to the layers after it (a review's captured room behind
    ``topk:0.99``: IoU 0.95, where the attack read nothing, ``no_signal``, until exact method version 25); on an
    untouched update that is a box branch whose ReLUs are all closed: the box is in no gradient, and not read."""
    names = linear_names(net)
    h = {n: linear_input(grads[f"{n}.weight"], grads[f"{n}.bias"]).unsqueeze(0) for n in ("head.0", names[-1])}
    exact = untouched(grads)
    try:
        box = linear_input(grads["box.0.weight"], grads["box.0.bias"]).unsqueeze(0)
        read = True
    except NoSignal:
        box, read = torch.zeros(1, grads["box.0.weight"].shape[1], dtype=torch.float64), not exact
    features, noise = read_features(net, grads, h["head.0"][0], exact)
    return ExactState(box=box if exact else fitted_box(net, grads, box),
                      features=features.unsqueeze(0), last_input=h[names[-1]],
                      feature_errors=feature_error(net, grads), untouched=exact, feature_noise=(noise,), box_read=read)


def read_features(net: PerceptionNet, grads: dict[str, torch.Tensor], inputs: torch.Tensor, exact: bool
                  ) -> tuple[torch.Tensor, float]:
    """One sample's conv features, the first part of ``head.0``'s input ``inputs`` read in closed form, and
    their noise-to-signal ratio: as read with ratio 0 on an untouched update (``exact``), else corrected for
    the noise (:func:`noised_features`)."""
    count = conv_feature_count(net)
    if exact:
        return inputs[:count], 0.0
    return noised_features(grads["head.0.weight"], grads["head.0.bias"], inputs, count)


def update_feature_cosine(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> float | None:
    """What one sample's update lets through of its conv features, :func:`feature_cosine` of the features
    read off it in closed form (leaklab's): a reading of the update, whatever attack then runs on it (paper
    mode reports it too). None where ``head.0``'s bias gradient is all zero (nothing to read)."""
    try:
        inputs = linear_input(grads["head.0.weight"], grads["head.0.bias"])
    except NoSignal:
        return None
    return feature_cosine(read_features(net, grads, inputs, untouched(grads))[1])


def noised_features(weight_grad: torch.Tensor, bias_grad: torch.Tensor, inputs: torch.Tensor, count: int
                    ) -> tuple[torch.Tensor, float]:
    """Behind noise, one sample's conv features ``f̂`` (the first ``count`` entries of ``head.0``'s input
    ``inputs``, read off its gradients in closed form) corrected for the noise's attenuation, and their
    noise-to-signal ratio ``r = ||f̂ − f|| / ||f||``, both from the update alone (leaklab's).

    Noise of variance ``v`` per gradient entry reaches ``h = db^T dW / ||db||²`` twice. Through ``dW`` it adds
    noise of variance ``v / ||db||²`` to each entry. Through ``db = δ + n`` (``δ`` the client's bias gradient)
    it shrinks ``h`` toward 0: the numerator carries ``h`` times ``δ·db``, about ``||δ||²``, while ``||db||²`` is
    ``||δ||² + n_b v`` on average (``n_b`` entries), regression dilution by ``||δ||² / ||db||²`` (0.56 on a QGI
    S2 update behind σ = 0.03, whose images fitted to such features came out under half as bright as the room).
    Dividing by ``||db||² − n_b v``, an unbiased estimate of ``||δ||²``, undoes it. ``v`` is read off the
    residual ``dW − db h^T``, which keeps the noise's variance per entry; the noise on the corrected features
    then has the squared norm ``count · v ||db||² / (||db||² − n_b v)²``, and their own ``||f||²`` is the rest
    of theirs. ``r`` is inf (and the features are left as read) where the bias gradient is all noise
    (``||db||² ≤ n_b v``) or the noise is all the features show. On the tests' synthetic updates behind
    σ = 0.03 the corrected features' regression slope on the true ones is 0.89 to 1.11 (the closed form's 0.50
    to 0.64) and ``r`` within 10 % of the true ratio (1.4 to 2.2)."""
    dw, db, h = weight_grad.double(), bias_grad.double(), inputs.double()
    variance = residual_variance(dw, db, h)
    observed = float((db * db).sum())
    delta = observed - len(db) * variance  # ||δ||²
    if delta <= 0:
        return h[:count], float("inf")
    features = h[:count] * (observed / delta)
    noise = count * variance * observed / delta ** 2
    return features, _noise_ratio(features, noise)


def _noise_ratio(features: torch.Tensor, noise: float) -> float:
    """``||f̂ − f|| / ||f||`` of features ``f̂`` read with noise of squared norm ``noise``: their own ``||f||²`` is
    the rest of theirs; inf where the noise is all they show."""
    signal = float((features * features).sum()) - noise
    return (noise / signal) ** 0.5 if signal > 0 else float("inf")


def residual_variance(weight_grad: torch.Tensor, bias_grad: torch.Tensor, inputs: torch.Tensor) -> float:
    """The mean square of a Linear layer's weight gradient less one sample's with the bias gradient and the
    ``inputs`` read off them, ``dW − db h^T`` (float64): the noise's variance per entry where the update is
    one sample's gradient behind noise."""
    dw, db = weight_grad.double(), bias_grad.double()
    return float(((dw - db[:, None] * inputs.double()[None]) ** 2).mean())


def feature_cosine(noise: float) -> float:
    """The cosine that features read with noise-to-signal ratio ``noise`` (:func:`noised_features`) keep with
    the client's, ``1 / sqrt(1 + r²)`` for noise independent of the features; 0 where ``r`` is inf. The server
    reads it off the update alone, so it says how much of the room a defense lets through before any image
    is reconstructed (leaklab's). On 367 defended updates (8 each of QGI and RGI, S2 on `small` and S1 on
    `wide-rgb`, and of QGI S2 on `deep` and S1 on `stacked`, behind Gaussian noise of σ = 0.001 to 0.1, DP-SGD
    at ε = 8, Laplace noise of scale 0.01, pruning of half and top-k of a tenth) it was within 0.09 of the true
    cosine on the 214 where that was 0.1 or more, and at most 0.19 above it on the 153 where it was less
    (features lost; 0.11 but on `deep`; docs/reproductions.md, "What an update lets through of the
    features")."""
    return 1.0 / (1.0 + noise * noise) ** 0.5 if noise != float("inf") else 0.0


PRUNED_UNREAD = 0.7  # the share of head.0's live weight-gradient entries at exactly 0 over which no cosine is estimated


def cosine_estimable(grads: dict[str, torch.Tensor]) -> bool:
    """Whether :func:`feature_cosine`'s estimate holds for an update: not where pruning (``prune``, ``topk``) left
    more than :data:`PRUNED_UNREAD` of ``head.0``'s weight-gradient entries exactly 0 in its live rows (bias entry
    not 0) and columns (an entry not 0), where a sample's gradient ``db h^T`` has none (leaklab's). The estimate
    reads what it misses of the rank-one form as noise independent of the features; a pruned entry is not: 4
    captured S2 rooms (``small``) behind ``prune:0.7`` estimated 0.972 to 0.981 for true cosines 0.932 to 0.960,
    behind ``prune:0.9`` 0.884 to 0.901 for 0.570 to 0.683, behind ``topk:0.9`` 1.000 for 0.991 to 0.994, behind
    ``topk:0.97`` 0.999 for 0.804 to 0.863 and behind ``topk:0.99`` 0.998 for 0.663 to 0.673."""
    dw, db = grads["head.0.weight"], grads["head.0.bias"]
    live = dw[db != 0][:, (dw != 0).any(0)]
    return not live.numel() or float((live == 0).double().mean()) <= PRUNED_UNREAD


ROUNDING = 1e-6  # recovered entries under this fraction of the largest are rounding (float32 data: ~1e-8)
NOISE_SLACK = 4.0  # behind noise, a batch's recovered entry under this many noise std (above 0: relu_open; under: the
# ends of RGI's line, _noisy_ends) is not a ReLU's positive output


def relu_open(values: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Which recovered ReLU outputs ``[B, n]`` are positive. One sample's linear rule returns a true
    zero exactly (its weight gradient's column is 0); separating a batch
    (:func:`separated_vectors`) leaves rounding noise of either sign where another sample's entry is
    not zero, so there an entry counts as zero under :data:`~leaklab.attacks.rl.layerwise.ZERO` times
    its sample's most negative entry's size or under :data:`ROUNDING` of its sample's largest (taking a
    +9e-12 as open left the box 0.17 off on a smooth synthetic batch of 2). Each sample's own: a REINFORCE
    sample with a zero return, its errors about 1e-4 of its partner's, reads its entries with its partner's
    rounding magnified as much; with the batch's most negative entry (until exact method version 18) it
    closed a 6.3e-6 of its partner's last-layer input on one of 48 captured untouched batches, whose features
    then came out 195 times too large, and left 1 to 5 features of its partner wrongly closed on 5 others (on
    48 untouched DQN batches each sample's opened one noise feature wrongly on one; docs/reproductions.md, "A
    batch of two (QGI, exact mode)"). Behind noise, ``noise`` ``[B]`` is the
    std of the noise on each sample's entries (:func:`read_noise`), and an entry counts as zero under
    :data:`NOISE_SLACK` times its sample's (leaklab's; held to its most negative entry instead, a sample whose
    error is small closed all or all but one of its entries: 8 of 16 captured DQN batches separated behind
    σ = 0.001 where 7 did, their features' true mean cosines up to 0.07 higher; docs/reproductions.md, "A batch
    of two behind noise")."""
    if len(values) == 1:
        return values > 0
    if noise is None:
        floor = torch.maximum(ZERO * (-values).amax(1, keepdim=True), ROUNDING * values.abs().amax(1, keepdim=True))
        return values > floor
    return values > NOISE_SLACK * noise[:, None]


def _inputs_down(seq: nn.Sequential, prefix: str, grads: dict[str, torch.Tensor], errors: torch.Tensor,
                 value: torch.Tensor | None, source: torch.Tensor | None,
                 found: dict[str, tuple[torch.Tensor, float, torch.Tensor]], variance: float | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """:func:`separated_vectors` through one branch, last module first: ``errors`` ``[B, out]`` at
    its output, ``value`` the output itself where known and ``source`` the errors it was read through. Each
    Linear layer's inputs, the relative residual of its weight gradient and the errors at its output go to
    ``found``. Returns the errors at the branch's input and the input; None where a Linear layer's errors are
    dependent or a module is not Linear or ReLU. ``variance``: the noise's per entry, None on the batch's exact
    gradient (:func:`relu_open`, :func:`read_noise`)."""
    for i in reversed(range(len(seq))):
        m = seq[i]
        if isinstance(m, nn.ReLU):
            if value is None:
                return None
            errors = errors * relu_open(value, None if variance is None else read_noise(source, variance))
        elif isinstance(m, nn.Linear):
            if int(torch.linalg.matrix_rank(errors)) < len(errors):
                return None
            dw = grads[f"{prefix}.{i}.weight"].double()
            value, source = torch.linalg.solve(errors @ errors.T, errors @ dw), errors
            residual = torch.linalg.vector_norm(dw - errors.T @ value) / torch.linalg.vector_norm(dw).clamp_min(1e-300)
            found[f"{prefix}.{i}"] = (value, float(residual), errors)
            errors = errors @ m.weight.detach().double()
        else:
            return None
    return errors, value


def read_noise(errors: torch.Tensor, variance: float) -> torch.Tensor:
    """The std ``[B]`` of the noise on each sample's inputs of a Linear layer read through the errors ``E``
    ``[B, out]`` at its output, ``(E E^T)^-1 E dW``, from a weight gradient with noise of ``variance`` per entry:
    ``sqrt(v [(E E^T)^-1]_bb)`` (leaklab's)."""
    return (variance * torch.linalg.inv(errors @ errors.T).diagonal()).sqrt()


def separated_vectors(net: PerceptionNet, grads: dict[str, torch.Tensor], deltas: torch.Tensor,
                      hidden: torch.Tensor | None = None) -> ExactState | None:
    """The inputs of every Linear layer for each sample of a batch whose errors at the output,
    ``deltas`` ``[B, A]``, are known (leaklab's; QGI with distinct actions: ``g_b[a_b] e_{a_b}``, eq. 7).
    A Linear layer's weight gradient is ``dW = E^T H`` for the errors ``E`` ``[B, out]`` at its output
    and its inputs ``H`` ``[B, in]``, so ``H = (E E^T)^-1 E dW`` when the samples' errors are
    independent; ``E W`` through the ReLU of the layer below's recovered output
    (:func:`relu_open`) is the next errors. From the last layer down to ``head.0`` (whose input
    splits into the conv features and the box branch's output; the feature part of its errors is
    the loss gradient at the features) and through the box branch to ``box.0``: every vector the
    single-sample rule of :func:`exact_vectors` reads, sample by sample; the boxes are fitted to every layer
    they feed (:func:`~leaklab.attacks.rl.box_fit.fitted_batch_box`). The update counts as
    untouched when ``head.0``'s weight gradient is ``E^T H`` to within :data:`UNTOUCHED`. None when
    some layer's errors are dependent (the same action twice, without ``hidden``) or the head or box branch holds other
    modules than Linear and ReLU. Behind noise (the last layer's gradient not of rank ``B``) the ReLU
    supports are read sample by sample, each against the noise on its own entries (:func:`relu_open`,
    :func:`read_noise`), and the features' noise ratio is that of the
    samples' mean :func:`feature_cosine`, each sample's read off the noise's variance per entry
    (:func:`trailing_variance` of the last layer) through ``(E E^T)^-1`` at ``head.0``: ``count v [(E E^T)^-1]_bb``
    of noise on its features (leaklab's; on the 14 captured DQN and REINFORCE batches it separated behind
    σ = 1e-5 to 1e-3 the mean cosine so estimated was within 0.015 of the true one, 0.77 against 0.755 at the
    lowest; a ratio read off the residual of ``head.0``'s fit instead came out twice the true one, the
    errors' own noise counted in). An untouched update's ratio is 0. ``hidden`` ``[B, n]``: the errors at the
    output of the last hidden Linear layer where the output errors do not separate the samples (the same action
    twice, :func:`~leaklab.attacks.rl.same_action.same_action_errors`); the layers from there down are read as
    above, the last layer's inputs are that layer's outputs through its ReLU."""
    batch = len(deltas)
    variance, noisy = trailing_variance(last_layer_matrix(net, grads), batch)
    found: dict[str, tuple[torch.Tensor, float, torch.Tensor]] = {}
    noise = variance if noisy else None
    if hidden is None:
        head = _inputs_down(net.head, "head", grads, deltas.double(), None, None, found, noise)
    else:  # the errors at the last hidden layer's output, its output through the ReLU to the last layer
        last = len(net.head) - 1
        head = _inputs_down(net.head[:last - 1], "head", grads, hidden.double(), None, None, found, noise)
        if head is not None:
            hid = net.head[last - 2]  # its input read above (head.0's for leaklab's networks, a deeper one's own)
            reached = found[f"head.{last - 2}"][0] @ hid.weight.detach().double().T
            if hid.bias is not None:
                reached = reached + hid.bias.detach().double()
            reached = reached.clamp_min(0)
            found[f"head.{last}"] = (reached, 0.0, deltas.double())
    if head is None:
        return None
    errors, fused = head
    count = conv_feature_count(net)
    head_errors = found["head.0"][2]
    if _inputs_down(net.box, "box", grads, errors[:, count:], fused[:, count:], head_errors, found, noise) is None:
        return None
    features, residual = fused[:, :count], found["head.0"][1]
    exact = residual <= UNTOUCHED
    if not noisy and not exact and residual > SPLIT_SLACK * _trailing_part(grads["head.0.weight"], batch):
        return None  # the split leaves far more of head.0 than its best rank-B fit does: a wrong split
    return ExactState(box=fitted_batch_box(net, found, bool(exact)), features=features,
                      last_input=found[linear_names(net)[-1]][0], feature_errors=errors[:, :count].float(),
                      untouched=exact, feature_noise=(0.0,) * batch if exact else _batch_noise_ratios(
                          features, head_errors, variance))


SPLIT_SLACK = 10.0  # a split whose head.0 residual is this many times its trailing part's is wrong (separated_vectors)


def _trailing_part(weight_grad: torch.Tensor, rank: int) -> float:
    """What a Linear layer's weight gradient holds beyond its ``rank`` leading parts, relative to the whole: the
    residual of its best rank-``rank`` fit. Where the last layer shows no noise, :func:`separated_vectors`' fit of
    ``head.0`` must come within :data:`SPLIT_SLACK` times of it. RGI's line of two samples whose ReLU supports nest
    (consecutive frames' often do) has no zero at the second sample; its end runs past it to where an entry open
    in both closes, and the split is wrong. On the synthetic batches of a review (states 0.1 apart, 7 of 20 seeds
    nested) the fit's residual was 2e-2 to 5e-2, 6e5 to 1.5e6 times the trailing part, and everything read was
    claimed exact (box IoU 0 to 0.88, rewards 0.2 off). A right split's residual lies near it: 1.3 and 2.1 times on
    the tests' untouched DQN and REINFORCE batches, 1.0 behind noise too weak for the last layer's test (σ =
    1e-8), 1.8 behind top-k pruning of 0.9, which can leave the last layer whole."""
    s = torch.linalg.svdvals(weight_grad.double())
    return float(s[rank:].norm() / s.norm().clamp_min(1e-300))


def _batch_noise_ratios(features: torch.Tensor, errors: torch.Tensor, variance: float) -> tuple[float, ...]:
    """Each sample's noise-to-signal ratio of a batch's ``features`` ``[B, F]`` (:func:`separated_vectors`),
    solved through the errors ``[B, out]`` at ``head.0``'s output from a weight gradient with noise of
    ``variance`` per entry (:func:`read_noise`)."""
    return tuple(_noise_ratio(f, features.shape[1] * std * std)
                 for f, std in zip(features, read_noise(errors, variance).tolist()))


def last_layer_matrix(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """The last Linear layer's ``[dW | db]`` (float64): ``Δ^T [H | 1]`` for a batch's errors ``Δ`` at the
    output and its inputs ``H``, of rank ``B`` on the batch's exact gradient."""
    return layer_matrix(grads, f"head.{len(net.head) - 1}")


def layer_matrix(grads: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The Linear layer ``name``'s ``[dW | db]`` (float64)."""
    return torch.cat([grads[f"{name}.weight"], grads[f"{name}.bias"].unsqueeze(1)], 1).double()


def trailing_variance(matrix: torch.Tensor, rank: int, singular: torch.Tensor | None = None) -> tuple[float, bool]:
    """The variance per entry of the noise on a gradient matrix whose signal has rank ``rank``, and whether
    there is any: the squared singular values beyond the first ``rank`` over the ``(rows − rank)(cols − rank)``
    dimensions they span (leaklab's), and whether the first of them exceeds :data:`UNTOUCHED` of the largest
    (float32 rounding: about 5e-9). ``(0, False)`` where the matrix has no more than ``rank`` rows or columns.
    ``singular``: the matrix's singular values where the caller has them already."""
    rows, cols = matrix.shape
    if min(rows, cols) <= rank:
        return 0.0, False
    s = torch.linalg.svdvals(matrix) if singular is None else singular
    return float((s[rank:] ** 2).sum()) / ((rows - rank) * (cols - rank)), float(s[rank]) > UNTOUCHED * float(s[0])


BATCH_RANK = 10.0  # a batch of two separates when the last layer's 2nd singular value is this far above the 3rd
RANK_FLOOR = 1e-12  # ... and above this fraction of the 1st (float64 rounding: a rank-1 gradient in float64)


def reinforce_batch_errors(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The output errors ``[2, A]`` of a REINFORCE batch of two, read from the last layer alone
    (leaklab's; seed 000's RGI reads one sample). The last layer's ``M = [dW | db] = Δ^T [H | 1]`` has
    rank 2, so its two leading singular directions span both samples' inputs ``h_b``: the rows
    ``[h | 1]`` of that span form the line ``h(t) = h0 + t d``. Each ``h_b`` is a ReLU output, so it is
    ≥ 0 and zero where the other is not: the nonnegative part of the line is the segment whose two
    ends are the samples' inputs (each end is where some entry of ``h`` reaches 0). With ``H`` known,
    ``Δ^T = M [H | 1]^+``; :func:`separated_vectors` then reads every other layer. None when the head
    does not end ``ReLU, Linear``, the samples' errors are not independent (:data:`BATCH_RANK`,
    :data:`RANK_FLOOR`), or the segment is open at one end (no entry of one sample is zero where
    the other's is positive). The entries that are zero in both samples carry the update's noise (float32's
    rounding at the least), and their ends fall anywhere on the line (on 6 captured batches behind σ = 1e-5
    none separated): each end is where no entry of ``h`` falls under :data:`NOISE_SLACK` times the noise's std
    at that point of the line (read off the last layer's trailing singular values, :func:`trailing_variance`),
    then moved to where the entries near 0 there are 0 in the least-squares sense (:func:`_noisy_ends`;
    leaklab's). Until exact method version 16 an update whose last layer showed no noise took each end where
    the first entry reached 0. On 16 captured untouched batches a zero return's sample, whose entries are
    about 1e-4 of its partner's, then came out 0.83 to 0.97 of its size on the 5 that pair it with a non-zero
    return; behind σ = 1e-8 (noise the last layer's test does not count) 11 of the 12 batches separated came
    out more than 0.3 % off in size (one sample 1,676 times), and behind 1e-7 3 separated. With the slack the
    size is within 0.1 % on every untouched batch, within 0.3 % on 11 of 12 behind σ = 1e-8, and 8 separate
    behind 1e-7 (docs/reproductions.md, "A batch of two behind noise")."""
    last = len(net.head) - 1
    if last < 1 or not isinstance(net.head[last - 1], nn.ReLU):
        return None
    m = last_layer_matrix(net, grads)
    _, s, vt = torch.linalg.svd(m, full_matrices=False)
    if len(s) < 3 or not float(s[1]) > max(BATCH_RANK * float(s[2]), RANK_FLOOR * float(s[0])):
        return None
    span = s[:2, None] * vt[:2]  # M = U span
    ones = span[:, -1]
    if not float(ones.norm()) > 0:
        return None
    h0 = (ones / (ones @ ones)) @ span[:, :-1]  # the point of the line with unit bias weight along `ones`
    d = torch.stack([-ones[1], ones[0]]) @ span[:, :-1]
    ends = _noisy_ends(h0, d, trailing_variance(m, 2)[0], float(ones @ ones))
    if ends is None:
        return None
    h = torch.stack([h0 + ends[0] * d, h0 + ends[1] * d]).clamp_min(0)
    h1 = torch.cat([h, torch.ones(2, 1, dtype=h.dtype)], 1)
    return torch.linalg.solve(h1 @ h1.T, h1 @ m.T)


def dominant_sample(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> bool:
    """Whether a batch's update reads as one sample's (leaklab's): behind noise, or the other sample's gradient zero
    (not an untouched batch's two samples, which the paper's stages read together: the last layer's second singular
    value :data:`BATCH_RANK` times its third or more, the third under :data:`UNTOUCHED` of the first), the last
    layer's leading singular value :data:`BATCH_RANK` times its second or more, the other sample's part a tenth of
    it or less, and ``head.0``'s weight gradient less the one sample's it gives in closed form
    (:func:`residual_variance`) no larger per entry than the last layer's less its leading part
    (:func:`trailing_variance`), to within :data:`NOISE_SLACK` std of that estimate (``2 / dof`` its relative
    variance). Behind noise a REINFORCE sample with a zero return sends only its entropy term (its singular value
    4.8e-6 and 6.8e-6 on two captured batches beside 3.1 and 6.8 for the other sample), under noise of σ = 1e-5
    already, and a DQN sample's small TD error hides as well: the other sample can be read alone
    (docs/reproductions.md, "A batch of two behind noise"). The ``head.0`` rule tells apart a batch whose samples
    took the same action: their errors at the output are parallel, so its last layer is one sample's, of a blend of
    the two inputs, but ``head.0`` shows the second sample (its residual 930 and 300 times the last layer's on a
    captured REINFORCE and DQN batch behind σ = 1e-5, 17 and 4 behind 1e-4; behind 1e-3, 1.15, over the 1.144
    allowed there, and 1.03, so the DQN batch's blend would be read; since exact method version 21
    :func:`~leaklab.attacks.rl.same_action.same_action_errors` separates that batch first). Noise of σ = 1e-7
    stays under ``UNTOUCHED`` in the last layer, and a zero return's entropy term (1e-6 to 3.4e-6 of the first
    singular value on 4 captured batches) within 5 times of it: until exact method version 19 any second singular
    value over ``UNTOUCHED`` so counted as two samples' exact gradient, and those 4 batches read nothing where behind
    1e-5 their other sample shows. The sample read may still carry the other's part (:func:`blended`)."""
    m = last_layer_matrix(net, grads)
    s = torch.linalg.svdvals(m)
    if len(s) < 3 or not float(s[0]) > BATCH_RANK * float(s[1]):
        return False
    if float(s[1]) > BATCH_RANK * float(s[2]) and UNTOUCHED * float(s[0]) >= float(s[2]):
        return False
    variance, _ = trailing_variance(m, 1)
    spread = (2 / ((m.shape[0] - 1) * (m.shape[1] - 1))) ** 0.5  # the estimate's relative std
    dw, db = grads["head.0.weight"], grads["head.0.bias"]
    return residual_variance(dw, db, linear_input(dw, db)) <= variance * (1 + NOISE_SLACK * spread)


NOISE_EDGE = 1.25  # a layer's second part counts as noise up to this many times the noise's edge (_second_hidden)
HIDDEN = 1e-4  # ... or up to this fraction of the layer's first part


def blended(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> bool:
    """Whether a batch read as one sample (:func:`dominant_sample`) reads a blend of its two samples, so that nothing
    read is exact (leaklab's): the last layer or ``head.0`` shows a second part (:func:`_second_hidden`).
    :func:`dominant_sample` compares ``head.0``'s part beside the one sample entry by entry with the last layer's noise
    estimated with the second sample's part in it; spread over ``head.0``'s 1.85 million entries a strong second sample
    passes that behind noise of σ = 3e-4 and more, and until exact method version 22 the blend was claimed exact: on the
    tests' synthetic REINFORCE batches (actions 3 and 5), returns 1.3 and −0.8 behind σ = 1e-3 read one reward of 1.43
    and a box 0.095 off; two of one action, returns 1.3 and 0.3, read 1.6 from σ = 1e-4. A singular value measures the
    part whole: the second sample's stands 2.1 to 2.6 times over the noise's edge in the last layer and 2.3 to 2.4 in
    ``head.0`` there (same action: 4.1 to 4.3 in ``head.0`` behind 1e-4), where noise alone gave about 0.96 and 0.99 (σ
    = 1e-7 to 1e-2). A zero return's entropy term stays under :data:`HIDDEN` (1.5e-6 to 5.6e-5 of the first part on
    those batches, returns 13 and 1.3 beside a zero one). Behind σ = 1e-3 two samples of one action and returns 1.3 and
    0.3 still read as one exact sample of return 1.6: the second's part in ``head.0`` lies under the noise's edge (1.0
    and 0.99 of it)."""
    return not all(_second_hidden(m, torch.linalg.svdvals(m))
                   for m in (last_layer_matrix(net, grads), layer_matrix(grads, "head.0")))


def _second_hidden(matrix: torch.Tensor, singular: torch.Tensor) -> bool:
    """Whether a gradient matrix's second part is the noise's or next to nothing: its second singular value under
    :data:`NOISE_EDGE` times the largest that noise of its variance per entry beyond its two leading parts
    (:func:`trailing_variance`) has on a matrix of its shape, ``sqrt(v) (sqrt(rows) + sqrt(cols))``, or under
    :data:`HIDDEN` of its first. ``singular``: the matrix's singular values."""
    variance, _ = trailing_variance(matrix, 2, singular)
    edge = variance ** 0.5 * (matrix.shape[0] ** 0.5 + matrix.shape[1] ** 0.5)
    return float(singular[1]) <= max(NOISE_EDGE * edge, HIDDEN * float(singular[0]))


END_STEPS = 100  # at most this many steps to where the first entry does, from either side of t = 0 (_noisy_ends)


def _noisy_ends(h0: torch.Tensor, d: torch.Tensor, variance: float, weight: float) -> tuple[float, float] | None:
    """:func:`reinforce_batch_errors`'s ends of the line ``h0 + t d`` (behind noise, float32's rounding at the
    least). First where some entry falls under ``−NOISE_SLACK`` times the noise's std there, ``sqrt(variance (1 /
    weight + t² weight))`` for the span's rows' noise of ``variance`` per entry (``weight``: ``ones · ones``),
    stepped to from ``t = 0`` until it stops moving (at most :data:`END_STEPS` steps: on the tests' synthetic batch
    with returns 1.3 and −0.1 behind σ = 1e-5, two steps stopped at t = −3.5, short of the small return's sample at
    −35, where entries zero in both samples fell under the slack times the std at the step before); that end lies
    short of the sample's by about the slack over the steepest entry. Then at the ``t`` where the entries within
    twice the slack of 0 there (those zero in that sample, rising towards the other) are 0 in the least-squares
    sense, ``−Σ h0 d / Σ d²``, each weighted by its slope: on the tests' synthetic batch (returns 1.3 and −0.8)
    behind σ = 1e-5 the slack alone left the ends 0.015 and 0.009 off the exact ones, the least squares 0.0013 and
    0.0001. None where the ends leave no segment or an end runs off."""
    rising, falling = d > 0, d < 0
    if not bool(rising.any()) or not bool(falling.any()):
        return None
    std = lambda t: (variance * (1 / weight + t * t * weight)) ** 0.5  # noqa: E731
    ends = []
    for side, pick in ((rising, torch.max), (falling, torch.min)):
        t = 0.0
        for _ in range(END_STEPS):
            moved, t = t, float(pick((-NOISE_SLACK * std(t) - h0[side]) / d[side]))
            if abs(t - moved) <= 1e-12 * (1 + abs(t)):
                break
        else:
            return None
        ends.append(t)
    zeros = [side & ((h0 + t * d).abs() <= 2 * NOISE_SLACK * std(t)) for t, side in zip(ends, (rising, falling))]
    ends = [float(-(h0[z] @ d[z]) / (d[z] @ d[z])) for z in zeros]
    return (ends[0], ends[1]) if ends[0] < ends[1] else None


def feature_error(net: PerceptionNet, grads: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32
                  ) -> torch.Tensor:
    """``dJ/df = W_head0[:, :F]^T db_head0`` ``[1, F]``: the loss gradient at the conv features,
    computed in ``dtype``."""
    w = net.head[0].weight.detach()[:, :conv_feature_count(net)].to(dtype)
    return (grads["head.0.bias"].to(dtype) @ w).unsqueeze(0)


@dataclass
class Stream:
    """One modality stream of the image branch that ends ``Conv2d, ReLU, Flatten``: ``body`` maps
    its ``channels`` of the images to the last convolution's input; its features are
    ``features[offset:offset + size]``, ``last``'s output ``[1, *shape]`` flattened. When ``body``
    itself ends ``Conv2d, ReLU`` (``small``, ``stacked``), ``inner`` is that convolution, ``inner_name``
    its weight in the update and ``head`` maps the stream's channels to its input."""

    weight_name: str  # the last convolution's weight in the update, e.g. "conv.rgb.4.weight"
    body: nn.Module
    last: nn.Conv2d
    channels: slice
    offset: int
    size: int
    shape: tuple[int, int, int]
    name: str = ""
    inner: nn.Conv2d | None = None
    inner_name: str | None = None
    head: nn.Module | None = None

    def last_input(self, images: torch.Tensor) -> torch.Tensor:
        """The input of the stream's last convolution."""
        return self.body(images[:, self.channels])


def _ends_conv_relu_flatten(stream: nn.Module) -> bool:
    tail = list(stream)[-3:] if isinstance(stream, nn.Sequential) else []
    return len(tail) == 3 and all(isinstance(m, k) for m, k in zip(tail, (nn.Conv2d, nn.ReLU, nn.Flatten)))


def exact_streams(net: PerceptionNet) -> list[Stream]:
    """The image branch as :class:`Stream` s (one per modality of :class:`ModalityStreams`, or the
    single stream ``conv`` of ``--arch stacked``); empty, which turns the gradient term off, when a
    stream ends otherwise: ``deep``'s max-pooling hides which input each feature's error reaches
    (routing it by the current images' maxima, `deep` S2 on 4 frames: depth 26.0 dB with the ramped
    term, 25.3 at full weight, 31.1 without it), and a user's own branch may be anything."""
    conv = net.conv
    parts = conv.streams() if isinstance(conv, ModalityStreams) else [("", conv, slice(None))]
    if not all(_ends_conv_relu_flatten(stream) for _, stream, _ in parts):
        return []
    out, offset = [], 0
    probe = torch.zeros(1, net.spec.in_channels, net.spec.image_size, net.spec.image_size,
                        device=next(net.parameters()).device)
    for name, stream, channels in parts:
        index = len(stream) - 3
        last = stream[index]
        with torch.no_grad():
            inner_out = stream[:index](probe[:, channels])
            shape = tuple(last(inner_out).shape[1:])
        size = shape[0] * shape[1] * shape[2]
        prefix = f"conv.{name}." if name else "conv."
        s = Stream(f"{prefix}{index}.weight", stream[:index], last, channels, offset, size, shape, name)
        body = list(stream[:index])
        height, width = inner_out.shape[-2:]
        reach = tuple(st * (n - 1) + k for st, n, k in zip(last.stride, shape[1:], last.kernel_size))
        if (len(body) >= 2 and isinstance(body[-1], nn.ReLU) and isinstance(body[-2], nn.Conv2d)
                and plain_conv(last) and reach == (height, width)):
            s.inner, s.inner_name, s.head = body[-2], f"{prefix}{index - 2}.weight", stream[:index - 2]
        out.append(s)
        offset += size
    return out


UNTOUCHED = 1e-6  # largest rank-1 residual of head.0 for an update taken as the exact gradient


def untouched(grads: dict[str, torch.Tensor]) -> bool:
    """Whether the update is one sample's exact gradient (head.0's weight gradient rank-1 to within
    :data:`UNTOUCHED`), as the last-convolution term needs: it matches the observed gradient entry
    by entry, so a defense's noise would be fitted (σ = 1e-5, 4 samples: S2 depth 8.1 dB with the
    term, 27.4 without; the baseline is 15.9)."""
    return rank_one_residual(grads["head.0.weight"], grads["head.0.bias"]) <= UNTOUCHED


LAYERWISE_ITERATIONS = 1000  # shorter runs skip the layerwise stage (module docstring)


TV_NOISE_CAP = 1.0  # the noise ratio above which the TV floor grows no further (tv_schedule)


def tv_schedule(cfg: RoomAttackConfig, noise: float, pixels_per_feature: float) -> Callable[[float], float]:
    """The TV weight over a stage (``done`` from 0 to 1): geometric from ``tv_weight`` to the floor
    ``max(tv_final, max(1, p) · min(r, TV_NOISE_CAP))`` for the features' noise ratio ``r``
    (:func:`noised_features`) and the image's ``p`` pixels per conv feature, from the floor itself when it
    is above ``tv_weight``; 0 throughout when ``tv_weight`` is 0. On an untouched update (``r`` = 0) the
    floor is ``tv_final``: a weak prior last stops biasing the edges. Behind noise the features carry the
    noise, and a prior that weak lets the images fit it; a final weight equal to the noise ratio raised the
    mean image gain in every setting and at every noise level measured, 112 noised updates in all
    (leaklab's; docs/reproductions.md, "The images' prior behind noise"). The prior is a mean over pixels
    and the feature match a sum over features, so where the two balance moves with ``p``: on S2's depth
    stream (7,200 features of 22,500 pixels, ``p`` = 3.1) ``p · r`` showed the room on 26 of 48 noised QGI
    and RGI updates against 21 with ``r`` (σ = 0.001 to 0.1). Below 1 it lost (S1 on ``nature``, ``p`` =
    0.78), hence ``max(1, p)``; it costs S2 on ``deep`` (``p`` = 4.3) 2 rooms of 16 updates behind σ = 0.01 (3
    → 1) and S1 on ``stacked`` (3.1) 2 of 16 (4 → 2; docs/reproductions.md, "The prior's weight per pixel
    behind noise")."""
    if not cfg.tv_weight:
        return lambda done: 0.0
    floor = max(cfg.tv_final, max(1.0, pixels_per_feature) * min(noise, TV_NOISE_CAP))
    start = max(cfg.tv_weight, floor)
    return lambda done: start * (floor / start) ** done


def _prior(cfg: RoomAttackConfig, noise: tuple[float, ...], pixels_per_feature: float
           ) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """The images' TV prior at ``done`` of a stage: each sample's :func:`modality_tv` weighed by its own
    :func:`tv_schedule` for its features' noise ratio (leaklab's). A batch behind noise reads its samples'
    features with noise of their own size (cosines 0.996 and 0.618 on one captured DQN batch behind σ = 1e-3),
    and a floor shared at their mean ratio was stronger than one's own and weaker than the other's. With this and
    :func:`_feature_match`'s own norms, the mean image gain of 16 captured DQN batches behind σ = 1e-3 rose from
    +6.83 to +8.15 dB, past paper mode's +7.95, and behind 1e-5 from +17.13 to +18.92 (docs/reproductions.md,
    "A batch of two behind noise")."""
    schedules = [tv_schedule(cfg, r, pixels_per_feature) for r in noise]

    def prior(x: torch.Tensor, done: float) -> torch.Tensor:
        weights = [tv(done) for tv in schedules]
        top = max(weights)  # one sample's prior (and a batch's alike) as top * modality_tv(x), to the bit
        return top * modality_tv(x, torch.tensor([w / top for w in weights]) if top else None)
    return prior


def _feature_match(out: torch.Tensor, target: torch.Tensor, f_norm: torch.Tensor) -> torch.Tensor:
    """``Σ_b ||out_b − target_b||² / ||f_b||²``: features ``[B, n]`` (all, or one stream's share) against the
    exact ones, each sample's normalised by all its features' norm ``f_norm`` ``[B]`` so that the streams'
    shares add up to the whole match and each sample of a batch weighs as one sample alone (leaklab's; over the
    batch's summed norm instead, 48 untouched DQN batches came back 0.8 dB lower on average, 38.93 against 39.74
    dB, though faster in runs of 300 steps; docs/reproductions.md, "A batch of two")."""
    return (((out - target) ** 2).sum(1) / f_norm).sum()


def weight_gradient(conv: nn.Conv2d, inputs: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """``conv``'s weight gradient of ``error^T conv(inputs)``, differentiable in ``inputs``: in closed form
    (``conv2d_weight``) for zero padding given in pixels, as leaklab's convolutions have; through the convolution
    itself for a user's other padding (``"same"`` or ``"valid"``: a traceback until session 52; a padding mode
    such as ``"reflect"``: the closed form's zeros matched a gradient 17 % off at the true images)."""
    if conv.padding_mode == "zeros" and not isinstance(conv.padding, str):
        return conv2d_weight(inputs, conv.weight.shape, error, stride=conv.stride, padding=conv.padding,
                             dilation=conv.dilation, groups=conv.groups)
    weight = conv.weight.detach().requires_grad_()
    out = torch.func.functional_call(conv, {"weight": weight}, (inputs,))
    return torch.autograd.grad((error * out).sum(), weight, create_graph=True)[0]


def _feature_terms(s: Stream, x: torch.Tensor, f: torch.Tensor, f_norm: torch.Tensor, error: torch.Tensor,
                   ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1 for one stream: its share of the feature match, and the mismatch of the last
    convolution's weight gradient of ``error^T conv(x)`` against the client's."""
    a = s.last_input(x)
    z = s.last(a)
    rec = weight_gradient(s.last, a, error.reshape(z.shape))
    return (_feature_match(z.flatten(1).relu(), f[:, s.offset:s.offset + s.size], f_norm),
            ((rec - ref) ** 2).sum() / (ref * ref).sum().clamp_min(1e-30))


def _inner_terms(s: Stream, x: torch.Tensor, target: torch.Tensor, error: torch.Tensor, ref: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The layerwise stage for one stream: the mismatch of the penultimate activations against the
    recovered ``target``, and of the inner convolution's weight gradient for its exact output error."""
    a = s.head(x[:, s.channels])
    z = s.inner(a)
    rec = weight_gradient(s.inner, a, error)
    return (((z.relu() - target) ** 2).sum() / (target * target).sum().clamp_min(1e-30),
            ((rec - ref) ** 2).sum() / (ref * ref).sum().clamp_min(1e-30))


def _inner_error(s: Stream, activations: torch.Tensor, error: torch.Tensor) -> torch.Tensor:
    """The error at the inner convolution's output: the last one's error through its transpose and
    the ReLU of the recovered activations."""
    a = activations.float().requires_grad_()
    back, = torch.autograd.grad((error.reshape(1, *s.shape) * s.last(a)).sum(), a)
    return back * (activations > 0)


def exact_images(net: PerceptionNet, grads: dict[str, torch.Tensor], st: ExactState,
                 cfg: RoomAttackConfig, progress: Progress | None) -> tuple[torch.Tensor, tuple[str, ...]]:
    """Images whose conv features and last-convolution weight gradients match the exact ones, then,
    for each stream whose penultimate activations come out exactly
    (:func:`~leaklab.attacks.rl.layerwise.penultimate_activations`), whose activations and inner
    convolution's weight gradient match; and the names of those streams' recovered activations.
    A batch's images are optimised together: each matches its own features, and their last
    convolutions' weight gradients add up to the update's (the layerwise stage reads one sample). Each
    image's feature match and prior weigh as one sample's alone (:func:`_feature_match`, :func:`_prior`)."""
    spec = net.spec
    batch = len(st.features)
    x = start_images(spec, batch, cfg.seed, st.features.device).requires_grad_()
    f = st.features.float()
    f_norm = (f * f).sum(1).clamp_min(1e-30)
    streams = exact_streams(net) if cfg.gradient_weight and st.untouched else []
    # the error at each last convolution's output: the feature error through the ReLU of the features
    errors = [(st.feature_errors * relu_open(f))[:, s.offset:s.offset + s.size] for s in streams]
    deeper = (batch == 1 and cfg.layerwise and cfg.iterations >= LAYERWISE_ITERATIONS
              and any(s.inner is not None for s in streams))
    first = cfg.iterations // 4 if deeper else cfg.iterations
    prior = _prior(cfg, st.feature_noise, spec.image_size ** 2 / f.shape[1])

    def stage1(done: float) -> torch.Tensor:
        total = prior(x, done)
        if not streams:
            return total + cfg.feature_weight * _feature_match(net.conv(x), f, f_norm)
        for s, err in zip(streams, errors):
            match, mismatch = _feature_terms(s, x, f, f_norm, err, grads[s.weight_name])
            # the gradient term ramps up: off at the noisy start
            total = total + cfg.feature_weight * match + cfg.gradient_weight * done * mismatch
        return total

    adam([x], stage1, first, cfg.lr, clamp=[x], progress=progress)
    if not deeper:
        return x.detach(), ()
    recovered, names = [], []
    fine = feature_error(net, grads, torch.float64) * relu_open(f)  # the errors without float32's rounding
    for s, err in zip(streams, errors):
        target = None
        if s.inner is not None:
            with torch.no_grad():
                estimate = s.inner(s.head(x[:, s.channels]))
            exact_err = fine[:, s.offset:s.offset + s.size]
            rounding = float((err.double() - exact_err).norm() / exact_err.norm().clamp_min(1e-300))
            target = penultimate_activations(s.last, f[:, s.offset:s.offset + s.size].reshape(1, *s.shape),
                                             err.reshape(1, *s.shape), grads[s.weight_name], estimate, rounding)
        if target is not None:
            target = target.float()
            recovered.append((target, _inner_error(s, target, err)))
            names.append(f"{s.name or 'conv'} activations")
        else:
            recovered.append(None)

    def stage2(done: float) -> torch.Tensor:
        total = prior(x, done)
        ramp = cfg.gradient_weight * done
        for s, err, known in zip(streams, errors, recovered):
            if known is None:  # stage 1's terms for this stream
                match, mismatch = _feature_terms(s, x, f, f_norm, err, grads[s.weight_name])
            else:
                match, mismatch = _inner_terms(s, x, known[0], known[1], grads[s.inner_name])
            total = total + cfg.feature_weight * match + ramp * mismatch
        return total

    shifted = (lambda it, value: progress(first + it, value)) if progress else None
    adam([x], stage2, cfg.iterations - first, cfg.lr, clamp=[x], progress=shifted)
    return x.detach(), tuple(names)
