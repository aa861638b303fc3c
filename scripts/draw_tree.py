"""Draw one ARPO rollout tree as a picture: the README's and the docs' figure.

    python scripts/draw_tree.py runs/smollm2-arpo/rollouts.jsonl --out docs/_static/rollout_tree.png

It picks the tree with the most branches (the first of them), and draws one row per path: the model's tokens as a
grey bar, tool results as orange blocks, a branch leaving its parent's row at its branch point (labelled with ΔH and
P), and each leaf's reward at the end. Needs matplotlib (the train extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def pick(path: Path) -> dict[str, Any]:
    """The tree with the most branches; among those, one whose rewards differ, else the best rewarded; the first."""
    best, best_key = None, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                tree = json.loads(line)
            except ValueError:
                continue
            if not isinstance(tree, dict) or "nodes" not in tree:
                continue
            rewards = [t.get("reward", 0) for t in tree.get("trajectories", [])] or [0]
            key = (sum(n.get("kind") == "branch" for n in tree["nodes"]), max(rewards) - min(rewards),
                   sum(rewards) / len(rewards))
            if best_key is None or key > best_key:
                best, best_key = tree, key
    if best is None:
        raise SystemExit(f"draw_tree: no rollout tree in {path}")
    return best


def draw(tree: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = {n["id"]: n for n in tree["nodes"]}
    trajs = sorted(tree["trajectories"], key=lambda t: _order(nodes, t["node"]))
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(trajs) + 1.6))
    row_of = {t["node"]: i for i, t in enumerate(trajs)}
    colours = {"global": "#4c72b0", "branch": "#55a868", "topup": "#8172b2"}
    for i, t in enumerate(trajs):
        y = len(trajs) - 1 - i
        node = nodes[t["node"]]
        start = node.get("start", 0)
        end = len(t.get("completion_ids") or []) or max((s.get("end", 0) for s in t.get("segments", [])), default=0)
        ax.plot([start, end], [y, y], color="#bbbbbb", lw=6, solid_capstyle="butt", zorder=1)
        for s in t.get("segments", []):
            if s.get("kind") == "tool" and s.get("end", 0) > start:
                ax.plot([max(s["start"], start), s["end"]], [y, y], color="#dd8452", lw=6, solid_capstyle="butt",
                        zorder=2)
        if node.get("parent") is not None and node["parent"] in row_of:
            py = len(trajs) - 1 - row_of[node["parent"]]
            ax.plot([start, start], [py, y], color=colours["branch"], lw=1.5, zorder=3)
            ax.scatter([start], [py], color=colours["branch"], s=30, zorder=4)
            if node.get("delta_h") is not None:
                ax.annotate(f"ΔH {node['delta_h']:+.2f}, P {node['p']:.2f}", (start, py), xytext=(4, 6),
                            textcoords="offset points", fontsize=8, color="#2f6b3a")
        ax.text(-6, y, node.get("kind", ""), ha="right", va="center", fontsize=8,
                color=colours.get(node.get("kind"), "black"))
        ax.text(end + 6, y, f"reward {t.get('reward', 0):+.1f}", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("completion tokens")
    question = str((tree.get("task") or {}).get("question", ""))[:110]
    ax.set_title(f"ARPO rollout tree: M = {len(trajs)} trajectories\n{question}", fontsize=10, pad=14)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.plot([], [], color="#bbbbbb", lw=6, label="model tokens")
    ax.plot([], [], color="#dd8452", lw=6, label="tool result (masked from the loss)")
    ax.plot([], [], color=colours["branch"], lw=1.5, marker="o", label="branch point")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    xmax = max(len(t.get("completion_ids") or []) for t in trajs)
    ax.set_xlim(-60, xmax + 90)
    ax.set_ylim(-0.6, len(trajs) - 0.2)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def _order(nodes: dict[int, dict[str, Any]], node: int) -> list[int]:
    """A path's place among its tree's rows: below its parent, in the order the paths were made."""
    chain = [node]
    while nodes[chain[-1]].get("parent") is not None:
        chain.append(nodes[chain[-1]]["parent"])
    return list(reversed(chain))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", type=Path, help="a rollout trees file (JSONL)")
    parser.add_argument("--out", type=Path, default=Path("docs/_static/rollout_tree.png"))
    args = parser.parse_args(argv)
    draw(pick(args.trees), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
