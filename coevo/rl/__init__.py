"""Multi-turn GRPO on stored trajectories: objective (grpo), credit assignment (estimators/:
grpo, gigpo, progress), tensors (batch), the Trainer (trainer), LoRA and checkpoints (lora),
and their configuration (config). The RL stage (stage) samples tasks (sampling) at per-task
temperatures (temperature)."""

from coevo.rl.batch import TrajectoryError, plan_grpo, plan_sft
from coevo.rl.config import LoraSettings, TrainConfig
from coevo.rl.grpo import group_advantages, groups_with_signal, policy_loss
from coevo.rl.lora import CheckpointError, CheckpointInfo, load_checkpoint, save_checkpoint
from coevo.rl.trainer import StepStats, Trainer

__all__ = [
    "CheckpointError", "CheckpointInfo", "LoraSettings", "StepStats", "TrainConfig", "Trainer",
    "TrajectoryError", "group_advantages", "groups_with_signal", "load_checkpoint",
    "plan_grpo", "plan_sft", "policy_loss", "save_checkpoint",
]
