"""The record of one episode: what the policy saw, sampled and was rewarded for.

The whole episode is one token sequence (`token_ids`), built incrementally by the runtime:
prompt tokens, then each turn's sampled tokens, then the tokenized observation and the next
assistant header, and so on. `loss_mask[i] == 1` exactly where token i was sampled by the policy;
prompt, tool output and observation tokens have mask 0. Training uses these ids as they are,
never a re-tokenized transcript (re-tokenizing text can split tokens differently from what was
sampled, which silently trains on sequences the policy never produced).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coevo.models.constrain import Constraint


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ToolResult(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    content: str
    error: str | None = None  # unknown tool, bad arguments, exception, timeout: an observation
    seconds: float = 0.0

    @classmethod
    def failed(cls, name: str, message: str, seconds: float = 0.0) -> "ToolResult":
        """The error observation the agent reads: content `Error: <message>`.

        >>> ToolResult.failed("add", "bad arguments").content
        'Error: bad arguments'
        """
        return cls(name=name, content=f"Error: {message}", error=message, seconds=seconds)


class TurnSampling(BaseModel):
    """The settings that shaped the distribution a turn's tokens were drawn from (with the
    turn's `constraint`, everything the trainer needs to recompute their log-probabilities)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


class Turn(BaseModel):
    """One policy step. `start:end` is the span of its sampled tokens inside `token_ids`.
    `sampling` and `constraint` say how they were sampled; trajectories stored before these
    fields existed read as None: the raw distribution, unconstrained."""

    model_config = ConfigDict(extra="forbid")
    index: int
    start: int
    end: int
    text: str
    finish_reason: str = "stop"  # stop | length | error
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_results: list[ToolResult] = Field(default_factory=list)
    parse_error: str | None = None
    seconds: float = 0.0
    sampling: TurnSampling | None = None
    constraint: Constraint | None = None


Status = Literal["ok", "infra_error"]


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    env: str
    task_id: str
    split: str = "train"
    group_id: str | None = None  # GRPO group: same task, same assets, G samples
    sample_index: int = 0
    seed: int = 0

    messages: list[dict[str, Any]] = Field(default_factory=list)
    token_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)  # sampling logprob; 0.0 where mask is 0
    prompt_len: int = 0  # tokens of the first prompt (shared by a group)
    turns: list[Turn] = Field(default_factory=list)
    trainable: bool = True  # False when the backend returned no token ids / logprobs

    answer: str | None = None
    outcome: float | None = None  # the environment verifier's score in [0, 1]; None if not run
    success: bool = False
    criteria: dict[str, float] = Field(default_factory=dict)  # per rubric criterion, in [0, 1]
    reward: float | None = None
    status: Status = "ok"
    error: str | None = None

    active_skills: list[str] = Field(default_factory=list)
    harness: str | None = None  # content hashes of the asset versions used
    skill_library: str | None = None
    rubric: str | None = None
    checkpoint: str | None = None  # the newest stored checkpoint the sampling policy descends from
    # RL rollouts: trainer steps applied to the weights that sampled (None outside RL). The exact
    # weights are `checkpoint` when its step equals this, else it plus the run's later updates.
    policy_step: int | None = None
    model: str = ""
    timings: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aligned(self) -> "Trajectory":
        n = len(self.token_ids)
        if self.loss_mask and len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} tokens")
        if self.logprobs and len(self.logprobs) != n:
            raise ValueError(f"logprobs has {len(self.logprobs)} entries for {n} tokens")
        return self

    @property
    def infra_failed(self) -> bool:
        return self.status == "infra_error"

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)
