"""The repository as published: workflows that lint clean and do what the README says, licences,
a citation file, and links that follow _config.yml."""

import subprocess
import sys
from pathlib import Path

import book
import pytest
import yaml

WORKFLOWS = book.ROOT / ".github" / "workflows"
BIN = Path(sys.executable).parent


def workflow(name: str) -> dict:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def steps(job: dict) -> list[dict]:
    return job["steps"]


def uses(job: dict) -> list[str]:
    return [s["uses"].split("@")[0] for s in steps(job) if "uses" in s]


@pytest.mark.parametrize(
    "command",
    [[str(BIN / "actionlint")], [str(BIN / "zizmor"), "--offline", str(WORKFLOWS)]],
    ids=["actionlint", "zizmor"],
)
def test_workflows_lint_and_audit_clean(command):
    result = subprocess.run(command, cwd=book.ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_action_is_pinned_to_a_commit():
    for path in WORKFLOWS.glob("*.yml"):
        for job in workflow(path.name)["jobs"].values():
            for step in steps(job):
                if "uses" in step:
                    ref = step["uses"].split("@")[1]
                    assert len(ref) == 40 and all(c in "0123456789abcdef" for c in ref), step


def test_ci_runs_the_test_command_on_pushes_and_pull_requests_and_keeps_the_book():
    ci = workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    job = ci["jobs"]["test"]
    assert job["container"].startswith("python:3.11")  # Python 3.11, Debian's Chromium
    runs = [s for s in steps(job) if "run" in s]
    assert [s["run"] for s in runs] == ["bash .ci/run"] and runs[0]["env"]["CI"] == "true"
    cache = next(s for s in steps(job) if s.get("uses", "").startswith("actions/cache@"))
    assert "hashFiles('requirements.txt')" in cache["with"]["key"]
    upload = next(s for s in steps(job) if s.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["with"]["path"] == "_build/html"
    assert (book.ROOT / ".ci" / "run").read_text().rstrip().endswith("exec make test")


def test_the_book_deploys_to_pages_with_least_privilege_one_at_a_time():
    pages = workflow("book.yml")
    assert pages["on"]["push"]["branches"] == ["main"]
    assert pages["permissions"] == {}
    assert pages["concurrency"] == {"group": "pages", "cancel-in-progress": False}
    build, deploy = pages["jobs"]["build"], pages["jobs"]["deploy"]
    assert build["permissions"] == {"contents": "read"}
    assert any(s.get("run") == "make book" for s in steps(build))
    assert "actions/upload-pages-artifact" in uses(build)
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["needs"] == "build" and uses(deploy) == ["actions/deploy-pages"]
    assert deploy["environment"]["name"] == "github-pages"


def test_the_canary_executes_every_chapter_weekly_with_loose_ranges():
    canary = workflow("canary.yml")
    assert "schedule" in canary["on"]
    commands = "\n".join(s.get("run", "") for s in steps(canary["jobs"]["chapters"]))
    assert "pip install . " in commands and "requirements.txt" not in commands
    assert "--nbval chapters/" in commands  # machine-aware: conftest.py compares what holds
    other_cpu = canary["jobs"]["another-cpu"]
    assert [s.get("run") for s in steps(other_cpu)][-1] == "make test"
    assert steps(other_cpu)[-1]["env"] == {"ATEN_CPU_CAPABILITY": "default"}


def test_licences_citation_and_footer():
    assert (book.ROOT / "LICENSE").read_text().startswith("MIT License")
    assert "CC BY 4.0" in (book.ROOT / "LICENSE-CONTENT").read_text()
    assert 'license = { text = "MIT" }' in (book.ROOT / "pyproject.toml").read_text()
    footer = book.config()["html"]["extra_footer"]
    assert "MIT" in footer and "CC BY 4.0" in footer
    readme = (book.ROOT / "README.md").read_text()
    assert "LICENSE-CONTENT" in readme and "CITATION.cff" in readme


def test_links_and_citation_follow_the_repository_url():
    parts = book.repository_parts()
    readme = (book.ROOT / "README.md").read_text()
    assert book.readme_links() in readme, "run `make links`"
    assert (book.ROOT / "CITATION.cff").read_text() == book.citation(), "run `make links`"
    citation = yaml.safe_load(book.citation())
    assert citation["repository-code"] == parts["url"] and citation["url"] == parts["pages"]
    assert parts["pages"] in readme


def test_the_sweep_runs_a_job_a_chapter_and_compares_with_the_committed_records():
    sweep = workflow("sweep.yml")
    assert {"schedule", "workflow_dispatch", "pull_request"} <= set(sweep["on"])
    paths = sweep["on"]["pull_request"]["paths"]
    assert {"chapters/**", "papernotes/**", "tests/mutants/**"} <= set(paths)
    jobs = sweep["jobs"]
    plan = "\n".join(s.get("run", "") for s in steps(jobs["plan"]))
    assert "tools/matrix.py --changed" in plan and "tools/matrix.py >" in plan
    chapter = jobs["chapter"]
    assert (
        chapter["strategy"]["matrix"]["chapter"] == "${{ fromJSON(needs.plan.outputs.chapters) }}"
    )
    assert chapter["strategy"]["fail-fast"] is False
    runs = "\n".join(s.get("run", "") for s in steps(chapter))
    assert "tools/seeds_and_mutants.py sweep" in runs and "--out _build/sweep" in runs
    assert "actions/upload-artifact" in uses(chapter)
    compare = jobs["compare"]
    assert compare["needs"] == ["plan", "chapter"] and compare["if"].startswith("always()")
    assert "actions/download-artifact" in uses(compare)
    assert "tools/sweep_records.py compare _build/sweep" in steps(compare)[-1]["run"]


def test_the_book_executes_its_chapters_on_a_matrix_and_builds_once():
    jobs = workflow("book.yml")["jobs"]
    chapter = jobs["chapter"]
    assert "matrix" in chapter["strategy"]
    assert any("tools/execute.py --out" in s.get("run", "") for s in steps(chapter))
    build = jobs["build"]
    assert build["needs"] == "chapter" and "actions/download-artifact" in uses(build)
    runs = [s.get("run", "") for s in steps(build)]
    assert any("tools/execute.py --from _build/executed" in r for r in runs)
    assert runs.index("make book") > next(i for i, r in enumerate(runs) if "--from" in r)


def test_the_matrix_names_the_chapters_a_change_reaches():
    import matrix

    every = [p.stem for p in book.toc_chapters()]
    assert matrix.reached(["papernotes/training.py"]) == every  # a shared module: all
    assert matrix.reached(["requirements.txt"]) == every
    assert matrix.reached(["README.md", "intro.md", "tests/test_browser.py"]) == []
    assert matrix.reached(["chapters/jsma.ipynb", "tests/mutants/ggnn.py"]) == ["ggnn", "jsma"]
    # a paper's folder reaches its chapter and the later chapters that import it
    reached = matrix.reached(["papernotes/batch_norm/__init__.py"])
    assert reached[0] == "batch_norm" and {"recurrent_batch_norm", "selu"} <= set(reached)
    assert "jsma" not in reached
