"""lm-evaluation-harness's spellings, task lists, --limit, and the prompt-control flags and keys
(parsed, checked, stored in config.json, checked again on --resume)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from gage_eval.cli.conventions import parse_gen_kwargs, parse_limit, split_pairs, translate
from gage_eval.api.errors import GageError

ROOT = Path(__file__).resolve().parents[2]
PIQA_ROWS = sum(1 for line in (ROOT / "tasks" / "piqa" / "sample.jsonl").read_text().splitlines() if line.strip())
KINDS = {"--tasks": "value", "-t": "value", "--model-args": "value", "-a": "value", "--limit": "value",
         "-l": "value", "-q": "flag", "--quiet": "flag", "--gen-kwargs": "value", "--num-fewshot": "value",
         "--apply-chat-template": "flag", "--no-apply-chat-template": "flag", "--fewshot-as-multiturn": "flag",
         "--dry-run": "optional:3", "--seed": "value", "--output-dir": "value", "-o": "value",
         "--max-error-rate": "value", "--system-prompt": "value", "--include-path": "value", "--model": "value"}
LONG = {k: {"-t": "--tasks", "-a": "--model-args", "-l": "--limit", "-q": "--quiet", "-o": "--output-dir"}.get(k, k)
        for k in KINDS}


def tr(*args: str, commands=("tasks", "validate")) -> list[str]:
    out, _ = translate(args, KINDS, LONG, commands)
    return out


# -- translate: spellings ----------------------------------------------------------------------

def test_lm_eval_spellings_become_ours():
    assert tr("--model_args", "a=1", "--num_fewshot", "5", "--output_path", "out", "--system_instruction", "Be brief",
              "--include_path", "d") == ["--model-args", "a=1", "--num-fewshot", "5", "--output-dir", "out",
                                         "--system-prompt", "Be brief", "--include-path", "d"]
    assert tr("--gen_kwargs=temperature=0") == ["--gen-kwargs", "temperature=0"]
    assert tr("--write_out") == ["--dry-run=3"]
    assert tr("-w", "--tasks", "piqa") == ["--dry-run=3", "--tasks", "piqa"]
    assert tr("--dry-run", "5") == ["--dry-run=5"]


def test_switches_in_lm_eval_form():
    assert tr("--apply_chat_template") == ["--apply-chat-template"]
    assert tr("--apply_chat_template", "--tasks", "x") == ["--apply-chat-template", "--tasks", "x"]
    assert tr("--apply_chat_template=false") == ["--no-apply-chat-template"]
    assert tr("--apply_chat_template", "tasks") == ["--apply-chat-template", "tasks"]  # a sub-command stays
    assert tr("--fewshot_as_multiturn", "true") == ["--fewshot-as-multiturn"]
    assert tr("--fewshot_as_multiturn=false") == ["--no-fewshot-as-multiturn"]
    with pytest.raises(GageError, match="named chat templates are not supported"):
        tr("--apply_chat_template", "chatml")


def test_log_samples_is_a_no_op_with_a_note():
    out, notes = translate(["--log_samples", "-t", "piqa"], KINDS, LONG)
    assert out == ["--tasks", "piqa"]
    assert notes == ["--log_samples: samples are always written (RUN_DIR/samples/TASK.jsonl)"]


def test_confirm_run_unsafe_code_is_a_no_op_that_says_code_runs_sandboxed():
    out, notes = translate(["--tasks", "humaneval", "--confirm_run_unsafe_code", "--limit", "2"], KINDS, LONG)
    assert out == ["--tasks", "humaneval", "--limit", "2"]
    assert len(notes) == 1 and "always runs in a sandbox" in notes[0] and "--allow-unsandboxed-code" in notes[0]


def test_confirm_run_unsafe_code_never_lets_code_run_unsandboxed(fresh_plugins, run_cli, tmp_path):
    """lm-eval's consent to run model code is not --allow-unsandboxed-code: through the real command,
    a code task whose sandbox cannot run still stops, naming the flag that would run it here."""
    from gage_eval.api import GageError, execution, hookimpl

    class Broken(execution.Sandbox):
        name = "test/broken"

        def check(self):
            raise GageError("test/broken cannot run here")

    class Sandboxes:
        @hookimpl
        def gage_register_sandboxes(self, register):
            register("test/broken", Broken)

    fresh_plugins.register_plugin(Sandboxes(), "test-sandboxes")
    config = tmp_path / "run.yaml"
    config.write_text("tasks:\n  - name: code_exec\n    metrics:\n      - name: code_exec\n"
                      "        args: {sandbox: test/broken}\n")
    result = run_cli("--config", config, "--model", "dummy", "--limit", "1", "-o", tmp_path, "--run-id", "r",
                     "--confirm_run_unsafe_code")
    assert result.exit_code == 3, result.output  # the code task failed; the run itself went on
    assert "--confirm_run_unsafe_code: model-written code (humaneval, code_exec) always runs in a sandbox" in result.output
    assert "the code task fails and --allow-unsandboxed-code runs it on this machine" in result.output
    assert "test/broken cannot run here; or, at your own risk" in result.output
    assert "UNSANDBOXED" not in result.output
    assert json.loads((tmp_path / "r" / "config.json").read_text()).get("allow_unsandboxed_code") is False


@pytest.mark.parametrize("flag, hint", [
    ("--use_cache", "--resume RUN_DIR"), ("--max_batch_size", "--batch-size"), ("--wandb_args", "summary.json"),
    ("--trust_remote_code", "--model-args trust_remote_code=true"), ("--predict_only", "samples"),
    ("--show_config", "--dry-run"), ("--samples", "--data TASK=FILE"), ("--verbosity", "--quiet"),
    ("--check_integrity", "validate"), ("--metadata", "--model-args"), ("--cache_requests", "--cache DIR"),
])
def test_lm_eval_flags_without_our_meaning_are_refused_with_a_hint(flag, hint):
    with pytest.raises(GageError) as err:
        tr("--tasks", "piqa", flag, "x")
    assert str(err.value).startswith(f"{flag} (lm-evaluation-harness): ") and hint in str(err.value)
    assert "\n" not in str(err.value)


def test_underscore_spelling_of_our_options_is_named():
    with pytest.raises(GageError, match="no such option: --max_error_rate; gage-eval spells it --max-error-rate"):
        tr("--max_error_rate", "0.1")
    assert tr("--no-such", "1") == ["--no-such", "1"]  # left to click, which names it


def test_task_lists_every_way():
    assert tr("--tasks", "a,b") == ["--tasks", "a,b"]
    assert tr("--tasks", "a", "b", "c", "-q") == ["--tasks", "a", "--tasks", "b", "--tasks", "c", "-q"]
    assert tr("-t", "a", "-t", "b") == ["--tasks", "a", "--tasks", "b"]
    assert tr("--tasks=a", "b") == ["--tasks", "a", "--tasks", "b"]
    assert tr("-tpiqa") == ["--tasks", "piqa"]


@pytest.mark.parametrize("args", [("--tasks", "list"), ("-t", "list_groups"), ("--tasks", "piqa", "list_tags")])
def test_lm_eval_task_listings_name_the_tasks_command(args):
    with pytest.raises(GageError, match=r"^--tasks list\w* \(lm-evaluation-harness\): `gage-eval tasks` lists"):
        tr(*args)


def test_tasks_command_lists_the_groups_too(run_cli):
    result = run_cli("tasks")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines() if line.strip()}
    assert rows["mmlu"][1:7] == ["group", "builtin", "a", "group", "of", "57"]
    assert rows["mmlu_stem"][1] == "group" and rows["piqa"][1] == "loglikelihood"


def test_short_bundles_and_values_that_look_like_options():
    assert tr("-ql", "5") == ["-q", "--limit", "5"]
    assert tr("-l5") == ["--limit", "5"]
    assert tr("--limit", "-1") == ["--limit", "-1"]  # a value, as click takes it, refused later by its rule


def test_model_args_as_lm_eval_lists_them():
    assert tr("--model_args", "pretrained=x", "dtype=float32", "--limit", "2") == [
        "--model-args", "pretrained=x,dtype=float32", "--limit", "2"]
    assert tr("--model-args", "a=1", "tasks") == ["--model-args", "a=1", "tasks"]


def test_sub_command_and_what_follows_pass_through():
    assert tr("validate", "f.jsonl", "--schema", "sample") == ["validate", "f.jsonl", "--schema", "sample"]
    assert tr("-q", "tasks", "--include_path", "x") == ["-q", "tasks", "--include_path", "x"]
    with pytest.raises(GageError, match="no `run` sub-command"):
        tr("run", "--tasks", "piqa")
    with pytest.raises(GageError, match="no `ls` sub-command: `gage-eval tasks` lists"):
        tr("ls", "tasks")


def test_seed_list_and_json_output_path_refused():
    with pytest.raises(GageError, match="one seed for the run"):
        tr("--seed", "0,1234,1234,1234")
    with pytest.raises(GageError, match="give --output-dir DIR"):
        tr("--output_path", "results.json")


def test_lm_eval_tables_do_not_shadow_our_own_spellings():
    from gage_eval.cli import conventions
    from gage_eval.cli import cli, option_spellings

    ours, _ = option_spellings(cli.params)
    for table in (conventions.ALIASES, conventions.NO_OPS, conventions.REFUSED):
        assert not set(table) & set(ours)
    assert set(conventions.ALIASES.values()) <= set(ours)


# -- --limit -------------------------------------------------------------------------------------

def test_limit_counts_and_fractions():
    assert parse_limit("20") == 20 and type(parse_limit("1")) is int
    assert parse_limit("1.0") == 1.0 and type(parse_limit("1.0")) is float
    assert parse_limit("0.25") == 0.25 and parse_limit("1e-1") == 0.1
    assert parse_limit(5) == 5 and parse_limit(0.5) == 0.5


@pytest.mark.parametrize("value, words", [
    ("0", "runs nothing"), ("-1", "leave the limit out"), ("-5", "positive whole number"), ("0.0", "fraction"),
    ("1.5", "fraction in (0, 1]"), ("2.0", "for 2 rows write 2"), ("nan", "fraction"), ("inf", "fraction"),
    ("-inf", "fraction"), ("abc", "not a number"), ("", "not a number"), (True, "got True"),
])
def test_limit_refusals(value, words):
    with pytest.raises(GageError) as err:
        parse_limit(value)
    assert words in str(err.value) and str(err.value).startswith("--limit")


def test_a_huge_whole_float_limit_gets_no_silly_hint():
    with pytest.raises(GageError) as err:
        parse_limit("1e30")
    assert "write" not in str(err.value) and str(err.value).endswith("(1.0 = all)")


# -- --gen-kwargs --------------------------------------------------------------------------------

def test_gen_kwargs_parsed_and_normalized():
    assert parse_gen_kwargs("max_gen_toks=16,temperature=0,top_p=0.9,top_k=40,seed=3,do_sample=true") == {
        "max_new_tokens": 16, "temperature": 0.0, "top_p": 0.9, "top_k": 40, "seed": 3, "do_sample": True}
    assert parse_gen_kwargs('stop=["\\n\\n","Question:"],max_new_tokens=8') == {
        "stop": ["\n\n", "Question:"], "max_new_tokens": 8}
    assert parse_gen_kwargs("until=['a,b', \"c\"]") == {"stop": ["a,b", "c"]}
    assert parse_gen_kwargs("stop=\\n\\n") == {"stop": ["\n\n"]}
    assert parse_gen_kwargs("stop=END") == {"stop": ["END"]}
    assert parse_gen_kwargs('stop="x"') == {"stop": ["x"]}
    assert split_pairs('a=1,b=[1,2],c="x,y"') == ["a=1", "b=[1,2]", 'c="x,y"']


@pytest.mark.parametrize("text, words", [
    ("max_tokens=5", "unknown key 'max_tokens'; known: max_new_tokens, temperature"),
    ("max_new_tokens=0", "max_new_tokens=0: expected a whole number >= 1"),
    ("max_new_tokens=2.5", "expected a whole number"), ("temperature=-1", "temperature=-1: expected a number >= 0"),
    ("temperature=hot", "expected a number"), ("top_p=1.5", "top_p=1.5: expected a number in (0, 1]"),
    ("top_k=-1", "expected a whole number >= 0"), ("do_sample=1", "do_sample=1: expected true or false"),
    ("seed=4294967296", "seed=4294967296: expected a whole number >= 0 and <= 4294967295"),
    ("stop=[1]", "stop=[1]: expected a non-empty string"), ('stop=[""]', "non-empty"),
    ("stop=[oops", "not a quoted string"), ("temperature", "expected key=value"),
])
def test_gen_kwargs_refusals(text, words):
    with pytest.raises(GageError) as err:
        parse_gen_kwargs(text)
    assert words in str(err.value) and str(err.value).startswith("--gen-kwargs: ")


# -- the command line ------------------------------------------------------------------------------

@pytest.fixture
def three_tasks(tmp_path) -> Path:
    """piqa copied as p1, p2, p3 (24 rows each)."""
    root = tmp_path / "tasks"
    for name in ("p1", "p2", "p3"):
        shutil.copytree(ROOT / "tasks" / "piqa", root / name)
        yaml = root / name / "task.yaml"
        yaml.write_text(yaml.read_text().replace("name: piqa", f"name: {name}"))
    return root


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _config(run_dir: Path) -> dict:
    return json.loads((run_dir / "config.json").read_text())


def test_task_names_as_glob_patterns_as_lm_eval_takes_them(run_cli, tmp_path, three_tasks):
    result = run_cli("--tasks", "p[23],p?", "--model", "dummy", "--limit", 1, "--include-path", three_tasks,
                     "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    assert list(_summary(tmp_path / "r")["tasks"]) == ["p2", "p3", "p1"]
    result = run_cli("--tasks", "q*", "--model", "dummy", "--include-path", three_tasks, "-o", tmp_path)
    assert result.exit_code == 2 and "unknown task(s): q*" in result.output


@pytest.mark.parametrize("task_args", [
    ["--tasks", "p1,p3,p2"], ["--tasks", "p1", "p3", "p2"], ["-t", "p1", "-t", "p3", "-t", "p2"],
    ["--tasks", "p1,p3", "--tasks", "p2,p1"], ["--tasks", "p1", "p3", "p1", "p2"],
])
def test_every_task_named_runs_once_in_order(run_cli, tmp_path, three_tasks, task_args):
    result = run_cli(*task_args, "--model", "dummy", "--limit", 2, "--include-path", three_tasks,
                     "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    assert _config(tmp_path / "r")["tasks"] == ["p1", "p3", "p2"]
    assert list(_summary(tmp_path / "r")["tasks"]) == ["p1", "p3", "p2"]
    assert all(t["counts"]["total"] == 2 for t in _summary(tmp_path / "r")["tasks"].values())


def test_a_run_with_lm_eval_spellings(run_cli, tmp_path, three_tasks):
    result = run_cli("--tasks", "p1", "p2", "--model", "dummy", "--model_args", "seed=7", "response=letter",
                     "--batch_size", "4", "--output_path", tmp_path / "out", "--limit", "3", "--log_samples",
                     "--include_path", three_tasks, "--gen_kwargs", "max_gen_toks=9,until=['\\n']",
                     "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    config = _config(tmp_path / "out" / "r")
    assert config["model_args"] == {"seed": 7, "response": "letter"}
    assert config["batch_size"] == 4 and config["limit"] == 3
    assert config["gen_kwargs"] == {"max_new_tokens": 9, "stop": ["\n"]}
    assert config["include_paths"] == [str(three_tasks)]
    assert (tmp_path / "out" / "r" / "samples" / "p2.jsonl").is_file()


@pytest.mark.parametrize("args, words", [
    (["--gen_kwargs", "bogus=1"], "--gen-kwargs: unknown key 'bogus'"),
    (["--use_cache", "c"], "--use_cache (lm-evaluation-harness): use --cache DIR"),
    (["--device", "cuda:0"], "backend 'dummy' takes no device"),
    (["--limit", "-1"], "leave the limit out"), (["--limit", "0"], "runs nothing"),
    (["--limit", "0.0"], "fraction"), (["--limit", "many"], "not a number"),
    (["--batch-size", "auto:4"], "give auto or a number"), (["--batch-size", "0"], "positive whole number"),
    (["--system-prompt", ""], "--system-prompt: empty"),
    (["--model", "hf"], "gage-eval's backend is transformers"),
    (["--include_paths", "x"], "No such option"),
])
def test_usage_errors_exit_2_in_one_line(run_cli, tmp_path, args, words):
    if "--model" not in args:
        args = ["--model", "dummy", *args]
    result = run_cli("--tasks", "piqa", *args, "-o", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "judge-args" not in result.output
    assert not (tmp_path / "runs").exists()


def test_num_fewshot_refuses_negative(run_cli, tmp_path):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--num_fewshot", "-1", "-o", tmp_path)
    assert result.exit_code == 2 and "-1 is not in the range x>=0" in result.output


def test_device_becomes_the_model_argument():
    from gage_eval.cli.settings import build_options

    def opts(**kw):
        base = dict(tasks="piqa", model="transformers", model_args=None, judge_model=None, judge_args=None,
                    batch_size=None, limit=None, output_dir=None, run_id=None, include_paths=(), data=(),
                    config_file=None, seed=None, fail_fast=False, quiet=True, command="")
        return build_options(**{**base, **kw})

    assert opts(device="cuda:0").model_args == {"device": "cuda:0"}
    assert opts(device="cpu", model_args="pretrained=x,device=cpu").model_args == {"pretrained": "x", "device": "cpu"}
    with pytest.raises(GageError, match="--device cuda and --model-args device=cpu disagree"):
        opts(device="cuda", model_args="device=cpu")
    for model, why in (("openai", "the server decides"), ("vllm", "CUDA_VISIBLE_DEVICES")):
        with pytest.raises(GageError, match=why):
            opts(model=model, device="cuda")


@pytest.mark.parametrize("limit, rows", [("0.5", math.ceil(PIQA_ROWS * 0.5)), ("0.1", math.ceil(PIQA_ROWS * 0.1)),
                                         ("1.0", PIQA_ROWS), ("1", 1), ("5", 5)])
def test_fractional_limit_takes_a_share_of_each_task_rounded_up(run_cli, tmp_path, limit, rows):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", limit, "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    assert _summary(tmp_path / "r")["tasks"]["piqa"]["counts"]["total"] == rows
    assert _config(tmp_path / "r")["limit"] == parse_limit(limit)
    assert type(_config(tmp_path / "r")["limit"]) is type(parse_limit(limit))


def test_run_config_keys(run_cli, tmp_path, three_tasks):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("models: {dut: {backend: dummy}}\n"
                   f"include_paths: [{three_tasks}]\n"
                   "tasks: [p1, {name: p2, limit: 0.25}]\n"
                   "limit: 0.5\n"
                   "system_prompt: Answer briefly.\n"
                   "gen_kwargs: {max_gen_toks: 12, temperature: 0, stop: \"\\n\"}\n"
                   "num_fewshot: 0\n"
                   "fewshot_as_multiturn: true\n"
                   "apply_chat_template: true\n"
                   "strip_reasoning: true\n")
    result = run_cli("--config", cfg, "-o", tmp_path, "--run-id", "r", "-q", "--gen-kwargs", "temperature=0.5")
    assert result.exit_code == 0, result.output
    config = _config(tmp_path / "r")
    assert config["system_prompt"] == "Answer briefly."
    assert config["gen_kwargs"] == {"max_new_tokens": 12, "temperature": 0.5, "stop": ["\n"]}  # the flag wins
    assert (config["num_fewshot"], config["fewshot_as_multiturn"], config["apply_chat_template"],
            config["strip_reasoning"]) == (0, True, True, True)
    counts = {name: t["counts"]["total"] for name, t in _summary(tmp_path / "r")["tasks"].items()}
    assert counts == {"p1": math.ceil(PIQA_ROWS * 0.5), "p2": math.ceil(PIQA_ROWS * 0.25)}


@pytest.mark.parametrize("text, words", [
    ("limit: 0", "key 'limit': 0: a limit of 0 rows runs nothing"),
    ("limit: -1", "key 'limit': -1: expected"), ("limit: 1.5", "key 'limit': 1.5: expected"),
    ("limit: .nan", "key 'limit': nan"), ("limit: true", "key 'limit': expected"),
    ("tasks: [{name: piqa, limit: 0}]", "key 'tasks.0.limit': 0"),
    ("gen_kwargs: {max_tokens: 3}", "key 'gen_kwargs': unknown key 'max_tokens'"),
    ("gen_kwargs: [1]", "key 'gen_kwargs': expected a mapping"),
    ("gen_kwargs: {top_p: 0}", "key 'gen_kwargs': top_p=0"),
    ("system_prompt: 3", "key 'system_prompt': expected a non-empty text"),
    ("num_fewshot: -2", "key 'num_fewshot': expected a whole number"),
    ("num_fewshot: 1.5", "key 'num_fewshot'"),
    ("apply_chat_template: yes please", "key 'apply_chat_template': expected true or false"),
    ("fewshot_as_multiturn: 1", "key 'fewshot_as_multiturn'"), ("strip_reasoning: maybe", "key 'strip_reasoning'"),
])
def test_run_config_refusals_name_the_file_and_key(run_cli, tmp_path, text, words):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(("" if text.startswith("tasks") else "tasks: [piqa]\n") + text + "\n")
    result = run_cli("--config", cfg, "--model", "dummy", "-o", tmp_path / "runs")
    assert result.exit_code == 2, result.output
    line = 1 if text.startswith("tasks") else 2  # the key's own line (a138aa1)
    assert f"{cfg}:{line}: {words}" in result.output
    assert not (tmp_path / "runs").exists()


# -- resume ------------------------------------------------------------------------------------------

@pytest.fixture
def stored_run(run_cli, tmp_path) -> Path:
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "1.0", "--gen-kwargs", "max_new_tokens=5",
                     "--num-fewshot", "0", "--strip-reasoning", "-o", tmp_path, "--run-id", "r", "-q")
    assert result.exit_code == 0, result.output
    return tmp_path / "r"


@pytest.mark.parametrize("args, diff", [
    (["--limit", "1"], "limit: 1.0 -> 1"),
    (["--gen-kwargs", "max_new_tokens=6"], "gen_kwargs: {'max_new_tokens': 5} -> {'max_new_tokens': 6}"),
    (["--num-fewshot", "1"], "num_fewshot: 0 -> 1"),
    (["--system-prompt", "Hi"], "system_prompt: None -> 'Hi'"),
    (["--apply-chat-template"], "apply_chat_template: None -> True"),
    (["--no-apply-chat-template"], "apply_chat_template: None -> False"),
    (["--fewshot-as-multiturn"], "fewshot_as_multiturn: None -> True"),
    (["--device", "cpu"], "model_args.device: None -> 'cpu'"),
])
def test_resume_refuses_a_different_prompt_control(run_cli, stored_run, args, diff):
    result = run_cli("--resume", stored_run, *args, "-q")
    assert result.exit_code == 2, result.output
    assert diff in result.output and "differ from the stored run's" in result.output


def test_resume_accepts_the_same_values(run_cli, stored_run):
    before = (stored_run / "samples" / "piqa.jsonl").read_text()
    result = run_cli("--resume", stored_run, "--limit", "1.0", "--gen_kwargs", "max_gen_toks=5", "--num_fewshot", "0",
                     "--strip-reasoning", "-q")
    assert result.exit_code == 0, result.output
    assert (stored_run / "samples" / "piqa.jsonl").read_text() == before
