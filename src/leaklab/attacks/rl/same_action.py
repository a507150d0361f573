"""A DQN batch of two whose samples took the same action, separated at the last hidden layer (leaklab's;
seed 000's eq. 7 tells only the sum of the two errors then, and the last layer's gradient is one blend of
the two inputs).

Each sample's error at the last hidden Linear layer's output is ``δ_b w ⊙ m_b``, with ``w`` the last layer's
row of the action, ``δ_b`` the sample's error there and ``m_b`` its ReLU support. Row ``i`` of that layer's
``[dW | db]`` is ``w_i Σ_b δ_b m_bi [x_b | 1]``: divided by ``w_i`` it is one of four points, ``0`` (both
units closed), ``P_0 = δ_0 [x_0 | 1]``, ``P_1`` and ``P_0 + P_1`` (both open), and its last entry is ``0``,
``δ_0``, ``δ_1`` or their sum, the last layer's bias gradient at the action. On an untouched update the rows
fall onto those points exactly (:func:`_exact_points`); behind noise they scatter around them, and the
parallelogram is fitted to them (:func:`_fitted_points`).
"""

from __future__ import annotations

import torch
from torch import nn

from leaklab.attacks.rl.exact import NOISE_SLACK, last_layer_matrix, trailing_variance
from leaklab.attacks.rl.rules import dqn_actions, error_directions
from leaklab.models.perception import PerceptionNet

SAME_ACTION_SPLIT = 1e-4  # rows of the last hidden layer read as one point within this fraction of its norm
FIT_ROWS = 32  # behind noise, the fit starts from pairs of the rows of largest norm among this many
FIT_STARTS = 8  # ... of which it runs the best this many starts to convergence
FIT_STEPS = 100  # at most this many alternations of the fit (assignments, then points)
SPLIT_GAIN = 2.0  # behind noise, two samples' corners must fit this many free points' worth of noise better than
# one sample's (_fitted_points)
_COMBOS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # 0, P_0, P_1, P_0 + P_1
_ONE = torch.tensor([[0.0], [1.0]], dtype=torch.float64)  # one sample's corners: 0, P


def exact_dqn_errors(net: PerceptionNet, grads: dict[str, torch.Tensor], batch: int
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Exact mode's reading of a DQN update's actions ``[B]``, errors at the output ``[B, A]`` and, where those
    do not separate a batch of two, the errors at the last hidden layer's output ``[B, n]`` (else None): eq. 7's
    actions and error directions; for a batch of two whose second action is the first again or, behind noise, an
    entry under :data:`NOISE_SLACK` times the noise's std (read off the last layer, :func:`trailing_variance`),
    :func:`same_action_errors` where it separates the samples, and else, for such an entry, no errors (None): an
    entry of the noise is no sample's error, and read as one (until exact method version 21) it gave that sample
    the noise's row and the batch's images under their baseline (docs/reproductions.md, "A batch of two behind
    noise")."""
    gb = grads[f"head.{len(net.head) - 1}.bias"].double()
    taken = dqn_actions(gb, batch)
    if batch == 1:
        return taken, error_directions(gb, taken), None
    in_noise = False
    if int(taken[1]) != int(taken[0]):
        variance, noisy = trailing_variance(last_layer_matrix(net, grads), 2)
        in_noise = noisy and float(gb[taken[1]].abs()) <= NOISE_SLACK * variance ** 0.5
    same = same_action_errors(net, grads, int(taken[0])) if in_noise or int(taken[1]) == int(taken[0]) else None
    if same is not None:
        return taken[:1].repeat(2), *same
    return taken, None if in_noise else error_directions(gb, taken), None


def same_action_errors(net: PerceptionNet, grads: dict[str, torch.Tensor], action: int
                       ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The output errors ``[2, A]`` and the errors ``[2, n]`` at the last hidden Linear layer's output of a DQN
    batch of two that took one ``action``. The rows' points (module docstring) give each sample's ``δ_b`` and
    support. None where the head does not end ``Linear, ReLU, Linear`` or the rows do not show two samples
    (:func:`_exact_points`, :func:`_fitted_points`)."""
    last = len(net.head) - 1
    if last < 2 or not isinstance(net.head[last - 1], nn.ReLU) or not isinstance(net.head[last - 2], nn.Linear):
        return None
    name = f"head.{last - 2}"
    if grads.get(f"{name}.bias") is None:
        return None
    total = grads[f"head.{last}.bias"].double()
    dw, db = grads[f"{name}.weight"].double(), grads[f"{name}.bias"].double()
    w = net.head[last].weight.detach()[action].double()
    found = _exact_points(dw, db, w, float(total[action])) or _fitted_points(dw, db, w)
    if found is None:
        return None
    own, support = found
    deltas = torch.zeros(2, net.head[last].out_features, dtype=torch.float64)
    deltas[:, action] = own
    return deltas, own[:, None] * w * support


def _exact_points(dw: torch.Tensor, db: torch.Tensor, w: torch.Tensor, total: float
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The samples' ``δ`` ``[2]`` and supports ``[2, n]`` off an untouched update: each row's closed-form reading
    ``dW_i / db_i`` is ``x_0``, ``x_1`` or their blend, and ``db_i / w_i`` is ``δ_0``, ``δ_1`` or ``total``, the
    last layer's bias gradient at the action. The rows fall into those three points (within
    :data:`SAME_ACTION_SPLIT`); the one whose ratio is ``total`` is the blend. None where they do not fall into
    three such points (noise spreads them; a sample whose error is under that fraction of the other's merges with
    the blend) or the ratios do not add up."""
    rows = torch.nonzero((db != 0) & (w != 0)).squeeze(1)
    readings, ratios = dw[rows] / db[rows, None], db[rows] / w[rows]
    points: list[torch.Tensor] = []
    left = torch.ones(len(rows), dtype=torch.bool)
    while bool(left.any()) and len(points) < 4:
        centre = readings[int(torch.nonzero(left)[0])]
        near = left & ((readings - centre).norm(dim=1) <= SAME_ACTION_SPLIT * centre.norm())
        points.append(near)
        left &= ~near
    if len(points) != 3:
        return None
    mean = [float(ratios[p].mean()) for p in points]
    blend = min(range(3), key=lambda k: abs(mean[k] - total))
    first, second = (k for k in range(3) if k != blend)
    if not max(abs(mean[first] + mean[second] - total), abs(mean[blend] - total)) <= SAME_ACTION_SPLIT * abs(total):
        return None
    support = torch.zeros(2, len(w), dtype=torch.bool)
    for b, k in enumerate((first, second)):
        support[b, rows[points[k] | points[blend]]] = True
    return torch.tensor([mean[first], mean[second]], dtype=torch.float64), support


def _fitted_points(dw: torch.Tensor, db: torch.Tensor, w: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`_exact_points` behind noise: the rows ``[dW | db]`` divided by ``w_i`` scatter around ``0``, ``P_0``,
    ``P_1`` and ``P_0 + P_1`` with noise of ``v / w_i²`` per entry, ``v`` the noise's variance per entry
    (:func:`trailing_variance` of the layer). The points are fitted by weighted least squares (weights ``w_i²``),
    alternating each row's nearest corner and the points given those (Lloyd's). The fit starts on the rows'
    projection onto their two leading singular directions (which span both samples' ``[x_b | 1]`` where the second
    sample stands clear of the noise), from the best :data:`FIT_STARTS` of the parallelograms two of the
    :data:`FIT_ROWS` rows of largest norm span (both single, or one single and one blend), and ends on the whole
    rows (behind σ = 1e-3 the second singular direction is the noise's as much as the second sample's; the noise
    across the corners' difference does not move a row's nearest corner). A row is open in each sample its corner
    holds. None where the fit's weighted residual exceeds the noise's (``v`` per entry of the ``(n − 2)`` rows'
    worth the two points leave, to within :data:`NOISE_SLACK` std of a chi-square: the rows of two distinct actions
    do not fall onto a parallelogram), where it beats one sample's corners ``0, P`` (fitted the same way from the
    sign of the rows' leading singular direction) by no more than :data:`SPLIT_GAIN` free points' worth of noise,
    ``SPLIT_GAIN v d`` for rows of ``d`` entries (one sample's rows split between two corners on the noise's say-so
    gain 1.16 to 1.77 of it, as one free point's and the rows' choice of corner give; on 48 captured S2 batches of
    ``deep`` behind σ = 1e-3 and 1e-2 such splits passed the other tests on 10, docs/reproductions.md, "A batch of
    two behind noise"), or where a sample's ``δ`` is under :data:`NOISE_SLACK` times its std (one sample under the
    noise: :func:`~leaklab.attacks.rl.exact.dominant_sample` reads the other)."""
    rows = torch.nonzero(w != 0).squeeze(1)
    m = torch.cat([dw, db[:, None]], 1)[rows]
    u, s, vt = torch.linalg.svd(m, full_matrices=False)
    variance, _ = trailing_variance(m, 2, s)
    y, weight = m / w[rows, None], w[rows].square()
    plane = y @ vt[:2].T
    top = torch.argsort(weight * plane.square().sum(1), descending=True)[:FIT_ROWS]
    i, j = torch.triu_indices(len(top), len(top), 1)
    a, b = plane[top[i]], plane[top[j]]
    starts = torch.cat([torch.stack([a, b], 1), torch.stack([a, b - a], 1), torch.stack([b, a - b], 1)])
    fits = []
    for k in torch.argsort(_cost(plane, weight, starts))[:FIT_STARTS].tolist():
        fit = _lloyd(plane, weight, starts[k], _COMBOS)
        fit = None if fit is None else _lloyd(y, weight, _points(y, weight, fit[1], _COMBOS), _COMBOS)
        if fit is not None:
            fits.append(fit)
    if not fits:
        return None
    cost, assign, points = min(fits, key=lambda f: f[0])
    dof = (len(rows) - 2) * y.shape[1]
    if cost > variance * dof * (1 + NOISE_SLACK * (2 / dof) ** 0.5):
        return None
    single = [_lloyd(y, weight, _points(y, weight, (sign * u[:, 0] > 0).long(), _ONE), _ONE) for sign in (1, -1)]
    if min((f[0] for f in single if f is not None), default=float("inf")) - cost <= SPLIT_GAIN * variance * y.shape[1]:
        return None
    combos = _COMBOS[assign]
    spread = (variance * torch.linalg.inv((combos * weight[:, None]).T @ combos).diagonal()).sqrt()
    own = points[:, -1]
    if not bool((own.abs() > NOISE_SLACK * spread).all()):
        return None
    support = torch.zeros(2, len(w), dtype=torch.bool)
    support[:, rows] = combos.T.bool()
    return own, support


def _corner_distances(y: torch.Tensor, points: torch.Tensor, combos: torch.Tensor) -> torch.Tensor:
    """The squared distances ``[..., n, C]`` of the rows ``y`` ``[n, d]`` to the corners ``combos @ points`` of the
    points ``[..., k, d]`` (``combos`` ``[C, k]``: which points each corner adds)."""
    corners = combos @ points
    return (y.square().sum(1)[:, None] - 2 * y @ corners.transpose(-1, -2)
            + corners.square().sum(-1)[..., None, :]).clamp_min(0)


def _cost(y: torch.Tensor, weight: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """The weighted squared distance ``[S]`` of the rows ``y`` ``[n, d]`` to their nearest corner of each of the
    parallelograms ``points`` ``[S, 2, d]``."""
    return (_corner_distances(y, points, _COMBOS).amin(-1) * weight).sum(-1)


def _points(y: torch.Tensor, weight: torch.Tensor, assign: torch.Tensor, combos: torch.Tensor
            ) -> torch.Tensor | None:
    """The points ``[k, d]`` whose corners (``combos`` ``[C, k]``) fit the rows ``y`` held at the corners ``assign``
    (indices into ``combos``) best in weighted least squares; None where those corners do not tell the points
    apart."""
    held = combos[assign]
    normal = (held * weight[:, None]).T @ held
    if int(torch.linalg.matrix_rank(normal)) < combos.shape[1]:
        return None
    return torch.linalg.solve(normal, (held * weight[:, None]).T @ y)


def _lloyd(y: torch.Tensor, weight: torch.Tensor, points: torch.Tensor | None, combos: torch.Tensor
           ) -> tuple[float, torch.Tensor, torch.Tensor] | None:
    """:func:`_fitted_points`' fit of the rows ``y`` ``[n, d]`` from ``points`` ``[k, d]`` with the corners
    ``combos`` ``[C, k]``: the weighted cost, each row's corner (an index into ``combos``) and the points; None where
    the corners held stop telling the points apart."""
    assign = None
    for _ in range(FIT_STEPS):
        if points is None:
            return None
        near = _corner_distances(y, points, combos).argmin(1)
        if assign is not None and torch.equal(near, assign):
            break
        assign = near
        points = _points(y, weight, assign, combos)
    if points is None:
        return None
    residual = y - combos[assign] @ points
    return float((residual.square().sum(1) * weight).sum()), assign, points
