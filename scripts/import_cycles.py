#!/usr/bin/env python3
"""List the import circles in arpo's packages, counting imports inside functions.

    python scripts/import_cycles.py            # exit 1 and print each circle when there is one

An edge runs from a module to each module it names in an ``import`` or ``from … import`` anywhere in its source
(a function body too: an import deferred to call time still ties the two modules together). ``from pkg import name``
points at ``pkg.name`` when that is a module, else at ``pkg`` itself. The parent packages that Python imports on the
way to a module are not edges: a package's ``__init__`` importing its submodules is not a circle with them.
It also checks that ``arpo_env`` imports neither ``arpo_algo`` nor the training stack.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("arpo_env", "arpo_algo")
TRAINING_STACK = ("torch", "transformers", "trl", "accelerate", "peft", "vllm", "arpo_algo")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of arpo, and the outside packages, that `name`'s source names."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main() -> int:
    known = modules()
    named = {name: imports(name, path, known) for name, path in known.items()}
    graph = {name: {m for m in out if m in known and m != name} for name, out in named.items()}
    problems = 0
    for component in cycles(graph):
        problems += 1
        inside = set(component)
        print(f"import circle: {' '.join(component)}")
        for v in component:
            for w in sorted(graph[v] & inside):
                print(f"  {v} -> {w}")
    for name, out in sorted(named.items()):
        if name.split(".")[0] == "arpo_env":
            bad = sorted(m for m in out if m.split(".")[0] in TRAINING_STACK)
            if bad:
                problems += 1
                print(f"{name} imports {', '.join(bad)}: arpo_env must run without the training stack")
    if problems:
        return 1
    print(f"no import circle among {len(known)} modules of {', '.join(PACKAGES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
