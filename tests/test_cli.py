"""The arpo command line as a user runs it (a subprocess), on a tiny model saved to disk."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import stopped_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tiny_agent import tiny_llama

    from arpo_algo.generation.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_arpo_rollout_writes_trees(tiny_model_dir, tmp_path):
    out = tmp_path / "trees.jsonl"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(tiny_model_dir), "--env", "ARPO-Math-v0",
           "--dataset", "arithmetic:10:3", "--tasks", "2", "--algo", "arpo", "-M", "3", "-N", "2",
           "--max_new_tokens", "8", "--max_completion_tokens", "64", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and all(len(json.loads(line)["trajectories"]) == 3 for line in lines)
    assert "2 tasks, 6 trajectories" in result.stdout and "arpo rollouts" in result.stderr
    # The same command again (a killed run started again) rolls out only the tasks the file lacks: it rolled them all
    # out again and appended them, each task's trees twice. Another rollout (here another seed) is appended.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    again = subprocess.run([*cmd, "--tasks", "3"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"{out} holds the trees of 2 of these 3 tasks from this same rollout" in again.stderr
    assert "1 task, 3 trajectories" in again.stdout and "other rollouts" not in again.stderr
    trees = [json.loads(line) for line in out.read_text().splitlines()]
    assert out.read_text().startswith("\n".join(lines)) and [t["stats"]["index"] for t in trees] == [0, 1, 2]
    other = subprocess.run([*cmd, "--tasks", "1", "--seed", "1"], capture_output=True, text=True, timeout=600,
                           cwd=ROOT, env=env)
    assert other.returncode == 0 and "1 task, 3 trajectories" in other.stdout, other.stderr[-2000:]
    assert f"{out} holds 3 trees of other rollouts" in other.stderr and "same rollout" not in other.stderr
    assert len(out.read_text().splitlines()) == 4
    done = subprocess.run([*cmd, "--tasks", "3"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0 and "nothing to roll out" in done.stderr and "loading" not in done.stderr, done.stderr
    assert len(out.read_text().splitlines()) == 4


@pytest.fixture
def arpo(capsys, monkeypatch):
    """``arpo ARGS`` in this process (`run_main`), as a result with ``returncode``, ``stdout`` and ``stderr``."""
    import types

    def run(*args):
        from arpo_algo.cli.main import main

        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code
        out = capsys.readouterr()
        return types.SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


def run_main(args, capsys, monkeypatch):
    """The ``arpo`` command run in this process from the project's root: its exit status and what it wrote on stderr."""
    from arpo_algo.cli.main import main

    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    return code, capsys.readouterr().err


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "arpo_algo.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("args, words", [
    (["rollout", "--env", "ARPO-Nope-v0"], "doesn't exist"),
    (["rollout", "--env", "Nope-v0"],
     "Environment `Nope` doesn't exist. arpo's environments: ARPO-Math-v0, ARPO-QA-v0, ARPO-DeepSearch-v0"),  # was
    # Gymnasium's "Did you mean: `Hopper`?" alone
    (["rollout", "--env", "nomodule:Math-v0"], "arpo rollout: nomodule:Math-v0: No module named 'nomodule'"),  # a trace
    (["rollout", "--dataset", "gsm8k", "--data_dir", "/nowhere"], "gsm8k"),
    (["rollout", "--dataset", "gsm8k"], "data directory"),
    (["train", "--config", "/nowhere/recipe.yaml"], "No such file"),
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--top_k", "5"], "top_k"),
    (["rollout", "--max_new_tokens", "0"], "at least one token (max_new_tokens=0"),  # was the default, silently
    (["rollout", "--dataset", "arithmetic:abc"], "N must be a whole number"),  # was int()'s ValueError traceback
    (["rollout", "--batch_tasks", "0"], "--batch_tasks must be at least 1"),  # was range()'s ValueError traceback
    (["rollout", "-M", "4", "-N", "9"], "need 1 <= N (num_global=9) <= M (num_generations=4)"),  # was N=4, silently
    (["rollout", "--start", "100"], "--start must be a task of the dataset, from 0 to 99, not 100"),  # was nothing
    (["rollout", "--tasks", "0"], "arpo rollout: --tasks must be at least 1, not 0\n"),  # and "--start … (not 0)"
    (["rollout", "--env_kwargs", "{max: 3}"], "--env_kwargs is not JSON"),
    (["rollout", "--env_kwargs", '{"max_turns": 0}'], "max_turns must be a whole number of at least 1"),  # a traceback
    (["rollout", "--env_kwargs", '{"sandbox": "e2b", "sandbox_options": {"api_key": ""}}'], "needs an API key"),
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--num_generations", "3"], "divisible by"),  # TRL's
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--max_stepz", "3"], "unknown flags: max_stepz"),
    # the paper's and arpo rollout's names: the nearest spellings were lora_alpha and data_seed
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--alpha", "0.4"],
     "unknown flags: alpha (arpo train calls it branch_alpha)"),
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--env_kwargs", "{max_tool_calls: 3}"],
     "env_kwargs is not JSON (Expecting property name"),  # was json's message alone, not naming the flag
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--env_kwargs", "[3]"],
     "env_kwargs must be an object of keyword arguments, not list [3]"),  # was a TypeError traceback
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--num_generationz", "3",
      "--gradient_accumulation_steps", "3"], "unknown flags: num_generationz (did you mean num_generations?) (the "
                                             "flags: arpo train --help-all); with it left out: generation_batch_size "
                                             "(3)"),  # was TRL's check alone, of the 4 the flag did not set
    # a model that is not there, an env argument the env refuses: tracebacks from transformers and the env
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--cold_start", "", "--model_name_or_path",
      "/nowhere/model"], "model /nowhere/model: no such folder"),
    (["rollout", "--model", "nobody/nothing"], "model nobody/nothing: not a folder here, and the hub could not"),
    (["rollout", "--backend", "vllm"], "needs the 'vllm' extra (vllm is not installed): pip install 'arpo[vllm]' on a "
                                       "GPU machine; on a CPU, vLLM's CPU build"),  # an ImportError traceback
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--use_vllm", "true"],
     "use_vllm with vllm_mode='colocate' needs vLLM"),  # TRL's AttributeError: no attribute 'LLM'
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--cold_start", "", "--env_kwargs",
      '{"max_turns": 0}'], "ARPO-Math-v0: budgets"),
    (["rollout", "--dataset", "chain:10:1:0"], "STEPS must be a whole number from 1"),  # was 10 questions of no step
    (["rollout", "--dataset", "chain:10:1:3:4:5"], "more than N, SEED, STEPS, RATE after chain"),  # "needs a data dir"
    (["rollout", "--dataset", "noisy:10:1:3:101"], "RATE must be a whole number from 0 to 100"),
    (["sft", "--config", "examples/recipes/smollm2_sft_cpu.yaml", "--synthetic_tasks", "-1"],
     "synthetic_tasks must be a whole number from 0"),  # was "dataset 'arithmetic:-1:1:': N …", after the weights
    (["sft", "--config", "examples/recipes/smollm2_sft_cpu.yaml", "--min_reward", "nan"],
     "min_reward must be a number (a reward to reach), not nan"),  # every trajectory kept, silently
    (["sft", "--config", "examples/recipes/smollm2_sft_cpu.yaml", "--synthetic_family", "chain:0"],
     "synthetic_family 'chain:0': its STEPS must be a whole number from 1 to 1,000, not '0' (e.g. chain:3, or "
     "chain:3:25"),
    (["sft", "--config", "examples/recipes/smollm2_sft_cpu.yaml", "--synthetic_family", "noisy:2:25:1"],
     "synthetic_family 'noisy:2:25:1': more than STEPS, RATE after noisy"),
    (["sft", "--config", "examples/recipes/smollm2_sft_cpu.yaml", "--env_id", "Nope-v0"],
     "arpo sft: Environment `Nope` doesn't exist. arpo's environments: ARPO-Math-v0"),  # Gymnasium's `Hopper`, late
    (["eval", "--model", "x", "--benchmarks", "gsm8k", "--max_completion_tokens", "0"], "--max_completion_tokens=0"),
    (["eval", "--model", "x", "--benchmarks", "gsm8k", "--runs", "0"], "--runs must be at least 1"),  # 0 samples
    (["eval", "--model", "x", "--benchmarks", "webwalker", "--judge", "127.0.0.1:8001/v1"],
     "--judge must be the http(s) URL of an OpenAI-compatible endpoint"),  # every sample's judge "unreachable": F1
    (["eval", "--model", "x", "--benchmarks", "gsm8k", "--backend", "openai", "--base_url", "localhost:8000"],
     "--base_url must be the http(s)"),
    (["eval", "--model", "x", "--benchmarks", "gsm8k", "--max_tool_calls", "-1"], "--max_tool_calls must be at "
                                                                                    "least 0"),  # was a traceback
    (["eval", "--model", "x", "--benchmarks", "gsm8k", "--seed", "-1"], "--seed must be at least 0"),
    (["train", "--config", "examples/recipes/smollm2_cpu.yaml", "--train_limit", "0"],
     "train_limit must be at least 1"),  # trained on every task (-1: on all but the last)
    (["rollout", "--seed", "-1"], "seed must be at least 0, not -1"),  # numpy's error, once the model had loaded
])
def test_mistakes_are_one_clear_line(args, words, capsys, monkeypatch):
    """Run in this process (`main(argv)`): what is tested is the message, not the process around it."""
    if "vllm" in words and importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    if "API key" in words and os.environ.get("E2B_API_KEY"):
        pytest.skip("an E2B key is set here")
    code, stderr = run_main(args, capsys, monkeypatch)
    assert code == 2 and words in stderr, stderr[-2000:]
    assert "Traceback" not in stderr
    assert len([line for line in stderr.splitlines() if line.startswith("arpo ")]) == 1


def test_a_recipe_of_other_bytes_or_keys_is_one_line(tmp_path, arpo):
    """A recipe that is no UTF-8 text (a binary file, another encoding), or whose keys are numbers (``1: 2``, ``env:
    {5: x}``), was a traceback: UnicodeDecodeError, TRL's "keywords must be strings", "str expected, not int"."""
    cases = [(b"\xff\xfe\x00num_generations: 4\n", "is not UTF-8 text: invalid start byte at byte 0"),
             (b"1: 2\nmax_steps: 1\n", "the recipe has a key that is no name: 1 (its keys"),
             (b"env:\n  5: x\n", "the recipe has a key that is no name: 5 (its keys")]
    for n, (content, words) in enumerate(cases):
        recipe = tmp_path / f"recipe{n}.yaml"
        recipe.write_bytes(content)
        for command in ("train", "sft"):
            result = arpo(command, "--config", str(recipe), "--model_name_or_path", str(tmp_path / "nowhere"))
            assert result.returncode == 2 and words in result.stderr, result.stderr[-2000:]
            assert "Traceback" not in result.stderr and result.stderr.startswith(f"arpo {command}: ")


def test_an_env_argument_the_env_refuses_stops_train_before_the_cold_start(tmp_path, arpo):
    """The recipe's env arguments were first used after its cold start: ``max_tool_calls: -1`` in env_kwargs (or a
    dataset that is not there) was found once the SFT recipe had run, minutes later."""
    sft_model = tmp_path / "sft"
    result = arpo("train", "--config", "examples/recipes/smollm2_cpu.yaml", "--model_name_or_path", str(sft_model),
                     "--output_dir", str(tmp_path / "run"), "--env_kwargs", '{"max_tool_calls": -1}')
    assert result.returncode == 2 and "ARPO-Math-v0: budgets: max_tool_calls must be" in result.stderr, result.stderr
    assert not sft_model.exists() and "Traceback" not in result.stderr


def test_a_paper_table_eval_cannot_read_is_one_line_before_the_model_loads(tmp_path, arpo):
    """`arpo eval --compare paper --paper_table T` read T only after the whole evaluation: a missing file, a column
    missing or a value that is no number was a traceback then (the samples kept, the table not printed)."""
    missing_column = tmp_path / "no_method.tsv"
    missing_column.write_text("model\tgsm8k\nQwen2.5-7B-Instruct\t92.0\n")
    not_a_number = tmp_path / "dash.tsv"
    not_a_number.write_text("model\tmethod\tgsm8k\nQwen2.5-7B-Instruct\tARPO\t-\n")
    header_only = tmp_path / "trees.jsonl"  # not a table, and no row to find it out by: read as one
    header_only.write_text(json.dumps({"task": {"question": "1+1?"}, "nodes": []}) + "\n")
    for table, words in [(tmp_path / "nowhere.tsv", "No such file"), (missing_column, "no 'method' column"),
                         (not_a_number, "is not a number"), (header_only, "no 'model' column")]:
        result = arpo("eval", "--model", "/nowhere/Qwen2.5-7B-Instruct", "--benchmarks", "gsm8k", "--compare",
                         "paper", "--paper_table", str(table), "--out", str(tmp_path / "out"))
        assert result.returncode == 2 and f"arpo eval: --paper_table {table}: " in result.stderr, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr and "/nowhere/Qwen" not in result.stderr
        assert not (tmp_path / "out").exists()  # nothing started


def test_a_model_without_a_chat_template_is_one_clear_line_before_its_weights_load(tiny_model_dir, tmp_path, arpo):
    """A base model's tokenizer has no chat template: transformers' ValueError was a traceback once the model had
    loaded, in arpo rollout, eval, train and sft alike (they all load the tokenizer through arpo_algo.generation.models)."""
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    for template in base.glob("*.jinja"):
        template.unlink()
    result = arpo("rollout", "--model", str(base), "--tasks", "1", "--out", str(tmp_path / "trees.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert (f"arpo rollout: model {base}: its tokenizer has no chat template (a base model?); arpo's prompts are "
            f"chat turns (system, user, assistant): use an instruct model, or give it a chat_template in "
            f"{base}/tokenizer_config.json") in result.stderr


def test_a_hub_dataset_out_of_reach_is_one_clear_line():
    """Offline (or a dataset the hub does not have), ``--dataset hub:owner/name`` was datasets' ConnectionError
    traceback, after half a minute of retries when not told it is offline."""
    pytest.importorskip("datasets")
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "rollout", "--dataset", "hub:arpo-tests/nothing"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "arpo rollout: hub:arpo-tests/nothing: Couldn't reach 'arpo-tests/nothing' on the Hub" in result.stderr
    assert "(a hub dataset needs a network, or the hub's cache;" in result.stderr


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_recipe_with_a_mistake_is_one_clear_line(command, tmp_path, arpo):
    """A recipe that is not YAML, not a mapping, or has a key with a typo was a traceback from TRL's parser."""
    for text, words in [("output_dir: runs/x\n  bad: [\n", "not valid YAML: mapping values are not allowed here "
                                                           "(line 2, column 6)"),
                        ("- a\n- b\n", "must contain a YAML mapping"),
                        ("learning_rat: 1.0e-5\nnonsense_key: 1\n", "keys no flag knows: learning_rat (did you mean "
                                                                   "learning_rate?), nonsense_key")] + [
            ("alpha: 0.4\nZ: 3\n", "keys no flag knows: alpha (arpo train calls it branch_alpha), Z (arpo train "
             "calls it branch_factor)")] * (command == "train") + [
            # TRL's own check refuses the default the typo left (16); it alone was the message
            ("num_generation: 4\nper_device_train_batch_size: 4\n", "keys no flag knows: num_generation (did you "
             "mean num_generations?) (the flags: arpo train --help-all); with it left out: generation_batch_size (8) "
             "must be divisible by num_generations (16)")] * (command == "train"):
        (tmp_path / "recipe.yaml").write_text(text)
        result = arpo(command, "--config", str(tmp_path / "recipe.yaml"))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert f"arpo {command}: " in result.stderr and words in result.stderr, result.stderr[-2000:]


def test_a_recipe_beta_is_named_as_trls_kl_weight(tmp_path, arpo):
    """``beta`` is a TRL flag (the KL weight), so the paper's ``β = 0.2`` written as ``beta: 0.2`` was no unknown key:
    it trained with a KL penalty and a reference model instead, silently. It is said before anything loads."""
    (tmp_path / "recipe.yaml").write_text(f"beta: 0.2\nmodel_name_or_path: {tmp_path / 'nowhere'}\n"
                                          f"output_dir: {tmp_path / 'run'}\n")
    result = arpo("train", "--config", str(tmp_path / "recipe.yaml"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert ("arpo train: beta=0.2 is TRL's KL weight (a reference model is kept and the policy pulled towards it); "
            "ARPO's β, the slope of P = α + β·ΔH, is branch_beta (here 0.2)") in result.stderr
    (tmp_path / "recipe.yaml").write_text(f"branch_beta: 0.3\nmodel_name_or_path: {tmp_path / 'nowhere'}\n")
    assert "KL weight" not in arpo("train", "--config", str(tmp_path / "recipe.yaml")).stderr


def test_a_dataset_named_twice_and_apart_is_one_clear_line(tmp_path, arpo):
    """The recipe's ``dataset_name: arithmetic`` won over ``--env_kwargs '{"dataset": "mine.jsonl"}'`` in silence:
    the run trained on the recipe's tasks, not the ones asked for."""
    result = arpo("train", "--config", str(ROOT / "examples" / "recipes" / "smollm2_cpu.yaml"), "--env_kwargs",
                     '{"dataset": "mine.jsonl", "data_dir": "here"}', "--data_dir", "there",
                     "--output_dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert ("arpo train: dataset_name 'arithmetic:1000:0:3:40' and env_kwargs' dataset 'mine.jsonl'; data_dir 'there' and "
            "env_kwargs' data_dir 'here' differ: name each once (--dataset_name and --data_dir override the "
            "recipe's)") in result.stderr, result.stderr[-2000:]
    assert "cold start" not in result.stderr and not (tmp_path / "run").exists()  # before anything runs


@pytest.mark.parametrize("recipe", sorted(p.name for p in (ROOT / "examples" / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_parses(recipe):
    """The 7B recipes run only on a GPU node: a key misspelt in one would show there first, after the model's
    download. Parsed here with bf16 off (transformers refuses it on a CPU), every key must be one a flag knows."""
    from arpo_algo.training import sft, train

    module = sft if "_sft_" in recipe else train
    script, args, _ = train.parse_recipe(module.make_parser(), ["--config", str(ROOT / "examples" / "recipes" /
                                                                                 recipe), "--bf16", "false"])
    assert args.output_dir.startswith("runs/") and args.seed == 0
    if module is train:  # the public code's Z and k everywhere; its M and N where the GPU can take them
        assert (args.branch_factor, args.entropy_k) == (2, 20)
        assert not recipe.startswith("qwen") or (args.num_generations, args.num_global) == (16, 8)


def test_train_help_leads_with_config_and_arpo_options(arpo):
    result = arpo("train", "--help")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("usage: arpo train --config") and len(lines) < 150
    head = "\n".join(lines[:40])
    assert "--config" in head and "--branch_alpha" in head and "--algorithm" in head
    assert "--help-all" in result.stdout


@pytest.mark.slow
def test_rollout_writes_each_tree_as_it_finishes(tiny_model_dir, tmp_path):
    """Killed while later tasks are still rolling out, the file already holds the finished trees."""
    import signal
    import time

    out = tmp_path / "trees.jsonl"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(tiny_model_dir), "--dataset",
           "arithmetic:50:3", "--tasks", "50", "--batch_tasks", "1", "-M", "2", "-N", "1", "--max_new_tokens", "8",
           "--max_completion_tokens", "32", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while (not out.exists() or len(out.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        assert proc.poll() is None, "the rollout ended before writing two trees"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    trees = [json.loads(line) for line in out.read_text().splitlines()]
    assert 2 <= len(trees) < 50 and all(len(t["trajectories"]) == 2 for t in trees)


@pytest.mark.slow
def test_rollout_interrupted_keeps_its_trees_and_says_so(tiny_model_dir, tmp_path):
    """Ctrl-C: the trees already finished are in the file, whole, and the command ends with status 130 and one line
    (it was a KeyboardInterrupt traceback)."""
    import signal
    import time

    out = tmp_path / "trees.jsonl"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(tiny_model_dir), "--dataset",
           "arithmetic:500:3", "--tasks", "500", "--batch_tasks", "1", "-M", "2", "-N", "1", "--max_new_tokens", "8",
           "--max_completion_tokens", "32", "--out", str(out)]
    # Ctrl-C as a terminal sends it, whatever this process inherited: a job started in the background (`cmd &`,
    # nohup) ignores SIGINT, its children inherit that, and Python then installs no KeyboardInterrupt handler
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while (not out.exists() or len(out.read_text().splitlines()) < 2) and time.monotonic() < deadline:
        assert proc.poll() is None, "the rollout ended before writing two trees"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stderr = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert "arpo rollout: interrupted; what had finished is kept" in stderr
    trees = [json.loads(line) for line in out.read_text().splitlines()]
    assert 2 <= len(trees) < 500 and all(len(t["trajectories"]) == 2 for t in trees)


@pytest.mark.slow
def test_rollout_to_a_reader_that_stops_ends_quietly(tiny_model_dir):
    """`arpo rollout --out - | head -1`: once the reader is gone the rollout stops with a pipe writer's status (141,
    as a shell reports SIGPIPE), not a BrokenPipeError traceback."""
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(tiny_model_dir), "--dataset",
           "arithmetic:4:3", "--tasks", "2", "-M", "2", "-N", "1", "--max_new_tokens", "8", "--max_completion_tokens",
           "32", "--out", "-"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first tree
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 141 and "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-2000:]


def test_version_names_the_stack():
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "--version"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    from arpo_algo import __version__

    assert result.returncode == 0 and result.stdout.startswith(f"arpo {__version__} (Python ")
    assert "torch " in result.stdout and "trl " in result.stdout and "gymnasium " in result.stdout


def test_rollout_says_which_budget_it_uses(tiny_model_dir, tmp_path, arpo):
    result = arpo("rollout", "--model", str(tiny_model_dir), "--dataset", "arithmetic:4:3", "--tasks", "1",
                     "-M", "2", "-N", "1", "--out", str(tmp_path / "t.jsonl"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tokens per turn" in result.stderr and ("CPU budget" in result.stderr or "default budget" in result.stderr)


def test_a_trees_file_that_cannot_be_written_is_one_clear_line_before_any_work(tiny_model_dir, tmp_path, arpo):
    """`arpo rollout --out FOLDER` rolled the first batch out, then lost it to an IsADirectoryError traceback (a file
    in a missing folder: the same work, then the error)."""
    for out, why in [(tmp_path, "Is a directory"), (tmp_path / "missing" / "t.jsonl", "No such file or directory")]:
        result = arpo("rollout", "--model", str(tiny_model_dir), "--dataset", "arithmetic:4:3", "--tasks", "1",
                         "-M", "2", "-N", "1", "--out", str(out))
        assert result.returncode == 2, result.stderr[-2000:]
        assert f"arpo rollout: --out {out} cannot be written ({why})" in result.stderr
        assert "Traceback" not in result.stderr and "loading" not in result.stderr  # before the model, and any rollout
    result = arpo("rollout", "--model", "nobody/nothing", "--out", str(tmp_path / "new.jsonl"))
    assert result.returncode == 2 and not (tmp_path / "new.jsonl").exists()  # the check leaves no file behind
    os.mkfifo(tmp_path / "pipe")  # opening it would wait for a reader for ever (the resume reads it first)
    # in a process of its own: a hang is what this checks for
    result = run_cli("rollout", "--model", str(tiny_model_dir), "--tasks", "1", "--out", str(tmp_path / "pipe"),
                     timeout=60)
    assert result.returncode == 2 and f"arpo rollout: --out {tmp_path / 'pipe'} is a pipe: the trees go to a file" \
        in result.stderr


def test_an_eval_output_that_is_a_file_is_one_clear_line_before_any_work(tiny_model_dir, tmp_path, data_dir, arpo):
    """`arpo eval --out FILE` was a FileExistsError traceback."""
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    result = arpo("eval", "--model", str(tiny_model_dir), "--benchmarks", "gsm8k", "--data_dir",
                     str(data_dir / "eval"), "--limit", "1", "--out", str(taken))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"arpo eval: --out {taken} is a file, not a folder: give a folder for the results" in result.stderr
    assert "Traceback" not in result.stderr and taken.read_text() == "not a folder"


@pytest.mark.parametrize("command, recipe, below", [("train", "smollm2_cpu.yaml", ""),
                                                     ("sft", "smollm2_sft_cpu.yaml", "sub")])
def test_an_output_dir_that_cannot_be_one_is_one_clear_line(command, recipe, below, tmp_path, arpo):
    """A file where the run directory (or a folder above it) should be was transformers' FileExistsError traceback,
    once the model was loaded; with a cold start, after the SFT stage."""
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    out = taken / below if below else taken
    result = arpo(command, "--config", f"examples/recipes/{recipe}", "--output_dir", str(out))
    why = f"{taken} is a file, not a folder" if not below else f"{out} cannot be made: {taken} is a file"
    assert result.returncode == 2 and f"arpo {command}: output_dir {why}" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and taken.read_text() == "not a folder"


def test_the_trees_file_of_a_rollout_is_hidden_from_the_sandbox(tmp_path):
    """`arpo rollout`'s trees hold every task's answer, and a run appending to the file may roll the same tasks out
    again: its cells could read them (the trainer and `arpo eval` hid their outputs, `tests/test_trainer.py` and
    `tests/test_eval.py`; the rollout did not)."""
    from conftest import assert_hidden_from_the_sandbox

    from arpo_algo.cli.rollout import make_parser, rollout_env_kwargs

    parser = make_parser()
    trees = tmp_path / "trees.jsonl"
    trees.write_text('{"task": {"answer": "204"}}\n')
    kwargs = rollout_env_kwargs(parser.parse_args(["--env_kwargs", '{"max_tool_calls": 2}', "--out", str(trees)]))
    assert kwargs == {"max_tool_calls": 2, "sandbox_options": {"hidden_paths": (str(trees),)}}
    assert "sandbox_options" not in rollout_env_kwargs(parser.parse_args(["--out", "-"]))
    assert_hidden_from_the_sandbox(kwargs, trees)


def test_rollout_flags_and_trainer_fields_are_made_from_rollout_config():
    """`RolloutConfig` is the one place rollout settings are written: ``arpo rollout``'s flags (both spellings) and
    `ARPOConfig`'s fields (under TRL's names) are made from it, and both give back the config they stand for."""
    from dataclasses import fields

    from arpo_algo.cli.rollout import make_parser
    from arpo_algo.core.config import TRAINER_NAMES, RolloutConfig, from_flags, from_trainer
    from arpo_algo.training.config import ARPOConfig

    parser = make_parser()
    budget = {"max_new_tokens": 512, "max_completion_tokens": 4096}  # the backend's budget, given by the command
    assert from_flags(parser.parse_args([]), **budget) == RolloutConfig()
    changed = from_flags(parser.parse_args(["--num_generations", "4", "-Z", "3", "--entropy_k", "5",
                                            "--speculative_branches", "--min_spare_samples", "0"]), **budget)
    assert changed == RolloutConfig(num_generations=4, branch_factor=3, entropy_k=5, speculative_branches=True,
                                    min_spare_samples=0)
    trainer = ARPOConfig("unused", report_to="none")
    assert from_trainer(trainer, seed=0) == RolloutConfig(branching=True)
    renamed = {TRAINER_NAMES.get(f.name, f.name): f.name for f in fields(RolloutConfig)}
    tuned = ARPOConfig("unused", report_to="none", branch_alpha=0.3, branch_beta=0.4, tool_workers=2,
                       max_new_tokens_per_turn=64, max_completion_length=256, num_generations=4,
                       per_device_train_batch_size=4, gradient_accumulation_steps=1)
    rollout = from_trainer(tuned, seed=0)
    for trainer_name, name in renamed.items():
        if hasattr(tuned, trainer_name) and name not in ("seed", "branching"):
            assert getattr(rollout, name) == getattr(tuned, trainer_name), trainer_name
    assert (rollout.alpha, rollout.beta, rollout.max_tool_workers, rollout.max_new_tokens) == (0.3, 0.4, 2, 64)
    assert ARPOConfig.__dataclass_fields__["branch_factor"].metadata["help"] == \
        RolloutConfig.__dataclass_fields__["branch_factor"].metadata["help"]


def test_transformers_generates_on_the_gpu_where_there_is_one(tiny_model_dir, monkeypatch):
    """`arpo rollout` and `arpo eval` take the GPU budget where CUDA is there; their model must go there too."""
    import torch

    import arpo_algo.generation.models as models
    from arpo_algo.generation.factory import make_generator

    placed = []
    load = models.load_model
    monkeypatch.setattr(models, "load_model", lambda name, dtype=None, device=None: (placed.append(device),
                                                                                     load(name, dtype))[1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    make_generator(str(tiny_model_dir))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    make_generator(str(tiny_model_dir))
    assert placed == ["cuda", None]


@pytest.mark.slow
def test_a_second_rollout_into_the_same_file_at_once_is_refused(tiny_model_dir, tmp_path):
    """Two `arpo rollout` into one --out at once each read the file at start, so each rolled out the tasks the other
    had under way and appended them: every tree twice."""
    out = tmp_path / "trees.jsonl"
    args = ["rollout", "--model", str(tiny_model_dir), "--dataset", "arithmetic:4:3", "--tasks", "2", "-M", "2", "-N",
            "1", "--max_new_tokens", "8", "--max_completion_tokens", "32", "--out", str(out)]
    first = stopped_run.stopped([sys.executable, "-m", "arpo_algo.cli", *args], "loading")
    try:
        second = run_cli(*args)
    finally:
        stopped_run.resume_and_wait(first)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"arpo rollout: another arpo rollout is writing {out} now: wait for it to end" in second.stderr
    assert first.returncode == 0 and [json.loads(t)["stats"]["index"] for t in out.read_text().splitlines()] == [0, 1]
    again = run_cli(*args)  # once the first has ended, the file is free
    assert again.returncode == 0 and "nothing to roll out" in again.stderr, again.stderr[-2000:]


@pytest.mark.slow
def test_a_second_eval_into_the_same_folder_at_once_is_refused(tiny_model_dir, tmp_path, data_dir):
    """Two `arpo eval` into one --out at once (the same model's default folder, one with --mode direct) each read the
    settings and samples at start: the second wrote its settings over the first's, and both appended samples."""
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_model_dir), "--benchmarks", "gsm8k", "--data_dir", str(data_dir / "eval"),
            "--limit", "1", "--max_new_tokens", "8", "--max_completion_tokens", "32", "--out", str(out)]
    first = stopped_run.stopped([sys.executable, "-m", "arpo_algo.cli", *args], "  sampling    ")
    try:
        second = run_cli(*args, "--mode", "direct")
    finally:
        stopped_run.resume_and_wait(first)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    assert f"arpo eval: another arpo eval is writing to {out} now: wait for it to end" in second.stderr
    assert first.returncode == 0 and json.loads((out / "settings.json").read_text())["mode"] != "direct"
    assert len((out / "samples.jsonl").read_text().splitlines()) == 1


def test_sole_writer_removes_the_log_it_made_only_if_nothing_was_written(tmp_path):
    from arpo_algo import jsonl
    from arpo_algo.settings import ConfigError

    empty, written = tmp_path / "empty.jsonl", tmp_path / "written.jsonl"
    with jsonl.sole_writer(empty, "busy"):
        assert empty.exists()
        with pytest.raises(ConfigError, match="busy"):  # another open file description: as another process
            with jsonl.sole_writer(empty, "busy"):
                pass
    with jsonl.sole_writer(written, "busy"):
        written.write_text("{}\n")
    assert not empty.exists() and written.read_text() == "{}\n"
    with jsonl.sole_writer(written, "busy"):  # released at the end
        pass
    folder, run = tmp_path / "new", tmp_path / "run"
    with jsonl.sole_writer(folder, "busy", folder=True), jsonl.sole_writer(run, "busy", folder=True):
        assert folder.is_dir()
        (run / "metrics.jsonl").write_text("{}\n")
    assert not folder.exists() and (run / "metrics.jsonl").is_file()


def test_sole_writer_runs_unguarded_on_a_file_system_without_locks(tmp_path, monkeypatch):
    import errno
    import fcntl

    from arpo_algo import jsonl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with jsonl.sole_writer(tmp_path / "trees.jsonl", "busy"):
        (tmp_path / "trees.jsonl").write_text("{}\n")
    assert (tmp_path / "trees.jsonl").read_text() == "{}\n"
