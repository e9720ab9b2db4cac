"""Advantage estimators (registry `ESTIMATORS`, chosen by `TrainConfig.estimator`).

Importing the package registers `grpo` (default), `gigpo` and `progress`."""

from coevo.rl.estimators.base import (
    ESTIMATORS,
    AdvantageEstimator,
    Credit,
    EstimatorContext,
    estimator_options,
    make_estimator,
    token_advantages,
)
from coevo.rl.estimators import grpo as _grpo  # noqa: F401  (registers "grpo")
from coevo.rl.estimators import gigpo as _gigpo  # noqa: F401  (registers "gigpo")
from coevo.rl.estimators import progress as _progress  # noqa: F401  (registers "progress")

__all__ = ["ESTIMATORS", "AdvantageEstimator", "Credit", "EstimatorContext",
           "estimator_options", "make_estimator", "token_advantages"]
