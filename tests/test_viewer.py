"""`arpo view`: the report built from real rollout trees, opened in headless Chromium as a person would open it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from browser import Browser, find_chromium
from tiny_agent import TASK

import arpo_env  # noqa: F401
from arpo_algo.cli import viewer
from arpo_algo.core.config import RolloutConfig
from arpo_algo.core.tree import write_jsonl
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.rollout.scheduler import ARPORollout

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trees_file(agent, tokenizer, tmp_path_factory) -> Path:
    """Real trees: the scripted tiny agent on three tasks, ARPO branching forced at every tool step."""
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=24,
                           max_completion_tokens=400, temperature=0.7, seed=3)
    engine = ARPORollout(HFGenerator(agent, tokenizer), lambda: gym.make(
        "ARPO-Math-v0", sandbox_options={"timeout_s": 5}, max_tool_calls=4).unwrapped, config)
    path = tmp_path_factory.mktemp("view") / "trees.jsonl"
    write_jsonl(engine.run([TASK, 1, 2]), path)
    return path


@pytest.fixture(scope="module")
def browser():
    executable = find_chromium()
    if executable is None:
        pytest.skip("no chromium: bash scripts/setup.sh --browser installs Debian's (CI does)")
    b = Browser(executable)
    yield b
    b.close()


def file_counts(path: Path) -> tuple[int, int]:
    trees = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return len(trees), sum(len(t["nodes"]) for t in trees)


def type_into(browser: Browser, element_id: str, value: str) -> None:
    browser.evaluate(f"{{ const f = document.getElementById({json.dumps(element_id)}); f.value = {json.dumps(value)};"
                     " f.dispatchEvent(new Event('input')); }")


@pytest.mark.slow
def test_report_in_headless_chromium(trees_file, browser, tmp_path):
    n_trees, n_nodes = file_counts(trees_file)
    assert n_trees == 3 and n_nodes == 12
    out = tmp_path / "report.html"
    result = viewer.build(trees_file, out)
    assert result["plots"] == [tmp_path / "report.entropy.png"]  # no run directory: no training curves
    assert result["totals"]["entropy"] == "top-10 log-probs, after the result"  # how ΔH was measured

    browser.open(out.as_uri())
    drawn = browser.wait_for(f"document.querySelectorAll('svg.tree').length === {n_trees}")
    assert drawn, "every tree card should be drawn once it is in view"
    assert browser.evaluate("document.querySelectorAll('svg.tree g.node').length") == n_nodes
    # Branch points are drawn and labelled with ΔH and P.
    branches = sum(n["kind"] == "branch" for line in trees_file.read_text().splitlines()
                   for n in json.loads(line)["nodes"])
    assert branches > 0
    assert browser.evaluate("document.querySelectorAll('circle.bp').length") == branches
    assert "ΔH" in browser.evaluate("document.querySelector('text.bpl').textContent")
    assert "top-10 log-probs, after the result" in browser.evaluate("document.querySelector('.stats').innerText")

    # A click on a trajectory's row opens it: segments, tool output set apart, tokens coloured by entropy.
    assert browser.evaluate("document.querySelectorAll('.traj').length") == 0
    browser.click("svg.tree g.node .hit")
    assert browser.wait_for("document.querySelectorAll('.traj').length === 1")
    text = browser.evaluate("document.querySelector('.traj').innerText")
    assert "reward" in text and "<python>" in text
    assert browser.evaluate("document.querySelectorAll('.traj .seg.tool').length") >= 2  # the task and a result
    coloured = browser.evaluate("[...document.querySelectorAll('.traj .tok')].filter(e => e.style.background)"
                                ".length")
    assert coloured > 0

    # Filters: a reward range no trajectory reaches hides every task; clearing it brings them back.
    type_into(browser, "f-min", "5")
    assert browser.evaluate("document.querySelectorAll('.card').length") == 0
    type_into(browser, "f-min", "")
    assert browser.evaluate("document.querySelectorAll('.card').length") == n_trees

    png = browser.screenshot()
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    assert browser.errors() == []
    assert all(u.startswith(("file:", "data:")) for u in browser.requests()), "the report must not use the network"


@pytest.mark.slow
def test_thousands_of_trajectories_load_lazily(trees_file, browser, tmp_path):
    """1,500 trees (6,000 trajectories) open with a page of cards; only cards in view are drawn; scrolling adds more."""
    lines = [json.loads(line) for line in trees_file.read_text().splitlines()]
    big = tmp_path / "big.jsonl"
    with open(big, "w") as f:
        for k in range(500):
            for tree in lines:
                tree["task"]["id"] = f"task-{k}-{tree['task'].get('id')}"
                f.write(json.dumps(tree) + "\n")
    # By default the page holds the newest 500 trees (reading the file a tree at a time); --limit 0 holds them all.
    import tracemalloc

    newest = viewer.build(big, tmp_path / "newest.html")
    page = (tmp_path / "newest.html").read_text()
    assert newest["totals"]["tasks"] == 500 and newest["trees read"] == 1500
    assert 'id="tree-499"' in page and '"id":"task-499-' in page and '"id":"task-0-' not in page
    tracemalloc.start()
    try:
        kept = viewer.read_trees(viewer.find_source(big), limit=50)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(kept) == 50 and peak < big.stat().st_size / 2  # all the trees read, then the last kept: 3.5 times more
    out = tmp_path / "big.html"
    viewer.build(big, out, limit=0)
    browser.open(out.as_uri())
    assert browser.wait_for("document.querySelectorAll('svg.tree').length > 0")
    assert browser.evaluate("window.arpoView.rows.length") == 1500
    first = browser.evaluate("document.querySelectorAll('.card').length")
    assert first == 40
    assert browser.evaluate("document.querySelectorAll('svg.tree').length") < first  # off-screen cards wait
    browser.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert browser.wait_for("document.querySelectorAll('.card').length > 40")
    assert "showing" in browser.evaluate("document.getElementById('count').textContent")
    assert browser.errors() == []


def test_cut_lines_and_bad_paths(trees_file, tmp_path):
    cut = tmp_path / "cut.jsonl"
    text = trees_file.read_text()
    cut.write_text(text + text.splitlines()[0][:200])  # a run killed while writing its last line
    result = viewer.build(cut, tmp_path / "r.html")
    assert result["totals"]["tasks"] == 3 and len(result["skipped"]) == 1
    assert "line(s) skipped" in (tmp_path / "r.html").read_text()
    # JSON, but not of a tree's shape (another tool's file, a hand edit): skipped and said, the other trees shown
    tree = json.loads(text.splitlines()[0])
    odd = []
    for path, value in [(("trajectories",), 5), (("trajectories", 0, "reward"), "high"), (("nodes", 0), {"k": 1}),
                        (("trajectories", 0, "entropies"), "abc"), (("stats",), 7), (("stats", "step"), "x"),
                        (("trajectories", 0, "decisions"), [{"delta_h": "big"}]), (("nodes",), [1, 2])]:
        bad = json.loads(json.dumps(tree))
        *parents, last = path
        target = bad
        for key in parents:
            target = target[key]
        target[last] = value
        odd.append(json.dumps(bad))
    shapes = tmp_path / "shapes.jsonl"
    shapes.write_text(text + "\n".join(odd) + "\n")
    result = viewer.build(shapes, tmp_path / "s.html")
    assert result["totals"]["tasks"] == 3 and len(result["skipped"]) == len(odd)
    assert all("shapes.jsonl:" in line for line in result["skipped"])
    with pytest.raises(SystemExit, match="does not exist"):
        viewer.build(tmp_path / "nope.jsonl", tmp_path / "x.html")
    # --out a folder (there, or written with a slash): report.html in it; it was IsADirectoryError, or a file so named
    (tmp_path / "there").mkdir()
    assert viewer.build(cut, tmp_path / "there")["report"] == tmp_path / "there" / "report.html"
    assert viewer.build(cut, f"{tmp_path / 'new'}/")["report"] == tmp_path / "new" / "report.html"
    assert (tmp_path / "new" / "report.html").is_file() and (tmp_path / "there" / "report.entropy.png").is_file()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="nothing to show"):
        viewer.build(tmp_path / "empty", tmp_path / "x.html")


def test_a_file_several_rollouts_wrote_says_how_many(trees_file, tmp_path):
    """`arpo rollout` appends to --out: trees of other rollouts in the file (another seed, model or setting) were
    shown as one rollout's. Each tree records its rollout's digest, and the page says how many rollouts it shows."""
    lines = trees_file.read_text().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({**tree, "stats": {**tree["stats"], "run": run}}) + "\n"
                             for tree, run in zip(map(json.loads, lines), ("a" * 16, "a" * 16, "b" * 16))))
    assert viewer.build(mixed, tmp_path / "r.html")["totals"]["rollouts in the file"] == 2
    assert "<b>2</b><span>rollouts in the file</span>" in (tmp_path / "r.html").read_text()
    assert viewer.build(trees_file, tmp_path / "one.html")["totals"]["rollouts in the file"] is None


def test_text_from_the_model_cannot_break_the_page(trees_file, tmp_path):
    """Model output is hostile: a closing script tag or a template placeholder in it stays text."""
    tree = json.loads(trees_file.read_text().splitlines()[0])
    evil = "</script><script>window.pwned = 1</script>{{script}}"
    tree["trajectories"][0]["segments"][0]["text"] = evil + tree["trajectories"][0]["segments"][0]["text"]
    tree["task"]["question"] = evil
    tree["trajectories"][0]["reward_parts"]["score"] = float("nan")  # not JSON: must not reach the page as NaN
    path = tmp_path / "evil.jsonl"
    path.write_text(json.dumps(tree) + "\n")
    page = viewer.build(path, tmp_path / "evil.html")["report"].read_text()
    assert "<script>window.pwned" not in page
    assert page.count("</script>") == page.count("<script")  # no block was closed early
    block = page.split('id="tree-0">', 1)[1].split("</script>", 1)[0]

    def reject(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    assert json.loads(block, parse_constant=reject)["trajs"][0]["parts"]["score"] is None


def test_lone_surrogates_and_a_file_name_not_in_utf8(trees_file, tmp_path):
    """`jsonl` writes a lone surrogate in a model's or a tool's text as its JSON escape, and a file name that is not
    UTF-8 reads as one: no UTF-8 encodes it, so `arpo view` failed with a traceback and left an empty page."""
    tree = json.loads(trees_file.read_text().splitlines()[0])
    tree["trajectories"][0]["segments"][0]["text"] += "half an emoji: \ud83d"
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/runs-\xff"))  # 'runs-\udcff'
    folder.mkdir()
    path = folder / "trees.jsonl"
    path.write_text(json.dumps(tree) + "\n")  # (ASCII JSON: the escape)
    page = viewer.build(path, tmp_path / "torn.html")["report"].read_text(encoding="utf-8")
    block = page.split('id="tree-0">', 1)[1].split("</script>", 1)[0]
    assert json.loads(block)["trajs"][0]["segs"][0]["text"].endswith("half an emoji: \ud83d")  # kept, as an escape
    assert "runs-\ufffd" in page


def test_entropy_curves_and_run_metrics(trees_file, tmp_path):
    source = viewer.find_source(trees_file)
    raw = viewer.read_trees(source)
    trees = [viewer.compact(t, i) for i, t in enumerate(raw)]
    curves = viewer.entropy_by_position(raw)
    assert curves["start of response"] and curves["after a tool result"]
    # Branches share their first segment with their parent: each start of a response is counted once, per root.
    roots = sum(n.get("parent") is None for c in trees for n in c["nodes"])
    assert curves["start of response"][0][2] == roots
    assert all(0.0 <= m <= 1.0 and n > 0 for m, _, n in curves["after a tool result"])
    # A resumed run logs some steps twice: the later entry is the one that trained.
    run = tmp_path / "run"
    run.mkdir()
    (run / "rollouts.jsonl").write_text(trees_file.read_text())
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in [
        {"step": 1, "reward": 0.1, "arpo/accuracy": 0.2}, {"step": 2, "reward": 0.3, "arpo/accuracy": 0.4},
        {"step": 2, "reward": 0.5, "arpo/accuracy": 0.6}, {"step": 2, "train_runtime": 9.0}]) + "\n")
    metrics = viewer.read_metrics(run / "metrics.jsonl")
    assert [(m["step"], m["reward"]) for m in metrics] == [(1, 0.1), (2, 0.5)]
    assert viewer.training_curves(metrics, trees)["accuracy"] == [(1, 0.2), (2, 0.6)]
    result = viewer.build(run, tmp_path / "run.html")
    assert [p.name for p in result["plots"]] == ["run.entropy.png", "run.training.png"]


def test_metric_lines_whose_step_is_no_whole_number_are_passed_over(tmp_path):
    """A metrics.jsonl line whose step is text, a fraction or infinite (an edited or damaged log) was a ValueError
    traceback from `arpo view`; such lines are passed over like lines that are not JSON."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("\n".join([
        '{"step": 1, "reward": 0.5}', '{"step": "x", "reward": 1}', '{"step": 1.5, "reward": 1}',
        '{"step": Infinity, "reward": 1}', '{"step": true, "reward": 1}', '{"step": 2.0, "reward": 0.75}', "[1, 2]",
        "not json"]) + "\n")
    assert [(m["step"], m["reward"]) for m in viewer.read_metrics(run / "metrics.jsonl")] == [(1, 0.5), (2.0, 0.75)]
    assert viewer.build(run, tmp_path / "run.html")["logged steps"] == 2


@pytest.mark.slow
def test_numbers_no_plot_can_draw_are_passed_over(trees_file, browser, tmp_path):
    """A logged value or an entropy near the float's limit (1e308, in a file edited by hand or damaged) was a
    traceback from `arpo view`: matplotlib's "arange: cannot compute length" on the axis, an OverflowError squaring
    it for the standard error. Such values, and true or false, are passed over (a segment's entropies stop there);
    the rest of the run is drawn."""
    run = tmp_path / "run"
    run.mkdir()
    tree = json.loads(trees_file.read_text().splitlines()[0])
    measured = [i for i, e in enumerate(tree["trajectories"][0]["entropies"]) if e is not None]
    tree["trajectories"][0]["entropies"][measured[0]] = 1e308
    tree["trajectories"][0]["entropies"][measured[1]] = -1e308
    tree["trajectories"][1]["entropies"][measured[2]] = float("nan")  # a diverged model's: the page's colour scale
    # sorted it with the nulls NaN became (a TypeError)
    (run / "rollouts.jsonl").write_text(json.dumps(tree) + "\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 1e308, "arpo/accuracy": true}\n'
                                       '{"step": 2, "reward": 0.5, "arpo/accuracy": 0.25}\n')
    assert viewer.training_curves(viewer.read_metrics(run / "metrics.jsonl"), [])["reward"] == [(2, 0.5)]
    result = viewer.build(run, tmp_path / "run.html")
    assert result["logged steps"] == 2 and len(result["plots"]) == 2
    curves = viewer.entropy_by_position([tree])
    assert all(abs(m) <= 1 for values in curves.values() for m, _, _ in values)
    # a reward function's NaN (null on the page): totals were a TypeError adding it
    rewards = [t["reward"] for t in tree["trajectories"]]
    tree["trajectories"][0]["reward"] = float("nan")
    (run / "rollouts.jsonl").write_text(json.dumps(tree) + "\n")
    mean = viewer.build(run, tmp_path / "run.html")["totals"]["mean reward"]
    assert mean == pytest.approx(sum(rewards[1:]) / len(rewards[1:]))
    browser.open((tmp_path / "run.html").as_uri())
    assert browser.wait_for("document.querySelectorAll('svg.tree').length === 1")
    shown = browser.evaluate("document.body.innerText")
    assert f"reward +{mean:.2f}" in shown and "+–" not in shown  # the card's mean leaves it out; the tree shows "–"
    assert browser.errors() == []


@pytest.mark.slow
def test_the_report_is_never_written_over_what_it_reads(trees_file, tmp_path):
    """``--out trees.jsonl`` (the trees themselves, or a run's metrics.jsonl) wrote the report over the file it read:
    the trees were lost. A negative --limit was deque's "maxlen must be non-negative" traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "rollouts.jsonl").write_text(trees_file.read_text())
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    before = {f: f.read_bytes() for f in run.iterdir()}
    for source, out in [(run / "rollouts.jsonl", run / "rollouts.jsonl"), (run, run / ".." / "run" / "rollouts.jsonl"),
                        (run, run / "metrics.jsonl")]:
        with pytest.raises(SystemExit, match=f"would write over {re.escape(str(out.resolve().parent))}.*, which the "
                                             "report reads"):
            viewer.build(source, out)
    assert {f: f.read_bytes() for f in run.iterdir()} == before
    with pytest.raises(SystemExit, match=r"--limit must be at least 0 \(0: all the trees\), not -1"):
        viewer.build(run, tmp_path / "report.html", limit=-1)
    assert viewer.build(run, run)["report"] == run / "report.html"  # a folder, even the run's: report.html in it


@pytest.mark.slow
def test_arpo_view_command(trees_file, tmp_path):
    out = tmp_path / "cli" / "report.html"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "view", str(trees_file), "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3 tasks, 12 trajectories" in result.stdout and out.exists()


@pytest.mark.slow
def test_a_run_without_trees_shows_its_curves(browser, tmp_path):
    """A run with rollout_log off (or killed before its first trees) has a training log: the report shows its curves
    (it used to stop at "no rollout trees")."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 10, "arpo/accuracy": s / 20}) + "\n"
                                               for s in (1, 2, 3)))
    cmd = [sys.executable, "-m", "arpo_algo.cli", "view", str(run), "--out", str(tmp_path / "out") + "/"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no rollout trees" in result.stdout and "3 logged steps" in result.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.training.png"]
    browser.open((tmp_path / "out" / "report.html").as_uri())
    assert browser.wait_for("document.querySelectorAll('figure img').length === 1")
    assert browser.evaluate("document.querySelectorAll('.card').length") == 0
    assert "3logged steps" in browser.evaluate("document.querySelector('.stats').innerText").replace("\n", "")
    assert browser.errors() == []
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train_runtime": 2.0}) + "\n")  # nothing to draw
    with pytest.raises(SystemExit, match="no readable rollout trees or eval samples and its metrics.jsonl no logged step"):
        viewer.build(run, tmp_path / "again.html")


@pytest.mark.slow
def test_eval_samples_in_headless_chromium(agent, tokenizer, data_dir, browser, tmp_path):
    """`arpo view` reads `arpo eval`'s output (it refused it: "not a rollout tree"): a card per question, a row per
    run, and each transcript with its tool calls, its score and why."""
    model_dir = tmp_path / "tiny"
    agent.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", "--model", str(model_dir), "--benchmarks",
                             "gsm8k", "--data_dir", str(data_dir / "eval"), "--limit", "2", "--runs", "2",
                             "--max_new_tokens", "32", "--out", str(out)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and any(s["tool_calls"] for s in samples)
    report = tmp_path / "report.html"
    shown = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "view", str(out), "--out", str(report)],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert shown.returncode == 0 and "2 tasks, 4 trajectories" in shown.stdout, shown.stdout + shown.stderr

    browser.open(report.as_uri())
    assert browser.wait_for("document.querySelectorAll('svg.tree').length === 2")
    assert browser.evaluate("document.querySelectorAll('svg.tree g.node').length") == 4
    browser.click("svg.tree g.node .hit")
    assert browser.wait_for("document.querySelectorAll('.traj').length === 1")
    text = browser.evaluate("document.querySelector('.traj').innerText")
    assert "<python>" in text and "why" in text and ("the gold" in text or "no answer read" in text), text
    assert browser.evaluate("document.querySelectorAll('.traj .seg.tool').length") >= 2  # the task and a result
    assert browser.errors() == []
