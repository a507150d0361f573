"""Experiments: the only layer that holds both the client's truth and the attacker's reconstruction.

* :mod:`leaklab.experiments.capture`: a client update as the server sees it, written as a case folder;
* :mod:`leaklab.experiments.image_attack`: attack a case (inversion or analytic), evaluate, write results;
* :mod:`leaklab.experiments.image_audit`: the default image audit behind ``make audit``.

Progress callbacks used here have the form ``progress(task, completed, total)``.
"""
