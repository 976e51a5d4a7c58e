"""The front door is light (issue 24): ``gage-eval --help`` and ``import gage_eval.api`` load few
core modules, counted as the review did, from ``python -X importtime`` in a fresh interpreter."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE_LINE = re.compile(r"\|\s*(gage_eval(?:\.[\w.]+)?)\s*$")

HELP_BOUND = 10
API_BOUND = 12


def core_modules_imported(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [m.group(1) for line in done.stderr.splitlines() if (m := CORE_LINE.search(line))]


def test_help_imports_at_most_10_core_modules():
    found = core_modules_imported("-m", "gage_eval.cli", "--help")
    assert "gage_eval.cli.app" in found, found  # the count is of a real --help
    assert len(found) <= HELP_BOUND, f"gage-eval --help imports {len(found)} core modules: {found}"
    assert not [m for m in found if m.startswith(("gage_eval.engine", "gage_eval.runfolder"))], found


def test_api_import_is_light():
    found = core_modules_imported("-c", "import gage_eval.api")
    assert len(found) <= API_BOUND, f"import gage_eval.api imports {len(found)} core modules: {found}"
    loaded = subprocess.run([sys.executable, "-c", "import sys, gage_eval.api; print(sorted(sys.modules))"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    assert "'click'" not in loaded and "'gage_eval.plugins'" not in loaded


def test_help_lists_core_commands_as_they_describe_themselves():
    """`--help` lists the core commands without importing them: what it says of each is the first
    paragraph of the command's own help."""
    from gage_eval.cli.app import CORE_COMMANDS, core_command

    for name, (_target, said) in CORE_COMMANDS.items():
        command = core_command(name)
        assert command.name == name
        first = (command.help or "").split("\n\n")[0]
        assert " ".join(said.split()) == " ".join(first.split()), name
