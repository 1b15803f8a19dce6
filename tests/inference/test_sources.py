"""``predict``'s glob sources: matched as Python's ``glob`` matches them, but below ``**`` walked as a folder source
is, so that a cycle of links is one line instead of a walk without end (Python's ``**`` follows ``loop -> .``
forever, its memory growing), and a pattern's matches are bounded as a list file's lines are."""

from __future__ import annotations

import glob
import os

import pytest

from bigbatch.errors import UserError
from bigbatch.inference import sources

pytestmark = pytest.mark.fast

FILES = ["a.png", "b.jpg", ".hidden.png", "sub/c.png", "sub/deeper/d.png", "sub/deeper/e.txt", ".dot/f.png",
         "sub/.g.png", "other/h.png", "x.png/i.png"]
PATTERNS = ["**/*.png", "**", "sub/**/*.png", "sub/**", "**/deeper/*.png", "*/*.png", "*.png", "**/.*.png",
            ".*/**/*.png", "s*/**/d.png", "**/*.[pj][np]g", "{root}/**/*.png", "{root}/sub/**", "nothing/**/*.png",
            "*/**", "**/", "sub/*/**", "**/deeper/", "sub/**/"]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "linked").symlink_to(tmp_path / "sub")  # a link to a folder, no cycle: followed, as glob does
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_matches_the_files_pythons_glob_matches(tree, pattern):
    """Python's matches, a matched folder taken as a folder source (its files, at any depth, links followed)."""
    pattern = pattern.format(root=tree)
    expected = set()
    for match in glob.glob(pattern, recursive=True):
        if os.path.isdir(match):
            expected |= {os.path.join(folder, name) for folder, _, names in os.walk(match, followlinks=True)
                         for name in names}
        else:
            expected.add(match)
    got = set()
    for match in sources._glob(pattern):
        got |= ({os.path.join(folder, name) for folder, _, names in os.walk(match, followlinks=True) for name in names}
                if os.path.isdir(match) else {match})
    assert {os.path.normpath(p) for p in got} == {os.path.normpath(p) for p in expected}


def test_a_cycle_of_links_below_a_double_star_is_one_line(tree):
    (tree / "sub" / "loop").symlink_to(".")
    (tree / "sub" / "again").symlink_to(".")
    with pytest.raises(UserError, match=r"leads back to .*a cycle of links"):
        sources.expand_sources(["sub/**/*.png"], warn=print)


def test_a_pattern_matching_more_files_than_a_source_may_name_is_refused(tree, monkeypatch):
    monkeypatch.setattr(sources, "MAX_LISTED", 3)
    for pattern in ("**/*.png", "*"):
        with pytest.raises(UserError, match=rf"^predict: {pattern.replace('*', '[*]')} matches more than 3 files"):
            sources._glob(pattern)
    assert len(sources._glob("sub/**/*.png")) == 2


def test_a_cycle_of_links_the_pattern_cannot_reach_is_not_walked(tree):
    """``**`` never enters a folder whose name starts with ``.``, nor does ``sub/**`` enter ``other``: a cycle there
    is no matter (it refused the whole pattern), and a large folder beside is not listed."""
    (tree / ".cache").mkdir()
    (tree / ".cache" / "loop").symlink_to(".")
    (tree / "other" / "loop").symlink_to(".")
    assert sorted(sources._glob("sub/**/*.png")) == ["sub/c.png", "sub/deeper/d.png"]
    # other/ holds a cycle that **/*.png reaches: refused, naming the link
    with pytest.raises(UserError, match="a cycle of links"):
        sources._glob("**/*.png")
