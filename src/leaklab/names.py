"""The names a user chooses from (datasets, models, settings, modes, ...), apart from the torch code
that implements them, so that the command line lists and checks them without loading torch. The
configurations' ``Literal`` types are built from these tuples (``Literal[SETTING_NAMES]``)."""

DATASET_NAMES = ("photos", "faces", "digits", "mnist")
MODEL_NAMES = ("lenet", "convnet", "resnet18", "mlp", "cnn", "convbig", "precode")
PRIOR_NAMES = ("tv", "range", "l2", "l1")
OBJECTIVE_NAMES = ("l2", "l1", "cosine", "bayes")  # gradient-matching objectives of the image attacks
LAYER_WEIGHTING_NAMES = ("none", "linear", "exp")  # how those objectives weight the parameter tensors
UPDATE_NAMES = ("fedsgd", "fedavg")
BN_STATS_NAMES = ("batch", "running")  # BatchNorm statistics on an image client

SETTING_NAMES = ("S1", "S2")  # seed 000 V: S1 = RGB + depth + box, S2 = depth + box
ARCH_NAMES = ("small", "nature", "wide-rgb", "deep", "stacked")
# the perception network unless --arch says otherwise: as cheap to attack as `small` and its S1 RGB frames leak
# (docs/reproductions.md, "Table I, exact mode, the RGB stream 64 wide")
DEFAULT_ARCH = "wide-rgb"
ROOM_MODE_NAMES = ("exact", "paper")
ROOM_ATTACK_NAMES = ("qgi", "rgi")
TABLE1_CELLS = tuple(f"{a}-{s}" for a in ROOM_ATTACK_NAMES for s in SETTING_NAMES)  # room-table1 --cells: qgi-S1 ...
RL_ALGORITHM_NAMES = ("dqn", "reinforce")
POLICY_NAMES = ("random", "agent")
AUDIT_KIND_NAMES = ("rooms", "images")  # leaklab audit --kind
INVERSION_CHECK_NAMES = ("dlg", "idlg", "analytic", "ig", "ig_batch_stats")  # reproduce inversion-checks

DEFENSE_NAMES = ("gaussian", "laplace", "prune", "topk", "clip")  # steps of a --defense chain
NOISE_DEFENSE_NAMES = ("gaussian", "laplace")  # the steps of a chain that add noise
DEVICE_PATTERN = r"^(cpu|cuda(:\d+)?)$"  # the room attacks' --device values

PPO_OPTIMIZER_NAMES = ("adam", "sgd")  # PPO's optimisers (leaklab.rl.agents.ppo): Adam, or eq. 3.7's plain SGD
ACCOUNTANT_NAMES = ("rdp", "prv", "pld")  # DP-SGD accountants (leaklab.privacy.accounting)
MECHANISM_NAMES = ("laplace", "gaussian", "exponential", "randomized-response", "dirichlet")  # audit cases
MECHANISM_ALIASES = {"rr": "randomized-response"}
AUDIT_TEST_NAMES = ("split", "scan")  # how an audit picks its threshold (leaklab.privacy.audit)
MAX_THREADS = 1024  # torch threads (--threads, LEAKLAB_THREADS): a million made its pool fail to map stacks, a segfault
# the active-perception rooms' movements (seed 000, section III)
ROOM_ACTION_NAMES = ("forward", "backward", "strafe_left", "strafe_right", "turn_left", "turn_right", "stay")
MAX_TRAIN_STEPS = 10_000_000  # an agent's most environment steps of training (AgentConfig, --train-steps, --steps)

# ``leaklab reproduce pe-marl``'s methods (seed 003 chapter 4), in the order they train
PE_MARL_METHODS = ("iql", "vdn", "pe-vdn", "pe-qmix", "pe-qtran", "dp-pe-vdn", "dp-pe-qmix", "dp-pe-qtran")
