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
