"""Versioned assets: Harness, Skill, SkillLibrary, Rubric (pydantic, content-addressed).

Importing this package registers every kind in `coevo.assets.base.ASSET_TYPES`, which the
store and `load_asset` use to rebuild a version from its kind.
"""

from coevo.assets.base import (
    ASSET_TYPES,
    Asset,
    canonical_json,
    changed_fields,
    diff,
    forbidden_changes,
    format_diff,
    is_editable,
)
from coevo.assets.harness import (
    AnswerExtraction,
    Decoding,
    Demo,
    DemoMessage,
    FunctionSpec,
    Harness,
    SkillActivation,
    ToolSpec,
    Workflow,
)
from coevo.assets.io import (
    asset_path,
    dump_asset,
    format_asset,
    load_asset,
    load_seed_dir,
    parse_asset,
)
from coevo.assets.rubric import CRITERION_KINDS, Criterion, Rubric
from coevo.assets.skill import Skill, SkillLibrary, SkillRef

__all__ = [
    "ASSET_TYPES",
    "AnswerExtraction",
    "Asset",
    "CRITERION_KINDS",
    "Criterion",
    "Decoding",
    "Demo",
    "DemoMessage",
    "FunctionSpec",
    "Harness",
    "Rubric",
    "Skill",
    "SkillActivation",
    "SkillLibrary",
    "SkillRef",
    "ToolSpec",
    "Workflow",
    "asset_path",
    "canonical_json",
    "changed_fields",
    "diff",
    "dump_asset",
    "forbidden_changes",
    "format_asset",
    "format_diff",
    "is_editable",
    "load_asset",
    "load_seed_dir",
    "parse_asset",
]
