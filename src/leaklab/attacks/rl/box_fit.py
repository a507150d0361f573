"""The target's box from a defended update (leaklab's exact mode; seed 000, section IV-A recovers the box,
the vector state ``s_c``, in its first stage by fitting every linear layer's gradient).

On a single sample's exact gradient ``box.0``'s closed form (``h = db^T dW / ||db||^2``) is the box.
Behind noise it is the noisiest reading there is: ``box.0``'s error is the head's error passed back
through the few box columns of ``head.0`` (``small`` S2: 32 of 7,232), so its gradient is small beside the
noise. The box also sets the box branch's output, which ``head.0``'s far larger gradient reads.
:func:`fitted_box` therefore fits the box to the weight gradients of every Linear layer it feeds, the
box branch's and ``head.0``'s box columns, given their bias gradients: for a Linear layer with output
error ``db`` and input ``h(x)``, ``||dW − db h(x)^T||^2 = ||db||^2 ||h(x) − ĥ||^2 + const`` with ``ĥ`` the
closed-form reading, so the fit is a weighted least-squares problem in the box's 4 numbers (paper mode's
stage 1 fits the same gradients, with the features, by Adam). Gauss–Newton from the closed form and from
0, the better fit kept. On 48 updates each (28 targets in view), behind Gaussian noise of σ = 0.001 / 0.01 /
0.03, the in-view mean IoU rose from 0.36 / 0.02 / 0.02 (closed form) to 0.93 / 0.53 / 0.05 for QGI S2 and
from 0.77 / 0.17 / 0.03 to 0.96 / 0.87 / 0.66 for RGI S2 (docs/reproductions.md, "The box behind noise").
A batch of two's boxes are fitted the same way (:func:`fitted_batch_box`, exact method version 13), on an
untouched update too (version 18): there a REINFORCE sample with a zero return, its errors about 1e-4 of its
partner's, reads ``box.0``'s closed form with its partner's float32 rounding magnified as much. On 48 captured
untouched batches its box came out up to 7.3e-3 off (an out-of-view target's zero box read as a box on 6); the
fit, 10 ms a batch, brought that to 1.6e-3 (on 1), and on 48 DQN batches the worst coordinate from 5.9e-5 to
5.0e-6 (docs/reproductions.md, "A batch of two (QGI, exact mode)"). On an untouched batch a coordinate the closed
form reads as exactly 0, its weight gradient's column zero in every sample, stays 0: the fit to the other layers'
rounding moved four such zero boxes up to 1.3e-4. Behind a defense a zero column is the defense's (``topk``
drops ``box.0``'s small gradient whole): pinned, the box came out at IoU 0 to 0.58 behind ``topk:0.9`` where the
fit to every layer reads it to 0.007.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from leaklab.models.perception import PerceptionNet, conv_feature_count

STEPS = 50  # at most this many Gauss–Newton steps from each start


Reading = tuple[torch.Tensor, torch.Tensor]  # a layer's input read in closed form [B, in] and its weight [B, B]


def _readings(net: PerceptionNet, grads: dict[str, torch.Tensor]) -> list[Reading]:
    """Per layer the box feeds (the box branch's Linear layers, then ``head.0``'s box columns): the
    closed-form reading ``ĥ`` of its input and its weight ``||db||`` (float64); weight 0 for a Linear layer
    without a bias (a user's own box branch), whose output error the update does not give."""
    out = []
    for name in _fed(net):
        dw, db = grads[f"{name}.weight"].double(), grads.get(f"{name}.bias")
        if db is None:
            out.append((torch.zeros(1, dw.shape[1], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)))
            continue
        if name == "head.0":
            dw = dw[:, conv_feature_count(net):]
        db = db.double()
        norm = torch.linalg.vector_norm(db)
        out.append((((db @ dw) / (norm * norm).clamp_min(1e-300)).unsqueeze(0), norm.reshape(1, 1)))
    return out


def _fed(net: PerceptionNet) -> list[str]:
    """The Linear layers the box feeds: the box branch's, then ``head.0`` (its box columns)."""
    return [f"box.{i}" for i, m in enumerate(net.box) if isinstance(m, nn.Linear)] + ["head.0"]


def fitted_box(net: PerceptionNet, grads: dict[str, torch.Tensor], closed_form: torch.Tensor) -> torch.Tensor:
    """The box ``[1, box_dim]`` (float64) whose Linear-layer inputs best explain the layers' weight
    gradients given their bias gradients (module docstring); ``closed_form`` ``[1, box_dim]`` is
    ``box.0``'s closed-form reading, one of the two starts."""
    return _fit(net, _readings(net, grads), closed_form, pin_zeros=False)


def fitted_batch_box(net: PerceptionNet, found: dict[str, tuple[torch.Tensor, float, torch.Tensor]],
                     untouched: bool) -> torch.Tensor:
    """A batch's boxes ``[B, box_dim]`` (float64) fitted as :func:`fitted_box` fits one sample's, to every
    Linear layer the box feeds, from the separated readings ``found`` of
    :func:`~leaklab.attacks.rl.exact.separated_vectors` (per layer: the inputs ``Ĥ`` ``[B, in]`` read in
    closed form, their relative residual and the errors ``E`` ``[B, out]`` at the layer's output). With ``dW =
    E^T H + noise``, ``||dW − E^T H(x)||² = ||R (H(x) − Ĥ)||² + const`` for ``R^T R = E E^T``, so ``R`` weighs
    each layer's reading as ``||db||`` weighs one sample's (leaklab's; docs/reproductions.md, "A batch of
    two behind noise"). The closed form where some layer's ``E E^T`` is too near singular to factor. ``untouched``:
    the batch's exact gradient, whose coordinates read as exactly 0 stay 0 (module docstring)."""
    count = conv_feature_count(net)
    readings = []
    for name in _fed(net):
        value, _, errors = found[name]
        lower, info = torch.linalg.cholesky_ex(errors @ errors.T)
        if int(info):
            return found["box.0"][0]
        readings.append((value[:, count:] if name == "head.0" else value, lower.T))
    return _fit(net, readings, found["box.0"][0], pin_zeros=untouched)


def _fit(net: PerceptionNet, readings: list[Reading], closed_form: torch.Tensor, pin_zeros: bool) -> torch.Tensor:
    """Gauss–Newton on the boxes ``[B, box_dim]`` from ``closed_form`` and from 0, the better fit kept: the
    residuals ``R (h(x) − ĥ)`` of every layer the box feeds (:func:`_readings`); with ``pin_zeros`` a coordinate
    ``closed_form`` holds at exactly 0 stays 0 (module docstring). Each step is halved until the loss falls; a
    start ends where no step of 1e-6 or more of it does, where its step is tiny, or after ``STEPS`` steps."""
    branch = copy.deepcopy(net.box).double().requires_grad_(False).eval()
    shape = closed_form.shape

    closed = closed_form.double().flatten()
    fitted = closed != 0 if pin_zeros else torch.ones_like(closed, dtype=torch.bool)
    place = torch.eye(len(closed), dtype=torch.float64)[:, fitted]  # the coordinates fitted; the rest stay 0

    def residuals(free: torch.Tensor) -> torch.Tensor:
        parts, h = [], (place @ free).reshape(shape)
        for m in branch:
            if isinstance(m, nn.Linear):
                parts.append(h)
            h = m(h)
        parts.append(h)
        return torch.cat([(root @ (p - target)).flatten() for p, (target, root) in zip(parts, readings)])

    def loss(x: torch.Tensor) -> float:
        return float((residuals(x) ** 2).sum())

    best, best_loss = closed, float("inf")
    if not place.shape[1]:
        return closed_form.double()
    for start in (closed[fitted], torch.zeros(place.shape[1], dtype=torch.float64)):
        x = start.clone()
        for _ in range(STEPS):
            r = residuals(x)
            jacobian = torch.autograd.functional.jacobian(residuals, x, vectorize=True)
            step = torch.linalg.lstsq(jacobian, -r.unsqueeze(1)).solution.squeeze(1)
            t, now = 1.0, float((r ** 2).sum())
            while (trial := loss(x + t * step)) > now and t > 1e-6:
                t /= 2
            if trial > now:  # no step along it lowers the loss (at a ReLU's kink behind noise): as good as it gets
                break
            x = x + t * step
            if float(torch.linalg.vector_norm(t * step)) <= 1e-12 * (1 + float(torch.linalg.vector_norm(x))):
                break
        if loss(x) < best_loss:
            best, best_loss = place @ x, loss(x)
    return best.reshape(shape)
