"""Task templates: sandboxed and bounded; a failure at load is a GageError naming file:line, a
failure at render a ValueError naming file:line and the problem (the row's error, stage template)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gage_eval.api.errors import GageError
from gage_eval.api.sandbox import MAX_SIZE
from gage_eval.api.templates import Template

ROOT = Path(__file__).resolve().parents[2]
VARS = {"sample": {"id": "s1"}, "messages": [], "question": "Why?", "options": [{"content": "a"}],
        "metadata": {}, "letters": "ABCD"}


def render_error(source: str, path: str = "/t/prompt.jinja") -> str:
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        Template(source, path, is_file=True).render(**VARS)
    assert time.perf_counter() - t0 < 5
    return str(err.value)


@pytest.mark.parametrize("source, message", [
    ("Q: {{ question }}\n\nA: {{ q }}", "/t/prompt.jinja:3: 'q' is undefined; "
                                        "available: sample, messages, question, options, metadata, letters"),
    ("{{ sample.nope }}", "/t/prompt.jinja:1: 'sample' has no key 'nope'; its keys: id"),
    ("x\n{% for i in range(10**12) %}{{ i }}{% endfor %}",
     f"/t/prompt.jinja:2: range() got the number 1000000000000, larger than the limit {MAX_SIZE}"),
    ("{{ range(200000)|length }}", "/t/prompt.jinja:1: Range too big. The sandbox blocks ranges larger than "
                                   "MAX_RANGE (100000)."),
    ("{{ 'x' * 10**9 }}", f"/t/prompt.jinja:1: '*' would make a value longer than {MAX_SIZE} characters"),
    ("{{ ([0] * 10**9)|length }}", "'*' would make a value longer than"),
    ("{{ 2 ** 10000000 }}", "'**' would make a number of more than 100000 bits"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "'~' would be longer than"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     "'+' would make a value longer than"),
    ("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
     f"/t/prompt.jinja: template output larger than {MAX_SIZE} characters"),
    ("{{ 'x'|center(10**9) }}", "filter 'center' got the number 1000000000"),
    ("{{ 'x'.ljust(10**9) }}", "ljust() got the number 1000000000"),
    ("{{ '{:>1000000000}'.format('x') }}", "format(): a format width or precision larger than"),
    ("{{ '{x:>99999999}'.format_map({'x': 1}) }}", "format_map(): a format width or precision larger than"),
    ("{{ '{0}'.format_map({}) }}", "/t/prompt.jinja:1: IndexError: tuple index out of range"),
    ("{{ '%1000000000s' % 'x' }}", "'%': a format width or precision larger than"),
    ("{{ '%*s' % (10**9, 'x') }}", "'%' got the number 1000000000"),
    ("{{ '%1000000000d'|format(1) }}", "filter 'format': a format width or precision larger than"),
    ("{{ lipsum(10**9) }}", "got the number 1000000000"),
    ("{{ lipsum(3999999) }}", "lipsum() would be longer than"),
    ("{{ (['x' * 3999999] * 250)|join }}", "'*' would make a list of more than 4000000 characters"),
    ("{{ ['x' * 3999999] * 2 }}", "'*' would make a list of more than"),
    ("{% set ns = namespace(l=['x' * 3999999]) %}{% for i in range(8) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"
     "{{ ns.l|join }}", "the result of filter 'join' would be longer than"),
    ("{{ ['x' * 3000000, 'y']|join('z' * 3000000) }}", "the result of filter 'join' would be longer than"),
    ("{{ [1]|batch(3999999, 'x' * 3999999)|join }}", "the result of filter 'join' would be longer than"),
    ("{{ ''.join([1]|batch(3999999, 'x' * 3999999)) }}", "the result of join() would be longer than"),
    ("{{ [1]|batch(3999999, 'x' * 3999999)|list }}", "writing a list or dict: a value of more than"),
    ("{{ [1]|batch(3999999, 'x' * 3999999)|list ~ '' }}", "writing a list or dict: a value of more than"),
    ("{{ [1]|batch(3999999, 'x' * 3999999)|list|tojson }}", "filter 'tojson': a value of more than"),
    ("{{ '%s' % ([1]|batch(3999999, 'x' * 3999999)|list) }}", "'%': a value of more than"),
    ("{{ ('a\n' * 60)|indent(3999999) }}", "the result of filter 'indent' would be longer than"),
    ("{{ ('a\n' * 60)|indent('x' * 100000) }}", "the result of filter 'indent' would be longer than"),
    ("{{ ('ab' * 2000)|replace('', 'y' * 3999999) }}", "the result of filter 'replace' would be longer than"),
    ("{{ ('ab' * 2000).replace('a', 'y' * 3999999) }}", "the result of replace() would be longer than"),
    ("{{ ('\t' * 1000).expandtabs(3999999) }}", "the result of expandtabs() would be longer than"),
    ("{{ ('a' * 1000).translate({97: 'x' * 3999999}) }}", "the result of translate() would be longer than"),
    ("{{ ('x' * 1600000)|wordwrap(1) }}", "filter 'wordwrap': breaking words of up to 1600000 characters at width 1"),
    ("{{ (('x' * 999 ~ ' ') * 4000)|wordwrap(1) }}", "would take too long"),
    ("{{ ('x' * 4000000)|wordwrap(79) }}", "would take too long"),
    ("{{ ('x ' * 1000)|wordwrap(1, wrapstring='y' * 10000) }}", "the result of filter 'wordwrap' would be longer"),
    ("{{ ''.__class__.__mro__ }}", "/t/prompt.jinja:1: not allowed in a template: access to attribute "
                                   "'__class__' of 'str' object is unsafe."),
    ("{{ options.append(1) }}", "not allowed in a template: access to attribute 'append'"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion too deep"),
    ("a\nb\n{{ 1 / 0 }}", "/t/prompt.jinja:3: ZeroDivisionError: division by zero"),
    ("{{ 1 + 'a' }}", "TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
])
def test_render_failures_are_value_errors_naming_the_line(source, message):
    assert message in render_error(source)


def test_ordinary_templates_render_as_before():
    source = ("{{ question }} {{ options|length }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 2 ** 10 }} {{ 'a%sb' % 1 }} "
              "{{ '{}x'.format(3) }} {{ 7 % 3 }} {{ letters[0] ~ '.' }} {{ 'x'|center(5) }}"
              "{% for o in options %} {{ loop.index }}{% endfor %}")
    assert Template(source, "p").render(**VARS) == "Why? 1 ababab [1, 2] 1024 a1b 3x 1 A.   x   1"
    big = "y" * (MAX_SIZE - 10)
    assert Template("{{ big }}", "p").render(big=big) == big
    source = ("{{ ['a', 'b']|join(', ') }}|{{ 'a b'|replace(' ', '--') }}|{{ 'a\nb'|indent(2) }}|"
              "{{ 'aaa bb'|wordwrap(3) }}|{{ '-'.join(['x', 1]|map('string')) }}|{{ 'a\tb'.expandtabs(2) }}|"
              "{{ 'ab'.translate({97: 'xy'}) }}|{{ [1, 'a'] }}|{{ ([1] * 2) ~ '' }}|{{ [1, 2]|batch(1)|list }}")
    assert Template(source, "p").render() == "a, b|a--b|a\n  b|aaa\nbb|x-1|a b|xyb|[1, 'a']|[1, 1]|[[1], [2]]"
    assert Template("{{ big|replace('y', 'z') }}{{ [big]|join }}", "p").render(big="y" * 1_000_000) == \
        "z" * 1_000_000 + "y" * 1_000_000


@pytest.mark.parametrize("source", ["{{ (['x' * 3999999] * 250)|join }}", "{{ ('a\n' * 60)|indent(3999999) }}",
                                    "{{ ('ab' * 2000)|replace('', 'y' * 3999999) }}"])
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_refused_templates_stay_small(source):
    """The size is known from the arguments: refused before the value is built (peak memory, not just speed)."""
    code = ("import sys\nfrom gage_eval.api.templates import Template\n"
            "try:\n    Template(sys.argv[1], 'p').render()\nexcept ValueError as e:\n    print(e)\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
            "print(int(hwm.split()[1]) // 1024)")  # ru_maxrss would keep the parent's peak across exec
    proc = subprocess.run([sys.executable, "-c", code, source], capture_output=True, text=True, cwd=ROOT, timeout=60)
    message, peak_mb = proc.stdout.splitlines()
    assert "would be longer than" in message or "would make a list" in message
    assert int(peak_mb) < 150, (source, peak_mb)


@pytest.mark.parametrize("source, line", [
    ("a\n{% include 'other.jinja' %}", 2),
    ("{% import 'macros.jinja' as m %}", 1),
    ("{% from 'macros.jinja' import m %}", 1),
    ("\n\n{% extends 'base.jinja' %}", 3),
])
def test_other_files_are_refused_at_load(source, line):
    with pytest.raises(GageError) as err:
        Template(source, "/t/prompt.jinja", is_file=True)
    assert str(err.value) == (f"/t/prompt.jinja:{line}: include/import/extends are not supported: "
                              f"write the template in one file")


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(GageError, match=r"^/t/p.jinja:2: template syntax error: unexpected end of template"):
        Template("a\n{{ x", "/t/p.jinja", is_file=True)
    with pytest.raises(GageError, match="nested too deeply"):
        Template("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "/t/p.jinja", is_file=True)
    path = tmp_path / "p.jinja"
    path.write_bytes(b"Q: {{ question }}\nA: caf\xe9\n")
    with pytest.raises(GageError, match=rf"^{path}:2: not UTF-8 text"):
        Template.from_file(path)
    with pytest.raises(GageError, match="cannot read"):
        Template.from_file(tmp_path / "missing.jinja")


def test_inline_template_errors_name_the_task_key():
    t = Template("{{ optin.content }}", "/t/task.yaml: request.choice")
    with pytest.raises(ValueError) as err:
        t.render(option={"content": "x"}, index=0)
    assert str(err.value) == "/t/task.yaml: request.choice: 'optin' is undefined; available: option, index"


# -- end to end: the real CLI ----------------------------------------------------------------

TASK = """name: tpl
dataset: {loader: jsonl, args: {path: rows.jsonl}}
preprocessor: {name: legacy, args: {question: goal, choices: [sol1, sol2], answer: label, metadata: [n]}}
request: {kind: loglikelihood, prompt: prompt.jinja}
metrics: [acc]
"""
ROWS = [{"goal": "Open a jar.", "sol1": "Twist.", "sol2": "Freeze.", "label": 0, "n": n} for n in (1, 10**12, 2)]


def cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gage_eval.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def make_task(tmp_path: Path, prompt: str) -> Path:
    folder = tmp_path / "tasks" / "tpl"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.yaml").write_text(TASK)
    (folder / "prompt.jinja").write_text(prompt)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return folder


def test_a_row_whose_template_fails_is_written_with_its_error(tmp_path):
    folder = make_task(tmp_path, "Question: {{ question }}\n{% for i in range(sample.metadata.n) %}.{% endfor %}"
                                 "{{ sample.metadata.missing }}\nAnswer:")
    proc = cli("--tasks", "tpl", "--model", "dummy", "--include-path", tmp_path / "tasks", "-o", tmp_path,
               "--run-id", "r")
    assert "Traceback" not in proc.stdout + proc.stderr
    records = [json.loads(l) for l in (tmp_path / "r" / "samples" / "tpl.jsonl").read_text().splitlines()]
    assert len(records) == 3
    errors = [r["eval_result"].get("error") for r in records]
    assert all(e and e["stage"] == "template" for e in errors)  # row 2: range; rows 1, 3: undefined key
    assert errors[1]["message"] == (f"{folder / 'prompt.jinja'}:2: range() got the number 1000000000000, "
                                    f"larger than the limit {MAX_SIZE}")
    assert errors[0]["message"] == f"{folder / 'prompt.jinja'}:2: 'metadata' has no key 'missing'; its keys: option_map, n"
    assert [e["locator"] for e in errors] == [f"{folder / 'rows.jsonl'}:{n}" for n in (1, 2, 3)]


def test_include_is_refused_before_any_row(tmp_path):
    folder = make_task(tmp_path, "Question: {{ question }}\n{% include 'other.jinja' %}")
    (folder / "other.jinja").write_text("Answer:")
    proc = cli("--tasks", "tpl", "--model", "dummy", "--include-path", tmp_path / "tasks", "-o", tmp_path,
               "--run-id", "r")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and proc.returncode != 0
    assert (f"{folder / 'prompt.jinja'}:2: include/import/extends are not supported: write the template in one "
            f"file") in out
