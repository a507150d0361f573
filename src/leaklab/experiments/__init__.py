"""Experiments: the only layer that holds both the client's truth and the attacker's reconstruction.

* :mod:`leaklab.experiments.capture`: a client update as the server sees it, written as a case folder;
* :mod:`leaklab.experiments.image_attack`: attack a case (inversion or analytic), evaluate, write results;
* :mod:`leaklab.experiments.image_audit`: the image audit (``leaklab audit --kind images``);
* :mod:`leaklab.experiments.room_attack`: the room attacks QGI and RGI on captured or fresh rooms;
* :mod:`leaklab.experiments.room_audit`: the main job behind ``make audit`` (rooms, with and without
  defenses), its reports drawn by :mod:`~leaklab.experiments.room_report`, its verdicts reached by
  :mod:`~leaklab.experiments.room_verdicts`;
* :mod:`leaklab.experiments.attack_pool` runs the room attacks in worker processes and
  :mod:`~leaklab.experiments.attack_journal` keeps them for a resumed run;
* :mod:`leaklab.experiments.room_tables`, :mod:`~leaklab.experiments.bayes_table2`,
  :mod:`~leaklab.experiments.dp_vs_inversion`, :mod:`~leaklab.experiments.inversion_checks`,
  :mod:`~leaklab.experiments.at_features`: the reproductions and reference checks behind ``leaklab reproduce``.

Progress callbacks used here have the form ``progress(task, completed, total)`` (:data:`ProgressFn`);
``completed`` may be fractional: the room attacks count a running attack's share of its image stage.
"""

from collections.abc import Callable

ProgressFn = Callable[[str, float, int], None]
