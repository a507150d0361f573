"""Cooperative multi-agent RL with privacy engineering: seed 003 (Gohari, thesis 2023), chapter 4.

* :mod:`leaklab.rl.marl.pe_vdn`: PE-VDN's per-agent loss, the team TD error assembled by a secure sum
  (:mod:`leaklab.privacy.secret_sharing`) so that no agent sees another's Q values, with gradients equal to
  centralised VDN's;
* :mod:`leaklab.rl.marl.pe_qmix`: PE-QMIX's per-agent mixer shares, the mixer evaluated layer by layer through secure
  sums, gradients equal to those of the centralised mixer of summed layers;
* :mod:`leaklab.rl.marl.pe_qtran`: PE-QTRAN's per-agent encoders and shares of the team and state values, QTRAN's
  three losses through secure sums, gradients equal to centralised QTRAN's;
* :mod:`leaklab.rl.marl.team_training`: IQL, VDN, PE-VDN, PE-QMIX, PE-QTRAN and DP PE-VDN on cooperative navigation.
"""
