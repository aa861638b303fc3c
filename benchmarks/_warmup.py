"""A short imitation warm-up shared by the benchmarks: a few optimizer steps on scripted arithmetic episodes.

SmolLM2-135M-Instruct does not use our tags out of the box (it writes Markdown code blocks), so a rollout benchmark
on it would see no tool step. These steps teach it the protocol on the procedural arithmetic family (the teacher's
observations come from the real sandbox); the loss covers the model's own tokens, not the tool output. `arpo sft`
(the cold-start stage) is the full version of this.
"""

from __future__ import annotations

import gymnasium as gym
import torch

import arpo_env  # noqa: F401
from arpo_env.datasets.procedural import procedural_tasks, scripted_episode


def episode_tensors(tokenizer, episode) -> tuple[list[int], list[int]]:
    """Input ids and labels (-100 on the prompt and the tool output) of a scripted episode."""
    from arpo_algo.training.sft import tokenize

    row = tokenize(episode, tokenizer)
    return row["input_ids"], [t if m else -100 for t, m in zip(row["input_ids"], row["assistant_masks"])]


def family_spec(family: str, n: int, seed: int) -> str:
    """The dataset name (`arpo_env.datasets.procedural`) of `n` tasks of seed `seed` from a procedural family, ``arithmetic``
    or ``chain`` with an optional level (``chain:3``: three operations, one Python call each)."""
    name, _, level = family.partition(":")
    return f"{name}:{n}:{seed}" + (f":{level}" if level else "")


def family_tasks(family: str, n: int, seed: int) -> list:
    """`n` tasks of seed `seed` from a procedural family (`family_spec`)."""
    tasks = procedural_tasks(family_spec(family, n, seed))
    if tasks is None:
        raise ValueError(f"not a procedural family: {family!r} (arithmetic[:TERMS] or chain[:STEPS])")
    return tasks


def warm_up(model, tokenizer, steps: int = 30, batch: int = 4, lr: float = 1e-4, seed: int = 1234,
            family: str = "arithmetic") -> list[float]:
    """Imitate scripted episodes of `family` (`family_tasks`) for `steps` optimizer steps; returns the losses."""
    env = gym.make("ARPO-Math-v0").unwrapped
    tasks = family_tasks(family, steps * batch, seed)
    data = [episode_tensors(tokenizer, scripted_episode(env, t)) for t in tasks]
    env.close()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for step in range(steps):
        chunk = data[step * batch:(step + 1) * batch]
        width = max(len(ids) for ids, _ in chunk)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([i + [pad] * (width - len(i)) for i, _ in chunk])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in chunk])
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in chunk])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def warmed_path(name: str = "smollm2-135m", steps: int = 8, batch: int = 2, lr: float = 2e-5,
                family: str = "arithmetic"):
    """Where `warmed_model` keeps the warmed-up model (a transformers folder, which vLLM loads too)."""
    from arpo_algo.generation.models import cache_dir

    suffix = "" if family == "arithmetic" else "-" + family.replace(":", "")
    return cache_dir() / f"{name}-warmup-{steps}x{batch}-lr{lr:g}{suffix}"


def warmed_model(name: str = "smollm2-135m", steps: int = 8, batch: int = 2, lr: float = 2e-5,
                 family: str = "arithmetic"):
    """The model after `warm_up` on `family`, saved once under the model cache and reused by later runs.

    The default is gentle on purpose: 8 steps at 2e-5 teach the tags (the model calls tools and answers in the
    format most of the time) but leave it uncertain (ΔH at tool steps spreads over about −1.5 … +4.5, and rewards
    vary within a group). At 1e-4 the imitation loss reaches 0 and the entropy collapses: every P is α."""
    import os
    import shutil
    import uuid

    from arpo_algo.generation.models import SOURCE_FILE, load_model

    target = warmed_path(name, steps, batch, lr, family)
    if warmed_ready(name, steps, batch, lr, family):
        return load_model(str(target))
    model, tokenizer = load_model(name)
    print(f"warming {name} up on scripted {family} episodes ({steps} steps, once; cached in {target}) …", flush=True)
    losses = warm_up(model, tokenizer, steps=steps, batch=batch, lr=lr, family=family)
    print(f"imitation loss {losses[0]:.3f} → {losses[-1]:.3f}", flush=True)
    # written whole or not at all (a kill during the write left a config without weights, taken for the model), and
    # stamped with what it was warmed from
    fresh = target.with_name(f".{target.name}.new.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        model.save_pretrained(fresh)
        tokenizer.save_pretrained(fresh)
        (fresh / SOURCE_FILE).write_text(_base_source(name), encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(fresh, target)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return model, tokenizer


def _base_source(name: str) -> str:
    from arpo_algo.generation.models import EMBEDDED, embedded_source

    return (embedded_source(name) if name in EMBEDDED else None) or name


def warmed_ready(name: str = "smollm2-135m", steps: int = 8, batch: int = 2, lr: float = 2e-5,
                 family: str = "arithmetic") -> bool:
    """Whether `warmed_path` holds a whole warm-up of the base model as it is now (the embedded model's package
    updated since: warmed again)."""
    from arpo_algo.generation.models import complete_model

    return complete_model(warmed_path(name, steps, batch, lr, family), _base_source(name))
