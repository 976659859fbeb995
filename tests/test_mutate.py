"""The mutation-testing tool (tools/mutate.py, `make mutate`) and its records
(tools/mutation_records.py): stable ids, the exclusion rule, the triage, the score, the
score-drop check of the sweep workflow, BENCHMARK.md's section, and one real run of mutmut on a
paper of three functions (a few seconds)."""

import json
import textwrap

import mutate
import mutation_records
import pytest
from mutation_records import compare, load_triage, scored, section

PAPER = '''\
from papernotes import checks


def scale(x, factor=2):
    """x times factor."""
    factor = checks.integer("factor", factor)
    if x < 0:
        raise ValueError(f"x must be at least 0; got {x}")
    return x * factor


def offset(x):
    return x + 1


def shifted(x, by=3):
    return x - checks.integer("by", by)


def labelled(x, desc="doubling"):
    return shown(x * 2, desc=desc)


def shown(value, desc):
    return value
'''

CHECKS = """\
def integer(name, value, low=1):
    if value < low:
        raise ValueError(f"{name} must be at least {low}; got {value}")
    return value
"""

TESTS = """\
from papernotes import tiny


def test_scale():
    assert tiny.scale(3) == 6


def test_shifted():
    assert tiny.shifted(5) == 2
"""


def write_paper(root, source=PAPER):
    """A repository with one paper, `tiny`, its unit tests and the files the tool copies."""
    (root / "papernotes" / "tiny").mkdir(parents=True)
    (root / "papernotes" / "__init__.py").write_text("")
    (root / "papernotes" / "checks.py").write_text(CHECKS)
    (root / "papernotes" / "tiny" / "__init__.py").write_text(source)
    (root / "tests").mkdir()
    (root / "tests" / "conftest.py").write_text("")
    (root / "tests" / "test_tiny.py").write_text(TESTS)
    (root / "tools").mkdir()
    (root / "conftest.py").write_text("")
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = []\n")
    return root


@pytest.fixture
def paper(tmp_path, monkeypatch):
    root = write_paper(tmp_path / "repo")
    monkeypatch.setattr(mutate, "ROOT", root)
    monkeypatch.setattr(mutate, "WORK", tmp_path / "work")
    return root


def mutants(source, tmp_path):
    root = write_paper(tmp_path / "ids", source)
    with mutate.inside(root):
        (root / "pyproject.toml").write_text(mutate.mutmut_config("tiny"))
        return mutate.mutants_of_file("papernotes/tiny/__init__.py")


# -- ids and the exclusion rule --------------------------------------------------------------------


def test_ids_name_the_function_and_survive_edits_elsewhere(tmp_path):
    first = mutants(PAPER, tmp_path / "a")
    edited = PAPER.replace("def offset(x):\n    return x + 1", "def offset(x):\n    return x + 2")
    edited = "import math\n\n\ndef first(y):\n    return y * 5\n\n\n" + edited
    second = mutants(edited, tmp_path / "b")
    ids = [m.id for m in first]
    assert len(set(ids)) == len(ids)
    assert all(m.id.startswith(m.function + "/") for m in first)
    scale_ids = {m.id for m in first if m.function == "scale"}
    assert scale_ids and scale_ids == {m.id for m in second if m.function == "scale"}
    # the edited function's mutants change; the new function's are new
    assert {m.id for m in first if m.function == "offset"} != {
        m.id for m in second if m.function == "offset"
    }
    assert any(m.function == "first" for m in second)


def test_identical_mutations_in_one_function_are_told_apart(tmp_path):
    found = mutants("def twice(x):\n    x = x + 1\n    x = x + 1\n    return x\n", tmp_path)
    ids = [m.id for m in found]
    assert len(set(ids)) == len(ids)
    assert any(i.endswith(".2") for i in ids)


def test_the_exclusion_rule_leaves_out_checks_raises_guards_and_labels_only(tmp_path):
    found = mutants(PAPER, tmp_path)
    left_out = {" / ".join(m.diff) for m in found if m.excluded}
    kept = {" / ".join(m.diff) for m in found if not m.excluded}
    assert left_out
    for diff in left_out:  # inside a check, a raise, a guard's condition or a progress label
        assert any(part in diff for part in ("checks.integer(", "raise", "if x", "desc")), diff
    assert any("if x" in d for d in left_out)
    # the label: its default changed, the argument set to None or dropped
    assert (
        '- def labelled(x, desc="doubling"): / + def labelled(x, desc="XXdoublingXX"):' in left_out
    )
    assert "- return shown(x * 2, desc=desc) / + return shown(x * 2, desc=None)" in left_out
    assert "- return shown(x * 2, desc=desc) / + return shown(x * 2, )" in left_out
    assert "- return shown(x * 2, desc=desc) / + return shown(x / 2, desc=desc)" in kept
    assert "- return shown(x * 2, desc=desc) / + return shown(None, desc=desc)" in kept
    # what lies outside them is mutated: the assignment of the checked value, the arithmetic
    # on a line that also checks an argument, the paper's own arithmetic
    assert '- factor = checks.integer("factor", factor) / + factor = None' in kept
    assert any(
        d.startswith("- return x - checks.integer") and "+ return x + checks" in d for d in kept
    )
    assert "- return x * factor / + return x / factor" in kept


def test_the_experiments_drawing_functions_are_out_of_scope():
    drawing = mutate.Mutant(
        "n", "experiment.draw_curve/0", "p/experiment.py", "experiment.draw_curve", [], False
    )
    measure = mutate.Mutant(
        "n", "experiment.accuracy/0", "p/experiment.py", "experiment.accuracy", [], False
    )
    mechanism = mutate.Mutant("n", "draw_sample/0", "p/__init__.py", "draw_sample", [], False)
    assert [mutate.in_scope(m) for m in (drawing, measure, mechanism)] == [False, True, True]


# -- the triage, the score and the comparison ------------------------------------------------------


def record(killed=(), **others):
    return {
        "chapter": "tiny",
        "killed": list(killed),
        "mutants": [
            {"id": i, "outcome": o, "function": "f", "diff": []} for i, o in others.items()
        ],
    }


def triage_file(tmp_path, text):
    (tmp_path / "tiny.yml").write_text(textwrap.dedent(text))
    return load_triage("tiny", tmp_path)


def test_the_score_leaves_equivalents_out_and_counts_timeouts_as_caught(tmp_path):
    triage = triage_file(
        tmp_path,
        """\
        equivalent:
          f/3: "device=None: the book runs on the CPU"
          f/1: "said to be equivalent, but the tests kill it"
          f/9: "no such mutant now"
        open:
          f/4: "unit test: pin f's output"
        """,
    )
    found = scored(
        record(["f/1", "f/2"], **{"f/3": "survived", "f/4": "survived", "f/5": "timeout"}), triage
    )
    assert found["counts"]["equivalent"] == 1 and found["counts"]["survived"] == 1
    assert found["score"] == pytest.approx(3 / 4)  # f/1, f/2 killed and f/5 hung, of 5 - 1
    assert found["stale"] == ["f/9"]
    assert found["killed_but_listed"] == ["f/1"]
    assert found["untriaged"] == []


@pytest.mark.parametrize(
    "text",
    [
        'equivalent:\n  f/1: ""\n',
        'equivalent:\n  f/1: "a"\nopen:\n  f/1: "b"\n',
        "wrong:\n  f/1: a\n",
    ],
    ids=["no reason", "listed twice", "unknown section"],
)
def test_a_triage_without_reasons_or_listing_an_id_twice_is_refused(tmp_path, text):
    (tmp_path / "tiny.yml").write_text(text)
    with pytest.raises(ValueError):
        load_triage("tiny", tmp_path)


def test_compare_fails_a_score_that_drops_naming_the_chapter_and_the_mutants(tmp_path):
    triage = load_triage("tiny", tmp_path)  # none written: nothing equivalent
    committed = record(["f/1", "f/2"], **{"f/3": "survived"})
    same = record(["f/2", "f/1"], **{"f/3": "survived"})
    better = record(["f/1", "f/2", "f/3"])
    worse = record(["f/1"], **{"f/2": "survived", "f/3": "survived", "f/4": "no tests"})
    assert compare(committed, same, "tiny", triage) == []
    assert compare(committed, better, "tiny", triage) == []
    problems = compare(committed, worse, "tiny", triage)
    assert len(problems) == 1 and problems[0].startswith("tiny: mutation score 25.0%")
    assert "66.7%" in problems[0] and "f/2" in problems[0] and "f/4" in problems[0]
    assert compare({}, same, "tiny", triage) != []


def test_listing_an_equivalent_raises_the_committed_score_without_a_rerun(tmp_path):
    run = record(["f/1"], **{"f/2": "survived"})
    before = scored(run, load_triage("tiny", tmp_path))["score"]
    after = scored(run, triage_file(tmp_path, 'equivalent:\n  f/2: "same value"\n'))["score"]
    assert (before, after) == (0.5, 1.0)


def test_compare_folders_reads_fresh_records_against_committed_ones(tmp_path):
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    for folder, run in (
        (fresh, record(["f/1"], **{"f/2": "survived"})),
        (committed, record(["f/1", "f/2"])),
    ):
        mutation_records.write(run, folder)
    assert mutation_records.main(["compare", str(fresh), "--committed", str(committed)]) == 1
    assert mutation_records.main(["compare", str(committed), "--committed", str(committed)]) == 0


def test_the_benchmark_section_is_rewritten_between_its_markers(tmp_path, monkeypatch):
    path = tmp_path / "BENCHMARK.md"
    path.write_text("# Benchmark\n\nthe lead's table\n")
    mutation_records.write_section(path, tmp_path)
    once = path.read_text()
    assert once.startswith("# Benchmark\n\nthe lead's table\n\n" + mutation_records.SECTION[0])
    assert once.rstrip().endswith(mutation_records.SECTION[1])
    path.write_text(once + "\nafter the section\n")
    mutation_records.write_section(path, tmp_path)
    assert path.read_text() == once + "\nafter the section\n"
    assert "| bert | not run |" in section({}, tmp_path)


# -- one real run ----------------------------------------------------------------------------------


def test_a_run_kills_what_the_tests_pin_and_records_the_rest(paper, tmp_path):
    out = tmp_path / "records"
    found = mutate.mutate(paper / "chapters" / "tiny.ipynb", out, jobs=1)
    saved = json.loads((out / "tiny.json").read_text())
    assert saved["killed"] == found["killed"] and saved["files"] == ["papernotes/tiny/__init__.py"]
    assert saved["excluded"] > 0
    outcome = {m["id"]: m["outcome"] for m in saved["mutants"]}
    assert {o for i, o in outcome.items() if i.startswith("offset/")} == {"no tests"}
    assert all(i.startswith(("scale/", "shifted/")) for i in saved["killed"])
    # the default of `factor` is pinned by test_scale: its mutant is killed
    by_diff = {" / ".join(m.diff): m.id for m in mutate.mutants_of("tiny", mutate.WORK / "tiny")}
    assert by_diff["- def scale(x, factor=2): / + def scale(x, factor=3):"] in saved["killed"]


def test_a_survivors_run_kills_what_new_tests_pin_and_refuses_changed_code(paper, tmp_path):
    out = tmp_path / "records"
    chapter = paper / "chapters" / "tiny.ipynb"
    first = mutate.mutate(chapter, out, jobs=1)
    offsets = {m["id"] for m in first["mutants"] if m["function"] == "offset"}
    assert offsets and all(
        m["outcome"] == "no tests" for m in first["mutants"] if m["id"] in offsets
    )
    tests = paper / "tests" / "test_tiny.py"
    tests.write_text(tests.read_text() + "\n\ndef test_offset():\n    assert tiny.offset(1) == 2\n")
    again = mutate.mutate(chapter, out, jobs=1, survivors=True)
    saved = json.loads((out / "tiny.json").read_text())
    assert saved == again and saved["hash"] != first["hash"]
    assert set(saved["killed"]) == set(first["killed"]) | offsets  # none left out, none twice
    assert len(saved["killed"]) == len(first["killed"]) + len(offsets)
    assert not offsets & {m["id"] for m in saved["mutants"]}
    assert saved["survivors_rerun"]["mutants"] == len(first["mutants"])
    assert saved["survivors_rerun"]["killed"] == len(offsets)
    assert saved["run"] == first["run"]  # the whole run's figures stay those of the whole run
    source = paper / "papernotes" / "tiny" / "__init__.py"
    source.write_text(source.read_text().replace("return x + 1", "return x + 2"))
    with pytest.raises(SystemExit, match="code changed since its record .*run `make mutate"):
        mutate.mutate(chapter, out, jobs=1, survivors=True)
    with pytest.raises(SystemExit, match="no record whose survivors"):
        mutate.mutate(chapter, tmp_path / "none", jobs=1, survivors=True)


# -- the weekly job --------------------------------------------------------------------------------


def test_the_sweep_workflow_mutates_weekly_a_job_a_chapter_and_fails_on_a_drop():
    import yaml
    from book import ROOT

    sweep = yaml.safe_load((ROOT / ".github" / "workflows" / "sweep.yml").read_text())
    jobs = sweep["jobs"]
    job = jobs["mutate"]
    assert "pull_request" in job["if"] and "!=" in job["if"]  # weekly and on demand only
    assert job["strategy"]["matrix"]["chapter"] == "${{ fromJSON(needs.plan.outputs.chapters) }}"
    assert job["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert 'make mutate CHAPTERS="chapters/$CHAPTER.ipynb" OUT=_build/mutation' in runs
    compare = jobs["compare-mutation"]
    assert compare["needs"] == ["plan", "mutate"] and compare["if"].startswith("always()")
    assert "tools/mutation_records.py compare _build/mutation" in compare["steps"][-1]["run"]


def test_triage_rewrites_the_file_keeping_peoples_lines_and_adding_new_survivors(tmp_path):
    survivor = {"outcome": "survived", "function": "f", "diff": ["- x = 1", "+ x = 2"]}
    run = record(["f/1"], **{"f/2": "survived", "f/3": "survived"})
    for m in run["mutants"]:
        m.update(diff=survivor["diff"])
    mutation_records.write(run, tmp_path)
    triage_file(tmp_path, 'equivalent:\n  f/2: "x is never read"\n  f/9: "gone since"\n')
    path = mutate.triage("tiny", folder=tmp_path)
    listed = load_triage("tiny", tmp_path)
    assert listed["equivalent"] == {"f/2": "x is never read", "f/9": "gone since"}
    assert listed["open"] == {"f/3": ""}  # new, its line to be written
    text = path.read_text()
    assert '  # - x = 1\n  # + x = 2\n  f/3: ""\n' in text
    assert "  # stale: the record has no such survivor now\n  f/9:" in text
    mutate.triage("tiny", {"f/3": ("open", "unit test: pin x")}, folder=tmp_path)
    assert load_triage("tiny", tmp_path)["open"] == {"f/3": "unit test: pin x"}
    assert path.read_text().count("f/2:") == 1


def test_a_second_run_of_the_same_paper_is_refused_while_one_goes_on(paper):
    with mutate.one_run_at_a_time("tiny"):
        with pytest.raises(SystemExit, match="another `make mutate` of this paper is running"):
            mutate.mutate(paper / "chapters" / "tiny.ipynb", paper / "out", jobs=1)
    with mutate.one_run_at_a_time("tiny"):  # free again
        pass
