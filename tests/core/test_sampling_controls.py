"""Sampling controls (spec 004 section 10.3): --shuffle / --shuffle-seed choose a seeded random
--limit of each task's rows (stable on any machine, kept by --resume, split by --shard);
--max-samples is spec 004's name for --limit N; the environment variables people set per
machine (output root, max samples, shuffling, concurrency, data cache) give way to flags.
All through the real command line with the dummy backend."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gage_eval.config.options import shuffled_pick

ROWS = 60
ENV_VARS = ("GAGE_EVAL_OUTPUT_DIR", "GAGE_EVAL_SAVE_DIR", "GAGE_EVAL_MAX_SAMPLES", "GAGE_EVAL_SHUFFLE",
            "GAGE_EVAL_SHUFFLE_SEED", "GAGE_EVAL_CONCURRENCY", "GAGE_EVAL_THREADS", "GAGE_EVAL_DATA_CACHE")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def data(tmp_path) -> Path:
    """60 piqa rows whose goal names their position."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"goal": f"goal {i}", "sol1": "a", "sol2": "b", "label": i % 2}) + "\n"
                            for i in range(ROWS)))
    return path


def run(run_cli, tmp_path, data, run_id, *args, code=(0, 1), env=None):
    result = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "-o", tmp_path / "runs",
                     "--run-id", run_id, "-q", "--no-report", *args, env=env)
    assert result.exit_code in code, result.output
    return tmp_path / "runs" / run_id


def goals(run_dir: Path) -> list[int]:
    """The positions of the rows a run wrote, in the order written."""
    lines = (run_dir / "samples" / "piqa.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        text = json.dumps(json.loads(line)["messages"])
        out.append(int(text.split("goal ")[1].split("\\")[0].split('"')[0]))
    return out


def test_shuffle_is_seeded_stable_and_taken_before_the_limit(run_cli, tmp_path, data):
    first = goals(run(run_cli, tmp_path, data, "plain", "--limit", "10"))
    assert first == list(range(10))  # without --shuffle: the first rows, in order
    a = goals(run(run_cli, tmp_path, data, "a", "--limit", "10", "--shuffle", "--shuffle-seed", "7"))
    again = goals(run(run_cli, tmp_path, data, "again", "--limit", "10", "--shuffle-seed", "7"))
    other = goals(run(run_cli, tmp_path, data, "other", "--limit", "10", "--shuffle", "--shuffle-seed", "8"))
    assert a == again  # the same seed: the same rows (--shuffle-seed alone asks for shuffling)
    assert len(a) == len(set(a)) == 10 and a != first and set(a) != set(other)
    assert a == sorted(a)  # run in the data's order
    assert set(a) == {i for i in range(ROWS) if shuffled_pick(ROWS, 10, 7)(i)}  # the documented rule
    wider = goals(run(run_cli, tmp_path, data, "wider", "--limit", "20", "--shuffle-seed", "7"))
    assert set(a) < set(wider)  # a larger limit takes a superset
    default = goals(run(run_cli, tmp_path, data, "default", "--limit", "10", "--shuffle", "--seed", "7"))
    assert default == a  # the seed defaults to --seed
    half = goals(run(run_cli, tmp_path, data, "half", "--limit", "0.5", "--shuffle"))
    assert len(half) == len(set(half)) == 30
    everything = goals(run(run_cli, tmp_path, data, "all", "--shuffle"))
    assert everything == list(range(ROWS))  # no limit: every row, as without --shuffle


def test_the_choice_is_the_same_on_any_machine():
    """sha256 of "seed:position": fixed figures, not Python's random module."""
    pick = shuffled_pick(100, 5, 1234)
    chosen = [i for i in range(100) if pick(i)]
    assert len(chosen) == 5
    assert chosen == [i for i in range(100) if shuffled_pick(100, 5, 1234)(i)]
    big = shuffled_pick(100, 95, 1234)  # (the left-out side is kept when it is smaller)
    assert {i for i in range(100) if not big(i)}.isdisjoint(chosen)
    assert sum(map(big, range(100))) == 95
    assert chosen == [20, 31, 65, 76, 83]  # fixed: a change here changes every shuffled run's rows


def test_resume_keeps_the_same_choice(run_cli, tmp_path, data):
    full = goals(run(run_cli, tmp_path, data, "full", "--limit", "12", "--shuffle-seed", "3"))
    part = run(run_cli, tmp_path, data, "part", "--limit", "12", "--shuffle-seed", "3")
    lines = (part / "samples" / "piqa.jsonl").read_text().splitlines()
    (part / "samples" / "piqa.jsonl").write_text("\n".join(lines[:5]) + "\n")  # as if stopped after 5 rows
    result = run_cli("--resume", part, "-q", env={"GAGE_EVAL_SHUFFLE": "0", "GAGE_EVAL_SHUFFLE_SEED": "9"})
    assert result.exit_code in (0, 1), result.output
    assert sorted(goals(part)) == sorted(full)  # the stored settings win over the environment
    config = json.loads((part / "config.json").read_text())
    assert (config["shuffle"], config["shuffle_seed"], config["limit"]) == (True, 3, 12)
    summary = json.loads((part / "summary.json").read_text())
    assert summary["run"]["settings"]["shuffle_seed"] == 3
    refused = run_cli("--resume", part, "-q", "--shuffle-seed", "4")
    assert refused.exit_code == 2 and "shuffle_seed: 3 -> 4" in refused.output
    refused = run_cli("--resume", part, "-q", "--no-shuffle")
    assert refused.exit_code == 2 and "shuffle: True -> False" in refused.output


def test_shards_of_a_shuffled_run_cover_each_chosen_row_once(run_cli, tmp_path, data):
    full = goals(run(run_cli, tmp_path, data, "full", "--limit", "15", "--shuffle-seed", "5"))
    parts = [goals(run(run_cli, tmp_path, data, f"s{i}", "--limit", "15", "--shuffle-seed", "5", "--shard", f"{i}/3"))
             for i in range(3)]
    assert sorted(x for p in parts for x in p) == sorted(full)
    merged = run_cli("merge", *(tmp_path / "runs" / f"s{i}" for i in range(3)), "-o", tmp_path / "merged")
    assert merged.exit_code in (0, 1), merged.output
    other = run(run_cli, tmp_path, data, "s2other", "--limit", "15", "--shuffle-seed", "6", "--shard", "2/3")
    refused = run_cli("merge", tmp_path / "runs" / "s0", tmp_path / "runs" / "s1", other, "-o", tmp_path / "m2")
    assert refused.exit_code == 2 and "shuffle_seed" in refused.output


def test_max_samples_is_the_limit(run_cli, tmp_path, data):
    assert goals(run(run_cli, tmp_path, data, "m", "--max-samples", "4")) == [0, 1, 2, 3]
    config = json.loads((tmp_path / "runs" / "m" / "config.json").read_text())
    assert config["limit"] == 4
    run(run_cli, tmp_path, data, "same", "--max-samples", "4", "--limit", "4")
    for args, words in ((("--max-samples", "0.5"), "--max-samples 0.5: expected a whole number"),
                        (("--max-samples", "3", "--limit", "4"), "are one setting"),
                        (("--max-samples", "x"), "--max-samples x: not a number")):
        result = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run", *args)
        assert result.exit_code == 2 and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_run_config_keys_and_per_task_overrides(run_cli, tmp_path, data):
    config = tmp_path / "run.yaml"
    config.write_text(f"tasks: [piqa]\nmax_samples: 6\nshuffle: true\nshuffle_seed: 11\ndata: {{piqa: {data}}}\n")
    got = goals(run(run_cli, tmp_path, data, "cfg", "--config", config))
    assert got == sorted(i for i in range(ROWS) if shuffled_pick(ROWS, 6, 11)(i))
    assert goals(run(run_cli, tmp_path, data, "flag", "--config", config, "--no-shuffle")) == list(range(6))
    per_task = tmp_path / "task.yaml"
    per_task.write_text(f"tasks:\n  - name: piqa\n    max_samples: 5\n    shuffle_seed: 2\ndata: {{piqa: {data}}}\n")
    got = goals(run(run_cli, tmp_path, data, "task", "--config", per_task))
    assert got == sorted(i for i in range(ROWS) if shuffled_pick(ROWS, 5, 2)(i))
    bad = tmp_path / "bad.yaml"
    for text, words in (("shuffle: 2\n", "key 'shuffle': expected true or false"),
                        ("shuffle_seed: -1\n", "key 'shuffle_seed': expected a whole number"),
                        ("limit: 3\nmax_samples: 4\n", "keys 'limit' (3) and 'max_samples' (4) are one setting")):
        bad.write_text("tasks: [piqa]\nmodels: {dut: {backend: dummy}}\n" + text)
        result = run_cli("--config", bad, "--dry-run")
        assert result.exit_code == 2 and words in result.output, result.output


def test_environment_variables_under_the_flags(run_cli, tmp_path, data, monkeypatch):
    root = tmp_path / "env-root"
    result = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "--run-id", "e", "-q",
                     "--no-report", env={"GAGE_EVAL_OUTPUT_DIR": str(root), "GAGE_EVAL_MAX_SAMPLES": "3"})
    assert result.exit_code in (0, 1), result.output
    assert goals(root / "e") == [0, 1, 2]  # the output root and the limit from the environment
    result = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "--run-id", "e2", "-q",
                     "--no-report", env={"GAGE_EVAL_SAVE_DIR": str(root)})  # spec 004's name
    assert result.exit_code in (0, 1) and (root / "e2" / "summary.json").is_file(), result.output
    env = {"GAGE_EVAL_MAX_SAMPLES": "3", "GAGE_EVAL_SHUFFLE": "yes", "GAGE_EVAL_SHUFFLE_SEED": "7",
           "GAGE_EVAL_OUTPUT_DIR": str(root)}
    flagged = goals(run(run_cli, tmp_path, data, "f", "--limit", "10", env=env))  # -o and --limit win
    assert flagged == sorted(i for i in range(ROWS) if shuffled_pick(ROWS, 10, 7)(i))
    assert goals(run(run_cli, tmp_path, data, "g", "--limit", "10", "--no-shuffle", env=env)) == list(range(10))
    assert not (root / "f").exists()


@pytest.mark.parametrize("name, value, words", [
    ("GAGE_EVAL_MAX_SAMPLES", "0.5", "expected a whole number of rows, 1 or more"),
    ("GAGE_EVAL_SHUFFLE", "maybe", "expected true or false (1, 0, yes, no, on, off)"),
    ("GAGE_EVAL_SHUFFLE_SEED", "-3", "expected a whole number, 0 or more"),
    ("GAGE_EVAL_CONCURRENCY", "0", "expected a whole number, 1 or more"),
    ("GAGE_EVAL_THREADS", "many", "expected a whole number, 1 or more"),
    ("GAGE_EVAL_OUTPUT_DIR", "FILE", "expected a folder"),
    ("GAGE_EVAL_SAVE_DIR", "FILE", "expected a folder"),
    ("GAGE_EVAL_DATA_CACHE", "FILE", "expected a folder"),
])
def test_a_bad_environment_value_is_one_line_naming_it(run_cli, tmp_path, name, value, words):
    if value == "FILE":
        value = str(tmp_path / "a-file")
        Path(value).write_text("x")
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run", env={name: value})
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"gage-eval: error: environment variable {name}={value!r}: {words}"]


def test_two_spellings_that_disagree_are_refused(run_cli, tmp_path):
    result = run_cli("--tasks", "piqa", "--model", "dummy", "--dry-run",
                     env={"GAGE_EVAL_CONCURRENCY": "4", "GAGE_EVAL_THREADS": "8"})
    assert result.exit_code == 2 and "GAGE_EVAL_CONCURRENCY='4' and GAGE_EVAL_THREADS='8' disagree" in result.output


def test_openai_concurrency_default_from_the_environment(monkeypatch):
    pytest.importorskip("aiohttp")
    from gage_plugins_builtin.backends.openai_backend import OpenAIBackend

    url = "http://127.0.0.1:9/v1"
    assert OpenAIBackend(base_url=url).concurrency == 32
    monkeypatch.setenv("GAGE_EVAL_THREADS", "5")  # spec 004's name
    assert OpenAIBackend(base_url=url).concurrency == 5
    monkeypatch.setenv("GAGE_EVAL_CONCURRENCY", "6")  # ours, read first
    assert OpenAIBackend(base_url=url).concurrency == 6
    assert OpenAIBackend(base_url=url, concurrency=2).concurrency == 2  # --model-args wins
    monkeypatch.setenv("GAGE_EVAL_CONCURRENCY", "x")
    with pytest.raises(Exception, match="environment variable GAGE_EVAL_CONCURRENCY"):
        OpenAIBackend(base_url=url)


def test_data_cache_goes_to_the_hf_loader(tmp_path, monkeypatch, data):
    pytest.importorskip("datasets")
    from gage_plugins_builtin.loaders import HFLoader

    cache = tmp_path / "data-cache"
    monkeypatch.setenv("GAGE_EVAL_DATA_CACHE", str(cache))
    rows = list(HFLoader("json", split="train", data_files=str(data)))
    assert len(rows) == ROWS and cache.is_dir() and any(cache.iterdir())


def test_dry_run_shows_the_chosen_rows(run_cli, tmp_path, data):
    result = run_cli("--tasks", "piqa", "--data", f"piqa={data}", "--model", "dummy", "--dry-run", "3",
                     "--limit", "10", "--shuffle-seed", "7")
    assert result.exit_code == 0, result.output
    chosen = sorted(i for i in range(ROWS) if shuffled_pick(ROWS, 10, 7)(i))[:3]
    shown = [line for line in result.output.splitlines() if line.startswith("-- row ")]
    assert [int(line.split()[2]) - 1 for line in shown] == chosen
    assert "limit 10 (a shuffled choice, seed 7)" in result.output
    assert "  shuffle: true" in result.output and "  shuffle_seed: 7" in result.output
