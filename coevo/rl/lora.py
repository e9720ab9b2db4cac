"""LoRA setup (peft) and trainer checkpoints that resume bit-exactly.

A checkpoint directory keeps the standard peft layout, so any consumer can load it with
`PeftModel.from_pretrained(base, dir)`:

    adapter_model.safetensors   the adapter weights (full fine-tuning: model.safetensors)
    adapter_config.json         peft's LoraConfig (full fine-tuning: config.json)
    trainer_state.pt            AdamW state, RNG states, step, the teacher schedule's running
                                means (coevo/rl/teacher.py) (plain tensors / numbers only,
                                loaded with torch.load(weights_only=True): no pickled code)
    coevo_checkpoint.json       CheckpointInfo: sha256 of the weights file, step, base model

Resuming restores the adapter, the optimizer moments and step counts, and the torch RNG, so
2 steps + save + load into a fresh trainer + 2 steps equals 4 uninterrupted steps exactly.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load_file

from coevo.errors import CoevoError
from coevo.rl.config import LoraSettings

if TYPE_CHECKING:
    from coevo.rl.trainer import Trainer

ADAPTER_FILE = "adapter_model.safetensors"
FULL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "coevo_checkpoint.json"


class CheckpointError(CoevoError):
    """A checkpoint directory is missing a file, corrupt, or does not fit the trainer."""


class CheckpointInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # the checkpoint directory
    sha256: str  # of the weights file (adapter_model.safetensors, or model.safetensors)
    step: int
    base_model: str


def apply_lora(model: torch.nn.Module, settings: LoraSettings):
    """Wrap `model` with a fresh LoRA adapter (B = 0: the policy starts equal to the base)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules), bias="none", task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:  # e.g. no module matches target_modules
        raise CheckpointError(f"lora.target_modules: {exc}") from None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, _, gauss = random.getstate()
    random.setstate((version, tuple(state["python"]), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(trainer: "Trainer", directory: str | Path) -> CheckpointInfo:
    """Write the adapter (safetensors), optimizer and RNG state; return what was written."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lora = trainer.config.lora.enabled
    # peft writes adapter_model.safetensors + adapter_config.json; a plain transformers model
    # writes model.safetensors + config.json.
    trainer.model.save_pretrained(str(d), safe_serialization=True)
    weights = d / (ADAPTER_FILE if lora else FULL_FILE)
    if not weights.is_file():
        raise CheckpointError(f"{weights}: expected weights file was not written")
    torch.save({
        "optimizer": trainer.optimizer.state_dict(),
        "param_names": [n for n, _ in trainer.named_trainable_parameters()],
        "rng": _rng_state(),
        "step": trainer.step_count,
        "teacher": trainer.teacher.state_dict(),
    }, d / STATE_FILE)
    info = CheckpointInfo(path=str(d), sha256=file_sha256(weights), step=trainer.step_count,
                          base_model=trainer.base_model)
    (d / INFO_FILE).write_text(json.dumps({**info.model_dump(), "weights": weights.name,
                                           "train_config": trainer.config.model_dump(mode="json")},
                                          indent=2))
    return info


def read_info(directory: str | Path) -> CheckpointInfo:
    p = Path(directory) / INFO_FILE
    if not p.is_file():
        raise CheckpointError(f"{p}: missing (not a coevo checkpoint)")
    data = json.loads(p.read_text())
    return CheckpointInfo(path=str(Path(directory)), sha256=data["sha256"], step=data["step"],
                          base_model=data["base_model"])


def load_checkpoint(trainer: "Trainer", directory: str | Path) -> CheckpointInfo:
    """Restore weights, optimizer and RNG into `trainer` (built like the saving one)."""
    d = Path(directory)
    info = read_info(d)
    lora = trainer.config.lora.enabled
    weights = d / (ADAPTER_FILE if lora else FULL_FILE)
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    actual = file_sha256(weights)
    if actual != info.sha256:
        raise CheckpointError(f"{weights}: sha256 {actual[:12]} does not match the recorded "
                              f"{info.sha256[:12]} ({INFO_FILE})")
    tensors = load_file(str(weights), device=str(trainer.device))
    try:
        if lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(trainer.model, tensors)
            unexpected = list(getattr(result, "unexpected_keys", []) or [])
            if unexpected:
                raise CheckpointError(f"{weights}: keys the trainer's adapter lacks: {unexpected[:3]}")
        else:
            missing, unexpected = trainer.model.load_state_dict(tensors, strict=False)
            if unexpected:
                raise CheckpointError(f"{weights}: unexpected keys {unexpected[:3]}")
    except RuntimeError as exc:  # shape mismatch: another rank or model
        raise CheckpointError(f"{weights}: does not fit the trainer's model: "
                              f"{str(exc).splitlines()[0]}") from None
    state_path = d / STATE_FILE
    if not state_path.is_file():
        raise CheckpointError(f"{state_path}: missing")
    # On the CPU: torch's RNG setters take CPU byte tensors only (a CUDA generator's state
    # mapped to the GPU is refused), and the optimizer's load_state_dict moves its state to
    # each parameter's device itself.
    state = torch.load(state_path, map_location="cpu", weights_only=True)
    names = [n for n, _ in trainer.named_trainable_parameters()]
    if state["param_names"] != names:
        raise CheckpointError(f"{state_path}: param_names: the optimizer state was saved for "
                              "different trainable parameters (other LoRA settings?)")
    trainer.optimizer.load_state_dict(state["optimizer"])
    _set_rng_state(state["rng"])
    trainer.step_count = int(state["step"])
    trainer.teacher.load_state_dict(state.get("teacher") or {})  # absent: saved before teachers
    return info
