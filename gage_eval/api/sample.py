"""Sample v1 (spec 000): the legacy field mapping, few-shot rendering, and text helpers."""
from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from gage_eval.api.strictjson import json_type, shown

SCHEMA_VERSION = "v1"
MEDIA_SEGMENTS = ("image_url", "audio_url", "video_url", "file_url")
LETTERS = string.ascii_uppercase


@dataclass(frozen=True)
class RowContext:
    """Where a record came from; handed to preprocessors."""

    task: str
    locator: str
    index: int
    base_dir: Path | None = None
    # folders beyond base_dir that data paths may point into (--allow-path), and whether
    # http(s) URLs in data may be fetched by the harness (--allow-urls)
    allowed_dirs: tuple[Path, ...] = ()
    allow_urls: bool = False


def text_segment(text: str) -> dict:
    return {"type": "text", "text": text}


def user_message(text: str) -> dict:
    return {"role": "user", "content": [text_segment(text)]}


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text segments of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if type(content) is list and len(content) == 1:  # one plain text segment: the usual message
        seg = content[0]
        if type(seg) is dict and seg.get("type") == "text":
            return str(seg.get("text", ""))
    parts = []
    for seg in content:
        if isinstance(seg, str):
            parts.append(seg)
        elif (type(seg) is dict or isinstance(seg, Mapping)) and seg.get("type") == "text":
            parts.append(str(seg.get("text", "")))
    return "".join(parts) if len(parts) <= 1 else "\n".join(parts)


def messages_text(messages: Iterable[Mapping], role: str | None = None) -> str:
    """All text of the messages (of one role, if given), one message a paragraph."""
    return "\n\n".join(content_text(m.get("content")) for m in messages
                       if role is None or m.get("role") == role)


def text_chat(messages: Iterable[Mapping]) -> list[dict]:
    """The messages with each content flattened to its text, for a text-only chat template."""
    return [{"role": m.get("role", "user"), "content": content_text(m.get("content"))} for m in messages]


def last_user_text(messages: Sequence[Mapping]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def reference_text(reference: Any) -> str:
    """A reference item (string, or ``{"answer": str | segments}``) as plain text."""
    if type(reference) is dict or isinstance(reference, Mapping):
        answer = reference.get("answer")
        return answer if isinstance(answer, str) else content_text(answer)
    return "" if reference is None else str(reference)


def reference_texts(sample: Mapping[str, Any]) -> list[str]:
    return [reference_text(r) for r in sample.get("references") or []]


def label_text(sample: Mapping[str, Any]) -> str:
    """``label`` if present, else the text of ``references[0]``."""
    if sample.get("label") is not None:
        return str(sample["label"])
    refs = reference_texts(sample)
    return refs[0] if refs else ""


def normalize_references(refs: Any) -> list[dict]:
    """Accept the string shorthand and return reference items ``{"answer": [segments]}``."""
    if refs is None:
        return []
    if not isinstance(refs, list):
        refs = [refs]
    out = []
    for ref in refs:
        if (type(ref) is dict or isinstance(ref, Mapping)) and "answer" in ref:
            answer = ref["answer"]
            item = dict(ref)
            item["answer"] = [text_segment(answer)] if isinstance(answer, str) else answer
            out.append(item)
        else:
            out.append({"answer": [text_segment(str(ref))]})
    return out


def _options_from_choices(choices: Any) -> list[dict]:
    if type(choices) is dict or (type(choices) is not list and isinstance(choices, Mapping)):
        return [{"id": str(k), "content": str(v)} for k, v in choices.items()]
    if type(choices) is list and len(choices) <= len(LETTERS):  # plain strings: str(c) is c
        options = []
        for i, choice in enumerate(choices):
            if type(choice) is not str:
                break
            options.append({"id": LETTERS[i], "content": choice})
        else:
            return options
    options = []
    for i, choice in enumerate(choices):
        if (type(choice) is dict or (type(choice) is not str and isinstance(choice, Mapping))) and "id" in choice:
            options.append({"id": str(choice["id"]), "content": str(choice.get("content", choice.get("text", "")))})
        elif isinstance(choice, (str, int, float)) and not isinstance(choice, bool):
            options.append({"id": LETTERS[i] if i < len(LETTERS) else str(i), "content": str(choice)})
        else:
            raise ValueError(f"choice {i} is {json_type(choice)}, not a string or a number")
    return options


def _label_for(answer: Any, options: list[dict]) -> str:
    ids = [o["id"] for o in options]
    if options and isinstance(answer, bool):
        raise ValueError(f"answer {shown(answer)} is a boolean, not an option index or id")
    if type(answer) is float and answer.is_integer():  # JSON's 1.0 is 1 (a CSV column with a gap is float)
        answer = int(answer)
    if options and isinstance(answer, int):
        if not 0 <= answer < len(options):
            raise ValueError(f"answer index {answer} is outside the {len(options)} choices")
        return ids[answer]
    text = str(answer).strip()
    if options and text not in ids:
        contents = [o["content"] for o in options]
        if text in contents:
            return ids[contents.index(text)]
        if text.isdigit() and 0 <= int(text) < len(options):
            return ids[int(text)]
        raise ValueError(f"answer {shown(answer)} is neither an option id ({', '.join(ids[:26])}{', ...' if len(ids) > 26 else ''}) nor an index")
    return text


def _field_name(what: str, found: Mapping[str, str], fields: Mapping[str, str] | None) -> str:
    """The name a message gives a legacy field: the record key it was read from, else the name
    the caller gave (``fields``), else the field's own name."""
    if what in found:
        return found[what]
    names = {"question": "question", "choices": "choices", "answer": "answer", **(fields or {})}
    return names[what]


def from_legacy(record: Mapping[str, Any], *, sample_id: str, question: Any = None,
                choices: Any = None, answer: Any = None, task_type: str | None = None,
                system: str | None = None, fields: Mapping[str, str] | None = None) -> dict:
    """Build a Sample v1 from legacy fields (spec 000 section 1.5).

    ``question`` is the prompt text (legacy ``question``/``prompt``/``text``),
    ``choices`` a list of strings, a mapping id -> text or a list of
    ``{id, content}``; ``answer`` an option index, an option id, or the answer
    text. ``fields`` names the record fields the given ``question``, ``choices`` and
    ``answer`` came from, for the messages. Raises ``ValueError`` naming the field.
    """
    found: dict[str, str] = {}  # the record fields question and answer were read from (for messages)
    if question is None:
        for key in ("question", "prompt", "text"):
            if record.get(key) is not None:
                question, found["question"] = record[key], key
                break
    if question is None and not record.get("messages"):
        raise ValueError("no question: expected one of 'question', 'prompt', 'text' or 'messages'")
    if choices is None:
        choices = record.get("choices")
    if answer is None:
        for key in ("answer", "label"):
            if key in record:
                answer, found["answer"] = record[key], key
                break
    sample: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "id": sample_id}
    kind = task_type or record.get("task_type") or record.get("question_type")
    if kind:
        sample["task_type"] = str(kind)
    sample["messages"] = _legacy_messages(record, question, system, found, fields)
    metadata: dict[str, Any] = {}
    options: list[dict] = []
    if choices is not None:
        if not isinstance(choices, (list, tuple, Mapping)) or not choices:
            raise ValueError(f"{_field_name('choices', found, fields)}: choices must be a non-empty list or mapping")
        try:
            options = _options_from_choices(choices)
        except ValueError as exc:
            raise ValueError(f"{_field_name('choices', found, fields)}: {exc}") from None
        sample["options"] = options
        option_map = metadata["option_map"] = {}
        for o in options:
            option_map[o["id"]] = o["content"]
    if answer is None:
        sample["references"] = []
    else:
        try:
            label = _label_for(answer, options)
        except ValueError as exc:
            raise ValueError(f"{_field_name('answer', found, fields)}: {exc}") from None
        # normalize_references([label]) for the str label _label_for returns
        sample["references"] = [{"answer": [{"type": "text", "text": label}]}]
        sample["label"] = label
    if metadata:
        sample["metadata"] = metadata
    return sample


def _legacy_messages(record: Mapping[str, Any], question: Any, system: str | None, found: dict[str, str],
                     fields: Mapping[str, str] | None) -> list[dict]:
    """The record's own messages, or the question as one user message; the system message first."""
    if record.get("messages"):
        messages = [dict(m) for m in record["messages"]]
    else:
        if not isinstance(question, str):
            raise ValueError(f"{_field_name('question', found, fields)}: question must be a string, "
                             f"got {json_type(question)}")
        messages = [{"role": "user", "content": [{"type": "text", "text": question}]}]  # user_message(question)
    if system:
        messages.insert(0, {"role": "system", "content": [text_segment(system)]})
    return messages


def render_few_shot(sample: Mapping[str, Any]) -> list[dict]:
    """The sample's messages with its few-shot examples rendered in front of them.

    Each example contributes its messages and then an assistant message holding
    its label (or the text of its first reference). System messages of the
    sample stay first.
    """
    messages = list(sample.get("messages") or [])
    shots = sample.get("few_shot_examples") or []
    if not shots:
        return messages
    system = [m for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    rendered: list[dict] = []
    for shot in shots:
        rendered.extend(dict(m) for m in shot.get("messages") or [])
        answer = label_text(shot)
        rendered.append({"role": "assistant", "content": [text_segment(answer)]})
    return system + rendered + rest


INLINE_MEDIA_KEEP = 256  # data: URLs up to this many characters are written as they are


def elide_inline_media(record: Any, keep: int = INLINE_MEDIA_KEEP) -> Any:
    """A copy of ``record`` with each long ``data:`` URL (a ``url`` value) replaced by a short
    placeholder ``data:<mime>;elided,sha256=<hex>;chars=<n>``, so inline images do not bloat
    the written samples. The input is not changed; parts without such URLs are shared.

    Per row (every written record passes here): plain dicts, lists and JSON scalars are told
    apart by their exact type, so a text-only record costs one walk with no ``typing.Mapping``
    checks; anything else goes through the general checks below, with the same result.
    A plain dict is first written with orjson (when installed, a few microseconds): an elided
    URL is a ``url`` key with a string value starting ``data:``, which always writes as
    ``"url":"data:``, so without those bytes the walk would change nothing and is skipped.
    What orjson cannot write (a Mapping that is no dict, a non-str key) is walked."""
    t = type(record)
    if t is dict:
        if _orjson is not None:
            try:
                if _DATA_URL not in _orjson.dumps(record, default=_refuse):
                    return record
            except TypeError:  # orjson.JSONEncodeError
                pass
        return _elide_mapping(record, keep)
    if t is list:
        return _elide_list(record, keep)
    if t in _LEAVES:
        return record
    if isinstance(record, Mapping):
        return _elide_mapping(record, keep)
    if isinstance(record, list):
        return _elide_list(record, keep)
    return record


try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a core dependency; the walk alone is exact too
    _orjson = None
_DATA_URL = b'"url":"data:'


def _refuse(obj: Any) -> Any:
    raise TypeError


_LEAVES = frozenset({str, int, float, bool, type(None)})  # never hold a url; a str is checked by its key


def _container(value: Any) -> bool:
    """Whether ``value`` may hold a url (the general case of a value that is no plain dict, list or leaf)."""
    return isinstance(value, (dict, list)) or (not isinstance(value, (str, int, float)) and isinstance(value, Mapping))


def _elide_mapping(record: Any, keep: int) -> Any:
    out = None
    for key, value in record.items():
        tv = type(value)
        if tv is str or (tv not in _LEAVES and tv is not dict and tv is not list and isinstance(value, str)):
            if key == "url" and len(value) > keep and value.startswith("data:"):
                new = _elided(value)
            else:
                continue
        elif tv is dict or tv is list or (tv not in _LEAVES and _container(value)):
            new = elide_inline_media(value, keep)  # only containers can hold a url (a per-row path)
        else:
            continue
        if new is not value:
            out = dict(record) if out is None else out
            out[key] = new
    return record if out is None else out


def _elide_list(record: list, keep: int) -> list:
    items = None  # copied on the first change only
    for i, value in enumerate(record):
        tv = type(value)
        if tv is dict or tv is list or (tv not in _LEAVES and _container(value)):
            new = elide_inline_media(value, keep)
            if new is not value:
                items = list(record) if items is None else items
                items[i] = new
    return record if items is None else items


def _elided(url: str) -> str:
    import hashlib

    mime = url[5:url.find(";")] if ";" in url[:64] else "application/octet-stream"
    digest = hashlib.sha256(url.encode("ascii", "replace")).hexdigest()
    return f"data:{mime};elided,sha256={digest};chars={len(url)}"
