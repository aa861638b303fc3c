"""`arpo view`: one self-contained HTML report of rollout trees, their token entropy, and a run's training curves.

    arpo view trees.jsonl --out report.html          # the output of `arpo rollout`
    arpo view runs/eval/smollm2-135m                 # the output of `arpo eval`: a tree per question, a row per run
    arpo view runs/smollm2-arpo --out report.html    # a training run: rollouts*.jsonl and metrics.jsonl

The page needs no network: styles, script, data and plots (PNG, base64) are inside the file. Each tree is stored as
its own JSON block and parsed only when its card scrolls into view, and cards are added page by page, so a run with
thousands of trajectories opens without freezing the browser. The plots are also written as PNG files beside the
report (``report.entropy.png``, and ``report.training.png`` for a run directory).

What the page shows, per task: the tree of trajectories (one row per path; a branch starts where its parent's row
has a dot labelled with ΔH and P), tool calls and results on each row, and each leaf's reward. Clicking a row opens
that trajectory: its segments, model text with the measured tokens coloured by entropy, tool calls and results set
apart, and the reward and its parts. Filters: by reward range, by task text, by source and by training step.
"""

from __future__ import annotations

import argparse
import base64
import collections
import html
import io
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from arpo_algo import jsonl
from arpo_algo.cli.eval_samples import is_sample
from arpo_algo.cli.eval_samples import trees as eval_trees
from arpo_algo.core.tree import entropy_windows
from arpo_algo.flags import Parser
from arpo_env.episode import whole_number
from arpo_env.tags import unicode_text

SCHEMA = 1
"""Version of the page's data layout (the compact trees below); the script checks it."""


# Reading ------------------------------------------------------------------------------------------------------------
@dataclass
class Source:
    """What `arpo view` was pointed at: rollout files, an optional metrics file, and what could not be read."""

    path: Path
    rollout_files: list[Path]
    metrics_file: Path | None = None
    bad_lines: list[str] = field(default_factory=list)

    @property
    def is_run(self) -> bool:
        return self.metrics_file is not None


def find_source(path: str | Path) -> Source:
    """A rollout JSONL file, or a directory: a training run (``rollouts.jsonl``; ``rollouts.rankN.jsonl`` from runs
    made before every rank's trees went into the one file;
    ``metrics.jsonl``) or any folder of tree files."""
    p = Path(path)
    if not p.exists():
        raise SystemExit(f"arpo view: {p} does not exist (give a trees file, an eval folder or samples.jsonl, or a "
                         "training run directory)")
    if p.is_file():
        return Source(p, [p])
    files = sorted(p.glob("rollouts*.jsonl")) or sorted(f for f in p.glob("*.jsonl") if f.name != "metrics.jsonl")
    metrics = p / "metrics.jsonl"
    if not files and not metrics.exists():
        raise SystemExit(f"arpo view: nothing to show in {p}: expected rollouts.jsonl (arpo train), samples.jsonl "
                         "(arpo eval) or a trees file (arpo rollout)")
    return Source(p, files, metrics if metrics.exists() else None)  # a run without trees (rollout_log off): curves


def read_trees(source: Source, limit: int | None = None) -> list[dict[str, Any]]:
    """Every tree as a dict, in file order. A line that is not a tree (a run killed while writing leaves a cut last
    line) is skipped and reported, never fatal. With `limit`, the last `limit` trees (the newest of a run)."""
    trees = [tree for _, tree in collections.deque(_each_tree(source), maxlen=limit or None)]  # the last kept alone
    if not trees:
        raise SystemExit(f"arpo view: {source.path} holds no readable rollout trees or eval samples"
                         + (f" ({source.bad_lines[0]})" if source.bad_lines else ""))
    return trees


def _each_tree(source: Source) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every tree of the source's files with where it is, read one line at a time (a run's rollouts.jsonl can be far
    larger than memory), with a progress bar over the bytes of large files. Lines that are not trees are noted in
    `source.bad_lines`."""
    from tqdm.auto import tqdm

    size = sum(f.stat().st_size for f in source.rollout_files)
    with tqdm(total=size, unit="B", unit_scale=True, desc="reading trees", disable=size < 64 * 2**20) as bar:
        for f in source.rollout_files:
            with open(f, encoding="utf-8", errors="replace") as fh:
                def bad(n: int, _line: str, exc: ValueError, name: str = f.name) -> None:
                    source.bad_lines.append(f"{name}:{n}: {str(exc)[:120]}")

                def lines() -> Iterator[str]:
                    for line in fh:
                        bar.update(len(line))
                        yield line

                samples = []
                for n, tree in jsonl.records(lines(), bad):
                    if is_sample(tree):  # arpo eval's: drawn once the file is read, a tree per question
                        samples.append(tree)
                        continue
                    if not isinstance(tree, dict) or "trajectories" not in tree or "nodes" not in tree or \
                            not isinstance(tree.get("stats", {}), dict):
                        source.bad_lines.append(f"{f.name}:{n}: neither a rollout tree (nodes, trajectories and an "
                                                "object of stats) nor an eval sample (benchmark, index)")
                        continue
                    tree.setdefault("stats", {})["file"] = f.name
                    yield f"{f.name}:{n}", tree
                for tree in eval_trees(samples, f.name):
                    yield f"{f.name}:{tree['task']['id']}", tree


def read_metrics(path: Path | None) -> list[dict[str, Any]]:
    """The training log, one entry per step (logs of runs resumed before ARPOTrainer set aside the steps after the
    checkpoint hold those steps twice; the later entry is the one that trained)."""
    if path is None:
        return []
    by_step: dict[int, dict[str, Any]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for _, entry in jsonl.records(f):
            step = whole_number(entry.get("step")) if isinstance(entry, dict) and "reward" in entry else None
            if step is not None:  # a step that is no whole number ("x", 1.5, Infinity) is passed over
                by_step[step] = entry
    return [by_step[s] for s in sorted(by_step)]


# The page's data ----------------------------------------------------------------------------------------------------
def _r(x: Any, nd: int = 4) -> Any:
    """Floats rounded for the page; NaN and infinities become null (JSON.parse rejects them); the rest unchanged."""
    if isinstance(x, float):
        return round(x, nd) if math.isfinite(x) else None
    return x


def compact(tree: dict[str, Any], index: int) -> dict[str, Any]:
    """What the page needs of one tree: no token ids or log-probs; each model segment keeps the entropy of its
    measured tokens and, when the rollout recorded them, those tokens' text."""
    trajs = []
    for t in tree["trajectories"]:
        ents = t.get("entropies") or []
        segs = []
        for s in t.get("segments", []):
            seg: dict[str, Any] = {"k": "m" if s.get("kind") == "model" else "t", "text": s.get("text", ""),
                                   "a": s.get("start", 0), "b": s.get("end", 0)}
            if seg["k"] == "m":
                measured = []
                for e in ents[seg["a"]:seg["b"]]:
                    if e is None:
                        break
                    if not isinstance(e, (int, float)) or isinstance(e, bool):
                        raise TypeError(f"an entropy of {str(e)[:20]!r}")  # a tree of another shape
                    if not plottable(e):  # NaN (a diverged model), 1e308 (a damaged file): the colours stop there
                        break
                    measured.append(_r(e, 3))
                seg["ent"] = measured
                if s.get("pieces"):
                    seg["pieces"] = s["pieces"][: len(measured)]
            segs.append(seg)
        parts = {k: _r(v) for k, v in (t.get("reward_parts") or {}).items() if not isinstance(v, (dict, list))}
        decisions = [{k: _r(v) for k, v in d.items()} for d in t.get("decisions", [])]
        for d in decisions:  # numbers where the page and the totals compute with them
            d.update({k: float(d[k]) for k in ("delta_h", "p") if d.get(k) is not None})
        trajs.append({"node": int(t["node"]), "reward": _r(float(t.get("reward", 0.0))), "parts": parts,
                      "tools": int(t.get("tool_calls", 0)), "truncated": bool(t.get("truncated")),
                      "len": len(t.get("completion_ids") or []), "segs": segs, "decisions": decisions})
    task = tree.get("task") or {}
    stats = {k: _r(v) for k, v in (tree.get("stats") or {}).items()}
    if stats.get("step") is not None:
        stats["step"] = int(stats["step"])
    return {"v": SCHEMA, "i": index, "task": {k: task.get(k) for k in ("id", "source", "kind", "question", "answer")},
            "algo": tree.get("algo"), "stats": stats,
            "nodes": [{k: _r(v) for k, v in n.items()} for n in tree["nodes"]], "trajs": trajs}


def summary_row(c: dict[str, Any]) -> dict[str, Any]:
    """One line of the page's index (what filters and the task list need, without parsing the tree)."""
    rewards = [t["reward"] for t in c["trajs"]]
    q = str(c["task"].get("question") or "")
    return {"i": c["i"], "id": str(c["task"].get("id", c["i"])), "source": c["task"].get("source") or "",
            "q": q[:240], "step": c["stats"].get("step"), "algo": c["algo"], "rewards": rewards,
            "nodes": len(c["nodes"]), "branches": sum(n.get("kind") == "branch" for n in c["nodes"]),
            "tools": sum(t["tools"] for t in c["trajs"]),
            "correct": sum(bool(t["parts"].get("correct")) for t in c["trajs"])}


def totals(trees: list[dict[str, Any]]) -> dict[str, Any]:
    trajs = [t for c in trees for t in c["trajs"]]
    n = max(1, len(trajs))
    decisions = [d for t in trajs for d in t["decisions"] if d.get("delta_h") is not None]
    rewards = [t["reward"] for t in trajs if t["reward"] is not None]  # NaN (a reward function's) is null on the page
    steps = sorted({c["stats"]["step"] for c in trees if c["stats"].get("step") is not None})
    runs = {str(c["stats"]["run"]) for c in trees if c["stats"].get("run") is not None}  # `arpo rollout`'s digest
    return {"tasks": len(trees), "trajectories": len(trajs), "nodes": sum(len(c["nodes"]) for c in trees),
            "mean reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "accuracy": sum(bool(t["parts"].get("correct")) for t in trajs) / n,
            "format valid": sum(bool(t["parts"].get("format_ok")) for t in trajs) / n,
            "tool calls / trajectory": sum(t["tools"] for t in trajs) / n,
            "branches / task": sum(n.get("kind") == "branch" for c in trees for n in c["nodes"]) / max(1, len(trees)),
            "mean ΔH at tool steps": (sum(d["delta_h"] for d in decisions) / len(decisions)) if decisions else None,
            "algorithms": ", ".join(sorted({str(c["algo"]) for c in trees})),
            "steps": f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else None),
            "rollouts in the file": len(runs) if len(runs) > 1 else None,  # several `arpo rollout`s into one --out
            "entropy": "; ".join(sorted({str(c["stats"]["entropy"]) for c in trees if c["stats"].get("entropy")}))
            or None}  # the estimator and timing ΔH was measured with


# Plots --------------------------------------------------------------------------------------------------------------
ENTROPY_WINDOWS = {"start": "start of response", "after_tool": "after a tool result"}


def tree_windows(tree: dict[str, Any]) -> list[tuple[str, list[float]]]:
    """The measured entropy windows of one tree as read from the file, ``(label, values)``: the start of each
    response and each segment that follows a tool result (`arpo_algo.core.tree.entropy_windows`). A prefix shared by the
    trajectories of a branch counts once."""
    starts = {n["id"]: n.get("start", 0) for n in tree["nodes"]}
    return [(ENTROPY_WINDOWS[where], list(itertools.takewhile(plottable, map(float, values))))
            for t in tree["trajectories"]
            for where, values in entropy_windows(t.get("segments") or [], t.get("entropies") or [],
                                                 starts.get(t["node"], 0))]


def plottable(x: Any) -> bool:
    """Whether `x` is a number a plot can draw: finite, and far from the float's limit. A log or tree edited by hand
    (or damaged) held 1e308, and matplotlib failed on the axis ("arange: cannot compute length"), the standard error
    on its square (OverflowError): tracebacks from `arpo view`. True and false are no numbers here."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= 1e15


def entropy_by_position(trees: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float, int]]]:
    """Mean (and standard error, count) of the measured entropy at each token position of a model segment, for the
    start of the response and for segments that follow a tool result, over the trees as read from the file."""
    return position_stats(tree_windows(tree) for tree in trees)


def position_stats(windows: Iterable[list[tuple[str, list[float]]]]) -> dict[str, list[tuple[float, float, int]]]:
    """`entropy_by_position` over the `tree_windows` of each tree."""
    acc: dict[str, list[list[float]]] = {label: [] for label in ENTROPY_WINDOWS.values()}
    for tree in windows:
        for label, values in tree:
            rows = acc[label]
            for j, e in enumerate(values):
                while len(rows) <= j:
                    rows.append([])
                rows[j].append(e)
    out = {}
    for key, rows in acc.items():
        stats = []
        for values in rows:
            m = sum(values) / len(values)
            var = sum((v - m) ** 2 for v in values) / max(1, len(values) - 1)
            stats.append((m, math.sqrt(var / len(values)), len(values)))
        out[key] = stats
    return out


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def entropy_plot(curves: dict[str, list[tuple[float, float, int]]]) -> bytes | None:
    """The plot of `entropy_by_position`'s curves (None when nothing was measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if not any(curves.values()):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (label, stats), colour in zip(curves.items(), ("#4a6fa5", "#d1495b")):
        if not stats:
            continue
        x = list(range(1, len(stats) + 1))
        m = [s[0] for s in stats]
        se = [s[1] for s in stats]
        ax.plot(x, m, marker="o", ms=3, color=colour, label=f"{label} ({stats[0][2]} segments)")
        ax.fill_between(x, [a - b for a, b in zip(m, se)], [a + b for a, b in zip(m, se)], color=colour, alpha=0.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("token position in the segment")
    ax.set_ylabel("normalised entropy")
    ax.set_title("Entropy of the first generated tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


TRAINING_CURVES = (("reward", "reward"), ("arpo/accuracy", "accuracy"),
                   ("arpo/tool_calls_per_trajectory", "tool calls / trajectory"),
                   ("arpo/branches_per_question", "branches / task"))


def training_curves(metrics: list[dict[str, Any]], trees: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per step: from the run's metrics.jsonl, or computed from the trees' step numbers when there is no log."""
    if metrics:
        return {label: [(int(m["step"]), float(m[key])) for m in metrics if plottable(m.get(key))]
                for key, label in TRAINING_CURVES}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for c in trees:
        if c["stats"].get("step") is not None:
            by_step.setdefault(int(c["stats"]["step"]), []).append(c)
    curves: dict[str, list[tuple[int, float]]] = {label: [] for _, label in TRAINING_CURVES}
    for step in sorted(by_step):
        t = totals(by_step[step])
        for key, label in (("mean reward", "reward"), ("accuracy", "accuracy"),
                           ("tool calls / trajectory", "tool calls / trajectory"), ("branches / task",
                                                                                    "branches / task")):
            curves[label].append((step, float(t[key])))
    return curves


def training_plot(curves: dict[str, list[tuple[int, float]]]) -> bytes | None:
    if sum(len(v) for v in curves.values()) == 0:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 4, figsize=(13, 3.0))
    for ax, (label, pts) in zip(axes, curves.items()):
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, color="#2e7d32")
        ax.set_title(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


_SURROGATE = re.compile("[\ud800-\udfff]")


# The page -----------------------------------------------------------------------------------------------------------
def _json_block(element_id: str, value: Any) -> str:
    # "</script>" or "<!--" in model text would end or derail the script element: no "<" reaches the HTML parser
    # ("\u003c" is the same JSON string). A lone surrogate (which `jsonl` writes as its escape) stays an escape: no
    # UTF-8 encodes it, and the page could not be written.
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _asset(name: str) -> str:
    return resources.files("arpo_algo.cli").joinpath("viewer_assets", name).read_text(encoding="utf-8")


def render(trees: list[dict[str, Any]], source: Source, metrics: list[dict[str, Any]],
           plots: dict[str, bytes], head: dict[str, Any] | None = None) -> str:
    """The report as one HTML string; `head`: the trees' `totals`, when the caller has them."""
    if not trees:  # no trees: no tree numbers, and the run's curves only
        head = {"tasks": 0}
    elif head is None:
        head = totals(trees)
    cells = []
    for key, value in head.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.1%}" if key in ("accuracy", "format valid") else f"{value:+.3f}" if "reward" in key \
                or "ΔH" in key else f"{value:.2f}"
        cells.append(f'<div class="stat"><b>{html.escape(str(value))}</b><span>{html.escape(key)}</span></div>')
    if metrics:
        cells.append(f'<div class="stat"><b>{len(metrics)}</b><span>logged steps</span></div>')
    warn = ""
    if source.bad_lines:
        shown = "".join(f"<li>{html.escape(b)}</li>" for b in source.bad_lines[:5])
        warn = (f'<div class="warn">{len(source.bad_lines)} line(s) skipped, not rollout trees:<ul>{shown}</ul>'
                "</div>")
    figs = "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
                   f'{base64.b64encode(png).decode()}"><figcaption>{html.escape(name)}</figcaption></figure>'
                   for name, png in plots.items())
    blocks = "\n".join(_json_block(f"tree-{c['i']}", c) for c in trees)
    index = _json_block("index", {"v": SCHEMA, "emax": entropy_scale(trees), "rows": [summary_row(c) for c in trees]})
    values = {"title": html.escape(f"arpo view — {source.path.name}"), "source": html.escape(str(source.path)),
              "style": _asset("report.css"), "stats": "".join(cells), "warnings": warn, "figures": figs,
              "script": _asset("report.js"), "data": index + "\n" + blocks}
    # One pass, so that text from the trees can never be taken for a placeholder.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], _asset("report.html"))


def entropy_scale(trees: list[dict[str, Any]]) -> float:
    """Where the colour of a token saturates: the 95th percentile of the measured entropies (normalised entropies of
    a trained model are small, so a fixed 0–1 scale would leave every token white)."""
    values = sorted(e for c in trees for t in c["trajs"] for s in t["segs"] for e in s.get("ent", ()))
    if not values:
        return 0.3
    return max(0.02, round(values[int(0.95 * (len(values) - 1))], 3))


DEFAULT_LIMIT = 500
"""The trees a report shows unless told otherwise (``--limit``): the newest of a run. A page of more is slow to open,
and a large run's trees do not fit in memory (a 7B model's, M = 16, take about a megabyte each in rollouts.jsonl)."""


def build(path: str | Path, out: str | Path, limit: int | None = DEFAULT_LIMIT) -> dict[str, Any]:
    """Write the report (and its PNG plots) for `path`; returns what was written and the header numbers. With
    `limit` (0 or None: all), the newest `limit` trees are shown: the files are read one tree at a time, and only what
    the page needs of those trees is kept."""
    if limit is not None and limit < 0:
        raise SystemExit(f"arpo view: --limit must be at least 0 (0: all the trees), not {limit}")
    source = find_source(path)
    folder = str(out).endswith(("/", os.sep))  # (Path drops the slash)
    out = Path(out)
    if folder or out.is_dir():  # a folder: the report goes in it
        out = out / "report.html"
    written_over = [f for f in [*source.rollout_files, source.metrics_file] if f is not None and any(
        _same_file(f, p) for p in (out, out.with_suffix(".entropy.png"), out.with_suffix(".training.png")))]
    if written_over:  # --out trees.jsonl wrote the report over the trees it shows
        raise SystemExit(f"arpo view: --out {out} would write over {written_over[0]}, which the report reads: give "
                         "another file (report.html) or a folder")
    shown: collections.deque = collections.deque(maxlen=limit or None)  # (compact tree, its entropy windows)
    read = 0
    for where, tree in _each_tree(source):
        try:  # everything the page and the plots read of it
            shown.append((compact(tree, 0), tree_windows(tree)))
            read += 1
        except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:  # JSON, but not of a tree's shape
            source.bad_lines.append(f"{where}: a tree of another shape ({type(exc).__name__}: {str(exc)[:100]})")
    trees = [dict(c, i=i) for i, (c, _) in enumerate(shown)]
    metrics = read_metrics(source.metrics_file)
    if not trees and not metrics:  # a run that wrote no trees (rollout_log off) still has its training curves
        raise SystemExit(f"arpo view: {source.path} holds no readable rollout trees or eval samples"
                         + (f" ({source.bad_lines[0]})" if source.bad_lines else "")
                         + (" and its metrics.jsonl no logged step" if source.is_run else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    plots: dict[str, bytes] = {}
    written = []
    ent = entropy_plot(position_stats(windows for _, windows in shown))
    if ent:
        plots["entropy by token position: start of the response vs after a tool result"] = ent
        p = out.with_suffix(".entropy.png")
        p.write_bytes(ent)
        written.append(p)
    if source.is_run or len({c["stats"].get("step") for c in trees} - {None}) > 1:
        train = training_plot(training_curves(metrics, trees))
        if train:
            plots["training: reward, accuracy, tool calls and branches per step"] = train
            p = out.with_suffix(".training.png")
            p.write_bytes(train)
            written.append(p)
    head = totals(trees)
    # (a path or a line not read that holds a lone surrogate, as a file name not in UTF-8 does: U+FFFD)
    out.write_text(unicode_text(render(trees, source, metrics, plots, head)), encoding="utf-8")
    return {"report": out, "plots": written, "totals": head, "skipped": source.bad_lines,
            "trees read": read, "logged steps": len(metrics)}


def _same_file(a: Path, b: Path) -> bool:
    """Whether `a` and `b` are one file (by another spelling or a link too); False when either is not there."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def make_parser() -> Parser:
    parser = Parser(prog="arpo view", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="rollout trees (arpo rollout), an eval folder or its samples.jsonl (arpo eval), "
                                     "or a training run directory (arpo train)")
    parser.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html; a folder: "
                                                            "report.html in it)")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT,
                        help=f"show the newest N trees (default {DEFAULT_LIMIT}; 0: all of them)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    result = build(args.path, args.out, args.limit)
    t = result["totals"]
    if t["tasks"] < result["trees read"]:
        print(f"showing the newest {t['tasks']:,} of {result['trees read']:,} trees (--limit N for another number, "
              "--limit 0 for all)")
    if result["trees read"]:
        print(f"{t['tasks']} tasks, {t['trajectories']} trajectories, mean reward {t['mean reward']:+.3f}, "
              f"accuracy {t['accuracy']:.1%}")
    else:
        print(f"no rollout trees (the run wrote none: rollout_log off, or killed before its first step); "
              f"{result['logged steps']} logged steps")
    for s in result["skipped"][:3]:
        print(f"skipped {s}", file=sys.stderr)
    if len(result["skipped"]) > 3:
        print(f"skipped {len(result['skipped'])} lines in all", file=sys.stderr)
    print(f"wrote {result['report']}" + "".join(f", {p}" for p in result["plots"])
          + f"\nopen it in a browser: file://{Path(result['report']).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
