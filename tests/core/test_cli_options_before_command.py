"""Options of a run written before a command (`gage-eval --include-path DIR tasks`) are refused,
not dropped: the listing used to leave DIR's tasks out, silently, with exit 0."""

import pytest


def test_a_run_option_before_a_command_is_refused_naming_it(run_cli, tmp_path):
    (tmp_path / "mine").mkdir()
    result = run_cli("--include-path", tmp_path, "tasks")
    assert result.exit_code == 2
    assert ("--include-path is an option of a run, which `gage-eval tasks` does not read; put that "
            "command's options after its name (gage-eval tasks --help)") in result.output


@pytest.mark.parametrize("args", [["-q", "plugins"], ["--debug", "plugins"], ["plugins"]])
def test_quiet_debug_and_the_environment_still_pass(run_cli, monkeypatch, args):
    monkeypatch.setenv("GAGE_EVAL_OUTPUT_DIR", "elsewhere")  # a run setting from the environment
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    assert "builtin" in result.output
