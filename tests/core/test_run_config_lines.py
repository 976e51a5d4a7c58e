"""The run config's errors name the file, the key's line and the key (issue 24: the key was read
back out of the message with a regex; the checks now raise KeyedError). Pinned line for line."""
from __future__ import annotations

import pytest

from gage_eval.api.errors import GageError
from gage_eval.cli.runconfig import read_run_config

HEAD = "models:\n  dut: {backend: dummy}\ntasks: [piqa]\n"
CASES = {
 "top-list": "- 1\n",
 "unknown": HEAD + "limt: 3\n",
 "models-list": "models: [1]\n",
 "tasks-str": "models: {dut: {backend: dummy}}\ntasks: piqa\n",
 "role": "models:\n  boss: {backend: dummy}\n",
 "role-shape": "models:\n  dut: {backend: dummy, x: 1}\n",
 "include-items": HEAD + "include_paths: [1]\n",
 "env": "models:\n  dut:\n    backend: dummy\n    args: {key: '${GAGE_TEST_UNSET}'}\n",
 "env-nested": "models:\n  dut:\n    backend: dummy\n    args:\n      a: {b: '${GAGE_TEST_UNSET}'}\n",
 "seed": HEAD + "seed: -1\n",
 "repeats": HEAD + "repeats: 0\n",
 "limit": HEAD + "limit: abc\n",
 "limit0": HEAD + "limit: 0\n",
 "max-samples": HEAD + "max_samples: 0.5\n",
 "limit-and-max": HEAD + "limit: 3\nmax_samples: 4\n",
 "shuffle": HEAD + "shuffle: 1\n",
 "shuffle-seed": HEAD + "shuffle_seed: -2\n",
 "gen-kwargs": HEAD + "gen_kwargs: {temprature: 1}\n",
 "gen-kwargs-value": HEAD + "gen_kwargs: {temperature: -1}\n",
 "system-prompt": HEAD + "system_prompt: ''\n",
 "batch": HEAD + "batch_size: many\n",
 "rate": HEAD + "max_error_rate: 2\n",
 "allow-paths": HEAD + "allow_paths: /tmp\n",
 "bool": HEAD + "fail_fast: 1\n",
 "data": HEAD + "data: [1]\n",
 "fewshot-data": HEAD + "fewshot_data: {piqa: ''}\n",
 "writers": HEAD + "writers: [1]\n",
 "task-keys": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, bogus: 1}\n",
 "task-type": "models: {dut: {backend: dummy}}\ntasks:\n  - 3\n",
 "task-limit": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, limit: -1}\n",
 "task-max": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, max_samples: x}\n",
 "task-shuffle": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, shuffle: 3}\n",
 "task-metrics": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, metrics: []}\n",
 "task-generation": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, generation: 1}\n",
 "task-data": "models: {dut: {backend: dummy}}\ntasks:\n  - {name: piqa, data: 1}\n",
 "missing-key-line": HEAD + "gen_kwargs: 5\n",
}
EXPECTED = {  # each message after the file's path
    'top-list': ': expected a mapping at the top level',
    'unknown': ': unknown key(s) limt; known: allow_paths, allow_urls, apply_chat_template, batch_size, data, executor, fail_fast, fewshot_as_multiturn, fewshot_data, gen_kwargs, include_paths, limit, max_error_rate, max_samples, models, num_fewshot, output_dir, repeats, seed, shard, shuffle, shuffle_seed, strip_reasoning, system_prompt, tasks, writers',
    'models-list': ":1: key 'models': expected a mapping of roles (dut, judge), got list",
    'tasks-str': ":2: key 'tasks': expected a list of tasks, got str",
    'role': ":2: key 'models.boss': roles are 'dut' and 'judge'",
    'role-shape': ":2: key 'models.dut': expected {backend: NAME, args: {...}}",
    'include-items': ":4: key 'include_paths': expected a list of folders",
    'env': ":4: key 'models.dut.args.key': ${GAGE_TEST_UNSET} names an environment variable that is not set",
    'env-nested': ":5: key 'models.dut.args.a.b': ${GAGE_TEST_UNSET} names an environment variable that is not set",
    'seed': ":4: key 'seed': expected a whole number from 0 to 4294967295, got -1",
    'repeats': ":4: key 'repeats': expected a whole number (1 or more), got 0",
    'limit': ":4: key 'limit': abc: not a number; expected a positive whole number of rows, or a fraction in (0, 1] of each task's rows (1.0 = all)",
    'limit0': ":4: key 'limit': 0: a limit of 0 rows runs nothing; expected a positive whole number of rows, or a fraction in (0, 1] of each task's rows (1.0 = all)",
    'max-samples': ":4: key 'max_samples': 0.5: expected a whole number of rows, 1 or more (a fraction of the rows is --limit's)",
    'limit-and-max': ": keys 'limit' (3) and 'max_samples' (4) are one setting (max_samples is spec 004's name for limit); give one",
    'shuffle': ":4: key 'shuffle': expected true or false, got 1",
    'shuffle-seed': ":4: key 'shuffle_seed': expected a whole number, got -2",
    'gen-kwargs': ":4: key 'gen_kwargs': unknown key 'temprature'; known: max_new_tokens, temperature, top_p, top_k, stop, seed, do_sample",
    'gen-kwargs-value': ":4: key 'gen_kwargs': temperature=-1: expected a number >= 0",
    'system-prompt': ":4: key 'system_prompt': expected a non-empty text, got ''",
    'batch': ":4: key 'batch_size': expected a number or 'auto', got 'many'",
    'rate': ":4: key 'max_error_rate': expected a number from 0 to 1, got 2",
    'allow-paths': ":4: key 'allow_paths': expected a list of folders",
    'bool': ":4: key 'fail_fast': expected true or false, got 1",
    'data': ":4: key 'data': expected a mapping TASK: PATH",
    'fewshot-data': ":4: key 'fewshot_data': expected a mapping TASK: PATH",
    'writers': ":4: key 'writers': expected a list of writer names (NAME or NAME:key=value,...)",
    'task-keys': ":3: key 'tasks.0': expected name plus any of data, fewshot_data, generation, limit, max_samples, metrics, shuffle, shuffle_seed; unknown: bogus",
    'task-type': ":3: key 'tasks.0': expected a task name or a mapping",
    'task-limit': ":3: key 'tasks.0.limit': -1: expected a positive whole number of rows, or a fraction in (0, 1] of each task's rows (1.0 = all); to run every row leave the limit out (lm-eval's -1)",
    'task-max': ":3: key 'tasks.0.max_samples': x: not a number; expected a positive whole number of rows, or a fraction in (0, 1] of each task's rows (1.0 = all)",
    'task-shuffle': ":3: key 'tasks.0.shuffle': expected true or false, got 3",
    'task-metrics': ":3: key 'tasks.0.metrics': expected a non-empty list of metric names or {name, as, args} mappings",
    'task-generation': ":3: key 'tasks.0.generation': expected a mapping (max_new_tokens, temperature, ...)",
    'task-data': ":3: key 'tasks.0.data': expected a path",
    'missing-key-line': ":4: key 'gen_kwargs': expected a mapping of generation settings (max_new_tokens, temperature, top_p, top_k, stop, seed, do_sample)",
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_run_config_error_names_the_file_the_line_and_the_key(case, tmp_path, monkeypatch):
    monkeypatch.delenv("GAGE_TEST_UNSET", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text(CASES[case])
    with pytest.raises(GageError) as info:
        read_run_config(str(path))
    assert str(info.value) == f"{path}{EXPECTED[case]}"
