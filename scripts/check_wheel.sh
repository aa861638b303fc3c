#!/usr/bin/env bash
# The wheel and the sdist are complete: build both, install the wheel alone (no extras, no torch) in a clean virtual
# environment, and make and step all three environments there, a search included. Run by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PY" -m venv "$work/build"
"$work/build/bin/python" -m pip install -q build
"$work/build/bin/python" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/arpo-*.whl)
sdist=$(ls "$work"/dist/arpo-*.tar.gz)
unzip -l "$wheel" > "$work/wheel.txt"
tar tzf "$sdist" > "$work/sdist.txt"
for f in arpo_env/data/search_corpus.jsonl.gz arpo_env/data/math_default.jsonl arpo_env/data/qa_default.jsonl \
         arpo_env/data/deepsearch_default.jsonl arpo_algo/cli/viewer_assets/report.js arpo_algo/cli/eval/paper_table1.tsv \
         arpo_algo/cli/help/train.txt arpo_algo/cli/help/sft.txt; do
  grep -q "$f" "$work/wheel.txt" || { echo "wheel lacks $f"; exit 1; }
  grep -q "$f" "$work/sdist.txt" || { echo "sdist lacks $f"; exit 1; }
done
grep -q "licenses/LICENSE" "$work/wheel.txt" || { echo "wheel lacks LICENSE"; exit 1; }
! grep -q "bm25s/" "$work/wheel.txt" "$work/sdist.txt" || { echo "a local index cache slipped into the package"; exit 1; }
"$PY" -m venv "$work/user"
"$work/user/bin/python" -m pip install -q "$wheel"
cd "$work"  # away from the checkout: only the installed wheel can be imported
"$work/user/bin/python" - <<'PYEOF'
import importlib.util

import gymnasium as gym

import arpo_env

assert importlib.util.find_spec("torch") is None, "the base install pulled torch"
assert "site-packages" in arpo_env.__file__, arpo_env.__file__
actions = {"ARPO-Math-v0": "<python>print(6 * 7)</python>", "ARPO-QA-v0": "<search>capital of France</search>",
           "ARPO-DeepSearch-v0": "<search>Eiffel Tower height</search>"}
for env_id, action in actions.items():
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert "<result>" in obs and not info["tool_failed"], (env_id, obs)
    assert env_id != "ARPO-Math-v0" or "42" in obs
    obs, reward, terminated, truncated, info = env.step("<answer>\\boxed{42}</answer>")
    assert terminated and info["reward_parts"]["format_ok"], (env_id, info)
    env.close()
    print(f"wheel check: {env_id} made, searched/ran and answered")
PYEOF
"$work/user/bin/python" - <<'PYEOF'
from arpo_algo.core.tree import Node, RolloutTree, Trajectory, write_jsonl

trajectory = Trajectory(0, [1], [2, 3], [1, 1], [-0.1, -0.2], [0.1, None], [], 1.0, {"total": 1.0}, 0)
write_jsonl([RolloutTree({"question": "q", "answer": "a"}, "arpo", [Node(0, None, 0, "global")], [trajectory])],
            "trees.jsonl")
PYEOF
printf 'model_name_or_path: smollm2-135m\n' > recipe.yaml
for command in "train --config recipe.yaml" "rollout --tasks 1" "view trees.jsonl"; do
  set +e
  message=$("$work/user/bin/arpo" $command 2>&1 >/dev/null)
  status=$?
  set -e
  [ "$status" = 2 ] && grep -q "pip install 'arpo\[train\]'" <<<"$message" \
    || { echo "arpo $command without the train extra: exit $status, said: $message"; exit 1; }
  echo "wheel check: arpo $command says: $message"
done
for command in train sft rollout eval view; do  # help needs no extra: it imports neither torch nor TRL
  help=$("$work/user/bin/arpo" $command --help) || { echo "arpo $command --help fails without the train extra"; exit 1; }
  grep -q "usage: arpo $command" <<<"$help" || { echo "arpo $command --help printed: $help"; exit 1; }
done
said=$("$work/user/bin/python" -c "from arpo_algo import ARPOTrainer" 2>&1 || true)
grep -q "needs the 'train' extra" <<<"$said" \
  || { echo "from arpo_algo import ARPOTrainer without the train extra said: $said"; exit 1; }
echo "wheel check: every command's --help works without the train extra"
echo "wheel check passed: $(basename "$wheel") and $(basename "$sdist") are complete"
