"""RunConfig files layered with `extends:`: blocks merge key by key, anything else replaces;
a missing, cyclic or malformed base is one error naming the file and `extends`."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from coevo import config
from coevo.config import RunConfig
from coevo.errors import AssetError

BENCH = Path(__file__).resolve().parent.parent / "training" / "bench"

BASE = """\
name: base
env: rg:basic_arithmetic
assets: {harness: reasoning}
rounds: 4
gate: {name: soft, alpha: 0.05, screen_size: 10}
proposers: [{name: demos, options: {k: 2}}, {name: knobs}]
"""


def test_a_config_states_only_what_it_changes(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "root.yaml").write_text(BASE)
    (tmp_path / "base" / "mid.yaml").write_text("extends: root.yaml\nname: mid\ngate: {alpha: 0.1}\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base/mid.yaml\nname: child\nproposers: [{name: demos}]\n"
                     "rl: {stage: {steps: 7}}\n")
    cfg = RunConfig.load(child, ["gate.screen_size=4"])
    assert cfg.name == "child" and cfg.rounds == 4 and cfg.env == "rg:basic_arithmetic"
    # gate merges key by key across the three files and the override
    assert (cfg.gate.name, cfg.gate.alpha, cfg.gate.screen_size) == ("soft", 0.1, 4)
    # a list replaces the base's list whole
    assert [(p.name, p.options) for p in cfg.proposers] == [("demos", {})]
    assert cfg.rl.stage.steps == 7
    mid = RunConfig.load(tmp_path / "base" / "mid.yaml")
    assert (mid.name, mid.gate.alpha, len(mid.proposers)) == ("mid", 0.1, 2)


@pytest.mark.parametrize("extends, says", [
    ("nowhere.yaml", "nowhere.yaml: no such file"),
    ("b.yaml", "a.yaml: a cycle (a.yaml -> b.yaml -> a.yaml)"),
    ("a.yaml", "a.yaml: a cycle (a.yaml -> a.yaml)"),
    ("[1, 2]", "expected the path of a run config"),
    ("''", "expected the path of a run config"),
])
def test_a_bad_base_is_one_error_naming_the_file_and_extends(tmp_path, extends, says):
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\n")
    a = tmp_path / "a.yaml"
    a.write_text(f"extends: {extends}\n" + BASE)
    with pytest.raises(AssetError) as e:
        RunConfig.load(a)
    assert e.value.field == "extends" and says in str(e.value)
    assert str(a) in str(e.value) or str(tmp_path / "b.yaml") in str(e.value)


def test_an_error_in_the_base_names_the_base_file(tmp_path):
    (tmp_path / "root.yaml").write_text(BASE + "gate: [\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: root.yaml\nname: child\n")
    with pytest.raises(AssetError) as e:
        RunConfig.load(child)
    assert str(tmp_path / "root.yaml") in str(e.value) and "invalid YAML" in str(e.value)
    # a key the schema refuses may be in either file: the error names both
    (tmp_path / "root.yaml").write_text(BASE + "roundz: 3\n")
    with pytest.raises(AssetError) as e:
        RunConfig.load(child)
    assert e.value.field == "roundz"
    assert str(child) in str(e.value) and str(tmp_path / "root.yaml") in str(e.value)


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize("child, base, differs", [
    ("bfcl-copy-rl-capability", "bfcl-copy-rl", {"name", "rl.stage.sampler", "rl.stage.sampler_options.rounds"}),
    ("bfcl-joint", "bfcl-copy", {"name", "proposers"}),
    ("bfcl-copy-rl-long", "bfcl-copy-rl", {"name", "rl.stage.steps", "rl.stage.checkpoint_every"}),
    ("arithmetic-rl-demos", "arithmetic-rl", {"name", "bettertogether.strategy"}),
])
def test_bench_configs_differ_from_their_base_only_where_they_say(child, base, differs):
    a = _flat(RunConfig.load(BENCH / f"{child}.yaml").model_dump(mode="json"))
    b = _flat(RunConfig.load(BENCH / f"{base}.yaml").model_dump(mode="json"))
    assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == differs


def test_doctests():
    from coevo import blocks

    assert doctest.testmod(config).failed == 0
    got = doctest.testmod(blocks)
    assert got.attempted == 1 and got.failed == 0
