"""Preprocessors for MMMU and DocVQA rows (the Hugging Face column layouts) into Sample v1.

Images become ``image_url`` segments: embedded bytes as data URLs, paths resolved from
the data file's folder (``ctx.base_dir``) and kept inside it (gage_eval.api.paths), http(s)
URLs kept only with ``--allow-urls``. The written samples file carries
a short placeholder instead of each inline image (gage_eval.api.sample.elide_inline_media).
"""
from __future__ import annotations

import ast
import re
from typing import Any, Mapping

from string import ascii_uppercase as LETTERS

from gage_eval.api import SCHEMA_VERSION, Preprocessor, RowContext, jsonio, normalize_references, text_segment

from gage_plugins_builtin.multimodal.media import image_segment, to_image_url
from gage_plugins_builtin.preprocessors import row_id

MC_INSTRUCTION = "Answer with the option's letter from the given choices directly."
OPEN_INSTRUCTION = "Answer the question using a single word or phrase."
DOCVQA_INSTRUCTION = "Answer the question using a single word or phrase."
_MARKER = re.compile(r"<image (\d+)>")
_ID = re.compile(r"^[A-Za-z]+_(.+?)_\d+$")


def _required(record: Mapping[str, Any], name: str) -> Any:
    if record[name] is None:  # (a missing field is the KeyError)
        raise ValueError(f"field {name!r} is null")
    return record[name]


def _string(record: Mapping[str, Any], name: str) -> str:
    value = _required(record, name)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {jsonio.json_type(value)}")
    return value


def _texts(values: list, name: str) -> list[str]:
    """The items of a list field as strings: each a string or a number, else the row's error."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"field {name!r}: an item is {jsonio.shown(value)}, not a string or a number")
    return [str(v) for v in values]


def _literal_list(value: Any, name: str) -> list:
    """MMMU keeps lists as Python literals in strings (``"['$6', '$7']"``)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a list or a list literal, got {jsonio.json_type(value)}")
    text = value.strip()
    if not text:
        return []
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise ValueError(f"field {name!r} is not a list literal: {text[:60]!r}") from None
    if not isinstance(parsed, (list, tuple)):
        raise ValueError(f"field {name!r} is not a list: {text[:60]!r}")
    return list(parsed)


def interleave(text: str, images: Mapping[int, str]) -> list[dict]:
    """Text and ``image_url`` segments, each image at the first ``<image k>`` marker naming it.

    Text around the markers is stripped and empty pieces dropped (as lmms-eval's
    interleaved messages); a repeated marker stays in the text. ``images`` maps k
    to a URL; a marker without an image raises ``ValueError``.
    """
    segments: list[dict] = []
    placed: set[int] = set()
    pos = 0
    pending = ""
    for match in _MARKER.finditer(text):
        k = int(match.group(1))
        if k in placed:
            continue
        if k not in images:
            raise ValueError(f"the text refers to <image {k}> but field 'image_{k}' holds no image")
        pending += text[pos:match.start()]
        if pending.strip():
            segments.append(text_segment(pending.strip()))
        pending = ""
        segments.append(image_segment(images[k]))
        placed.add(k)
        pos = match.end()
    pending += text[pos:]
    if pending.strip():
        segments.append(text_segment(pending.strip()))
    return segments


def subject_of(sample_id: str) -> str | None:
    match = _ID.match(sample_id)
    return match.group(1) if match else None


class MMMU(Preprocessor):
    """An MMMU row (``id``, ``question``, ``options``, ``answer``, ``question_type``,
    ``subfield``, ``image_1`` .. ``image_7``) as in lmms-eval ``mmmu_val``.

    The prompt is the question, then for multiple choice the options as ``A. ...``
    lines and ``mc_instruction`` after a blank line, for open questions
    ``open_instruction`` after a blank line; images sit at their ``<image k>``
    markers (in the question or the options). ``data_tag`` holds subject (from the
    id), subfield and question_type, so accuracy is sliced by each.
    """

    def __init__(self, mc_instruction: str = MC_INSTRUCTION, open_instruction: str = OPEN_INSTRUCTION,
                 max_images: int = 7):
        self.mc_instruction = mc_instruction
        self.open_instruction = open_instruction
        self.max_images = int(max_images)

    def prompt_text(self, question: str, options: list[str]) -> str:
        if options:
            listed = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
            return f"{question}\n{listed}\n\n{self.mc_instruction}"
        return f"{question}\n\n{self.open_instruction}"

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        sample_id = row_id(record, "id")
        question = _string(record, "question")
        qtype = _string(record, "question_type")
        answer = _required(record, "answer")
        if qtype == "multiple-choice":
            options = _texts(_literal_list(record.get("options", "[]"), "options"), "options")
            if not options:
                raise ValueError("options: a multiple-choice row needs options")
            if len(options) > len(LETTERS):
                raise ValueError(f"options: {len(options)} options; at most {len(LETTERS)} can be lettered")
        elif qtype == "open":
            options = []
        else:
            raise ValueError(f"question_type: {jsonio.shown(qtype)} is neither 'multiple-choice' nor 'open'")
        text = self.prompt_text(question, options)
        wanted = {int(k) for k in _MARKER.findall(text)}
        images = {}
        for k in sorted(wanted):
            if k > self.max_images:
                raise ValueError(f"question: <image {k}> is beyond the {self.max_images} image fields")
            url = to_image_url(record.get(f"image_{k}"), ctx, f"image_{k}")
            if url is not None:
                images[k] = url
        content = interleave(text, images)
        if options:
            letters = list(LETTERS[:len(options)])
            label = answer.strip() if isinstance(answer, str) else answer
            if label not in letters:
                raise ValueError(f"answer: {jsonio.shown(label)} is not one of the option letters {', '.join(letters)}")
            references = [label]
        else:
            golds = answer if isinstance(answer, list) else [answer]
            text_answer = str(answer).strip()
            if text_answer.startswith("[") and text_answer.endswith("]"):
                try:
                    golds = _literal_list(text_answer, "answer")
                except ValueError:
                    golds = [text_answer]
            references = _texts(golds, "answer")
            label = references[0]
        for name in ("subfield", "subject"):  # slices of the scores: a string or nothing
            if record.get(name) is not None and not isinstance(record[name], str):
                raise ValueError(f"field {name!r} must be a string, got {jsonio.json_type(record[name])}")
        subject = subject_of(sample_id) or record.get("subject")
        tags = {"subject": subject, "subfield": record.get("subfield"), "question_type": qtype}
        sample: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "id": sample_id,
            "task_type": "multiple-choice" if options else "short-answer",
            "messages": [{"role": "user", "content": content}],
            "references": normalize_references(references),
            "label": label,
            "data_tag": {k: v for k, v in tags.items() if v},
            "metadata": {k: record[k] for k in ("subfield", "topic_difficulty", "img_type", "question_type")
                         if record.get(k) is not None},
        }
        if options:
            sample["options"] = [{"id": letter, "content": o} for letter, o in zip(LETTERS, options)]
        if subject:
            sample["metadata"]["subject"] = subject
        return sample


class DocVQA(Preprocessor):
    """A DocVQA row in the lmms-lab/DocVQA layout (``questionId``, ``question``, ``image``,
    ``answers``, ``question_types``) as in lmms-eval ``docvqa_val``: the page image,
    then the question followed by ``instruction`` on a new line. Every answer is a reference."""

    def __init__(self, instruction: str = DOCVQA_INSTRUCTION, image_field: str = "image"):
        self.instruction = instruction
        self.image_field = image_field

    def __call__(self, record: Mapping[str, Any], ctx: RowContext) -> dict:
        qid = row_id(record, "questionId")
        question = _string(record, "question")
        answers = _texts(_literal_list(_required(record, "answers"), "answers"), "answers")
        if not answers:
            raise ValueError("field 'answers' is empty; ANLS needs at least one gold answer")
        url = to_image_url(_required(record, self.image_field), ctx, self.image_field)
        if url is None:
            raise ValueError(f"field {self.image_field!r} holds no image")
        text = f"{question}\n{self.instruction}" if self.instruction else question
        sample: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "id": qid,
            "task_type": "doc-qa",
            "messages": [{"role": "user", "content": [image_segment(url), text_segment(text)]}],
            "references": normalize_references(answers),
            "label": answers[0],
            "metadata": {k: record[k] for k in ("docId", "ucsf_document_id", "ucsf_document_page_no")
                         if record.get(k) is not None},
        }
        types = record.get("question_types")
        if types:
            types = _texts([types] if isinstance(types, str) else types, "question_types") \
                if isinstance(types, (str, list)) else _literal_list(types, "question_types")
            sample["data_tag"] = {"question_type": types}
        return sample
