"""Users' settings: the error a setting ARPO cannot honour raises, and the checks shared by every place settings
are read (recipes, flags, Python)."""

from typing import Any, Mapping

import numpy as np


class ConfigError(ValueError):
    """A setting ARPO cannot honour; the message says which and what to do.
    It lives here, away from the training stack, so that the command line can catch it without the training extra."""


def json_object(name: str, value: Any, example: str) -> dict[str, Any]:
    """A table of keyword arguments given as a dict (YAML) or as JSON text (a flag): ``--env-kwargs`` of `arpo
    rollout`, ``env_kwargs`` and ``vllm_engine_kwargs`` of the trainer. Text that is not JSON, or JSON that is not an
    object, is a `ConfigError` naming `name` and showing `example`."""
    import json

    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{name} is not JSON ({exc}): give an object, e.g. '{example}'") from None
    if value is not None and not isinstance(value, dict):
        raise ConfigError(f"{name} must be an object of keyword arguments, not {type(value).__name__} {value!r}")
    return dict(value or {})


def whole_problems(values: Mapping[str, Any]) -> list[str]:
    """The settings in `values` (by name) that are no whole number: text, true/false, 2.5 (a config written from
    Python). Each is said by name before anything runs, not as a TypeError deep in a rollout."""
    from arpo_env.episode import whole_number

    return [f"{name} must be a whole number, not {value!r}" for name, value in values.items()
            if whole_number(value) is None]


def switch_problems(values: Mapping[str, Any]) -> list[str]:
    """The settings in `values` (by name) that are neither true nor false: "no" is true to Python."""
    return [f"{name} must be true or false, not {value!r}" for name, value in values.items()
            if not isinstance(value, (bool, np.bool_))]
