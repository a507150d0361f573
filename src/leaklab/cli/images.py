"""Commands on image classifiers' updates: ``leaklab capture`` and ``leaklab attack inversion|analytic|features``
(seed 001's attacks, the analytic recovery and seed 004's two-step attack).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError

from leaklab.cli.app import _guard, app, attack_app
from leaklab.cli.options import ATTACK, CAPTURE, OutOpt, _choice, _defense_chain, _seed_opt
from leaklab.cli.progress import _progress
from leaklab.errors import LeaklabError, validation_message
from leaklab.names import BN_STATS_NAMES, DATASET_NAMES, MODEL_NAMES, PRIOR_NAMES, UPDATE_NAMES
from leaklab.words import cosine_text, percent_text, plural


def _echo_summary(out: Path, results: dict) -> None:
    s = results.get("summary", {})
    parts = []
    if s.get("psnr_mean") is not None:
        parts.append(f"PSNR {s['psnr_mean']:.2f} dB (constant-image baseline {s['psnr_baseline_mean']:.2f} dB)")
        parts.append(f"SSIM {s['ssim_mean']:.3f}")
    if results.get("view", {}).get("capabilities", {}).get("knows_labels"):
        parts.append("labels given")
    elif s.get("label_accuracy") is not None:
        parts.append(f"labels {percent_text(s['label_accuracy'])}")
    capture = results.get("config", {}).get("capture") or {}
    defended = results.get("view", {}).get("defense") or capture.get("soteria_layer")  # what changes the update
    if defended and s.get("update_cosine_median") is not None:  # as captured
        parts.append(f"update kept (cosine with the true one) {cosine_text(s['update_cosine_median'])}")
    parts.append(f"{plural(s['images'], 'image') if 'images' in s else '? images'}, {s.get('seconds', 0):.1f} s")
    typer.echo(f"wrote {out}: " + ", ".join(parts))


def _model_opt(default: str) -> Any:
    return _choice("--model", MODEL_NAMES, f"(default {default})", rich_help_panel=CAPTURE)


ModelOpt = Annotated[Optional[str], _model_opt("convnet")]
DataOpt = Annotated[Optional[str], _choice("--data", DATASET_NAMES, "(default photos)", rich_help_panel=CAPTURE)]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-size", help="images per update (default 1)",
                                                 rich_help_panel=CAPTURE)]
NumOpt = Annotated[Optional[int], typer.Option("--num-images",
                                               help="private images in all (a multiple of --batch-size) "
                                                    "(default 1)", rich_help_panel=CAPTURE)]
ImageSeedOpt = Annotated[Optional[int], _seed_opt("which images (default 0)", "--image-seed",
                                                     rich_help_panel=CAPTURE)]
SizeOpt = Annotated[Optional[int], typer.Option("--image-size", help="pixels per side (default 32)",
                                                rich_help_panel=CAPTURE)]
WidthOpt = Annotated[Optional[int], typer.Option("--width", help="model width (convnet 64, resnet18 64, mlp 500, "
                                                 "cnn 32, convbig 32, precode 500 by default; lenet has none)",
                                                 rich_help_panel=CAPTURE)]
DefenseOpt = Annotated[Optional[str], typer.Option("--defense",
                                                   help="defense chain, e.g. prune:0.5,gaussian:0.1 "
                                                        "(gaussian:σ laplace:b prune:p topk:p clip:c) "
                                                        "(default none)", rich_help_panel=CAPTURE,
                                                   callback=_defense_chain)]
TrainOpt = Annotated[Optional[int], typer.Option("--train-steps", help="SGD steps on other images before "
                                                 "the round (default 0)", rich_help_panel=CAPTURE)]
KnowsLabelsOpt = Annotated[Optional[bool], typer.Option("--knows-labels/--no-knows-labels",
                                                        help="grant the server the labels "
                                                             "(default no)", rich_help_panel=CAPTURE)]
UpdateOpt = Annotated[Optional[str], _choice("--update", UPDATE_NAMES, "(default fedsgd)", rich_help_panel=CAPTURE)]
LocalStepsOpt = Annotated[Optional[int], typer.Option("--local-steps", help="FedAvg local steps "
                                                      "(default 1)", rich_help_panel=CAPTURE)]
BnStatsOpt = Annotated[Optional[str], _choice("--bn-stats", BN_STATS_NAMES, "(BatchNorm statistics on the client; "
                                              "default batch)", rich_help_panel=CAPTURE)]
LocalLrOpt = Annotated[Optional[float], typer.Option("--local-lr", help="FedAvg local learning rate "
                                                     "(default 0.1)", rich_help_panel=CAPTURE)]
AdversarialOpt = Annotated[Optional[float], typer.Option("--adversarial-eps", help="the client trains "
                                                         "adversarially (--train-steps and its update): Madry's L2 "
                                                         "PGD of this radius, pixels in [0, 1] (default: it does "
                                                         "not)", rich_help_panel=CAPTURE)]
AtsOpt = Annotated[Optional[str], typer.Option("--ats", help="ATS (seed 001 section 5): the client augments its "
                                                "training and private images with this policy of ATS's table, e.g. "
                                                "7-4-15 or 21-13-3+7-4-15 (default: it does not)",
                                                rich_help_panel=CAPTURE)]
SoteriaLayerOpt = Annotated[Optional[str], typer.Option("--soteria-layer", help="Soteria (seed 001 section 5) "
                                                        "prunes this fully connected layer's weight gradient, e.g. "
                                                        "classifier.0 (default: no Soteria)",
                                                        rich_help_panel=CAPTURE)]
SoteriaRateOpt = Annotated[Optional[float], typer.Option("--soteria-rate", help="the fraction of its columns "
                                                         "Soteria prunes (default 0.8)", rich_help_panel=CAPTURE)]

CaseOpt = Annotated[Optional[Path], typer.Option("--case", help="case folder from `leaklab capture`; without it, "
                                                "the capture options make one in OUT/case")]
_CAPTURE_FIELDS = ("model", "data", "batch_size", "num_images", "image_seed", "image_size", "width",
                   "defense", "train_steps", "knows_labels", "update", "local_steps", "local_lr", "bn_stats",
                   "adversarial_eps", "ats", "soteria_layer", "soteria_rate")


def _capture_fields(options: dict[str, Any]) -> dict[str, Any]:
    """The capture options among a command's parameters (the one-shot attack forms)."""
    return {name: options[name] for name in _CAPTURE_FIELDS}


def _capture_config(seed: int | None, **fields: Any):
    from leaklab.experiments.capture import CaptureConfig

    given = {k: v for k, v in fields.items() if v is not None}
    if "local_lr" in given and given.get("update", "fedsgd") == "fedsgd":
        raise LeaklabError("--local-lr applies to FedAvg updates; add --update fedavg")
    if seed is not None:
        given["seed"] = seed
    return CaptureConfig(**given)


@app.command()
@_guard
def capture(
    out: Annotated[Path, typer.Option("--out", help="case folder to write")],
    model: ModelOpt = None, data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None,
    seed: Annotated[Optional[int], _seed_opt("model initialisation and defense noise (default 0)")] = None,
    train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None, update: UpdateOpt = None,
    local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None, bn_stats: BnStatsOpt = None,
    adversarial_eps: AdversarialOpt = None, ats: AtsOpt = None, soteria_layer: SoteriaLayerOpt = None,
    soteria_rate: SoteriaRateOpt = None,
) -> None:
    """Capture what the server sees of a client round (view, model, updates) and the client's truth."""
    from leaklab.experiments import capture as capture_mod

    config = _capture_config(seed, **_capture_fields(locals()))
    with _progress() as progress:
        result = capture_mod.run(config, out, progress)
    defended = capture_mod.defenses_text(config.model_dump()) or "none"
    typer.echo(f"wrote {out}: {plural(len(result.updates), 'update')} of {plural(config.batch_size, 'image')}, "
               f"model {result.spec.name}, defense {defended}")


def _attack_opt(flag: str, text: str, field: str, more: str = "", key: str | None = None) -> Any:
    """An attack option whose help ends with its default (``key``: of a mapping field) and ``more``,
    read from :class:`InversionConfig`, the one place the default is set; a field of named values
    (a ``Literal``) is a :func:`_choice` of those names, ``text`` then saying what it is."""
    from typing import Literal, get_args, get_origin

    from leaklab.attacks.inversion.config import InversionConfig

    value = getattr(InversionConfig(), field)
    default = f"default {value if key is None else value[key]}{more}"
    annotation = InversionConfig.model_fields[field].annotation
    if get_origin(annotation) is Literal:
        return _choice(flag, get_args(annotation), f"({text}; {default})" if text else f"({default})",
                       rich_help_panel=ATTACK)
    return typer.Option(flag, help=f"{text} ({default})", rich_help_panel=ATTACK)


@attack_app.command("inversion")
@_guard
def attack_inversion(
    out: OutOpt,
    case: CaseOpt = None,
    objective: Annotated[Optional[str], _attack_opt("--objective", "", "objective")] = None,
    optimizer: Annotated[Optional[str], _attack_opt("--optimizer", "", "optimizer")] = None,
    iterations: Annotated[Optional[int], _attack_opt("--iterations", "optimisation steps", "iterations")] = None,
    lr: Annotated[Optional[float], _attack_opt("--lr", "step size", "lr", "; lbfgs 1")] = None,
    schedule: Annotated[Optional[str], _attack_opt("--schedule", "the learning rate's", "schedule")] = None,
    tv: Annotated[Optional[float], _attack_opt("--tv", "total-variation prior weight, relative to the data "
                                               "term's gradient at the start (prior_scale: absolute in --config), "
                                               "0: off", "priors",
                                               "; lbfgs 0", key="tv")] = None,
    prior: Annotated[Optional[list[str]], typer.Option("--prior", help=f"NAME=WEIGHT, repeatable ({', '.join(PRIOR_NAMES)}): "
                                                       "sets the priors it names, keeps the others (0 removes one); "
                                                       "weights relative as --tv's",
                                                       rich_help_panel=ATTACK)] = None,
    restarts: Annotated[Optional[int], _attack_opt("--restarts", "independent starts, the best kept",
                                                   "restarts")] = None,
    precision: Annotated[Optional[str], _attack_opt("--precision", "", "precision")] = None,
    init: Annotated[Optional[str], _attack_opt("--init", "the starting images", "init")] = None,
    mc_samples: Annotated[Optional[int], _attack_opt("--mc-samples", "k of Algorithm 1", "mc_samples")] = None,
    mc_radius: Annotated[Optional[float], _attack_opt("--mc-radius", "delta of Algorithm 1", "mc_radius")] = None,
    drop: Annotated[Optional[list[str]], typer.Option("--drop", help="a parameter tensor left out of the "
                                                      "comparison, repeatable (seed 001's attack on Soteria drops "
                                                      "the defended layer's weight, e.g. classifier.0.weight)",
                                                      rich_help_panel=ATTACK)] = None,
    config_file: Annotated[Optional[Path], typer.Option("--config", help="YAML/JSON file of "
                                                        "InversionConfig fields; options override it",
                                                        rich_help_panel=ATTACK)] = None,
    seed: Annotated[Optional[int], _seed_opt("attack seed (and, one-shot, the capture seed) (default 0)")] = None,
    model: ModelOpt = None, data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None, train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None,
    update: UpdateOpt = None, local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None,
    bn_stats: BnStatsOpt = None, adversarial_eps: AdversarialOpt = None, ats: AtsOpt = None,
    soteria_layer: SoteriaLayerOpt = None, soteria_rate: SoteriaRateOpt = None,
) -> None:
    """Gradient inversion (DLG, Inverting Gradients, Bayes) of every update of a case."""
    from leaklab.experiments import image_attack
    from leaklab.io import IMAGE_ATTACK_FORMAT, check_out, read_config

    capture_fields = _capture_fields(locals())
    if config_file:  # the config is an input too: an --out that holds it would delete it
        check_out(out, IMAGE_ATTACK_FORMAT, inputs=[config_file])
    base = read_config(config_file) if config_file else None
    alone = None  # a rule across the file's fields that it breaks on its own
    if base is not None:  # the file's own mistakes named in the file, not as options never typed
        from leaklab.attacks.inversion.config import InversionConfig

        try:  # as written: `restarts: true` is not 1, `seed: 2.0` not 2
            InversionConfig.model_validate(base, strict=True)
            image_attack.inversion_config(base)
        except ValidationError as e:  # a rule across fields waits for the options, which may complete the file
            if any(err.get("loc") for err in e.errors()):
                raise LeaklabError(validation_message(e, f"--config {config_file}")) from None
            alone = validation_message(e)
    try:
        config = image_attack.inversion_config(
            base, objective=objective, optimizer=optimizer, iterations=iterations, lr=lr, schedule=schedule,
            priors=image_attack.parse_priors(prior, tv), restarts=restarts, precision=precision, init=init,
            mc_samples=mc_samples, mc_radius=mc_radius, drop=drop or None, seed=seed)
    except ValidationError as e:  # the file's rule the options left broken is named in the file
        if alone is not None and validation_message(e) == alone:
            raise LeaklabError(f"--config {config_file}: {alone}") from None
        raise
    _attack(out, case, "inversion", config, seed, capture_fields)


@attack_app.command("analytic")
@_guard
def attack_analytic(
    out: OutOpt,
    case: CaseOpt = None,
    seed: Annotated[Optional[int], _seed_opt("one-shot capture seed (default 0)")] = None,
    model: Annotated[Optional[str], _model_opt("mlp")] = None,
    data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None, train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None,
    update: UpdateOpt = None, local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None,
    bn_stats: BnStatsOpt = None, adversarial_eps: AdversarialOpt = None, ats: AtsOpt = None,
    soteria_layer: SoteriaLayerOpt = None, soteria_rate: SoteriaRateOpt = None,
) -> None:
    """Exact recovery of the input of a first fully connected layer (mlp, precode; one image per update)."""
    capture_fields = _capture_fields(locals())
    if case is not None and seed is not None:
        raise LeaklabError("--seed is the one-shot capture's seed; the analytic attack of --case draws nothing")
    if case is None and capture_fields["model"] is None and any(v is not None for v in capture_fields.values()):
        capture_fields["model"] = "mlp"  # the one model whose first layer is fully connected
    _attack(out, case, "analytic", None, seed, capture_fields)


def _features_opt(flag: str, text: str, field: str) -> Any:
    """A features-attack option whose help ends with its default, read from :class:`FeatureInversionConfig`."""
    from leaklab.attacks.inversion.config import FeatureInversionConfig

    return typer.Option(flag, help=f"{text} (default {getattr(FeatureInversionConfig(), field)})",
                        rich_help_panel=ATTACK)


@attack_app.command("features")
@_guard
def attack_features(
    out: OutOpt,
    case: CaseOpt = None,
    iterations: Annotated[Optional[int], _features_opt("--iterations", "Adam steps", "iterations")] = None,
    lr: Annotated[Optional[float], _features_opt("--lr", "Adam's initial step size, annealed to 0", "lr")] = None,
    tv: Annotated[Optional[float], _features_opt("--tv", "total-variation weight", "tv")] = None,
    restarts: Annotated[Optional[int], _features_opt("--restarts", "random starts, the lowest loss kept",
                                                     "restarts")] = None,
    seed: Annotated[Optional[int], _seed_opt("attack seed (and, one-shot, the capture seed) (default 0)")] = None,
    model: ModelOpt = None, data: DataOpt = None, batch_size: BatchOpt = None, num_images: NumOpt = None,
    image_seed: ImageSeedOpt = None, image_size: SizeOpt = None, width: WidthOpt = None,
    defense: DefenseOpt = None, train_steps: TrainOpt = None, knows_labels: KnowsLabelsOpt = None,
    update: UpdateOpt = None, local_steps: LocalStepsOpt = None, local_lr: LocalLrOpt = None,
    bn_stats: Annotated[Optional[str], _choice("--bn-stats", BN_STATS_NAMES, "(BatchNorm statistics on the "
                                               "client; default running: the attack cannot reproduce one image's "
                                               "features under a batch's)", rich_help_panel=CAPTURE)] = None,
    adversarial_eps: AdversarialOpt = None, ats: AtsOpt = None, soteria_layer: SoteriaLayerOpt = None,
    soteria_rate: SoteriaRateOpt = None,
) -> None:
    """Seed 004's two-step attack: each image's feature from the last layer's batch gradient, then the image."""
    from leaklab.attacks.inversion.config import FeatureInversionConfig

    capture_fields = _capture_fields(locals())
    if case is None and bn_stats is None and any(v is not None for v in capture_fields.values()):
        capture_fields["bn_stats"] = "running"
    given = {k: v for k, v in dict(iterations=iterations, lr=lr, tv=tv, restarts=restarts, seed=seed).items()
             if v is not None}
    _attack(out, case, "features", FeatureInversionConfig(**given), seed, capture_fields)


def _attack(out: Path, case: Path | None, method: str, config, seed: int | None,
            capture_fields: dict[str, Any]) -> None:
    from leaklab.experiments import image_attack

    given = sorted("--" + k.replace("_", "-") for k, v in capture_fields.items() if v is not None)
    with _progress() as progress:
        if case is not None:
            if given:
                raise LeaklabError(f"--case reads a captured case; capture options ({', '.join(given)}) "
                                   "belong to the one-shot form without --case")
            results = image_attack.run(case, out, method, config, progress=progress)
        else:
            if not given:
                raise LeaklabError("give --case CASE, or capture options (--model, --data, ...) to "
                                   "capture and attack in one go")
            capture_config = _capture_config(seed, **capture_fields)
            results = image_attack.run_oneshot(capture_config, out, method, config, progress=progress)
    _echo_summary(out, results)
