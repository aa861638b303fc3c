"""The command line's conventions, command by command: one flag style, help that fits a screen without TRL, one-line
errors, a refusal of the GPU defaults on a CPU, a plan before long work, progress that moves, and no half-made
output folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("train", "sft", "rollout", "eval", "view")


def run_arpo(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arpo_algo.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    from arpo_algo.cli.main import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def argparse_parsers():
    from arpo_algo.cli.eval.command import make_parser as eval_parser
    from arpo_algo.cli.rollout import make_parser as rollout_parser

    return {"rollout": rollout_parser(), "eval": eval_parser()}


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_every_flag_takes_both_spellings_and_help_shows_one(command):
    """``--data_dir`` and ``--data-dir`` are the same flag in every command; help spells every flag as TRL does."""
    parser = argparse_parsers()[command]
    required = ["--model", "m"] if command == "eval" else []
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help" and "_" in a.option_strings[-1]]
    assert flags, "the command has flags with two words"
    for action in flags:
        flag = next(o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-"))
        if action.nargs == 0:
            value: list[str] = []
        elif action.choices:
            value = [str(list(action.choices)[-1])]
        elif action.type in (int, float):
            value = ["3"]
        else:
            value = ["x"]
        under = vars(parser.parse_args([*required, flag, *value]))
        dashed = vars(parser.parse_args([*required, flag.replace("_", "-"), *value]))
        assert under == dashed, flag
    shown = parser.format_help()
    assert "--data_dir" in shown and "--data-dir" not in shown and "--max_new_tokens" in shown


def test_trl_commands_take_both_spellings():
    from arpo_algo.training.sft import make_parser as sft_parser
    from arpo_algo.training.train import make_parser as train_parser

    for parser, more in ((train_parser(), []), (sft_parser(), ["--synthetic_tasks", "2"])):
        a = parser.parse_args_into_dataclasses(["--output_dir", "o", "--max_steps", "3", "--logging_steps", "2", *more])
        b = parser.parse_args_into_dataclasses(["--output-dir", "o", "--max-steps", "3", "--logging-steps", "2",
                                                *[m.replace("_", "-") for m in more]])
        assert [(x.output_dir, x.max_steps, x.logging_steps) for x in a[1:2]] == \
            [(x.output_dir, x.max_steps, x.logging_steps) for x in b[1:2]] == [("o", 3, 2)]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_a_screen_or_two_and_imports_no_training_stack(command):
    """``arpo train --help`` imported TRL (about 11 s) and printed 860 lines for sft. Help is read from the package:
    no TRL, no torch; at most two screens; ``--config`` first where there is one."""
    code = ("import sys\nfrom arpo_algo.cli.main import main\n"
            f"try:\n    main([{command!r}, '--help'])\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', 'trl' in sys.modules, 'torch' in sys.modules, 'transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "IMPORTED False False False"
    assert 5 < len(lines) <= 110, len(lines)
    if command in ("train", "sft"):
        options = [line.split()[0] for line in lines if line.startswith("  --")]
        assert options[0] == "--config" and "--help-all" in result.stdout


def test_the_packaged_help_is_written_from_the_configs_as_they_are():
    """The curated help of train and sft is a text kept in the package: it must say what the dataclasses say now
    (``python -m arpo_algo.training.help_texts`` writes it again)."""
    from arpo_algo.flags import packaged_help
    from arpo_algo.training.help_texts import HELP_TEXTS

    for command, make in HELP_TEXTS.items():
        assert packaged_help(command) == make(), f"run python -m arpo_algo.training.help_texts ({command})"


@pytest.mark.slow
def test_help_all_lists_every_trl_flag(capsys):
    code, out, _ = in_process(["sft", "--help-all"], capsys)
    assert code == 0 and "--gradient_checkpointing" in out and len(out.splitlines()) > 300


@pytest.mark.parametrize("argv, flag", [
    (["eval", "--model", "m", "--limit", "abc"], "--limit: invalid int value: 'abc'"),
    (["rollout", "--tasks", "many"], "--tasks: invalid int value: 'many'"),
    (["rollout", "--num-generatons", "3"], "unknown flag: --num-generatons (did you mean --num_generations?)"),
    (["view"], "the following arguments are required: path"),
    (["bogus"], "unknown command 'bogus'"),
])
def test_a_bad_flag_or_value_is_one_line_and_a_hint(argv, flag, capsys):
    code, out, err = in_process(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and flag in err and "--help lists the flags" in err, err


@pytest.mark.slow
def test_a_bad_value_of_a_trl_flag_is_one_line(tmp_path, capsys):
    recipe = ROOT / "examples" / "recipes" / "smollm2_cpu.yaml"
    for command in ("train", "sft"):
        code, _, err = in_process([command, "--config", str(recipe), "--max_steps", "abc"], capsys)
        assert code == 2 and err == (f"arpo {command}: --max_steps: invalid int value: 'abc' (arpo {command} --help "
                                     "lists the flags)\n"), err


def test_error_texts_name_flags_as_the_command_line_spells_them(capsys):
    code, _, err = in_process(["rollout", "--dataset", "gsm8k"], capsys)
    assert code == 2 and "give --data_dir DIR" in err and "give --dataset default" in err and "pass " not in err


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_train_without_a_recipe_on_a_cpu_refuses_and_points_to_the_cpu_recipe(tmp_path):
    """``arpo train`` alone started a 300-step run of the GPU defaults on the CPU, silently, into ./trainer_output."""
    result = run_arpo("train", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "arpo train --config examples/recipes/smollm2_cpu.yaml" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_failed_eval_leaves_no_folder_behind(tmp_path, data_dir):
    """A run that fails before its first sample (here: no such model) removes the folder it made; one that was
    there already is kept."""
    out = tmp_path / "runs" / "eval"
    result = run_arpo("eval", "--model", str(tmp_path / "nowhere"), "--benchmarks", "gsm8k", "--data_dir",
                      str(data_dir / "eval"), "--limit", "1", "--out", str(out))
    assert result.returncode == 2 and "nowhere" in result.stderr, result.stderr
    assert not out.exists()
    out.mkdir(parents=True)
    result = run_arpo("eval", "--model", str(tmp_path / "nowhere"), "--benchmarks", "gsm8k", "--data_dir",
                      str(data_dir / "eval"), "--limit", "1", "--out", str(out))
    assert result.returncode == 2 and out.is_dir()


@pytest.mark.slow
def test_a_failed_training_run_leaves_no_folder_behind(tmp_path):
    recipe = ROOT / "examples" / "recipes" / "smollm2_cpu.yaml"
    out = tmp_path / "run"
    result = run_arpo("train", "--config", str(recipe), "--model_name_or_path", str(tmp_path / "nowhere"),
                      "--cold_start", "", "--output_dir", str(out))
    assert result.returncode == 2 and "nowhere" in result.stderr, result.stderr
    assert "no such folder" in result.stderr  # found before the model loads (and so before the plan)
    assert not out.exists()


def test_the_output_folder_is_removed_only_when_this_run_made_it_and_it_holds_no_result(tmp_path):
    from arpo_algo import jsonl

    made = tmp_path / "made"
    with pytest.raises(RuntimeError), jsonl.removed_if_unused(made, lambda: (made / "r.jsonl").exists()):
        made.mkdir()
        (made / "settings.json").write_text("{}")
        raise RuntimeError("the model did not load")
    assert not made.exists()
    with pytest.raises(RuntimeError), jsonl.removed_if_unused(made, lambda: (made / "r.jsonl").exists()):
        made.mkdir()
        (made / "r.jsonl").write_text("{}\n")
        raise RuntimeError("after the first result")
    assert made.is_dir()
    there = tmp_path / "there"
    there.mkdir()
    with jsonl.removed_if_unused(there, lambda: False) as folder:
        folder.failed = True
    assert there.is_dir()


def test_the_token_meter_moves_while_a_segment_is_generated(tokenizer):
    """The transformers backend counts every sampled token as it is sampled (`GeneratorStats.sampled_tokens`), so a
    progress line shows tokens within one long segment, not only when it ends: after one poll (8 decoding steps) of
    a 48-token segment, the meter reads 8 tokens while no segment has ended."""
    import torch
    from tiny_agent import tiny_llama

    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.protocol import SamplingParams
    from arpo_algo.generation.throughput import TokenMeter

    torch.manual_seed(0)
    gen = HFGenerator(tiny_llama(tokenizer), tokenizer)
    path = gen.new_path(tokenizer("Count:", add_special_tokens=False)["input_ids"])
    gen.submit(path, SamplingParams(max_new_tokens=48, temperature=1.0, stop=(), seed=0), "only")
    with TokenMeter(gen.stats, lambda line: None, every=3600) as meter:
        assert gen.poll() == []  # 8 decoding steps: the segment goes on
        assert gen.stats.generated_tokens == 0 and gen.stats.sampled_tokens == 8
        assert meter.line().startswith("8 tok, ")
        ended = []
        while not ended:
            ended = gen.poll()
    total = len(ended[0][1].token_ids)
    assert 8 < total and gen.stats.sampled_tokens == gen.stats.generated_tokens == total


def test_the_token_meter_shows_its_line_from_a_thread_of_its_own():
    import time

    from arpo_algo.generation.protocol import GeneratorStats
    from arpo_algo.generation.throughput import TokenMeter

    stats, shown = GeneratorStats(), []
    with TokenMeter(stats, shown.append, every=0.01):
        stats.sampled_tokens += 1234
        deadline = time.monotonic() + 30
        while not any(line.startswith("1,234 tok, ") for line in shown) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert any(line.startswith("1,234 tok, ") and line.endswith(" tok/s") for line in shown), shown
    count = len(shown)
    time.sleep(0.05)
    assert len(shown) == count  # the thread ended with the block


def test_the_quickstart_answer_scores_one_and_a_solution_column_is_an_answer():
    """The README's quickstart answers its own task (it answered a GSM8K question with 408: reward 0); a row with
    only TRL's ``solution`` column ("18") is a task."""
    import gymnasium as gym

    import arpo_env
    from arpo_env.integrations.trl_dataset import row_task

    env = gym.make("ARPO-Math-v0")
    env.reset(seed=0, options={"question": "What is 12 * 34?", "answer": "408"})
    obs, *_ = env.step("<think>Compute it.</think><python>print(12 * 34)</python>")
    assert obs == "\n<result>\n408\n</result>\n"
    _, reward, terminated, _, _ = env.step("<answer>\\boxed{408}</answer>")
    assert terminated and reward == 1.0
    env.close()
    assert row_task({"prompt": [{"role": "user", "content": "3 * 6?"}], "solution": "18"})["answer"] == "18"
    worked = "We have $3 \\cdot 6 = 18$.\nSo the answer is $\\boxed{18}$."
    assert row_task({"prompt": [{"role": "user", "content": "3 * 6?"}], "solution": worked})["answer"] == "18"
    assert arpo_env


def test_restore_on_the_unwrapped_env_then_a_step_of_the_made_env_works():
    """``env.unwrapped.restore(snapshot)`` then ``env.step``: Gymnasium's OrderEnforcing wrapper raised ResetNeeded
    (it saw no reset). gym.make gives the env itself, which enforces reset before step on its own."""
    import gymnasium as gym

    env = gym.make("ARPO-Math-v0")
    with pytest.raises(gym.error.ResetNeeded, match="call reset"):
        env.step("<python>print(1)</python>")
    env.reset(seed=0)
    env.step("<python>x = 41</python>")
    saved = env.unwrapped.snapshot()
    other = gym.make("ARPO-Math-v0")
    other.unwrapped.restore(saved)
    assert other.step("<python>print(x + 1)</python>")[0] == "\n<result>\n42\n</result>\n"
    env.close()
    other.close()


def test_a_missing_training_extra_says_which_extra_to_install():
    """``from arpo_algo import ARPOTrainer`` without torch was a bare ``No module named 'torch'``."""
    code = ("import sys\nsys.modules['torch'] = None\n"
            "try:\n    from arpo_algo import ARPOTrainer\nexcept ModuleNotFoundError as exc:\n    print(exc)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "needs the 'train' extra" in result.stdout and "pip install 'arpo[train]'" in result.stdout, result
