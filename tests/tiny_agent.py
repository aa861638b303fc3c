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
        loss = model(input_ids=ids, labels=labels).loss
        if loss.item() < target:
            break
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return float(loss.detach())


def undecided_agent(tokenizer, env, steps: int = 300, seed: int = 1):
    """A tiny Llama taught two episodes that agree up to the last tool result and then answer 42 (right) or 43
    (wrong): its uncertainty sits after the tool output, so a group of samples gets mixed rewards."""
    model = tiny_llama(tokenizer, seed=seed)
    prompt, right = episode_ids(tokenizer, env)
    wrong_tail = tokenizer.encode("<answer>\\boxed{43}</answer>", add_special_tokens=False) + [tokenizer.eos_token_id]
    right_tail = tokenizer.encode(SCRIPT[-1], add_special_tokens=False) + [tokenizer.eos_token_id]
    wrong = right[: len(right) - len(right_tail)] + wrong_tail
    width = max(len(right), len(wrong))
    pad = tokenizer.pad_token_id
    rows = [prompt + c + [pad] * (width - len(c)) for c in (right, wrong)]
    ids = torch.tensor(rows)
    labels = ids.clone()
    labels[:, : len(prompt)] = -100
    for r, c in enumerate((right, wrong)):
        labels[r, len(prompt) + len(c):] = -100
    mask = (labels != -100) | (torch.arange(ids.size(1)) < len(prompt))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return model
