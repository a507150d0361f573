"""Rule-based recovery of the action and the supervision signal (seed 000, IV-C and IV-D).

All rules read the last layer's bias gradient ``g_b`` (``[A]``; the batch mean of the losses of
:mod:`leaklab.rl.losses` makes it ``sum_b delta_b / B``).
"""

from __future__ import annotations

import math

import torch

from leaklab.errors import NoSignal


def dqn_actions(grad_b: torch.Tensor, batch: int) -> torch.Tensor:
    """Eq. 7: the taken actions are the non-zero entries of ``g_b`` (DQN's error is one-hot per
    sample). Batch 1: the largest entry; batch 2: the two largest when both are non-zero (a set: the
    order of the samples is not identifiable), else the same action twice. Non-zero is exact where every other
    entry is exactly 0 (an untouched update: a second error 3e-7 of the first was dropped, the action still
    claimed); where they are not (noise), the second entry must pass 1e-6 of the first."""
    mag = grad_b.abs()
    if float(mag.max()) == 0.0:
        raise NoSignal("the last bias gradient is all zero (predicted Q equals the target); "
                           "no action or target can be read from this update")
    top = torch.topk(mag, 2).indices
    if batch == 1:
        return top[:1]
    untouched = int((mag > 0).sum()) <= 2
    distinct = float(mag[top[1]]) > (0.0 if untouched else 1e-6 * float(mag[top[0]]))
    return top if distinct else top[:1].repeat(2)


def error_directions(grad_b: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Per-sample error direction ``[B, A]`` whose sum is ``g_b`` (eq. 6): sample ``b`` carries
    ``g_b[a_b] e_{a_b}``; samples sharing an action split its entry equally. Eq. 6 weighs the outputs by the
    whole ``g_b``; its other entries are exactly 0 on an untouched DQN update, and behind noise (noise alone)
    they are left out here."""
    e = torch.zeros(len(actions), grad_b.numel(), dtype=grad_b.dtype, device=grad_b.device)
    counts = torch.bincount(actions, minlength=grad_b.numel()).to(grad_b.dtype)
    for i, a in enumerate(actions.tolist()):
        e[i, a] = grad_b[a] / counts[a]
    return e


def dqn_target_exact(q_pred: torch.Tensor, own: torch.Tensor, batch: int) -> torch.Tensor:
    """Each sample's own error at its action in a batch of ``batch`` is ``own = 2 (Q̂ − Q) / B`` (``g_b[a]`` for a
    sample alone on its action), so ``Q = Q̂ − B own / 2``."""
    return q_pred - batch * own / 2


def dqn_target_paper(q_pred: torch.Tensor, grad_b: torch.Tensor, actions: torch.Tensor,
                     norm_ratio: torch.Tensor) -> torch.Tensor:
    """IV-C2: sign ``n = sign(Q̂ − Q) = sign(g_b[a])``, magnitude ``|Q̂_rec − Q̃| ||g|| / ||g_rec||``
    with ``Q̃ = Q̂_rec − n`` (unit error), then ``Q_rec = Q̂_rec − n |Q̂ − Q|_rec``."""
    n = torch.sign(grad_b[actions])
    return q_pred - n * norm_ratio


def entropy_bias_gradient(probs: torch.Tensor, alpha: float) -> torch.Tensor:
    """``d(−α H(softmax(z)))/dz = α p (log p + H)``: the entropy part of eq. 4's gradient (one sample)."""
    log_p = probs.clamp_min(torch.finfo(probs.dtype).tiny).log()  # p log p -> 0 where p is 0, in either precision
    h = -(probs * log_p).sum(-1, keepdim=True)
    return alpha * probs * (log_p + h)


IDENTIFIABLE = 1e-3  # policy-gradient part / entropy part below which the action is not in the update
SEPARATION_NOISE = 1e-4  # policy-gradient part / the batch's largest error below which it is rounding


CONFIDENT = 0.1  # 1 − p_a under which an untouched update's taken action's entry is left out of the reward's fit


def reinforce_action_reward(grad_b: torch.Tensor, probs: torch.Tensor, alpha: float,
                            batch_scale: float = 0.0, untouched: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 8 removes the entropy part; the action is the one whose policy-gradient direction
    ``p − e_a`` (reward 1) is parallel to the rest (enumeration), and eq. 9 gives the reward as the
    ratio of the two (least squares over the entries). One sample: ``probs`` is ``[A]``.

    A zero return leaves no policy-gradient part, so the update carries no trace of the action: the
    third value says whether the action was identifiable, ``||pg|| > IDENTIFIABLE ||entropy part||``.
    Measured on 48 ViZDoom samples (S2, exact mode): the ratio is 1e-6 to 4e-6 for the 18 zero
    returns (the error of the recovered probabilities) and 2.8e3 and more for returns of 0.5 and
    more (about 5,500 per unit of return), so the threshold sits three decades from each.

    A sample separated from a batch of two (:func:`leaklab.attacks.rl.exact.reinforce_batch_errors`)
    carries rounding of the other sample's error too, so its policy-gradient part must also exceed
    :data:`SEPARATION_NOISE` times ``batch_scale``, the norm of the batch's largest per-sample bias
    gradient (0, the default: no such floor; a sample's own norm would add nothing to the first test).
    Measured on 60 batches of two (S2 and S1, 120 samples): zero returns up to 2.2e-3 of their entropy part (over
    :data:`IDENTIFIABLE`) but at most 3.3e-6 of the largest error; non-zero returns at least 7.2e-3 of it.

    With two actions ``p − e_0 = −(p − e_1)``: both directions fit, so the update holds neither the action nor
    the return (``−c / p_1`` for action 0, ``c / p_0`` for action 1, where ``pg = c (1, −1)``); the action is
    then never identified (action 0, the return read for it).

    On an ``untouched`` update a policy sure of its action (``1 − p_a`` under :data:`CONFIDENT`) leaves the action's
    own entry ``r (p_a − 1)`` to float32's cancellation: the client rounds ``p_a`` to 6e-8, over 6e-7 of that
    entry, and the fit, which weighs it most, read a return of 20 as 20.06 at ``p_a`` = 0.999995 and 11.2 at
    0.9999999, claimed exact. The return is then read off the other entries alone, ``r p_j`` (each to float32's
    relative precision). Behind noise the entry stays: the noise outweighs its rounding, and without it the noise's
    error grew 1.4 to 2.6 times (a review's p_a = 0.96 behind σ = 3e-4: 0.0165 off on average against 0.0080)."""
    entropy = entropy_bias_gradient(probs, alpha)
    pg = grad_b - entropy
    eye = torch.eye(probs.numel(), dtype=probs.dtype, device=probs.device)
    units = probs.unsqueeze(0) - eye  # row a: p − e_a
    cos = (units @ pg).abs() / (units.norm(dim=1) * pg.norm() + 1e-300)
    action = int(cos.argmax())
    u = units[action]
    if untouched and 1 - float(probs[action]) < CONFIDENT and probs.numel() > 2:
        u = u * (1 - eye[action])  # the action's own entry left out of the fit
    identified = (probs.numel() > 2 and bool(pg.norm() > IDENTIFIABLE * entropy.norm())
                  and float(pg.norm()) > SEPARATION_NOISE * batch_scale)
    return (torch.tensor([action], device=probs.device), ((pg @ u) / (u @ u)).reshape(1),
            torch.tensor([identified], device=probs.device))


# relative uncertainty of a fitted clipping factor under which the reward read with it is claimed exact (the
# target's 0.01 % of exact mode)
SCALE_EXACT = 1e-4


def clipped_scale(grad_b: torch.Tensor, probs: torch.Tensor, alpha: float) -> tuple[float, float] | None:
    """The factor ``c`` a clipping defense scaled one sample's bias gradient by (leaklab's; seed 000 reads the
    gradient unscaled) and its relative uncertainty: clipped, ``g_b = c (r (p − e_a) + e)`` with the entropy part
    ``e`` known from the probabilities (eq. 8), so a least-squares fit of ``g_b`` on ``p − e_a`` and ``e`` gives
    ``c`` as ``e``'s coefficient, for the action whose fit leaves the least; what it leaves over the basis's
    smaller singular value bounds the coefficient's error: the gradient's float32 rounding, magnified as ``e`` is
    a few thousandths of a return's part. On 5 clipped REINFORCE updates of captured rooms (S2, ``small``, clip
    1e-3) the rewards came 1e-6 to 1.1e-3 off relatively, the bound 1.1e-4 to 6.7e-3; on the tests' synthetic
    ones 1e-5 to 7e-5 off, the bound 1.4e-4 to 3.1e-4. None where ``e`` does not
    tell the scale apart: α = 0 (``e`` is 0), three actions or fewer (``e`` and every ``p − e_a`` lie in the plane
    of entries summing to 0: every action fits, with factors 7434, 0.37 and −2532), or a factor that is not
    positive. With four actions one entry is left over the fit, too few for its bound: the bound is then infinite
    (a review's claim within 1e-4 came 3e-4 off)."""
    if probs.numel() <= 3:
        return None
    entropy = entropy_bias_gradient(probs, alpha)
    eye = torch.eye(probs.numel(), dtype=probs.dtype, device=probs.device)
    best = None
    for a in range(probs.numel()):
        basis = torch.stack([probs - eye[a], entropy], 1)
        singular = torch.linalg.svdvals(basis)
        if float(singular[1]) <= 1e-9 * float(singular[0]):
            return None
        coef = torch.linalg.lstsq(basis, grad_b.unsqueeze(1)).solution.squeeze(1)
        left = float((basis @ coef - grad_b).norm())
        if best is None or left < best[0]:
            best = (left, float(coef[1]), float(singular[1]))
    left, factor, smallest = best
    if factor <= 0:
        return None
    return factor, (left / (smallest * factor) if probs.numel() > 4 else math.inf)
