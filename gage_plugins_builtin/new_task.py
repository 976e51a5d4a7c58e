"""``gage-eval new-task``: the files of a starter task folder that runs as it is written.

docs/tasks.md shows these files (for the names ``capitals`` and ``fruit``) in its walkthroughs,
and tests/docs/test_task_docs.py checks that what is written here equals what it shows.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from gage_eval.api import GageError

KINDS = ("generate", "loglikelihood")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

GENERATE_TASK = """\
# A generate task: the model writes an answer, metrics compare it with the reference.
# Every key is described in docs/tasks.md. The task's name is the folder's name.
description: Short factual questions answered in a word or two.
version: 1
dataset:
  loader: jsonl              # rows from a local .jsonl file (or a folder of them)
  args:
    path: sample.jsonl       # relative to this folder; --data @NAME@=FILE reads another file
preprocessor:
  name: legacy               # turns each row into a Sample: which column holds what
  args:
    question: question       # the column with the question text
    answer: answer           # the column with the reference answer
request:
  kind: generate
  chat: true                 # through the model's chat template: instruct models need it
  prompt: prompt.jinja       # the user message, a Jinja2 template in this folder
  generation:
    max_new_tokens: 32
    temperature: 0.0         # 0: greedy decoding
metrics:
  - contains                 # 1 when the reference occurs in the answer (ignoring case)
  - exact_match              # 1 when the answer equals the reference (ignoring case)
"""

GENERATE_PROMPT = """\
{#- The user message for one row. Variables: question, sample, messages, options, metadata, letters. -#}
Answer the question in a few words.
Question: {{ question }}
"""

GENERATE_ROWS = """\
{"question": "What is the capital of France?", "answer": "Paris"}
{"question": "What is the capital of Japan?", "answer": "Tokyo"}
{"question": "What is the capital of Italy?", "answer": "Rome"}
{"question": "How many days are there in a week?", "answer": "7"}
{"question": "What colour is the sky on a clear day?", "answer": "blue"}
"""

LOGLIKELIHOOD_TASK = """\
# A log-likelihood task: the model scores each choice after the prompt; the most likely one
# is its answer. Every key is described in docs/tasks.md. The task's name is the folder's name.
description: Two-way commonsense questions scored by log-likelihood.
version: 1
dataset:
  loader: jsonl              # rows from a local .jsonl file (or a folder of them)
  args:
    path: sample.jsonl       # relative to this folder; --data @NAME@=FILE reads another file
preprocessor:
  name: legacy               # turns each row into a Sample: which column holds what
  args:
    question: question       # the column with the question text
    choices: choices         # the column with the list of choices
    answer: answer           # the column with the index of the right choice
request:
  kind: loglikelihood
  prompt: prompt.jinja       # the context, plain text (no chat template)
  choice: "{{ option.content }}"   # each choice's text, scored after the context
  target_delimiter: " "      # put between the context and each choice
metrics:
  - acc                      # 1 when the most likely choice is the right one
  - acc_norm                 # the same with log-likelihoods divided by the choice's length
"""

LOGLIKELIHOOD_PROMPT = """\
{#- The context each choice is scored after. Variables: question, options, sample, messages, metadata, letters. -#}
Question: {{ question }}
Answer:
"""

LOGLIKELIHOOD_ROWS = """\
{"question": "Which is heavier?", "choices": ["a brick", "a feather"], "answer": 0}
{"question": "What do you use to cut paper?", "choices": ["a spoon", "scissors"], "answer": 1}
{"question": "Where do fish live?", "choices": ["in water", "in trees"], "answer": 0}
{"question": "What melts in the sun?", "choices": ["a stone", "an ice cube"], "answer": 1}
"""

README = """\
# @NAME@

A @KIND@ task made with `gage-eval new-task`. Say here what it measures, where its rows come
from (source, licence, split) and how its numbers compare with a reference harness.

Run it:

    gage-eval validate @FOLDER@/task.yaml --schema task
    gage-eval --tasks @NAME@ --include-path @DIR@ --model dummy     # no model: checks the task
    gage-eval --tasks @NAME@ --include-path @DIR@                   # the default model, SmolLM2
    gage-eval --tasks @NAME@ --include-path @DIR@ --data @NAME@=rows.jsonl   # your own rows

Files: `task.yaml` (the settings), `prompt.jinja` (the prompt template), `sample.jsonl` (a
few rows with the columns the preprocessor reads). docs/tasks.md of gage-eval describes every
key and template variable.
"""

FILES = {
    "generate": {"task.yaml": GENERATE_TASK, "prompt.jinja": GENERATE_PROMPT, "sample.jsonl": GENERATE_ROWS},
    "loglikelihood": {"task.yaml": LOGLIKELIHOOD_TASK, "prompt.jinja": LOGLIKELIHOOD_PROMPT,
                      "sample.jsonl": LOGLIKELIHOOD_ROWS},
}


def task_files(name: str, kind: str, folder: str = "", parent: str = ".") -> dict[str, str]:
    """The files of a new task folder: name -> text."""
    out = {file: text.replace("@NAME@", name) for file, text in FILES[kind].items()}
    out["README.md"] = (README.replace("@NAME@", name).replace("@KIND@", kind)
                        .replace("@FOLDER@", folder or name).replace("@DIR@", parent))
    return out


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise GageError(f"new-task: {name!r} is not a task name: use up to 100 letters, digits, '_', '-' and '.', "
                        f"starting with a letter or digit")


def write_task(name: str, kind: str, parent: Path) -> Path:
    """Write the folder ``parent/name``; refuse a bad name or a folder (or file) already there."""
    check_name(name)
    if kind not in KINDS:
        raise GageError(f"new-task: --kind {kind!r}: expected one of {', '.join(KINDS)}")
    if parent.exists() and not parent.is_dir():
        raise GageError(f"new-task: --dir {parent}: not a folder")
    folder = parent / name
    if folder.exists() or folder.is_symlink():
        raise GageError(f"new-task: {folder} already exists; choose another name or --dir (nothing was written)")
    parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir()
    for file, text in task_files(name, kind, shlex.quote(str(folder)), shlex.quote(str(parent))).items():
        (folder / file).write_text(text, encoding="utf-8")
    return folder
