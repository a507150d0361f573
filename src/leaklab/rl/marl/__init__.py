"""Cooperative multi-agent RL with privacy engineering: seed 003 (Gohari, thesis 2023), chapter 4.

* :mod:`leaklab.rl.marl.pe_vdn`: PE-VDN's per-agent loss, the team TD error assembled by a secure sum
  (:mod:`leaklab.privacy.secret_sharing`) so that no agent sees another's Q values, with gradients equal to
  centralised VDN's.
"""
