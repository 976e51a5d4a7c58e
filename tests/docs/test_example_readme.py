"""The example plugin's README names everything the plugin registers: each component and task folder."""
from __future__ import annotations

import importlib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gage-eval-plugin-example"


def test_every_name_the_example_plugin_registers_is_in_its_readme(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    plugin = importlib.import_module("gage_eval_plugin_example")
    names: list[str] = []
    for hook in sorted(h for h in dir(plugin) if h.startswith("gage_register_") and h != "gage_register_task_paths"):
        getattr(plugin, hook)(register=lambda name, *args, **kwargs: names.append(name))
    names += [p.name for p in sorted((EXAMPLE / "gage_eval_plugin_example" / "tasks").iterdir())
              if (p / "task.yaml").is_file()]
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    assert len(names) >= 7 and not [n for n in names if f"`{n}`" not in readme], names
