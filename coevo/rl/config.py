"""Training configuration of the GRPO trainer (pydantic, extra="forbid": a typo is an error).

`TrainConfig.from_mapping(data, source)` turns validation failures into a one-line
`coevo.errors.AssetError` naming the file and field, for YAML sections read by the CLI.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coevo.errors import AssetError
from coevo.registry import choice_validators
from coevo.rl.estimators import ESTIMATORS
from coevo.rl.teacher import TeacherConfig


class LoraSettings(BaseModel):
    """The adapter trained by the RL stage (peft LoRA). `enabled=False` = full fine-tuning."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    rank: int = Field(16, ge=1)
    alpha: float = Field(32.0, gt=0.0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # Names (or suffixes) of the linear layers that get an adapter; llama-style defaults.
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    lora: LoraSettings = Field(default_factory=LoraSettings)

    # AdamW
    lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0.0)
    max_grad_norm: float | None = Field(1.0, gt=0.0)  # None = no clipping

    # Objective (see coevo/rl/grpo.py)
    advantage_scale: Literal["std", "none"] = "std"  # "none" = Dr. GRPO (no std division)
    advantage_eps: float = Field(1e-6, gt=0.0)
    clip_eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_eps_high: float = Field(0.28, ge=0.0)  # DAPO "clip-higher"; set 0.2 for symmetric PPO
    kl_coef: float = Field(0.0, ge=0.0)  # > 0 adds k3 KL to the base (adapter disabled)
    agg: Literal["token", "sequence"] = "token"
    # Credit assignment (coevo/rl/estimators/): grpo | gigpo | progress, with its options.
    estimator: str = "grpo"
    estimator_options: dict[str, Any] = Field(default_factory=dict)
    # On-policy distillation from the base model under a richer context (coevo/rl/teacher.py):
    # {kind: none | distill, harness, skill_library, demos, weight, schedule}.
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)

    # Schedule
    num_updates_per_batch: int = Field(1, ge=1)  # > 1: old log-probs recomputed before update 1
    # With one update the sampler's stored log-probs are the old policy; recompute them when
    # the sampler's numerics differ from training (another engine, quantized weights).
    recompute_old_logprobs: bool = False
    max_tokens_per_microbatch: int = Field(8192, ge=1)  # gradient accumulation unit
    shared_prompt: bool = True  # run a group's common prompt once per micro-batch
    warmup_steps: int = Field(0, ge=0)  # supervised steps on successful trajectories first

    _known_estimator, _estimator_options = choice_validators(
        ESTIMATORS, "estimator", "estimator_options")

    @model_validator(mode="after")
    def _kl_needs_adapter(self) -> "TrainConfig":
        # The reference policy is the base model with the adapter switched off; full
        # fine-tuning has no adapter to switch off and coevo keeps no second model copy.
        if self.kl_coef > 0 and not self.lora.enabled:
            raise ValueError("kl_coef > 0 needs lora.enabled (the reference is the base model "
                             "with the adapter disabled)")
        if self.teacher.kind != "none" and not self.lora.enabled:
            raise ValueError("teacher needs lora.enabled (the teacher is the base model with "
                             "the adapter disabled)")
        return self

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, source: str = "<train config>") -> "TrainConfig":
        try:
            return cls.model_validate(data or {})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or None
            raise AssetError(source, field, err["msg"]) from None
