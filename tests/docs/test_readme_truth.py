"""README.md says what the code does: every lm-evaluation-harness spelling gage-eval answers is in
its table, and every builtin task folder has the README the Tasks section promises."""
from __future__ import annotations

from pathlib import Path

import pytest

from gage_eval.cli.conventions import ALIASES, NO_OPS, REFUSED

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LM_EVAL_SECTION = README.split("### Coming from lm-evaluation-harness", 1)[1].split("\n### ", 1)[0]


@pytest.mark.parametrize("flag", sorted(f for f in {**ALIASES, **NO_OPS, **REFUSED} if f.startswith("--")))
def test_every_lm_eval_spelling_is_in_the_readme_table(flag):
    assert f"`{flag}`" in LM_EVAL_SECTION or f"`{flag} " in LM_EVAL_SECTION, (
        f"README.md's 'Coming from lm-evaluation-harness' does not say what {flag} does")


@pytest.mark.parametrize("folder", sorted(p.name for p in (ROOT / "tasks").iterdir() if (p / "task.yaml").is_file()))
def test_every_builtin_task_folder_has_a_readme(folder):
    assert (ROOT / "tasks" / folder / "README.md").is_file(), f"tasks/{folder} has no README.md"
