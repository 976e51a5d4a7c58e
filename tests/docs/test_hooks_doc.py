"""docs/hooks.md is kept equal to the code (the pattern datasette uses for its plugin hooks).

- every hookspec has a ``### name(arg, ...)`` heading with its exact argument names, says
  whether it is firstresult, when it is called and what it returns, and shows an example;
- the page documents no hook that does not exist;
- the Backend, Judge and Metric tables name every public attribute of the base class; a row
  marked ``declared`` exists on the base class, a row marked ``optional`` does not (and the
  core still reads it by name);
- every event is documented with its exact fields, and every documented metric result key is
  still read by the core.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pluggy
import pytest

from gage_eval.api import events

from gage_eval.api import hookspecs
from gage_eval.api.backend import Backend
from gage_eval.api.judge import Judge
from gage_eval.api.loader import Loader, Preprocessor
from gage_eval.api.metric import Metric
from gage_eval.api.writer import Writer

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = ROOT / "docs" / "hooks.md"
DOC = DOC_PATH.read_text(encoding="utf-8")
CORE_SOURCE = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "gage_eval").rglob("*.py")))

HEADING = re.compile(r"^###\s+(gage_\w+)\(([^)]*)\)\s*$", re.MULTILINE)
NOT_HOOKS = ("gage_eval", "gage_plugins_builtin")  # package names the page mentions


def _hook_callers() -> dict[str, pluggy.HookCaller]:
    pm = pluggy.PluginManager("gage_eval")
    pm.add_hookspecs(hookspecs)
    return {name: getattr(pm.hook, name) for name in dir(pm.hook) if name.startswith("gage_")}


HOOKS = _hook_callers()


def _section(start: int) -> str:
    """The page from ``start`` to the next heading of level 2 or 3."""
    nxt = re.compile(r"^#{2,3}\s", re.MULTILINE).search(DOC, DOC.index("\n", start) + 1)
    return DOC[start:nxt.start() if nxt else len(DOC)]


def _documented_hooks() -> dict[str, tuple[str, str]]:
    """Hook heading name -> (argument list as written, the section's text)."""
    out = {}
    for m in HEADING.finditer(DOC):
        assert m.group(1) not in out, f"docs/hooks.md: hook {m.group(1)} has two headings"
        out[m.group(1)] = (m.group(2), _section(m.start()))
    return out


DOCUMENTED = _documented_hooks()


def test_hookspecs_are_found():
    # guards against an empty parametrization passing silently
    assert len(HOOKS) >= 11 and "gage_register_backends" in HOOKS and "gage_run_end" in HOOKS


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_is_documented_with_its_signature(name):
    argnames = [a for a in HOOKS[name].spec.argnames if a != "__multicall__"]
    expected = f"{name}({', '.join(argnames)})"
    assert name in DOCUMENTED, f"docs/hooks.md has no '### {expected}' heading for hookspec {name}"
    written, _ = DOCUMENTED[name]
    assert f"{name}({written})" == expected, (
        f"docs/hooks.md documents '{name}({written})' but hookspecs.py declares '{expected}'")


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_section_says_when_what_and_firstresult(name):
    if name not in DOCUMENTED:
        pytest.fail(f"docs/hooks.md: no section for hook {name}")
    _, text = DOCUMENTED[name]
    first = "yes" if HOOKS[name].spec.opts.get("firstresult") else "no"
    assert f"firstresult: {first}" in text, f"docs/hooks.md: {name} must say 'firstresult: {first}'"
    for part in ("**Called:**", "**Arguments:**", "**Returns:**", "```python"):
        assert part in text, f"docs/hooks.md: the {name} section lacks {part}"
    assert "@hookimpl" in text and f"def {name}(" in text, f"docs/hooks.md: {name} has no example implementation"


def test_no_documented_hook_is_missing_from_hookspecs():
    ghosts = sorted(set(DOCUMENTED) - set(HOOKS))
    assert not ghosts, f"docs/hooks.md documents hooks that hookspecs.py does not declare: {ghosts}"
    mentioned = {t for t in re.findall(r"\bgage_\w*[A-Za-z0-9](?!\w)", DOC)  # not a family: gage_register_*
                 if t not in NOT_HOOKS and not t.startswith("gage_eval_plugin")}
    unknown = sorted(mentioned - set(HOOKS))
    assert not unknown, f"docs/hooks.md names hooks that hookspecs.py does not declare: {unknown}"


# -- the Backend / Judge / Metric tables ---------------------------------------------------

TABLE_ROW = re.compile(r"^\|\s*`([A-Za-z_]\w*)(?:\([^`]*\))?`\s*\|\s*(declared|optional)\s*\|", re.MULTILINE)
CONTRACTS = {"Backend": Backend, "Judge": Judge, "Metric": Metric, "Writer": Writer, "Loader": Loader,
             "Preprocessor": Preprocessor}


def _table(title: str) -> dict[str, str]:
    m = re.search(rf"^## {title} contract\s*$", DOC, re.MULTILINE)
    assert m, f"docs/hooks.md has no '## {title} contract' section"
    rows = {}
    for name, status in TABLE_ROW.findall(_section(m.start())):
        assert name not in rows, f"docs/hooks.md: {title} attribute {name} is listed twice"
        rows[name] = status
    assert rows, f"docs/hooks.md: the {title} contract has no attribute table"
    return rows


def _public(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))


@pytest.mark.parametrize("title", sorted(CONTRACTS))
def test_contract_table_matches_the_base_class(title):
    cls = CONTRACTS[title]
    rows = _table(title)
    undocumented = sorted(n for n in _public(cls) if not n.startswith("_") and n not in rows)
    assert not undocumented, (f"{cls.__module__}.{title} declares {undocumented}, which the "
                              f"'## {title} contract' table of docs/hooks.md does not list")
    for name, status in rows.items():
        on_base = hasattr(cls, name)
        if status == "declared":
            assert on_base, (f"docs/hooks.md: {title}.{name} is marked 'declared' but the base class "
                             f"has no such attribute; mark it 'optional' or declare it")
        else:
            assert not on_base, (f"docs/hooks.md: {title}.{name} is marked 'optional' but the base "
                                 f"class now declares it; mark it 'declared'")
            assert f'"{name}"' in CORE_SOURCE, (f"docs/hooks.md: optional {title}.{name} is no longer "
                                                f"read by name anywhere in gage_eval/; remove the row")


# -- events and metric result keys ---------------------------------------------------------

EVENTS = {name: cls for name, cls in inspect.getmembers(events, inspect.isclass)
          if dataclasses.is_dataclass(cls) and cls.__module__ == events.__name__}


def test_events_are_found():
    assert {"RunStart", "SampleDone", "TaskDone", "RunEnd"} <= set(EVENTS)


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_event_is_documented_with_its_fields(name):
    expected = f"{name}({', '.join(f.name for f in dataclasses.fields(EVENTS[name]))})"
    assert f"`{expected}`" in DOC, f"docs/hooks.md does not document the event as `{expected}`"


def test_no_documented_event_is_missing():
    m = re.search(r"^## Events\s*$", DOC, re.MULTILINE)
    assert m, "docs/hooks.md has no '## Events' section"
    documented = set(re.findall(r"^- `(\w+)\(", _section(m.start()), re.MULTILINE))
    ghosts = sorted(documented - set(EVENTS))
    assert not ghosts, f"docs/hooks.md documents events that gage_eval/api/events.py does not define: {ghosts}"


def test_metric_result_keys_are_read_by_the_core():
    m = re.search(r"^\*\*Result keys\.\*\*", DOC, re.MULTILINE)
    assert m, "docs/hooks.md has no '**Result keys.**' table in the Metric contract"
    keys = re.findall(r"^\|\s*`(\w+)`\s*\|", _section(m.start()), re.MULTILINE)
    assert "value" in keys and "counters" in keys, keys
    stale = [k for k in keys if f'"{k}"' not in CORE_SOURCE]
    assert not stale, f"docs/hooks.md documents metric result keys no code in gage_eval/ reads: {stale}"


def test_readme_links_the_hook_reference():
    assert "docs/hooks.md" in (ROOT / "README.md").read_text(encoding="utf-8")
