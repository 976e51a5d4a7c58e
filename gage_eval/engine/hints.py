"""One-line hints a run prints on stderr before its model loads, where lm-evaluation-harness
warns the same (said in our words, with our flags)."""
from __future__ import annotations

from typing import Any, Sequence

from gage_eval.tasks.spec import TaskSpec


def chat_template_hint(backend: Any, options: Any, specs: Sequence[TaskSpec]) -> str | None:
    """lm-eval's "appears to be an instruct or chat variant but chat template is not applied":
    said when the backend declares a chat template of its own (``Backend.chat_template``) and a
    task formats its prompts without it (``request.chat`` false, no ``--apply-chat-template``).
    An explicit ``--no-apply-chat-template`` or ``--quiet`` says nothing. Returns the line said."""
    if not getattr(backend, "chat_template", False) or options.apply_chat_template is not None or options.quiet:
        return None
    plain = [spec.name for spec in specs if not spec.request.get("chat")]
    if not plain:
        return None
    import click

    named = ", ".join(plain[:3]) + (f" and {len(plain) - 3} more" if len(plain) > 3 else "")
    line = (f"gage-eval: hint: {backend.model_id} has a chat template (an instruct or chat model), but "
            f"{named} format{'s' if len(plain) == 1 else ''} prompts without it; --apply-chat-template applies it "
            f"(and --fewshot-as-multiturn puts few-shot examples in turns of their own), as lm-eval recommends")
    click.echo(line, err=True)
    return line
