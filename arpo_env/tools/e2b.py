"""The ``<python>`` tool in an E2B cloud sandbox (``sandbox="e2b"``; ``pip install arpo[e2b]``, ``E2B_API_KEY``).

Each `E2BSandbox` is one remote Jupyter-style interpreter in its own micro-VM: the isolation the local sandbox
does not give. Forking a remote VM is not offered, so `fork()` and `restore()` replay the executed cells in a new
sandbox (cost grows with history; see ``benchmarks/fork_latency.py`` for the local numbers).
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any

from arpo_env.tools.protocol import MAX_SECONDS, ToolOutput, elide, limit_problem, snapshot_cells, type_problem


class E2BSandbox:
    """A persistent interpreter in an E2B sandbox, created at the first call."""

    name = "python"
    tag = "python"

    def __init__(self, api_key: str | None = None, template: str | None = None, timeout_s: float = 10.0,
                 sandbox_lifetime_s: int = 600, max_output_chars: int = 4000) -> None:
        # checked before the key: a timeout of text failed every call, for the whole run
        problems = [limit_problem("timeout_s", timeout_s, None, MAX_SECONDS),
                    limit_problem("sandbox_lifetime_s", sandbox_lifetime_s, 1, MAX_SECONDS),
                    limit_problem("max_output_chars", max_output_chars, 1),
                    type_problem("api_key", api_key, "text", str), type_problem("template", template, "a name", str)]
        if any(problems):
            raise ValueError("sandbox_options: " + "; ".join(p for p in problems if p))
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        if not self.api_key:
            raise RuntimeError("sandbox='e2b' needs an API key: set E2B_API_KEY or pass sandbox_options={'api_key':…}")
        if importlib.util.find_spec("e2b_code_interpreter") is None:  # else every call would fail, the run go on
            raise RuntimeError("sandbox='e2b' needs the e2b extra: pip install 'arpo[e2b]'")
        self.template = template
        self.timeout_s = timeout_s
        self.sandbox_lifetime_s = sandbox_lifetime_s
        self.max_output_chars = max_output_chars
        self.history: list[str] = []
        self._sbx: Any = None

    def _sandbox(self) -> Any:
        if self._sbx is None:
            try:
                from e2b_code_interpreter import Sandbox
            except ImportError as exc:
                raise RuntimeError("sandbox='e2b' needs the e2b extra: pip install 'arpo[e2b]'") from exc
            kwargs: dict[str, Any] = {"api_key": self.api_key, "timeout": self.sandbox_lifetime_s}
            if self.template:
                kwargs["template"] = self.template
            self._sbx = Sandbox.create(**kwargs)
        return self._sbx

    def call(self, query: str) -> ToolOutput:
        start = time.perf_counter()
        try:
            execution = self._sandbox().run_code(query, timeout=self.timeout_s,
                                                 request_timeout=self.timeout_s + 30)
        except Exception as exc:  # noqa: BLE001 - network, quota and timeout errors become observations
            return ToolOutput(f"python failed: {type(exc).__name__}: {exc}", failed=True, error=str(exc),
                              latency_s=time.perf_counter() - start)
        self.history.append(query)
        parts = ["".join(execution.logs.stdout or []).rstrip("\n"), "".join(execution.logs.stderr or []).rstrip("\n")]
        if execution.text:
            parts.append(str(execution.text))
        error = execution.error
        if error is not None:
            parts.append(f"{error.name}: {error.value}")
        text, _ = elide("\n".join(p for p in parts if p) or "(no output)", 2 * self.max_output_chars)
        return ToolOutput(text, failed=error is not None, error=f"{error.name}: {error.value}" if error else None,
                          latency_s=time.perf_counter() - start)

    def fork(self) -> "E2BSandbox":
        child = E2BSandbox(self.api_key, self.template, self.timeout_s, self.sandbox_lifetime_s,
                           self.max_output_chars)
        child.restore(self.snapshot())
        return child

    def snapshot(self) -> dict:
        return {"cells": list(self.history)}

    def restore(self, snapshot: dict | None) -> None:
        cells = snapshot_cells(snapshot)
        self.close()
        for cell in cells:
            self._sandbox().run_code(cell, timeout=self.timeout_s)
            self.history.append(cell)

    def close(self) -> None:
        if self._sbx is not None:
            try:
                self._sbx.kill()
            except Exception:  # noqa: BLE001 - already gone
                pass
            self._sbx = None
        self.history = []
