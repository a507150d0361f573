"""QGI's action behind noise: eq. 7's rule against three readings that use more of the update. Per defense
chain, how many of ``--samples`` updates each names right:

* ``bias_rule``: eq. 7, the largest entry of the last bias gradient (what QGI does, both modes);
* ``row_energy``: the row of the last layer's whole gradient ``[dW | db]`` with the most energy (DQN's error
  is one-hot, so that row alone carries ``δ_a [h, 1]``; the others hold noise only);
* ``matched``: the row whose projection on ``[h, 1]`` is largest, ``h`` the last layer's input computed
  from the fused vector read off ``head.0``'s gradient;
* ``head0``: the last layer's weight row most aligned with ``head.0``'s error direction (the leading left
  singular vector of ``head.0``'s ``[db | dW]``), which is ``δ_a W_last[a]`` through the ReLU.

    .venv/bin/python analysis/action_behind_noise.py --setting S2 --samples 48 \\
        --defenses "gaussian:0.1;gaussian:0.3;gaussian:1;clip:1,gaussian:0.21472"
"""

from __future__ import annotations

import json

import torch

from leaklab.attacks.inversion.analytic import linear_input
from leaklab.rl.capture import defended

from room_captures import captures


def main() -> None:
    args, config, state, samples = captures(__doc__.splitlines()[0], ("qgi",), "gaussian:0.1;gaussian:0.3;gaussian:1")
    last = max(int(k.split(".")[1]) for k in state if k.startswith("head."))
    for chain in args.defenses.split(";"):
        bias = rows = matched = head = 0
        for sample in samples:
            update = defended(sample.update, chain, config.seed, sample.index).tensors
            db, dw = update[f"head.{last}.bias"].double(), update[f"head.{last}.weight"].double()
            truth = int(sample.truth["action"].reshape(-1)[0])
            bias += int(db.abs().argmax()) == truth
            rows += int((dw.pow(2).sum(1) + db.pow(2)).argmax()) == truth
            w0, b0 = update["head.0.weight"].double(), update["head.0.bias"].double()
            fused = linear_input(w0, b0)
            h = torch.relu(state["head.0.weight"].double() @ fused + state["head.0.bias"].double())
            matched += int((dw @ h + db).abs().argmax()) == truth
            u = torch.linalg.svd(torch.cat([b0[:, None], w0], 1), full_matrices=False)[0][:, 0]
            wl = state[f"head.{last}.weight"].double()
            head += int(((wl @ u).abs() / wl.norm(dim=1)).argmax()) == truth
        print(json.dumps({"setting": args.setting, "defense": chain, "updates": len(samples),
                          "bias_rule": bias, "row_energy": rows, "matched": matched, "head0": head}), flush=True)


if __name__ == "__main__":
    main()
