"""tools/device_ab.sh's local half: the overlays it makes from a branch or from commits."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "device_ab.sh"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A history like the project's: a base, an experiment and its revert, an unrelated change."""
    r = tmp_path / "repo"
    (r / "engine").mkdir(parents=True)
    git(r, "init", "-q")
    (r / "engine" / "k.cu").write_text("base\n")
    (r / "engine" / "old.cu").write_text("old\n")
    (r / "README.md").write_text("readme\n")
    commit(r, "base")
    (r / "engine" / "k.cu").write_text("experiment\n")
    (r / "engine" / "old.cu").unlink()
    (r / "engine" / "new.cu").write_text("new\n")
    commit(r, "experiment")
    git(r, "revert", "--no-edit", "HEAD")
    (r / "README.md").write_text("readme, later\n")
    commit(r, "later")
    return r


def run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)


def test_commits_overlay_holds_the_experiment_on_head(repo: Path) -> None:
    experiment = git(repo, "rev-list", "--max-count=1", "--grep=^experiment$", "HEAD")
    out = run(repo, "--commits", "ab/x", experiment)
    assert out.returncode == 0, out.stderr
    ab = repo / "ab" / "x"
    assert (ab / "engine" / "k.cu").read_text() == "experiment\n"
    assert (ab / "engine" / "new.cu").read_text() == "new\n"
    assert (ab / ".deleted").read_text().split() == ["engine/old.cu"]
    assert not (ab / "README.md").exists()  # HEAD's own file, unchanged by the experiment
    # The repository is left as it was: no worktree, no commit, HEAD unchanged.
    assert git(repo, "log", "-1", "--format=%s") == "later"
    assert len(git(repo, "worktree", "list").splitlines()) == 1
    assert (repo / "engine" / "k.cu").read_text() == "base\n"


def test_commits_that_do_not_apply_are_refused(repo: Path) -> None:
    (repo / "engine" / "k.cu").write_text("something else\n")
    commit(repo, "conflicting")
    experiment = git(repo, "rev-list", "--max-count=1", "--grep=^experiment$", "HEAD")
    out = run(repo, "--commits", "ab/y", experiment)
    assert out.returncode == 1
    assert experiment in out.stderr and "--overlay" in out.stderr
    assert not (repo / "ab" / "y").exists()
    assert len(git(repo, "worktree", "list").splitlines()) == 1


def test_commits_needs_a_commit(repo: Path) -> None:
    out = run(repo, "--commits", "ab/z")
    assert out.returncode == 2 and "at least one commit" in out.stderr


def test_branch_overlay(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "wip/b")
    (repo / "engine" / "k.cu").write_text("branch\n")
    commit(repo, "branch change")
    git(repo, "checkout", "-q", "-")
    out = run(repo, "--overlay", "wip/b", "ab/b")
    assert out.returncode == 0, out.stderr
    assert (repo / "ab" / "b" / "engine" / "k.cu").read_text() == "branch\n"
    assert (repo / "ab" / "b" / ".deleted").read_text() == ""
