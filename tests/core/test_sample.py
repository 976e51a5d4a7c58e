"""Sample v1 helpers: the legacy mapping of spec 000 section 1.5 and few-shot rendering."""
from __future__ import annotations

import pytest

from gage_eval.api.sample import (from_legacy, label_text, last_user_text, messages_text, normalize_references,
                              reference_texts, render_few_shot)
from gage_eval.tasks.requests import segment_types
from gage_eval.api.schemas import validation_errors


def test_question_and_choices_map_to_messages_options_and_option_map():
    s = from_legacy({"question": "Which is a mammal?", "choices": ["Shark", "Dolphin"], "answer": 1,
                     "question_type": "multiple-choice"}, sample_id="mc1")
    assert s["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Which is a mammal?"}]}]
    assert s["options"] == [{"id": "A", "content": "Shark"}, {"id": "B", "content": "Dolphin"}]
    assert s["metadata"]["option_map"] == {"A": "Shark", "B": "Dolphin"}
    assert s["label"] == "B" and s["references"] == [{"answer": [{"type": "text", "text": "B"}]}]
    assert s["task_type"] == "multiple-choice"
    assert validation_errors(s, "sample") == []


@pytest.mark.parametrize("record, label", [
    ({"prompt": "p", "choices": {"X": "x", "Y": "y"}, "label": "Y"}, "Y"),
    ({"text": "t", "choices": ["a", "b", "c"], "answer": "c"}, "C"),
    ({"question": "q", "choices": ["a", "b"], "answer": "1"}, "B"),
    ({"question": "q", "answer": "Paris"}, "Paris"),
])
def test_answer_forms(record, label):
    s = from_legacy(record, sample_id="x")
    assert s["label"] == label and label_text(s) == label


@pytest.mark.parametrize("record, message", [
    ({"choices": ["a"]}, "no question"),
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "outside the 2 choices"),
    ({"question": "q", "choices": ["a", "b"], "answer": "Z"}, "neither an option id"),
    ({"question": 3}, "must be a string"),
    ({"question": "q", "choices": []}, "non-empty"),
])
def test_bad_legacy_records(record, message):
    with pytest.raises(ValueError, match=message):
        from_legacy(record, sample_id="x")


def test_few_shot_rendered_before_the_question_after_system():
    s = {"schema_version": "v1", "id": "f", "references": ["4"],
         "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}],
         "few_shot_examples": [{"messages": [{"role": "user", "content": "1+1?"}], "references": ["2"]},
                               {"messages": [{"role": "user", "content": "1+2?"}], "references": [], "label": "3"}]}
    assert validation_errors(s, "sample") == []
    rendered = render_few_shot(s)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages_text(rendered, "assistant") == "2\n\n3"
    assert last_user_text(rendered) == "2+2?"


def test_reference_helpers_and_segments():
    s = {"references": ["a", {"answer": [{"type": "text", "text": "b"}]}, {"answer": "c"}],
         "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                                   {"type": "text", "text": "what?"}]}]}
    assert reference_texts(s) == ["a", "b", "c"]
    assert segment_types(s["messages"]) == {"image_url", "text"}
    assert normalize_references("x") == [{"answer": [{"type": "text", "text": "x"}]}]
