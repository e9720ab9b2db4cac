"""RunConfig files: loading with dotted overrides, a bad key as one error naming the file and
the key, the quickstart config; files layered with `extends:` (blocks merge key by key,
anything else replaces; a missing, cyclic or malformed base is one error naming the file and
`extends`)."""

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


# --- loading, overrides and the quickstart config -----------------------------------------


def test_config_yaml_and_dotted_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("name: x\nenv: rg:basic_arithmetic\nassets: {harness: reasoning}\n")
    cfg = RunConfig.load(path, ["rounds=5", "gate.alpha=0.1", "rl.stage.steps=7",
                                "proposers=[{name: demos, options: {k: 3}}]", "mode=ungated"])
    assert (cfg.rounds, cfg.gate.alpha, cfg.rl.stage.steps, cfg.mode) == (5, 0.1, 7, "ungated")
    assert cfg.proposers[0].options == {"k": 3}


@pytest.mark.parametrize("override, field", [("gate.alfa=0.1", "gate.alfa"),
                                             ("roundz=3", "roundz"),
                                             ("mode=both", "mode"),
                                             ("rl.train.lr=-1", "rl.train.lr")])
def test_config_errors_name_the_key(tmp_path, override, field):
    path = tmp_path / "run.yaml"
    path.write_text("name: x\nenv: rg:basic_arithmetic\nassets: {harness: reasoning}\n")
    with pytest.raises(AssetError) as e:
        RunConfig.load(path, [override])
    assert e.value.field == field and str(path) in str(e.value)


def test_quickstart_config_is_valid():
    cfg = RunConfig.load(Path(__file__).resolve().parent.parent / "training" / "quickstart.yaml")
    assert cfg.mode == "gated" and [p.name for p in cfg.proposers] == ["demos"]


@pytest.mark.parametrize("args, seed", [([], 0), (["--seed", "7"], 7)])
def test_quickstart_seed_option_sets_the_run_seed(tmp_path, monkeypatch, args, seed):
    """`coevo quickstart --seed N` runs the quickstart config with seed N (and only that
    changed): the three-seed runs of the quickstart's evidence use it."""
    from typer.testing import CliRunner

    import coevo.cli as cli
    import coevo.report as report

    seen = []
    monkeypatch.setattr(cli, "_run_and_summarise", lambda cfg, store, resume: seen.append(cfg))
    monkeypatch.setattr(report, "write_report", lambda store, name, path: path)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    res = CliRunner().invoke(cli.app, ["quickstart", *args, "--db", str(tmp_path / "q.db")])
    assert res.exit_code == 0, res.output
    [cfg] = seen
    base = RunConfig.load(Path("training") / "quickstart.yaml")
    assert cfg.seed == seed and cfg.rounds == 2 and cfg.name.startswith("quickstart-")
    assert cfg.model_dump(exclude={"seed", "name"}) == base.model_dump(exclude={"seed", "name"})
