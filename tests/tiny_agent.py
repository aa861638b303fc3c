"""A tiny randomly initialised Llama, taught by real gradient steps to speak the tool protocol.

A random model never writes a tool tag, so rollout tests would see no tool step. This module builds a 2-layer
Llama over SmolLM2's tokenizer (read from the embedded package, offline) and fits it, with Adam, to a short scripted
episode: define a variable in Python, use it in a second call, answer. Sampling from it then produces real tool
calls through the real generator, environment and sandbox.
"""

from __future__ import annotations

import torch

SCRIPT = ["<python>x = 41</python>", "<python>print(x + 1)</python>", "<answer>\\boxed{42}</answer>"]
TASK = {"question": "Add one to forty-one.", "answer": "42"}


def tiny_llama(tokenizer, seed: int = 0, layers: int = 2, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def no_checkpointing() -> dict[str, bool]:
    """Checkpointing off for TRL's own configs, by the name the installed transformers knows: from 5.20 on
    ``activation_checkpointing`` (the old name warns there), before it ``gradient_checkpointing`` (the vLLM
    environment pins transformers below 5.20)."""
    from transformers import TrainingArguments

    new = "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if new else "gradient_checkpointing": False}


def episode_ids(tokenizer, env) -> tuple[list[int], list[int]]:
    """Prompt ids and the scripted completion (actions and the env's real observations) of one episode."""
    _, info = env.reset(options=TASK)
    prompt = tokenizer.apply_chat_template(info["messages"], add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    completion: list[int] = []
    for action in SCRIPT:
        completion += tokenizer.encode(action, add_special_tokens=False)
        obs, *_ = env.step(action)
        completion += tokenizer.encode(obs, add_special_tokens=False)
    completion.append(tokenizer.eos_token_id)
    return prompt, completion


def completion_loss(model, ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Next-token cross-entropy on the labelled positions only: the LM head (49,152 outputs) runs on those alone,
    not on the long system prompt, which makes teaching several times faster."""
    hidden = model.model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def teach(model, prompt: list[int], completion: list[int], max_steps: int = 500, lr: float = 1e-2,
          target: float = 0.01) -> float:
    """Fit the model to the scripted completion (loss on completion tokens) until the loss is below `target` or
    `max_steps` have run; return the final loss."""
    ids = torch.tensor([prompt + completion])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(max_steps):
        loss = completion_loss(model, ids, labels)
        if loss.item() < target:
            break
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return float(loss.detach())


def scripted_ids(tokenizer, env, script: list[str]) -> list[int]:
    """The completion of one scripted episode: its actions and the env's real observations, then EOS."""
    env.reset(options=TASK)
    completion: list[int] = []
    for action in script:
        completion += tokenizer.encode(action, add_special_tokens=False)
        obs, _, terminated, truncated, _ = env.step(action)
        if not (terminated or truncated):
            completion += tokenizer.encode(obs, add_special_tokens=False)
    return completion + [tokenizer.eos_token_id]


def taught_agent(tokenizer, env, scripts: list[list[str]], steps: int = 300, seed: int = 1, hidden: int = 64,
                 lr: float = 1e-2):
    """A tiny Llama fitted to several scripted episodes at once: where they differ it is uncertain (about evenly
    split between them), where they agree it is sure."""
    model = tiny_llama(tokenizer, seed=seed, hidden=hidden)
    prompt, _ = episode_ids(tokenizer, env)
    completions = [scripted_ids(tokenizer, env, script) for script in scripts]
    width = max(len(c) for c in completions)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([prompt + c + [pad] * (width - len(c)) for c in completions])
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    for r, c in enumerate(completions):
        labels[r, len(prompt) + len(c):] = -100
    mask = (labels != -100) | (torch.arange(ids.size(1)) < len(prompt))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = completion_loss(model, ids, labels, mask.long())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return model


def undecided_agent(tokenizer, env, steps: int = 300, seed: int = 1, hidden: int = 64, lr: float = 1e-2):
    """A tiny Llama taught two episodes that agree up to the last tool result and then answer 42 (right) or 43
    (wrong): its uncertainty sits after the tool output, so a group of samples gets mixed rewards."""
    wrong = SCRIPT[:-1] + ["<answer>\\boxed{43}</answer>"]
    return taught_agent(tokenizer, env, [SCRIPT, wrong], steps, seed, hidden, lr)


def hesitant_start_agent(tokenizer, env, steps: int = 300, seed: int = 1):
    """The opposite of `undecided_agent`: four ways to write the first cell (uncertain at the start of the
    response), then one sure continuation after every tool result (its entropy falls after tools)."""
    firsts = ["<python>x = 41</python>", "<python>x=41</python>", "<python>x = 40 + 1</python>",
              "<python>x = 42 - 1</python>"]
    return taught_agent(tokenizer, env, [[first, *SCRIPT[1:]] for first in firsts], steps, seed)


def write_recipe(tmp_path, model, tokenizer, tasks: int = 8, **overrides) -> tuple:
    """Save `model` and a tasks file under `tmp_path` and write an `arpo train` recipe for them (a tiny, fast run
    on the CPU; `overrides` replace or add keys). Returns (recipe path, run directory)."""
    import json

    model_dir = tmp_path / "tiny"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(TASK) + "\n" for _ in range(tasks)))
    run = tmp_path / "run"
    keys = {"model_name_or_path": model_dir, "output_dir": run, "dataset_name": tmp_path / "tasks.jsonl",
            "num_generations": 4, "num_global": 2, "branch_alpha": 1.0, "branch_beta": 0.0,
            "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_steps": 3, "save_steps": 1,
            "logging_steps": 1, "max_new_tokens_per_turn": 24, "max_completion_length": 400,
            "learning_rate": "1.0e-3", "gradient_checkpointing": "false", "report_to": "none", "use_cpu": "true",
            "env_kwargs": "{max_tool_calls: 4, sandbox_options: {timeout_s: 5}}", **overrides}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{k}: {v}\n" for k, v in keys.items()))
    return recipe, run
