"""The names a user chooses from (datasets, image models, inversion priors), apart from the torch code
that implements them, so that the command line lists them without loading torch."""

DATASET_NAMES = ("photos", "faces", "digits", "mnist")
MODEL_NAMES = ("lenet", "convnet", "resnet18", "mlp", "cnn")
PRIOR_NAMES = ("tv", "range", "l2")
