"""The per-row fast paths (issue 13, point 4) give exactly what the general code gives:
a plain-field template's output, eliding inline media, and the JSON written per record."""
from __future__ import annotations

import json
import math
import types
from collections import OrderedDict

import pytest

from gage_eval.api import jsonlines
from gage_eval.api.jsonlines import dumps
from gage_eval.api.sample import elide_inline_media
from gage_eval.api.templates import Template

LONG = "data:image/png;base64," + "A" * 400


class Text(str):
    pass


VALUES = ["plain", "", "é ünïcode\n", None, 0, 1.5, True, [1, "a"], {"k": "v"}, Text("sub"), float("nan"),
          "x" * 300]


def _both(template: Template, **variables):
    """(fast-path result, Jinja's result); each a str or the error message."""
    def one(t):
        try:
            return t.render(**variables)
        except ValueError as exc:
            return f"error: {exc}"

    assert template._parts is not None
    jinja = Template.__new__(Template)
    jinja.__dict__.update(template.__dict__, _parts=None)
    return one(template), one(jinja)


@pytest.mark.parametrize("source", ["{{ option.content }}", "{{option.content}}\n", "{{ option['content'] }}",
                                    "{{ question }}", "Question: {{ question }}\nAnswer:",
                                    "{# note #}  {{- question }} / {{ option.content -}}  \n\n", "{{ question }}{{ question }}",
                                    "{% raw %}{{ x }}{% endraw %} {{ question }}\n\n"])
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_plain_field_template_matches_jinja(source, value):
    t = Template(source, "task.yaml: request.choice")
    option = {"content": value}
    fast, jinja = _both(t, option=option, question=value, index=0)
    assert fast == jinja
    assert type(fast) is str


@pytest.mark.parametrize("variables", [
    {}, {"option": {}}, {"option": None}, {"option": "text"}, {"option": {"contents": "x"}},
    {"option": OrderedDict(content="x")}, {"option": types.SimpleNamespace(content="x")},
], ids=repr)
def test_plain_field_template_missing_or_odd_values_match_jinja(variables):
    fast, jinja = _both(Template("{{ option.content }}", "choice"), **variables)
    assert fast == jinja


def test_dict_attribute_names_are_left_to_jinja():
    t = Template("{{ option.items }}", "choice")
    fast, jinja = _both(t, option={"items": "x"})
    assert fast == jinja and fast != "x"  # Jinja finds the dict's method first


def test_only_a_lone_field_takes_the_fast_path():
    for source in ("{{ question | upper }}", "Q: {{ question ~ 'x' }}", "{% set y = 1 %}{{ question }}",
                   "{% if x %}{{ x }}{% endif %}", "{{ a.b.c }}", "{{ option[0] }}", "plain text", "{{ 'const' }}", "{{ self }}", "{{ loop.x }}"):
        assert Template(source, "t")._parts is None, source
    assert Template("{{ a }}", "t")._parts == (("a", None),)
    assert Template("Q: {{ a.b }}\n", "t")._parts == ("Q: ", ("a", "b"))


def test_output_past_the_size_limit_is_left_to_jinja(monkeypatch):
    from gage_eval.api import sandbox
    monkeypatch.setattr(sandbox, "MAX_SIZE", 10)
    t = Template("Q: {{ question }}", "t")
    assert t.render(question="1234567") == "Q: 1234567"
    with pytest.raises(ValueError, match="larger than 10"):
        t.render(question="12345678")


def _elide_reference(record, keep=256):
    """elide_inline_media as it was before the fast paths (the general isinstance walk)."""
    from typing import Mapping

    from gage_eval.api.sample import _elided

    if isinstance(record, Mapping):
        out = None
        for key, value in record.items():
            if key == "url" and isinstance(value, str) and value.startswith("data:") and len(value) > keep:
                new = _elided(value)
            elif isinstance(value, (dict, list)) or (not isinstance(value, (str, int, float)) and
                                                     isinstance(value, Mapping)):
                new = _elide_reference(value, keep)
            else:
                continue
            if new is not value:
                out = dict(record) if out is None else out
                out[key] = new
        return record if out is None else out
    if isinstance(record, list):
        items = None
        for i, value in enumerate(record):
            if isinstance(value, (dict, list)) or (not isinstance(value, (str, int, float)) and
                                                   isinstance(value, Mapping)):
                new = _elide_reference(value, keep)
                if new is not value:
                    items = list(record) if items is None else items
                    items[i] = new
        return record if items is None else items
    return record


class Listish(list):
    pass


RECORDS = [
    {"id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "n": None, "b": True},
    {"messages": [{"content": [{"type": "image_url", "image_url": {"url": LONG}}]}], "url": LONG},
    {"url": "data:short"}, {"url": Text(LONG)}, {"url": 5}, {"other": LONG},
    {"m": types.MappingProxyType({"url": LONG})}, {"l": Listish([{"url": LONG}])}, {"t": ({"url": LONG},)},
    [{"url": LONG}, "x", [{"url": LONG}]], LONG, 3, None, types.MappingProxyType({"x": {"url": LONG}}),
    OrderedDict(url=LONG),
]


@pytest.mark.parametrize("record", RECORDS, ids=range(len(RECORDS)))
def test_elide_inline_media_matches_the_general_walk(record):
    got, want = elide_inline_media(record), _elide_reference(record)
    assert got == want
    assert (got is record) == (want is record)  # shared when nothing changed


def test_text_only_record_is_returned_as_is():
    record = RECORDS[0]
    assert elide_inline_media(record) is record


def _json_dumps(obj):
    opts = {"ensure_ascii": False, "separators": (",", ":"), "default": str, "allow_nan": False}
    try:
        return json.dumps(obj, **opts)
    except ValueError:
        return json.dumps(jsonlines.finite(obj), **opts)


class Number(int):
    pass


class Real(float):
    pass


DUMPED = [
    {"a": 1.5, "b": [float("nan"), -math.inf, math.inf, 1e300, 1e-7, 0.1, -0.0], "c": "é\u2028\x00\"\\ \U0001F600"},
    {1: 2, True: 3, None: 4}, {"x": 2**70, "y": -2**63}, {"s": "\ud800"}, {"t": (1, 2)}, {"set": {1}},
    {"bytes": b"x"}, {"s": Text("x"), "i": Number(4), "f": Real(math.nan)}, OrderedDict(a=[{"b": None}]),
    [], {}, "text", None,
]


@pytest.mark.parametrize("obj", DUMPED, ids=range(len(DUMPED)))
def test_dumps_parses_to_what_json_writes(obj):
    line = dumps(obj)
    assert "\n" not in line and "NaN" not in line and "Infinity" not in line
    assert json.loads(line) == json.loads(_json_dumps(obj))


def test_dumps_without_orjson_is_the_json_encoder(monkeypatch):
    monkeypatch.setattr(jsonlines, "_orjson", None)
    for obj in DUMPED:
        assert dumps(obj) == _json_dumps(obj)


def test_dumps_with_options_uses_json():
    assert dumps({"b": 1, "a": float("nan")}, sort_keys=True) == '{"a":null,"b":1}'


@pytest.mark.parametrize("record", RECORDS, ids=range(len(RECORDS)))
def test_elide_without_orjson_prescan_is_the_same(record, monkeypatch):
    from gage_eval.api import sample
    monkeypatch.setattr(sample, "_orjson", None)
    got, want = elide_inline_media(record), _elide_reference(record)
    assert got == want and (got is record) == (want is record)


def test_elide_prescan_sees_urls_orjson_cannot_reach_by_walking():
    nested = {"a": [{"b": {"url": LONG}}], "c": {1: "non-str key"}, "d": types.MappingProxyType({"url": LONG})}
    assert elide_inline_media(nested) == _elide_reference(nested)
    assert elide_inline_media(nested)["d"]["url"].startswith("data:image/png;elided,sha256=")


# -- row checking, legacy mapping and scoring (second slice) --------------------------------------

class _Map(OrderedDict):
    """A Mapping that is no plain dict: always takes the general path."""


def _general_media(sample):
    """RowChecker._media without its text-only shortcut."""
    from gage_eval.tasks.rows import RowChecker

    checker = RowChecker("t", lambda r, c: r)
    ctx = checker.context("f:1", 0)
    from gage_eval.tasks import rows as rows_mod
    saved = rows_mod._text_only
    rows_mod._text_only = lambda messages: False
    try:
        return checker._media(sample, ctx)
    finally:
        rows_mod._text_only = saved


@pytest.mark.parametrize("sample", [
    {"id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]},
    {"id": "a", "messages": [{"role": "user", "content": "q"}], "unconditioned_input": "u"},
    {"id": "a", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": LONG}}]}]},
    {"id": "a", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "nope.png"}}]}]},
    {"id": "a", "messages": [_Map(role="user", content=[{"type": "image_url", "image_url": {"url": "x.png"}}])]},
    {"id": "a", "messages": [{"role": "user", "content": [_Map(type="image_url", image_url={"url": "x.png"})]}]},
    {"id": "a", "messages": [{"role": "user", "content": "q"}],
     "unconditioned_input": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "a.wav"}}]}]},
    {"id": "a", "messages": [{"role": "user", "content": "q"}],
     "few_shot_examples": [{"messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "s.png"}}]}]}]},
    {"id": "a", "messages": "not a list"},
])
def test_media_check_shortcut_matches_the_general_walk(sample, tmp_path, monkeypatch):
    from gage_eval.tasks.rows import RowChecker

    monkeypatch.chdir(tmp_path)
    checker = RowChecker("t", lambda r, c: r)
    assert checker._media(sample, checker.context("f:1", 0)) == _general_media(sample)


@pytest.mark.parametrize("choices", [["a", "b"], ["x"] * 26, ["x"] * 27, ["a", Text("b")], ["a", 1],
                                     [{"id": "K", "content": "c"}, "d"], ("a", "b"), {"p": "q"}])
def test_options_from_choices_shortcut_matches_the_general_code(choices, monkeypatch):
    from gage_eval.api import sample as sample_mod
    fast = sample_mod._options_from_choices(choices)
    general = [{"id": sample_mod.LETTERS[i] if i < 26 else str(i), "content": str(c)}
               if not (isinstance(c, dict) and "id" in c) else {"id": str(c["id"]), "content": str(c["content"])}
               for i, c in enumerate(choices)] if not isinstance(choices, dict) else \
        [{"id": str(k), "content": str(v)} for k, v in choices.items()]
    assert fast == general
    assert all(type(o["content"]) is str for o in fast)


@pytest.mark.parametrize("answer", [0, 1, "A", "B", "sol b", " A ", "1"])
def test_legacy_references_are_the_normalized_label(answer):
    from gage_eval.api.sample import from_legacy, normalize_references

    sample = from_legacy({}, sample_id="s", question="q", choices=["sol a", "sol b"], answer=answer)
    assert sample["references"] == normalize_references([sample["label"]])


@pytest.mark.parametrize("result", [1, 0, 1.5, True, False, None, {"value": 1}, {"value": True},
                                    {"value": None}, {}, _Map(value=0.5), {"value": "x"}, "x", [1]])
def test_metric_value_matches_the_general_rule(result):
    from gage_eval.api.errors import GageError
    from gage_eval.api.metric import metric_value

    def general(r):
        value = r.get("value") if isinstance(r, Mapping) else r
        if value is None:
            return None
        if isinstance(value, (bool, int, float)):
            return float(value)
        raise GageError(f"metric returned {value!r}; a metric value must be a number or bool")

    def run(f):
        try:
            out = f(result)
            return type(out), out
        except GageError as exc:
            return "error", str(exc)

    assert run(metric_value) == run(general)


from typing import Mapping  # noqa: E402


@pytest.mark.parametrize("path", ["sample.a.b", "sample.l.1", "sample.l.-1", "sample.l.5", "sample.m.x",
                                  "sample.missing", "model_output", "sample.a.b.c", "other.x", "sample.l.--1"])
def test_metric_context_get_reads_dicts_mappings_and_lists(path):
    from gage_eval.api.errors import GageError
    from gage_eval.api.metric import MetricContext

    ctx = MetricContext(sample={"a": {"b": 1}, "l": [10, 20], "m": _Map(x="y")}, model_output={"t": 1})

    def run(**kw):
        try:
            return ctx.get(path, **kw)
        except (KeyError, GageError, ValueError) as exc:
            return type(exc).__name__, str(exc)

    expected = {"sample.a.b": 1, "sample.l.1": 20, "sample.l.-1": 20, "sample.m.x": "y",
                "model_output": {"t": 1}}
    if path in expected:
        assert run() == expected[path]
    elif path == "other.x":
        assert run()[0] == "GageError"
    elif path == "sample.l.--1":
        assert run()[0] == "ValueError"  # int('--1'), as before
    else:
        assert run()[0] == "KeyError" and run(default=None) is None


@pytest.mark.parametrize("source", ["{{ option.content }}", "{{ option['content'] }}", "{{ option.text }}",
                                    "{{ option.items }}", "{{ x.content }}"])
@pytest.mark.parametrize("option", [{"content": v, "text": v, "items": v} for v in VALUES]
                         + [None, "text", {}, OrderedDict(content="x"), types.SimpleNamespace(content="x")], ids=repr)
def test_render_field_is_render(source, option):
    """RequestBuilder.choices' shortcut (Template.render_field) gives what render gives, errors included."""
    t = Template(source, "task.yaml: request.choice")
    variables = {"question": "q", "options": [option], "letters": "AB"}

    def run(f):
        try:
            return f()
        except ValueError as exc:
            return f"error: {exc}"

    if source in ("{{ option.items }}", "{{ x.content }}"):
        assert t.lone_field is None if source == "{{ option.items }}" else t.lone_field == ("x", "content")
        return
    assert t.lone_field is not None
    assert run(lambda: t.render_field(option, variables, index=0)) == \
        run(lambda: t.render(option=option, index=0, **variables))


@pytest.mark.parametrize("content", [None, "s", [], [{"type": "text", "text": "a"}], [{"type": "text"}],
                                     [{"type": "text", "text": Text("t")}], [{"type": "text", "text": 5}],
                                     [{"type": "image_url"}], [OrderedDict(type="text", text="o")], ["raw"],
                                     [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]], ids=repr)
def test_content_text_shortcut_matches_the_general_join(content):
    from gage_eval.api.sample import content_text

    def general(c):
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        parts = [s if isinstance(s, str) else str(s.get("text", "")) for s in c
                 if isinstance(s, str) or (isinstance(s, Mapping) and s.get("type") == "text")]
        return "".join(parts) if len(parts) <= 1 else "\n".join(parts)

    out = content_text(content)
    assert out == general(content) and type(out) is type(general(content))


def test_row_context_shortcut_is_the_constructor():
    from pathlib import Path

    from gage_eval.api.sample import RowContext
    from gage_eval.tasks.rows import _PLAIN_ROW_CONTEXT, RowChecker

    assert _PLAIN_ROW_CONTEXT  # RowContext gained a __post_init__, __slots__ or a field: see RowChecker.context
    checker = RowChecker("t", lambda record, ctx: record, base_dir=Path("/data"), allowed_dirs=[Path("/more")],
                         allow_urls=True)
    fast = checker.context("f.jsonl:3", 2)
    made = RowContext("t", "f.jsonl:3", 2, checker.base_dir, checker.allowed_dirs, True)
    assert fast == made and hash(fast) == hash(made) and repr(fast) == repr(made) and vars(fast) == vars(made)
    with pytest.raises(Exception, match="cannot assign"):
        fast.task = "x"


@pytest.mark.parametrize("text", ['{"a": 1}', "", "  ", "x", '{"a":}', "[1,", '{"a":1,"a":2}', "NaN", "1e999",
                                  '{"a": 1} x', '"\\ud800"', "[1] "])
def test_decode_reports_as_raw_decode_did(text):
    import json as _json

    from gage_eval.api import strictjson
    def via_raw_decode(t):  # the reader as it was: JSONDecoder.raw_decode's own StopIteration handling
        try:
            return strictjson.decode(t)
        except strictjson.JsonProblem as exc:
            return exc.message, exc.pos

    got = via_raw_decode(text)
    try:
        value, end = strictjson._DECODER.raw_decode(text, 0)
    except _json.JSONDecodeError as exc:
        assert got == (exc.msg, exc.pos)
    except strictjson.JsonProblem:
        assert isinstance(got, tuple)
    else:
        assert got == (value, end) or isinstance(got, tuple)  # trailing data, depth, surrogates: checked after


LINES = [b'{"a":1,"a":2}\n', b'{"a":NaN}', b'{"a":-Infinity}', b'{"a":1e400}', b'{"a":18446744073709551616}',
         b'{"a":-9223372036854775809}', b'{"a":9223372036854775807,"b":-0,"c":-0.0,"d":4.9e-324}',
         b'{"a":0.00012345678901234567}', b'{"a":"\\ud800"}', b'{"\\udfff\\udbff":1}', b'{"a":"\\ud83d\\ude00"}',
         b'\xef\xbb\xbf{"a":1}', b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"x\x01"}', b'[1,]', b'{"a":01}',
         b' {"a":[1.5,true,null,"\\/\\b\\u00e9"]} \r\n', b'{"a":1}\x00', b'{"a":\x0c1}', b'', b'"' + b'1' * 25 + b'"',
         b'[' * 2000 + b']' * 2000, json.dumps({"x": [-78.78337319544899, 1e300, "é"]}).encode()]


@pytest.mark.parametrize("raw", LINES)
@pytest.mark.parametrize("orjson_installed", [True, False])
def test_loads_line_reads_as_json_loads(raw, orjson_installed, monkeypatch):
    """A samples line read back: the value json.loads gives (an int past 64 bits an int, NaN a float)
    or its error, whether orjson reads it or not."""
    if not orjson_installed:
        monkeypatch.setattr(jsonlines, "_orjson", None)

    def one(f):
        try:
            value = f(raw)
            return repr(value), [type(v) for v in value.values()] if isinstance(value, dict) else None
        except (ValueError, RecursionError) as exc:
            return type(exc).__name__, str(exc)
    assert one(jsonlines.loads_line) == one(json.loads)
