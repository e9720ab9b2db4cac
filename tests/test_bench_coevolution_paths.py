"""bench/coevolution_paths.py: how the co-evolution bench names files and folders in the data
it stores and on the page (the data file from the checkout that holds it, the stored command
and configs with no folder of the machine that ran the bench)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import coevolution as bench  # noqa: E402


def test_stored_report_names_no_folder_of_the_machine_that_ran_it(tmp_path):
    """The data and page keep the command and configs, with the checkout written "." and the
    --out folder "<out>"."""
    out = tmp_path / "o"
    rep = {"command": f"python bench/coevolution.py --out {out}",
           "configs": {"e": {"assets": {"seed_dir": str(bench.REPO)},
                             "rl": {"stage": {"checkpoint_dir": f"{out}/checkpoints/e"}}}},
           "seconds": 60.0, "reused": 2, "runs": [{"seconds": 120.0}, {"seconds": 60.0}]}
    got = bench.portable(rep, out)
    assert got["command"] == "python bench/coevolution.py --out <out>"
    assert got["configs"]["e"]["assets"]["seed_dir"] == "."
    assert got["configs"]["e"]["rl"]["stage"]["checkpoint_dir"] == "<out>/checkpoints/e"
    assert str(tmp_path) not in str(got) and got["seconds"] == 60.0


def test_a_results_page_outside_the_checkout_is_named_not_stored(tmp_path):
    """A --results page outside any checkout went into the stored command as the machine's own
    path: it is `<results>`; a page in a checkout (this one or another clone) is named from it,
    given as `--results P` or `--results=P`; the command is named by `stored_command` alone."""
    page = tmp_path / "elsewhere" / "R.md"
    assert bench.stored_command(["--out", str(tmp_path / "o"), "--results", str(page)]) == \
        "python bench/coevolution.py --out <out> --results <results>"
    other = _checkout(tmp_path / "main")
    assert bench.stored_command([f"--results={other / 'docs' / 'RESULTS.md'}"]) == \
        "python bench/coevolution.py --results=docs/RESULTS.md"
    inside = bench.REPO / "docs" / "RESULTS.md"
    assert bench.stored_command(["--results", str(inside)]) == \
        "python bench/coevolution.py --results docs/RESULTS.md"


def test_the_rebuild_command_names_the_files_the_page_was_built_from(tmp_path):
    """A data file keeps the --out path its run first wrote it to; the page's rebuild command
    named that path (`<out>/coevolution.json`), which no one can rerun."""
    src = bench.REPO / "bench" / "data" / "coevolution-bfcl-copy.json"
    moved = tmp_path / "kept.json"
    data = json.loads(src.read_text())
    data["data"] = "<out>/coevolution.json"
    moved.write_text(json.dumps(data))
    page = tmp_path / "R.md"
    bench.main(["--report-only", "--data", str(src), "--data", str(moved), "--results", str(page)])
    text = page.read_text()
    assert ("--report-only --data bench/data/coevolution-bfcl-copy.json --data kept.json`"
            in text)
    assert "<out>/coevolution.json" not in text


def _checkout(root: Path) -> Path:
    """A second coevo clone as `checkout_of` recognizes one: a .git and the bench script."""
    (root / ".git").mkdir(parents=True)
    (root / "bench").mkdir()
    (root / "bench" / "coevolution.py").write_text("")
    return root


def test_a_data_file_in_another_checkout_is_named_from_that_checkout(tmp_path):
    """A bench run from a second clone writing into the main one (`--data ../main/bench/data/
    x.json`) named the file `x.json`, so the page's rebuild command did not rerun as printed:
    it is named from the checkout that holds it; a file no checkout holds keeps its name."""
    other = _checkout(tmp_path / "main")
    inside = other / "bench" / "data" / "x.json"
    assert bench.data_name(inside) == "bench/data/x.json"
    assert bench.data_name(tmp_path / "scratch" / "y.json") == "y.json"
    (tmp_path / "repo" / ".git").mkdir(parents=True)  # a repository, not a coevo checkout
    assert bench.data_name(tmp_path / "repo" / "bench" / "data" / "w.json") == "w.json"
    assert bench.data_name(bench.REPO / "bench" / "data" / "z.json") == "bench/data/z.json"


def test_the_stored_command_names_no_folder_of_the_machine(tmp_path):
    """--data, --reuse and a relative --out went into the stored command as given (`/work/
    main/bench/data/...`, `/tmp/...`, `bench/out/gated2`): files in a checkout are named from
    it, others `<name>`, the --out folder `<out>`."""
    other = _checkout(tmp_path / "main")
    argv = ["--envs", "bfcl-copy-rl", "--data", str(other / "bench/data/a.json"),
            f"--reuse={tmp_path / 'b.json'}", "--reuse", str(bench.REPO / "bench/data/c.json"),
            "--out", "bench/out/gated2", "--name", "n"]
    got = bench.stored_command(argv)
    assert got == ("python bench/coevolution.py --envs bfcl-copy-rl --data bench/data/a.json "
                   "--reuse=<b.json> --reuse bench/data/c.json --out <out> --name n")
    assert bench.stored_command(["--out=/x/y", "--seeds", "3"]) == \
        "python bench/coevolution.py --out=<out> --seeds 3"
    assert str(tmp_path) not in got
