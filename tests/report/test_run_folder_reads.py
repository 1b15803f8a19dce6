"""``bigbatch report`` reads a run folder that may come from anyone: each file only where its real path lies inside
the folder (a link leading out is a note, the file it names never opened) and only as a regular file."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_main

SECRET = "password: swordfish-SECRET\n"


def a_run(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.yaml").write_text("batch: 64\nsteps: 3\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "images": 64 * s, "lr": 0.1, "loss": 2.0 / s})
                                                  + "\n" for s in (1, 2, 3)))
    return folder


def report(tmp_path: Path, run: Path) -> str:
    page = tmp_path / "r.html"
    result = run_main("report", str(run), "--out", str(page))
    assert result.returncode == 0, result.stderr
    return page.read_text(encoding="utf-8")


def test_a_config_yaml_linking_outside_the_run_is_not_put_on_the_page(tmp_path):
    """The review's case: evilrun/config.yaml a link to a secret file outside; the report quoted the file whole."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    run = a_run(tmp_path / "evilrun")
    (run / "config.yaml").unlink()
    (run / "config.yaml").symlink_to(secret)
    html = report(tmp_path, run)
    assert "swordfish" not in html and "password" not in html
    assert "config.yaml leads outside the run folder (a link?): not read" in html
    assert secret.read_text() == SECRET


def test_every_file_of_the_run_leading_outside_is_left_unread(tmp_path):
    """metrics.jsonl, memory.csv, updates.csv and advisor.json linked to files outside: none is read (their values
    would be charted and listed); each is named in a note."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "m.jsonl").write_text(json.dumps({"step": 1, "swordfish_metric": 7.0, "loss": 1.0}) + "\n")
    (outside / "mem.csv").write_text("time,step,swordfish_mib\n1,1,5\n")
    (outside / "u.csv").write_text("step,name,relative\n1,swordfish.weight,0.5\n")
    (outside / "a.json").write_text(json.dumps({"bigbatch_advisor": 1, "rows": [], "link": {"name": "swordfish"}}))
    run = a_run(tmp_path / "run")
    (run / "metrics.jsonl").unlink()
    for name, target in (("metrics.jsonl", "m.jsonl"), ("memory.csv", "mem.csv"), ("updates.csv", "u.csv"),
                         ("advisor.json", "a.json")):
        (run / name).symlink_to(outside / target)
    html = report(tmp_path, run)
    assert "swordfish" not in html
    for name in ("metrics.jsonl", "memory.csv", "updates.csv", "advisor.json"):
        assert f"{name} leads outside the run folder (a link?): not read" in html, name


def test_a_link_inside_the_run_is_read(tmp_path):
    """Where the real path lies decides, not whether the name is a link: a config.yaml linked to a file in the run
    folder is read and shown."""
    run = a_run(tmp_path / "run")
    (run / "kept").mkdir()
    (run / "config.yaml").rename(run / "kept" / "config.yaml")
    (run / "config.yaml").symlink_to("kept/config.yaml")
    html = report(tmp_path, run)
    assert "steps: 3" in html and "leads outside" not in html



def test_a_run_folder_named_with_a_byte_that_is_not_utf8_is_reported(tmp_path):
    """``train`` and ``eval`` take such a folder; ``report`` ended in matplotlib's traceback drawing its name (a lone
    surrogate), then would have failed writing the UTF-8 page. The byte is shown as ``\\xff``."""
    import os

    run = a_run(Path(os.fsdecode(bytes(tmp_path) + b"/r\xffx")))
    page = report(tmp_path, run)
    assert "r\\xffx" in page and "\udcff" not in page
