"""Exact mode one layer down: a stream's penultimate activations in closed form (leaklab's).

Seed 000 (section IV) reads the inputs of linear layers from their gradients; exact mode does so for
every linear layer (:mod:`leaklab.attacks.rl.exact`). A modality stream that ends ``conv_p, ReLU,
conv_l, ReLU, Flatten`` goes one step further. Exact mode knows the stream's features
``a_l = relu(conv_l(a_p))`` and the error ``d_l`` at ``conv_l``'s output (the feature error through
the ReLU of the known features), so the penultimate activations ``a_p >= 0`` satisfy two *linear*
systems: ``conv_l(a_p) + b = a_l`` wherever ``a_l > 0``, and ``conv_l``'s weight gradient
``G[o, c, i, j] = sum_u d_l[o, u] a_p[c, s u + (i, j)]``. On the ``small`` network that is about 3,600
plus 9,216 equations for 9,248 unknowns per stream, of which about 40 % are ReLU zeros.

:func:`penultimate_activations` solves them as non-negative least squares by an active set: the
support starts from an estimate's pre-activations (those above ``-0.1`` of their standard deviation:
a superset of the true support but for a few to a few hundred entries), the least-squares problem on
the support is solved by a Cholesky factorisation of its normal equations (float64, Jacobi-scaled),
and the outside entries that would each remove the most residual are added by bordering the factor.
On a superset of the true support a full-rank system has the true activations as its only exact
solution; a support that still misses entries leaves a residual or compensates with negative
entries, so a solution is taken only when its relative residual is under :data:`EXACT` and no entry
is below ``-NEGATIVE`` of the largest (session 8, 48 S1 frames: one RGB stream stopped at a residual
of 6.0-6.7e-7, under a looser 1e-6, with 4.7-4.8e-4 error and an entry at -1.1e-3 of the largest; its
frame's RGB fell to 2.5 dB *below* the constant baseline; with the true activations it gained 8.1
dB). When bordering loses a pivot (the support has grown past what the systems determine), the
support is pruned to its positive entries and factorised afresh (at most :data:`REBUILDS` times);
otherwise ``None``. From the image after exact mode's first 500 steps, on the 4 streams of the two
hardest of those frames: at most 9.6e-6 relative error against the true activations, 3-22 s per
stream on one core (session 8); the same solver stopping at a residual of 1e-6 had recovered 6
streams of 3 other frames to at most 2e-6 in 3-10 s. Session 7's solver (L-BFGS, then conjugate
gradients on the support) reached that accuracy in 8-39 s. The first Cholesky factor (5,500-8,000
unknowns) is most of the cost once bordering copies nothing (:class:`_BorderedFactor`, session 12):
the 4 streams of the first two S1 samples of ``leaklab attack qgi`` took 1.7-3.9 s each against
3.0-9.8 s when the factor was concatenated anew at each bordering and solved by
``torch.cholesky_solve`` (0.76 s for one right-hand side on 6,000 unknowns, against 0.02 s for two
triangular solves), with the same activations in float32.

Where the weight-gradient system alone determines the activations (``M`` has full column rank: its
``O * kh * kw`` rows cover the ``H * W`` positions of a channel, as on ``wide-rgb``'s RGB stream and
both of ``nature``'s, 576 rows for 289 positions; ``small``'s streams have 288), no support is needed:
:func:`_determined_by_gradient` takes each channel's least-squares solution of that system and refines
it on both systems by :data:`REFINE` steps of conjugate gradients on their normal equations,
preconditioned by ``M^T M`` (one 289 × 289 factor for every channel). On the RGB streams of 3 ``wide-rgb``
S1 frames (session 31) the gradient system alone left a residual of 2.3-2.5e-7 on both systems, over
:data:`EXACT`, and 3.5-3.9e-7 relative error against the true activations; 5 steps took the residual to
1.2e-7, 10 to 1.1e-7 (no lower by 40), with 2.3-2.4e-7 error against the active set's 2.0-2.2e-7 and
every ReLU zero where the true ones are, in 0.6-1.1 s against the active set's 10-12 s (the factor of
11,000 unknowns). A solution that fails the same test as the active set's (:func:`_exact`) falls back
to the active set.

The client's update carries the float32 rounding of its own arithmetic, the error ``d_l`` the
attacker computes carries its own: where both sum in the same order (the same kernels on the same
processor) the two agree to the bit and the residual floor is the data's, 4e-8 to 1.2e-7 (this host);
where they do not (another machine, a GPU), the floor grows with the error's rounding. On the lent H100
(session 32, torch 2.11) one RGB stream of ``wide-rgb``'s RGI S1 audit ended at 2.04e-7 against 1.17e-7
here for the same frame, over :data:`EXACT`, the active set failed the same test, and the frame's RGB
fell from 36.97 to 24.97 dB; the same machine's CPU cores left 1.5-1.7e-7. A synthetic stream of
``wide-rgb``'s shape (64 channels of 17 x 17, its error a float32 sum of 256 to 1,024 terms in the other
order) leaves a floor of 0.8 times the error's relative rounding (2.3-4.8e-7). So a solution is taken
under ``EXACT`` plus that rounding, which the caller measures as its float32 error's distance from the
float64 one (:func:`leaklab.attacks.rl.exact.exact_images`; 1.9-2.1e-7 on 6 S2 frames of ``small``). The active
set's rounds on 6 ``small`` S1 frames ended either at 1.5e-6 or more or at the floor (4e-8 to 1e-7), so
the allowance accepts the same rounds there.

A client training on a GPU computes its convolutions in TF32 by default (torch's cuDNN setting: 10-bit
mantissas), and its update carries rounding a thousand times float32's. Where the weight gradient
determines the activations, its system's own least-squares residual measures that rounding (float32:
about 1e-7; TF32: 1.1e-4 on a ``wide-rgb`` RGB stream, whose both systems' residual was 1.2-1.3 times it
and most negative entry 3.2-3.3 times it, of the largest, as in float32), so the test widens by its
multiples (:data:`NOISE_RESIDUAL`, :data:`NOISE_NEGATIVE`) up to :data:`NOISY`. On 2 ``wide-rgb`` S1
frames whose update was computed with emulated TF32 convolutions (operands rounded to 10-bit mantissas;
session 32) the RGB streams' activations then came out where version 6 refused them: RGB 23.48 and 31.39
dB against 23.11 and 27.71 (which is what the attack gets without the layerwise stage) and 30.59 and
33.30 from the float32 update. ``small``'s streams, read by the active set, still fail on such updates.

The entries left at true zeros come out as rounding noise of either sign, so an entry counts as a
ReLU zero when it is below :data:`ZERO` times the most negative entry's size. The split matters
although those entries are tiny: the ReLU mask gates the error passed to the layer below. A fixed
cut at 1e-4 of the largest entry (session 8) zeroed true activations of 6.5e-5 to 8.5e-5 of it
where the noise was at most 1.2e-6; on 4 S2 frames with such entries the noise-based
cut lifted depth from +26.4 to +32.9 dB over the constant baseline, on 4 S1 frames RGB from +5.39
to +5.72 dB (session 9).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sparse
from scipy.linalg import LinAlgError, cho_solve, cholesky
import torch
from torch import nn

EXACT = 2e-7  # largest relative residual of the two systems taken as exact, before the error's rounding
# (:func:`_exact`; float32 data whose error repeats the client's arithmetic: 4e-8 to 1.2e-7)
NEGATIVE = 1e-4  # most negative entry, of the largest, in an exact solution (rounding: under 3e-5)
PIVOT = 1e-9  # smallest squared Cholesky pivot of the Jacobi-scaled normal matrix taken as determined
SUPPORT = 0.1  # entries whose estimated pre-activation is above -SUPPORT * its std start in the support
ZERO = 2.0  # recovered entries under this multiple of the most negative one's size are the ReLU's zeros
ROUNDS = 30  # rounds of the active set, each a bordering or a fresh factorisation
REBUILDS = 12  # fresh factorisations of a pruned support after a failed bordering (2 left 3 of 48 S2
# depth streams unsolved in session 8; 6 solved 2 of them to a residual under 5e-8, session 9; the
# third needs 10 and 23 rounds, its residual falling at each, to 4.9e-8, session 10)
NOISY = 1e-3  # largest relative residual of the weight-gradient system alone taken as its arithmetic's
# rounding (float32: ~1e-7; TF32 convolutions: ~1e-4; a defense's noise lies far above)
NOISE_RESIDUAL = 2.0  # both systems' residual allowed over EXACT, in multiples of that rounding (1.2-1.3 seen)
NOISE_NEGATIVE = 10.0  # most negative entry allowed over NEGATIVE, of the largest, in its multiples (3.2-3.3 seen)
REFINE = 10  # conjugate-gradient steps from the weight-gradient system's solution on both systems (module
# docstring)
ADD = 0.1  # each round adds the outside entries pulled up by more than this fraction of the strongest


def _systems(last: nn.Conv2d, features: torch.Tensor, error: torch.Tensor, weight_grad: torch.Tensor,
             shape: tuple[int, int, int]):
    """The two linear systems on ``a_p`` (flattened ``[C, H, W]``), each row scaled by its system's
    right-hand side norm: the feature rows as a sparse matrix, the gradient rows as the matrix ``M``
    shared by every input channel (``G[:, c] = M a_p[c]``)."""
    w = last.weight.detach().double().cpu().numpy()
    bias = last.bias.detach().double().cpu().numpy() if last.bias is not None else np.zeros(w.shape[0])
    out_c, in_c, kh, kw = w.shape
    sh, sw = last.stride
    _, height, width = shape
    a_l, d_l = (t[0].detach().double().cpu().numpy() for t in (features, error))
    o, y, x = np.nonzero(a_l > 0)
    target = a_l[o, y, x] - bias[o]
    f_norm = max(np.linalg.norm(target), 1e-300)
    c, i, j = (t.reshape(-1, 1) for t in np.meshgrid(np.arange(in_c), np.arange(kh), np.arange(kw), indexing="ij"))
    cols = (c * height + sh * y + i) * width + sw * x + j
    rows = np.broadcast_to(np.arange(len(o)), cols.shape)
    vals = w[o].transpose(1, 2, 3, 0).reshape(-1, len(o)) / f_norm
    feat = sparse.csc_matrix((vals.ravel(), (rows.ravel(), cols.ravel())), shape=(len(o), in_c * height * width))
    out_h, out_w = d_l.shape[1:]
    m = np.zeros((out_c, kh, kw, height, width))
    for i in range(kh):
        for j in range(kw):
            m[:, i, j, i:i + sh * (out_h - 1) + 1:sh, j:j + sw * (out_w - 1) + 1:sw] = d_l
    g = weight_grad.detach().double().cpu().numpy().transpose(1, 0, 2, 3).reshape(in_c, -1)
    g_norm = max(np.linalg.norm(g), 1e-300)
    return feat, target / f_norm, m.reshape(out_c * kh * kw, height * width) / g_norm, g / g_norm


class _BorderedFactor:
    """A lower Cholesky factor grown by bordering, kept as its diagonal blocks and the panels left of
    them: growing it copies nothing (concatenating the dense factor at each bordering took longer
    than factorising it, and a solve with a view into a larger buffer copies it as well)."""

    def __init__(self, first: torch.Tensor):
        self.diagonal = [first]
        self.panels: list[torch.Tensor | None] = [None]  # block j's rows, the columns of blocks < j

    def forward(self, b: torch.Tensor) -> torch.Tensor:
        """``L^-1 b`` for ``b`` ``[k, r]``."""
        parts, start = [], 0
        for d, p in zip(self.diagonal, self.panels):
            rhs = b[start:start + len(d)]
            parts.append(torch.linalg.solve_triangular(d, rhs if p is None else rhs - p @ torch.cat(parts),
                                                       upper=False))
            start += len(d)
        return torch.cat(parts)

    def backward(self, y: torch.Tensor) -> torch.Tensor:
        """``L^-T y`` for ``y`` ``[k, r]``."""
        sizes = [len(d) for d in self.diagonal]
        parts = list(torch.split(y, sizes))
        for j in reversed(range(len(parts))):
            parts[j] = torch.linalg.solve_triangular(self.diagonal[j].mT, parts[j], upper=True)
            if self.panels[j] is not None:
                below = torch.split(self.panels[j].mT @ parts[j], sizes[:j])
                parts[:j] = [q - r for q, r in zip(parts[:j], below)]
        return torch.cat(parts)

    def solve(self, b: torch.Tensor) -> torch.Tensor:
        """``(L L^T)^-1 b``."""
        return self.backward(self.forward(b))

    def border(self, panel: torch.Tensor, corner: torch.Tensor) -> None:
        """Append the rows ``[panel, corner]``."""
        self.panels.append(panel)
        self.diagonal.append(corner)


def _residual_and_slope(feat, target: np.ndarray, m: np.ndarray, g: np.ndarray, x: np.ndarray
                        ) -> tuple[float, np.ndarray]:
    """The two systems' relative residual at ``x`` and the gradient of half their squared residual."""
    in_c, plane = g.shape[0], m.shape[1]
    r_f, r_g = feat @ x - target, x.reshape(in_c, plane) @ m.T - g
    res = np.sqrt(((r_f ** 2).sum() + (r_g ** 2).sum()) / ((target ** 2).sum() + (g ** 2).sum()))
    return float(res), feat.T @ r_f + (r_g @ m).reshape(-1)


def _normal_rhs(feat, target: np.ndarray, m: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The right-hand side of both systems' normal equations, ``F^T t + vec(G M)``."""
    return feat.T @ target + (g @ m).reshape(-1)


def _exact(residual: float, x: np.ndarray, rounding: float, noise: float = 0.0) -> bool:
    """Whether ``x``, whose two systems' relative residual is ``residual``, solves them (under
    :data:`EXACT` plus the error's relative ``rounding``, module docstring) with no entry below
    ``-NEGATIVE`` of the largest (a missing support entry shows as negative ones); ``noise``, the
    weight-gradient system's own residual where it determines the activations, widens both by its
    multiples (:data:`NOISE_RESIDUAL`, :data:`NOISE_NEGATIVE`)."""
    return (residual < EXACT + rounding + NOISE_RESIDUAL * noise
            and x.min() >= -(NEGATIVE + NOISE_NEGATIVE * noise) * x.max())


def _determined_by_gradient(feat, target: np.ndarray, m: np.ndarray, g: np.ndarray
                            ) -> tuple[np.ndarray, float] | None:
    """The activations when the weight-gradient system alone determines every channel's (``M`` of
    full column rank, module docstring): its least-squares solution, refined on both systems by
    :data:`REFINE` steps of conjugate gradients on their normal equations, preconditioned by the
    gradient system's (``M^T M`` on each channel), and the gradient system's own relative residual,
    the rounding of the client's arithmetic; None when ``M``'s Jacobi-scaled ``M^T M`` has a pivot
    under :data:`PIVOT`."""
    in_c, plane = g.shape[0], m.shape[1]
    if m.shape[0] < plane:
        return None
    mtm = m.T @ m
    scale = np.sqrt(mtm.diagonal()).clip(1e-300)
    try:
        factor = cholesky(mtm / scale[:, None] / scale[None, :], lower=True, check_finite=False)
    except LinAlgError:
        return None
    if factor.diagonal().min() ** 2 < PIVOT:
        return None

    def gradient_solve(r: np.ndarray) -> np.ndarray:  # (I ⊗ M^T M)^-1 r
        return (cho_solve((factor, True), r.reshape(in_c, plane).T / scale[:, None]) / scale[:, None]).T.reshape(-1)

    def normal(v: np.ndarray) -> np.ndarray:  # (F^T F + I ⊗ M^T M) v
        return feat.T @ (feat @ v) + (v.reshape(in_c, plane) @ mtm).reshape(-1)

    x = gradient_solve((g @ m).reshape(-1))  # the weight-gradient system's own solution
    noise = float(np.linalg.norm(x.reshape(in_c, plane) @ m.T - g) / np.linalg.norm(g))  # its own residual
    r = _normal_rhs(feat, target, m, g) - normal(x)
    z = gradient_solve(r)
    p, rz = z, r @ z
    for _ in range(REFINE):
        q = normal(p)
        step = rz / (p @ q)
        x, r = x + step * p, r - step * q
        z = gradient_solve(r)
        p, rz = z + (r @ z) / rz * p, r @ z
    return x, noise


def _active_set(feat, target: np.ndarray, m: np.ndarray, g: np.ndarray, estimate: torch.Tensor,
                rounding: float) -> np.ndarray | None:
    """The non-negative least-squares solution of both systems by the active set (module docstring),
    its support started from ``estimate``, taken by :func:`_exact` with ``rounding``; None when the
    systems do not determine it."""
    in_c, plane = g.shape[0], m.shape[1]
    n = in_c * plane
    mtm = m.T @ m
    rhs = torch.from_numpy(_normal_rhs(feat, target, m, g))

    def normal_block(rows: np.ndarray, cols: np.ndarray) -> torch.Tensor:
        """Entries ``(rows, cols)`` of the normal matrix ``F^T F + blockdiag(M^T M)``, in memory torch allocates:
        numpy advises the kernel to back large arrays by huge pages, and where it compacts memory for them on the
        first write (transparent huge pages in ``madvise`` mode) filling this block of 6,000-8,000 squared took
        4.0 of a 7.0-s solve (an AMD EPYC host, session 65), the same values in 0.15-0.27 s this way."""
        product = feat[:, rows].T @ feat[:, cols]
        out = torch.zeros(product.shape, dtype=torch.float64)  # the systems are float64 (_systems)
        block = product.toarray(out=out.numpy())
        row_channel, row_at = np.divmod(rows, plane)
        col_channel, col_at = np.divmod(cols, plane)
        for c in np.intersect1d(row_channel, col_channel):
            i, k = np.nonzero(row_channel == c)[0], np.nonzero(col_channel == c)[0]
            block[np.ix_(i, k)] += mtm[np.ix_(row_at[i], col_at[k])]
        return out

    diagonal = np.asarray(feat.multiply(feat).sum(0)).ravel() + np.tile(mtm.diagonal(), in_c) + 1e-300

    def factorise(idx: np.ndarray) -> tuple[_BorderedFactor, torch.Tensor, bool]:
        """The Cholesky factor of the Jacobi-scaled normal matrix on ``idx``, the scale, and whether
        every pivot is above :data:`PIVOT`."""
        block = normal_block(idx, idx)
        scale = block.diagonal().sqrt().clamp_min(1e-300)
        block /= scale[:, None]
        block /= scale[None, :]
        factor, info = torch.linalg.cholesky_ex(block)
        determined = len(idx) > 0 and not info and float(factor.diagonal().min()) ** 2 >= PIVOT
        return _BorderedFactor(factor), scale, determined

    pre = estimate.detach().double().cpu().flatten()
    support = np.nonzero((pre > -SUPPORT * pre.std()).numpy())[0]
    factor, scale, ok = factorise(support)
    if not ok:
        return None
    rebuilds, x, added = 0, np.zeros(n), np.zeros(0, dtype=np.int64)  # the last solution and added entries
    for _ in range(ROUNDS):
        if not ok:  # the support grew past what the systems determine: keep its positive part
            if rebuilds == REBUILDS:
                return None
            rebuilds += 1
            support = np.union1d(support[x[support] > 0], added)
            factor, scale, ok = factorise(support)
            continue
        solved = factor.solve((rhs[support] / scale).unsqueeze(1)).squeeze(1) / scale
        x = np.zeros(n)
        x[support] = solved.numpy()
        res, slope = _residual_and_slope(feat, target, m, g, x)
        if _exact(res, x, rounding):
            return x
        outside = np.setdiff1d(np.arange(n), support)
        pull = slope[outside] / np.sqrt(diagonal[outside])  # the residual each entry alone would remove
        added = outside[pull < ADD * pull.min()] if pull.min() < 0 else outside[:0]
        if not len(added):
            return None
        cols = normal_block(np.concatenate([support, added]), added)
        new_scale = cols[len(support):].diagonal().sqrt().clamp_min(1e-300)
        cross = factor.forward(cols[:len(support)] / scale[:, None] / new_scale[None, :])
        corner, info = torch.linalg.cholesky_ex(cols[len(support):] / new_scale[:, None] / new_scale[None, :]
                                                - cross.T @ cross)
        factor.border(cross.T, corner)
        support, scale = np.concatenate([support, added]), torch.cat([scale, new_scale])
        ok = not info and float(corner.diagonal().min()) ** 2 >= PIVOT
    return None


def penultimate_activations(last: nn.Conv2d, features: torch.Tensor, error: torch.Tensor,
                            weight_grad: torch.Tensor, estimate: torch.Tensor, rounding: float = 0.0
                            ) -> torch.Tensor | None:
    """The activations ``a_p`` ``[1, C, H, W]`` (float64, on ``estimate``'s device) feeding ``last``
    (``padding=0``, ``dilation=1``, ``groups=1``) given its ReLU output ``features`` ``[1, O, h, w]``,
    the error ``error`` at its output and its weight gradient: from the weight gradient where it alone
    determines them (:func:`_determined_by_gradient`), otherwise by the active set with its support
    started from ``estimate``, the pre-activations of ``a_p`` computed from an approximate input;
    ``rounding``: the relative rounding ``error`` may carry against the client's own (module
    docstring); ``None`` when the systems do not determine them."""
    _, in_c, height, width = estimate.shape
    systems = _systems(last, features, error, weight_grad, (in_c, height, width))
    found = _determined_by_gradient(*systems)
    x, noise = found if found is not None else (None, 0.0)
    if x is None or noise > NOISY or not _exact(_residual_and_slope(*systems, x)[0], x, rounding, noise):
        # every solution leaves both systems a residual of at least noise / sqrt(2) (the gradient system's
        # own, of unit norm like the features'): past the active set's test, it cannot pass
        x = None if noise > 2 * (EXACT + rounding) else _active_set(*systems, estimate, rounding)
    if x is None:
        return None
    a = torch.from_numpy(x)
    a = torch.where(a > ZERO * max(-float(a.min()), 0.0), a, torch.zeros_like(a))
    return a.reshape(1, in_c, height, width).to(estimate.device)
