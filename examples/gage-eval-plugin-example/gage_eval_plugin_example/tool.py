"""A tool for gage-eval's tool loop: a pantry the model may look into and take from.

The loop builds one instance per row (``Pantry(sample)``), so what one row takes is gone for
that row only. Each public method is a function the model may call with keyword arguments;
what it returns goes back to the model as the ``tool`` turn's text (a dict as JSON). Raising is
fine: the loop hands the model the error message as the result and goes on. A call that has not
returned within the task's ``tool_loop.call_timeout_s`` (300 s) is the model's error and the tool is
not called again for that row; a result over ``tool_loop.max_result_chars`` (65,536) is cut.
"""
from __future__ import annotations

from typing import Any, Mapping

from gage_eval.api import tools


class Pantry(tools.Tool):
    def __init__(self, sample: Mapping[str, Any] | None = None):
        super().__init__(sample)
        start = ((sample or {}).get("metadata") or {}).get("pantry") or {}
        self.items: dict[str, int] = {str(k): int(v) for k, v in start.items()}

    def count(self, item: str) -> dict:
        """How many of ``item`` are left."""
        return {"item": item, "count": self.items.get(item, 0)}

    def take(self, item: str, amount: int = 1) -> dict:
        """Take ``amount`` of ``item``; refused when there are not that many."""
        have = self.items.get(item, 0)
        if amount > have:
            raise ValueError(f"only {have} {item} left")
        self.items[item] = have - amount
        return {"item": item, "left": self.items[item]}

    def definitions(self) -> list[dict]:
        # sent to the model when a row has no `tools` of its own
        item = {"type": "string", "description": "what to look for, e.g. eggs"}
        return [
            {"type": "function", "function": {"name": "count", "description": "How many of an item are left.",
                                              "parameters": {"type": "object", "properties": {"item": item},
                                                             "required": ["item"]}}},
            {"type": "function", "function": {"name": "take", "description": "Take some of an item.",
                                              "parameters": {"type": "object", "properties": {
                                                  "item": item, "amount": {"type": "integer"}},
                                                  "required": ["item"]}}},
        ]

    def state(self) -> dict:
        # recorded after each user turn, for a metric that checks where the row ended up
        return dict(self.items)
