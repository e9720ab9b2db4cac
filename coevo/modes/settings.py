"""The run-config blocks of the peer-method modes (`fst:`, `bettertogether:`, `skillopt:` in a
run config). Each is read only by its own mode; the other modes ignore it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

STAGES = {"p": "prompt optimization", "w": "weight optimization"}


class FstSettings(BaseModel):
    """fst: `every` RL steps between two reflective prompt-evolution rounds (T of Fast-Slow
    Training); an fst round is T RL steps, then one reflection round. None: rl.stage.steps."""

    model_config = ConfigDict(extra="forbid")
    every: int | None = Field(None, ge=1)


def parse_strategy(text: str) -> list[str]:
    """BetterTogether's strategy string as its stages: "p -> w -> p" -> ["p", "w", "p"].

    >>> parse_strategy("p -> w -> p")
    ['p', 'w', 'p']
    """
    stages = [s.strip() for s in text.split("->")]
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise ValueError(f"{text!r}: stages are p (prompts) or w (weights) joined by '->'; "
                         f"not {', '.join(repr(s) for s in bad)}")
    return stages


class BetterTogetherSettings(BaseModel):
    """bettertogether: the stages in order, one per round (cycling when rounds exceed them).
    `select`: how a p stage picks among its candidates: `mean` (BetterTogether's optimizers:
    the best val mean per kind, if strictly above the incumbent's) or `gate` (coevo's paired
    statistical gate, as the gated mode uses after its RL stage: the p -> w order with the
    gate's false-accept control)."""

    model_config = ConfigDict(extra="forbid")
    strategy: str = "p -> w -> p"
    select: Literal["mean", "gate"] = "mean"

    @field_validator("strategy")
    @classmethod
    def _parses(cls, v: str) -> str:
        parse_strategy(v)
        return v

    @property
    def stages(self) -> list[str]:
        return parse_strategy(self.strategy)


class SkillOptSettings(BaseModel):
    """skillopt: at most `max_edits` skill edits evaluated per step (SkillOpt's edit budget,
    its 'learning rate'); an edit is one member skill added, changed or removed."""

    model_config = ConfigDict(extra="forbid")
    max_edits: int = Field(1, ge=1)
