"""The names a user chooses from (datasets, models, settings, modes, ...), apart from the torch code
that implements them, so that the command line lists and checks them without loading torch. The
configurations' ``Literal`` types are built from these tuples (``Literal[SETTING_NAMES]``)."""

DATASET_NAMES = ("photos", "faces", "digits", "mnist")
MODEL_NAMES = ("lenet", "convnet", "resnet18", "mlp", "cnn")
PRIOR_NAMES = ("tv", "range", "l2")
UPDATE_NAMES = ("fedsgd", "fedavg")
BN_STATS_NAMES = ("batch", "running")  # BatchNorm statistics on an image client

SETTING_NAMES = ("S1", "S2")  # seed 000 V: S1 = RGB + depth + box, S2 = depth + box
ARCH_NAMES = ("small", "nature", "deep", "stacked")
ROOM_MODE_NAMES = ("exact", "paper")
ROOM_ATTACK_NAMES = ("qgi", "rgi")
RL_ALGORITHM_NAMES = ("dqn", "reinforce")
POLICY_NAMES = ("random", "agent")
AUDIT_KIND_NAMES = ("rooms", "images")  # leaklab audit --kind
