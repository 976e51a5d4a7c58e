"""Run options plugins declare (gage_register_options): flags, run config keys, environment
variables, config.json and --resume, duplicates refused."""
from __future__ import annotations

import json

import pytest

from gage_eval.api import GageError, RunOption, hookimpl
from gage_eval.config.plugin_options import option_values


class Declares:
    def __init__(self, *options: tuple):
        self.options = options

    @hookimpl
    def gage_register_options(self, register):
        for key, flags, fields in self.options:
            register(key, *flags, **fields)


def test_values_come_from_the_flag_then_the_run_config_then_env_then_the_default(tmp_path):
    opts = [RunOption("depth", ("--depth",), type="whole", minimum=1, default=3, env=("X_DEPTH",)),
            RunOption("where", ("--where",), type="folder")]
    config = str(tmp_path / "run.yaml")
    assert option_values(opts, {}, {}, None, {}) == {"depth": 3, "where": None}
    assert option_values(opts, {}, {}, None, {"X_DEPTH": "7"})["depth"] == 7
    assert option_values(opts, {}, {"depth": 5, "where": "out"}, config, {"X_DEPTH": "7"}) == {
        "depth": 5, "where": str(tmp_path / "out")}  # relative to the config file's folder
    assert option_values(opts, {"depth": 9}, {"depth": 5}, config, {})["depth"] == 9


@pytest.mark.parametrize("option, cfg, env, message", [
    (RunOption("depth", ("--depth",), type="whole", minimum=1), {"depth": 0}, {}, "key 'depth': expected a whole number, 1 or more, got 0"),
    (RunOption("depth", ("--depth",), type="whole"), {"depth": "deep"}, {}, "key 'depth': expected a whole number"),
    (RunOption("loud", ("--loud",), type="switch"), {"loud": "yes"}, {}, "key 'loud': expected true or false, got 'yes'"),
    (RunOption("v", ("--v",), choices=("1", "2")), {"v": 3}, {}, "key 'v': expected one of 1, 2, got '3'"),
    (RunOption("depth", ("--depth",), type="whole", env=("X_DEPTH",)), {}, {"X_DEPTH": "x"},
     "environment variable X_DEPTH='x': expected a whole number, 0 or more"),
    (RunOption("n", env=("X_N", "X_M"), type="whole", stored=False), {}, {"X_N": "1", "X_M": "2"},
     "X_N='1' and X_M='2' disagree"),
])
def test_a_bad_value_names_where_it_came_from(option, cfg, env, message):
    with pytest.raises(GageError, match=message.replace("(", r"\(")):
        option_values([option], {}, cfg, "run.yaml", env)


def test_an_env_only_option_is_checked_but_not_stored():
    assert option_values([RunOption("n", env=("X_N",), type="whole", stored=False)], {}, {}, None, {"X_N": "4"}) == {}


@pytest.mark.parametrize("fields, message", [
    (("Bad-Key", ("--x",), {}), "lower-case"),
    (("x", ("-x",), {}), "not a --long-name"),
    (("x", ("--x",), {"type": "list"}), "type 'list'"),
    (("x", (), {}), "give flags, env, or both"),
])
def test_a_malformed_declaration_names_the_plugin(fresh_plugins, fields, message):
    fresh_plugins.load_plugins()
    with pytest.raises(GageError, match=f"plugin 'p1': run option .*{message}"):
        fresh_plugins.register_plugin(Declares(fields), "p1")


def test_a_flag_declared_twice_is_refused_naming_both_plugins(fresh_plugins):
    fresh_plugins.register_plugin(Declares(("tag", ("--tag",), {})), "p1")
    with pytest.raises(GageError, match="'--tag' is registered by both plugin 'p1' and plugin 'p2'"):
        fresh_plugins.register_plugin(Declares(("label", ("--tag",), {})), "p2")
    with pytest.raises(GageError, match="'tag' is registered by both plugin 'p1' and plugin 'p3'"):
        fresh_plugins.register_plugin(Declares(("tag", ("--label",), {})), "p3")


def test_a_core_flag_is_refused_naming_the_plugin(fresh_plugins, run_cli):
    fresh_plugins.register_plugin(Declares(("taskz", ("--seed",), {})), "p1")
    result = run_cli("--help")
    assert result.exit_code == 2 and "plugin 'p1' declares run option '--seed', which is gage-eval's own" in result.output


def test_a_core_setting_without_a_flag_is_refused_when_a_command_runs(fresh_plugins, run_cli):
    """A key among the core's settings that no flag spells (``command``) is refused as soon as a
    command runs; --help lists it without importing the settings (tests/core/test_import_cost.py)."""
    fresh_plugins.register_plugin(Declares(("command", ("--cmdline",), {})), "p1")
    assert run_cli("--help").exit_code == 0
    result = run_cli("tasks")
    assert result.exit_code == 2 and "plugin 'p1' declares run option 'command', which is gage-eval's own" in result.output


def test_a_plugin_option_reaches_the_run_config_and_resume(fresh_plugins, run_cli, tmp_path):
    fresh_plugins.register_plugin(Declares(("shade", ("--shade",), {"choices": ("light", "dark"), "default": "light",
                                                                     "resume_checked": True, "lm_eval": ("--shade_of",)})),
                                  "p1")
    config = tmp_path / "run.yaml"
    config.write_text("tasks: [piqa]\nshade: dark\nlimit: 2\n")
    result = run_cli("--config", config, "--model", "dummy", "-o", tmp_path, "--run-id", "a", "-q")
    assert result.exit_code == 0, result.output
    stored = json.loads((tmp_path / "a" / "config.json").read_text())
    assert stored["shade"] == "dark"
    result = run_cli("--resume", tmp_path / "a", "--shade", "light", "-q")  # it changes the results: refused
    assert result.exit_code == 2 and "shade: 'dark' -> 'light'" in result.output
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "1", "-o", tmp_path, "--run-id", "b", "-q",
                     "--shade_of", "dark")  # lm-eval's spelling
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "b" / "config.json").read_text())["shade"] == "dark"
    config.write_text("tasks: [piqa]\nshadow: dark\n")
    result = run_cli("--config", config, "--model", "dummy", "-o", tmp_path, "--run-id", "c", "-q")
    assert result.exit_code == 2 and "unknown key(s) shadow" in result.output and "shade" in result.output


def test_merge_compares_only_the_plugin_options_that_change_results(fresh_plugins, run_cli, tmp_path):
    fresh_plugins.register_plugin(Declares(("shade", ("--shade",), {"resume_checked": True})), "p1")
    base = ("--tasks", "piqa", "--model", "dummy", "--limit", "4", "-o", tmp_path, "-q")
    for run_id, extra in (("s0", ("--shard", "0/2", "--shade", "dark", "--cache", tmp_path / "c0", "--report")),
                          ("s1", ("--shard", "1/2", "--shade", "dark", "--cache", tmp_path / "c1", "--no-report",
                                  "--eee-version", "0.3.0")),
                          ("o1", ("--shard", "1/2", "--shade", "light"))):
        result = run_cli(*base, "--run-id", run_id, *extra)
        assert result.exit_code in (0, 1), result.output
    # where or how a shard ran (the builtin's cache, report, EEE version) may differ
    result = run_cli("merge", tmp_path / "s0", tmp_path / "s1", "-o", tmp_path / "m")
    assert result.exit_code in (0, 1), result.output
    result = run_cli("merge", tmp_path / "s0", tmp_path / "o1", "-o", tmp_path / "m2")
    assert result.exit_code == 2 and "differ in shade ('light' vs 'dark')" in result.output, result.output


@pytest.mark.parametrize("run_id", ["../x", "a/b", "..", ".", "-x", "--help", "a b"])
def test_a_run_id_that_is_not_a_plain_folder_name_is_refused(run_cli, tmp_path, run_id):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--limit", "1", "-o", tmp_path, f"--run-id={run_id}", "-q")
    assert result.exit_code == 2, result.output
    assert f"--run-id {run_id!r}: a run id is a folder name" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", [("--seed", "4294967296"), ("--seed", "-1"), ("--config", "seed: 4294967296"),
                                 ("--model-args", "seed=99999999999999999999")])
def test_a_seed_past_what_numpy_and_torch_take_is_refused_before_any_run(run_cli, tmp_path, how):
    flag, value = how
    if flag == "--config":
        (tmp_path / "run.yaml").write_text(value + "\n")
        value = tmp_path / "run.yaml"
    model = ["--model", "transformers", "--model-args", f"pretrained={tmp_path}"] if flag != "--model-args" else \
        ["--model", "transformers", "--model-args", f"pretrained={tmp_path},{value}"]
    args = [flag, value] if flag != "--model-args" else []
    result = run_cli("--tasks", "piqa", *model, "--limit", "1", "-o", tmp_path / "runs", *args, "-q")
    assert result.exit_code == 2, result.output
    assert "4294967295" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
