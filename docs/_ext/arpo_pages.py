"""Pages and tables of the documentation made from the code, so that they cannot drift from it.

* ``environments/<id>.md``: one page per registered environment, its class docstring (Gymnasium's headings) under the
  id, written when the build starts (as Gymnasium's docs generate their environment pages).
* ``{config-fields}``: a directive that lists a dataclass's fields with their default and help text (``ARPOConfig``'s
  own fields, ``RolloutConfig``'s), as TRL's docs list a config's.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

ENV_PAGES = {
    "ARPO-Math-v0": ("arpo_env.envs.math", "MathEnv"),
    "ARPO-QA-v0": ("arpo_env.envs.qa", "QAEnv"),
    "ARPO-DeepSearch-v0": ("arpo_env.envs.qa", "DeepSearchEnv"),
}


def env_page(env_id: str, module: str, name: str) -> str:
    cls = getattr(importlib.import_module(module), name)
    doc = inspect.getdoc(cls) or ""
    summary, _, body = doc.partition("\n")
    return (f"# {env_id}\n\n{summary.strip()}\n\n"
            f"```python\nimport gymnasium as gym\nimport arpo_env\n\nenv = gym.make(\"{env_id}\")\n```\n\n"
            f"Class: `{module}.{name}` (subclass of `arpo_env.env.ToolEnv`).\n\n{body.strip()}\n")


def write_env_pages(app: Any) -> None:
    folder = Path(app.srcdir) / "environments"
    folder.mkdir(exist_ok=True)
    for env_id, (module, name) in ENV_PAGES.items():
        path = folder / f"{env_id}.md"
        text = env_page(env_id, module, name)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


class ConfigFields(SphinxDirective):
    """``{config-fields} module.Class`` with ``:exclude-from: module.Base`` (leave out the base's fields)."""

    required_arguments = 1
    option_spec = {"exclude-from": str}

    def run(self) -> list[nodes.Node]:
        cls = _resolve(self.arguments[0])
        skip = {f.name for f in dataclasses.fields(_resolve(self.options["exclude-from"]))} \
            if "exclude-from" in self.options else set()
        lines = ["| field | default | what it is |", "|---|---|---|"]
        for spec in dataclasses.fields(cls):
            if spec.name in skip or spec.name.startswith("_"):
                continue
            default = spec.default if spec.default is not dataclasses.MISSING else (
                spec.default_factory() if spec.default_factory is not dataclasses.MISSING else "required")
            help_text = spec.metadata.get("help") or _attribute_doc(cls, spec.name)
            lines.append(f"| `{spec.name}` | `{_cell(repr(default))}` | {_cell(help_text)} |")
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=self.arguments[0]), self.content_offset, container)
        return container.children


def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _attribute_doc(cls: Any, name: str) -> str:
    """The docstring written under a dataclass field (``x: int = 1`` then ``\"\"\"…\"\"\"``), read from the source."""
    import ast

    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return ""
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, following in zip(body, body[1:]):
        target = getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(following, ast.Expr) \
                and isinstance(getattr(following, "value", None), ast.Constant):
            return str(following.value.value)
    return ""


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_env_pages)
    app.add_directive("config-fields", ConfigFields)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
