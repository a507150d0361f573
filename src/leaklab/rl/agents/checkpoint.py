"""Agent checkpoints: the network's tensors in safetensors with its :class:`PerceptionSpec` as JSON in
the file's header (never pickle). Loading validates the spec and every tensor against the network the
spec rebuilds (seed 000 section III networks)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from leaklab.errors import LeaklabError, validation_message
from leaklab.io import load_tensors, save_tensors
from leaklab.models import PerceptionNet, PerceptionSpec
from leaklab.threat import model_with_state

AGENT_FORMAT = "leaklab.agent"


def save_agent(path: Path, spec: PerceptionSpec, net: PerceptionNet, algorithm: str = "") -> str:
    """Write ``net`` (of ``spec``) to ``path``; returns the file's SHA-256. Only what :func:`load_agent` rebuilds:
    one of leaklab's networks, of ``spec`` (another spec of the same shapes loaded as that one; a user's own class
    saved and never loaded)."""
    if type(net) is not PerceptionNet:
        raise LeaklabError(f"save_agent writes leaklab's own perception networks, not a {type(net).__name__} "
                           "(a --model-class network: save its state_dict with safetensors yourself)")
    if net.spec != spec:
        raise LeaklabError(f"the network was built for {net.spec!r}, not the spec given ({spec!r}); pass net.spec")
    state = {k: v.detach() for k, v in net.state_dict().items()}
    return save_tensors(Path(path), state, {"format": AGENT_FORMAT, "spec": spec.model_dump_json(),
                                            "algorithm": algorithm})


def load_agent(path: Path) -> tuple[PerceptionSpec, PerceptionNet]:
    """Rebuild the network saved by :func:`save_agent`; a file of another kind, a bad spec or a tensor
    that does not fit is a :class:`LeaklabError`."""
    state, meta = load_tensors(Path(path), "agent")
    if meta.get("format") != AGENT_FORMAT:
        raise LeaklabError(f"{path} is not a leaklab agent checkpoint (format {meta.get('format')!r}); "
                           "save one with save_agent")
    try:
        spec = PerceptionSpec.model_validate(json.loads(meta.get("spec", "")))
    except ValidationError as e:
        raise LeaklabError(validation_message(e, f"{path}: spec")) from None
    except (ValueError, RecursionError):  # not JSON, too deep, or a number past Python's digit limit
        raise LeaklabError(f"{path}: the agent's spec is not valid JSON; save the agent again") from None
    try:
        return spec, model_with_state(spec, state)
    except LeaklabError as e:  # its words are a case's ("re-capture ..."): an agent is saved again
        raise LeaklabError(f"{path}: {str(e).split('; re-capture')[0]}; the file does not hold the network its spec "
                           "builds: save the agent again with save_agent") from None
