"""Can exact mode recover the `small` network's second activations exactly, and does that help the images?

Each modality stream of ``small`` is ``conv1, ReLU, conv2, ReLU, conv3, ReLU, Flatten``. Exact mode
knows the stream's features ``a3 = relu(conv3(a2))`` and conv3's weight gradient, whose error ``d3``
is known (the feature error through the ReLU of the known features). Both are *linear* in ``a2 >= 0``
(conv3's output equals ``a3`` where ``a3 > 0``; its weight gradient is ``sum_p d3_p a2_p^T``), so
``a2`` is the solution of a non-negative least-squares problem: warm start by L-BFGS on the clamped
problem, then an active-set loop of CGLS solves on the support (float64). When that system's relative
residual is under 1e-5, ``a2`` is taken as exact, and with it conv2's output error
``d2 = (conv3^T d3) * [a2 > 0]``; conv2's weight gradient ``sum_p d2_p a1_p^T`` then gives 8,192 more
equations on ``a1``. The ``layerwise`` image stage matches ``a2`` (instead of ``a3``) and ramps in the
conv2 weight gradient (instead of conv3's, which ``a2`` already satisfies), with exact mode's TV,
schedule and Adam; a stream whose residual is too large keeps exact mode's terms. ``exact`` is
leaklab's image stage (:func:`leaklab.attacks.rl.exact.exact_images`) on the same frames.

Not in leaklab: it costs 3-5x exact mode's time per S1 sample. ``a1`` itself is not determined by
``a2`` and conv2's gradient (NNLS on them alone left 33-51 % error on 2 frames): the image prior is
still needed there.

    .venv/bin/python analysis/layerwise_probe.py --samples 8 --out runs/layerwise-probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_weight

from leaklab.attacks.rl.config import RoomAttackConfig
from leaklab.attacks.rl.exact import exact_images, exact_streams, exact_vectors, feature_error
from leaklab.attacks.rl.images import gaussian_start, modality_tv
from leaklab.attacks.rl.optim import adam
from leaklab.experiments.room_attack import RoomRunConfig, capture_samples, layouts_arg
from leaklab.metrics.image import constant_baseline, psnr
from leaklab.models.perception import build_perception_net

EXACT = 1e-5  # largest relative residual of the a2 system taken as an exact recovery
ZERO = 1e-4  # entries below this fraction of the largest are ReLU zeros


def _cgls(op, adjoint, b, x, mask, iterations=3000):
    """Least squares ``min ||op(x) - b||`` over ``x`` supported on ``mask`` (conjugate gradients)."""
    x = x * mask
    r = b - op(x)
    s = adjoint(r) * mask
    p, gamma = s.clone(), (s * s).sum()
    first = gamma
    for _ in range(iterations):
        q = op(p)
        alpha = gamma / (q * q).sum().clamp_min(1e-300)
        x, r = x + alpha * p, r - alpha * q
        s = adjoint(r) * mask
        new = (s * s).sum()
        if new < 1e-24 * first:
            break
        p, gamma = s + (new / gamma) * p, new
    return x


def recover_input(layer: torch.nn.Conv2d, out: torch.Tensor, delta: torch.Tensor, grad: torch.Tensor,
                  shape: tuple[int, ...]) -> tuple[torch.Tensor, float]:
    """The non-negative input ``a`` of ``layer`` with ``relu(layer(a)) = out`` and weight gradient
    ``grad`` for the output error ``delta`` (float64), and the system's relative residual."""
    w, bias, stride = layer.weight.detach().double(), layer.bias.detach().double(), layer.stride
    pos = out > 0
    out_norm, grad_norm = out.norm(), grad.norm()
    conv = lambda a: F.conv2d(a, w, stride=stride)  # noqa: E731
    weight_grad = lambda a: conv2d_weight(a, w.shape, delta, stride=stride)  # noqa: E731
    free = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    lbfgs = torch.optim.LBFGS([free], lr=1, max_iter=500, history_size=100, line_search_fn="strong_wolfe",
                              tolerance_grad=1e-20, tolerance_change=1e-30)

    def closure():
        lbfgs.zero_grad()
        a = free.clamp_min(0)
        z = conv(a) + bias.view(1, -1, 1, 1)
        loss = ((((z - out) * pos) ** 2).sum() + ((z.relu() * ~pos) ** 2).sum()) / out_norm ** 2
        loss = loss + ((weight_grad(a) - grad) ** 2).sum() / grad_norm ** 2 + (free.clamp_max(0) ** 2).sum()
        loss.backward()
        return loss

    lbfgs.step(closure)
    a = free.detach().clamp_min(0)
    op = lambda v: torch.cat([conv(v)[pos] / out_norm, weight_grad(v).flatten() / grad_norm])  # noqa: E731

    def adjoint(r):
        v = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
        return torch.autograd.grad(op(v), v, r)[0]

    b = torch.cat([(out - bias.view(1, -1, 1, 1))[pos] / out_norm, grad.flatten() / grad_norm])
    mask = (a > 1e-3 * a.max()).double()
    for _ in range(10):  # active set: add entries whose gradient pulls them up, drop negative ones
        a = _cgls(op, adjoint, b, a, mask)
        slope = adjoint(op(a) - b)
        add, drop = (mask == 0) & (slope < -1e-10), (mask == 1) & (a < -1e-6 * a.max())
        if not (add.any() or drop.any()):
            break
        mask = torch.where(add, 1.0, torch.where(drop, 0.0, mask)).double()
        a = a.clamp_min(0) * mask
    a = a.clamp_min(0)
    residual = float((op(a) - b).norm() / b.norm())
    return torch.where(a > ZERO * a.max(), a, torch.zeros_like(a)), residual


def layerwise_images(net, grads, features, cfg: RoomAttackConfig, truth: torch.Tensor):
    """The probe's image stage (module docstring); also returns per-stream recovery figures."""
    f, g_f = features.double(), feature_error(net, grads).double()
    terms, info = [], {}
    for s, (name, stream, channels) in zip(exact_streams(net), net.conv.streams()):
        last = s.last
        side = round((s.size / last.out_channels) ** 0.5)
        a3 = f[:, s.offset:s.offset + s.size].reshape(1, last.out_channels, side, side)
        d3 = (g_f * (f > 0))[:, s.offset:s.offset + s.size].reshape(a3.shape)
        shape = (1, stream[2].out_channels, side + 2, side + 2)
        a2, residual = recover_input(last, a3, d3, grads[s.weight_name].double(), shape)
        with torch.no_grad():
            true_a2 = stream[:4](truth[:, channels]).double()
        info[name] = {"a2_residual": residual, "a2_error": float((a2 - true_a2).norm() / true_a2.norm())}
        if residual > EXACT:
            terms.append(("features", s, stream, channels, a3.flatten(1).float(), d3.flatten(1).float(),
                          grads[s.weight_name]))
            continue
        a2v = a2.clone().requires_grad_()
        u2, = torch.autograd.grad((d3 * F.conv2d(a2v, last.weight.double())).sum(), a2v)
        terms.append(("a2", s, stream, channels, a2.float(), (u2 * (a2 > 0)).float(),
                      grads[f"conv.{name}.2.weight"]))
    x = gaussian_start(tuple(truth.shape), cfg.seed).requires_grad_()

    def loss(done: float) -> torch.Tensor:
        total = cfg.tv_weight * (cfg.tv_final / cfg.tv_weight) ** done * modality_tv(x)
        ramp = cfg.gradient_weight * done
        for kind, s, stream, channels, target, error, ref in terms:
            if kind == "features":
                z = s.pre_features(x)
                rec, = torch.autograd.grad((error * z).sum(), s.last.weight, create_graph=True)
            else:
                a1 = stream[:2](x[:, channels])
                z = stream[2](a1)
                rec = conv2d_weight(a1, stream[2].weight.shape, error, stride=stream[2].stride)
            total = total + ((z.relu() - target) ** 2).sum() / (target * target).sum()
            total = total + ramp * ((rec - ref) ** 2).sum() / (ref * ref).sum()
        return total

    adam([x], loss, cfg.iterations, cfg.lr, clamp=[x])
    return x.detach(), info


def _scores(x: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    out = {}
    for name, part, channel in (("rgb", slice(0, 3), "y"), ("depth", slice(3, 4), "rgb")):
        t = truth[:, part]
        out[f"{name}_gain"] = float(psnr(x[:, part], t, channel) - psnr(constant_baseline(t), t, channel))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--layouts", default="12")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = RoomRunConfig(setting="S1", samples=args.samples, layouts=layouts_arg(args.layouts), seed=args.seed)
    state, samples = capture_samples(run)  # the frames of `leaklab attack qgi --setting S1`
    net = build_perception_net(run.spec)
    net.load_state_dict(state)
    cfg, rows = RoomAttackConfig(), []
    for sample in samples:
        truth = sample.truth["images"][:1].float()
        grads = {k: v.float() for k, v in sample.update.tensors.items()}
        features = exact_vectors(net, grads).features
        start = time.perf_counter()
        exact = exact_images(net, grads, features, cfg, None)
        middle = time.perf_counter()
        layerwise, info = layerwise_images(net, grads, features, cfg, truth)
        row = {"index": sample.index, "layouts": sample.layouts, "streams": info,
               "exact": {**_scores(exact, truth), "seconds": middle - start},
               "layerwise": {**_scores(layerwise, truth), "seconds": time.perf_counter() - middle}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {f"{method}_{key}_mean": statistics.fmean(r[method][key] for r in rows)
               for method in ("exact", "layerwise") for key in ("rgb_gain", "depth_gain", "seconds")}
    summary["samples"] = len(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "samples": rows}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
