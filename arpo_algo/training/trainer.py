"""`ARPOTrainer`: TRL's `GRPOTrainer` with ARPO's rollouts over arpo_env environments and ARPO's advantages.

TRL keeps everything it does: the optimisation and the loss family (``loss_type``, clipping, KL), logging
(``report_to``), checkpoints and resume, accelerate / DeepSpeed / FSDP, and vLLM weight syncing. Two steps change:

* generation — each group of M identical rows (TRL's repeat sampler) is one question; the rollout engine
  (`arpo_algo.rollout`) plays it in the environment ``env_id`` (one env per trajectory, forked at branch points)
  and hands TRL the M trajectories through its ``rollout_func`` hook: token ids, sampling log-probs and an
  ``env_mask`` that is 0 on tool-output tokens, so they are excluded from the loss. The reward is the env's
  (the default reward function `env_reward` returns it; extra reward functions are added to it as in TRL).
* advantages — computed from the trees (`arpo_algo.core.advantages`): GRPO or REINFORCE++, with soft or hard
  attribution of shared prefixes.

Generation backends: the transformers model being trained (`HFGenerator`), or vLLM with ``use_vllm=True``: the
colocated engine (``vllm_mode="colocate"``) or a ``trl vllm-serve`` server (``vllm_mode="server"``), both through
the vLLM generators, after the weights are synced: by TRL, or where TRL's sync cannot work (vLLM's CPU build, a
server without CUDA) by vLLM's in-place reload (`arpo_algo.generation.weight_sync`).

Each step logs reward and its parts, accuracy, tool calls per trajectory and in all (``arpo/tool_calls``, a shared
prefix's calls once), branches per question, ΔH and entropy statistics and tokens generated (under ``arpo/``), and
appends the step's trees, with their advantages, to
``output_dir/rollouts.jsonl``. A run that starts over (``train()`` without ``resume_from_checkpoint``) first moves
the logs an earlier run left in ``output_dir`` to ``output_dir/earlier-runs/TIME/`` (`set_aside_earlier_logs`); a
resumed run moves there the lines of the steps after its checkpoint, which it trains and logs again.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator

import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from arpo_algo import jsonl
from arpo_algo.core.advantages import grpo_advantages, hard_token_advantages, reinforce_pp_advantages
from arpo_algo.core.config import from_trainer
from arpo_algo.core.tree import RolloutTree, entropy_windows, write_jsonl
from arpo_algo.environments import hide_from_sandbox
from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout
from arpo_algo.settings import ConfigError
from arpo_algo.training.config import ARPOConfig
from arpo_algo.training.distributed import HFGeneration, check_processes_joined, lockstep_problem
from arpo_env.integrations.trl_dataset import row_task, task_dataset


def quiet_trl_deprecations() -> None:
    """TRL (1.16) asks the model `is_gradient_checkpointing` at every generation and, with checkpointing on (TRL's
    default), turns it off and on again by `gradient_checkpointing_disable` / `_enable`: names transformers 5.20+
    deprecates with a FutureWarning that no setting of the user's can answer. Only those warnings are silenced: when
    this module is imported, and again by each `ARPOTrainer` (filters set since, by a test runner say, drop them)."""
    for name in ("is_gradient_checkpointing", "gradient_checkpointing_disable", "gradient_checkpointing_enable"):
        warnings.filterwarnings("ignore", message=f"`{name}` is deprecated", category=FutureWarning)


quiet_trl_deprecations()


TRL_VERSIONS = ("1.16", "1.17")
"""The TRL releases ARPOTrainer runs on, from the first to before the second (pyproject's bound): it overrides
GRPOTrainer's private steps, which change between releases."""


def check_trl(version: str) -> None:
    """A TRL outside `TRL_VERSIONS` is a one-line `ConfigError` before any work (TRL 1.15 failed at the first
    rollout, inside TRL: "unwrap_model_for_generation() got an unexpected keyword argument")."""
    from packaging.version import Version

    low, high = (Version(v) for v in TRL_VERSIONS)
    if not low <= Version(Version(version).base_version) < high:
        raise ConfigError(f"ARPOTrainer runs on TRL {TRL_VERSIONS[0]}.x (its private steps change between releases), "
                          f"not TRL {version}: pip install 'trl>={TRL_VERSIONS[0]},<{TRL_VERSIONS[1]}'")


def env_reward(completions: list[Any], env_reward: list[float], **kwargs: Any) -> list[float]:
    """The reward the environment gave each trajectory (the hierarchical reward of `arpo_env.rewards`)."""
    return [float(r) for r in env_reward]


def _check_first_row(name: str, dataset: Any) -> None:
    """A dataset whose rows `row_task` cannot read (no question, no gold answer) is refused before the model loads,
    not at the first generation step."""
    if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__") or not len(dataset):
        return
    try:
        row_task(dict(dataset[0]))
    except ValueError as exc:
        raise ValueError(f"ARPOTrainer: {name}'s first row: {exc}") from None


class ARPOTrainer(GRPOTrainer):
    """Train a causal LM with ARPO (or its GRPO, DAPO and REINFORCE++ baselines) on an arpo_env environment.

    Args:
        model: a model id or path, or a `PreTrainedModel`, as for `GRPOTrainer`.
        reward_funcs: extra TRL reward functions; the env's reward (`env_reward`) is always the first.
        args: `ARPOConfig`.
        train_dataset: rows with a question and a gold answer, read as dataset files are (`row_task`:
            ``question``, ``problem`` or a conversational ``prompt``; ``answer``, ``ground_truth``,
            ``reward_model.ground_truth``, a ``solution``'s ``\\boxed{}``, …; optionally ``kind``, ``meta``), its
            first row checked before the model loads; by default the tasks of the environment (`task_dataset`).
        make_env: returns a fresh unwrapped `arpo_env.ToolEnv`; by default ``gym.make(args.env_id, **env_kwargs)``.
        Other arguments as for `GRPOTrainer` (``tools``, ``rollout_func`` and ``environment_factory`` are ARPO's
        own and cannot be passed).

    Example:
        ```python
        from arpo_algo import ARPOConfig, ARPOTrainer

        args = ARPOConfig("runs/arpo", env_id="ARPO-Math-v0", env_kwargs={"dataset": "arithmetic"},
                          num_generations=4, num_global=2, per_device_train_batch_size=4, max_steps=10)
        ARPOTrainer("HuggingFaceTB/SmolLM2-135M-Instruct", args=args).train()
        ```
    """

    _tag_names = ["trl", "grpo", "arpo"]

    def __init__(self, model: Any, reward_funcs: Any = None, args: ARPOConfig | None = None,
                 train_dataset: Any = None, eval_dataset: Any = None, processing_class: Any = None,
                 reward_processing_classes: Any = None, callbacks: Any = None,
                 optimizers: tuple[Any, Any] = (None, None), peft_config: Any = None,
                 make_env: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        import trl

        check_trl(trl.__version__)
        for own in ("tools", "rollout_func", "environment_factory"):
            if kwargs.get(own) is not None:
                raise ValueError(f"ARPOTrainer runs tools through its environment; {own}= cannot be passed")
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = ARPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-ARPO")
        if train_dataset is None:
            train_dataset = task_dataset(args.env_id, **self.env_kwargs(args))
        named = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
        for name, dataset in [("train_dataset", train_dataset), *((f"eval_dataset{name and f'[{name!r}]'}", d)
                                                                  for name, d in named)]:
            _check_first_row(name, dataset)
        quiet_trl_deprecations()
        extra = reward_funcs if isinstance(reward_funcs, list) else ([reward_funcs] if reward_funcs else [])
        with warnings.catch_warnings(), _vllm_engine_options(args):
            warnings.filterwarnings("ignore", message=".*'rollout_func'.*experimental")
            super().__init__(model=model, reward_funcs=[env_reward, *extra], args=args, train_dataset=train_dataset,
                             eval_dataset=eval_dataset, processing_class=processing_class,
                             reward_processing_classes=reward_processing_classes, callbacks=callbacks,
                             optimizers=optimizers, peft_config=peft_config, rollout_func=self._rollout_output,
                             **kwargs)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        if per_process % args.num_generations:
            raise ConfigError(
                f"a rollout tree must stay on one process: per_device_train_batch_size × steps_per_generation "
                f"({args.per_device_train_batch_size} × {args.steps_per_generation} = {per_process}) must be a "
                f"multiple of num_generations (M={args.num_generations})")
        if args.use_vllm and args.vllm_enable_sleep_mode:
            raise ConfigError("ARPOTrainer does not support vllm_enable_sleep_mode yet: turn it off")
        check_processes_joined(self.accelerator.state)
        problem = lockstep_problem(self._dist, args.ds3_gather_for_generation, args.use_vllm,
                                   self.accelerator.num_processes)
        if problem:
            raise ConfigError(problem)
        env_kwargs = self.env_kwargs(args)
        self.make_env = make_env or _env_maker(args.env_id, env_kwargs)
        self._pending: dict[str, Any] | None = None
        self._pending_trees: list[RolloutTree] | None = None
        self._trained: list[Any] | None = None
        self._server_client: Any = None
        self.add_callback(MetricsFile())

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """TRL's `train`. A run that starts over (no `resume_from_checkpoint`) into an ``output_dir`` that holds the
        logs of an earlier run first moves them aside (`set_aside_earlier_logs`): they were appended to, so `arpo
        view` showed the two runs as one (the later run's steps over the earlier's, their trees mixed). A resumed run
        moves aside the lines of the steps after its checkpoint, which it trains and logs again; one resumed from a
        checkpoint at ``max_steps`` or past it is refused (transformers trained a step past ``max_steps``)."""
        out = self.args.output_dir
        step = checkpoint_step(out, resume_from_checkpoint) if resume_from_checkpoint else None
        if step is not None and 0 < self.args.max_steps <= step:  # on every process: transformers trained one more
            raise ConfigError(f"the checkpoint is at step {step} and max_steps is {self.args.max_steps}: that run is "
                              "finished; give a larger max_steps to train on from it")
        if self.accelerator.is_main_process:
            from transformers.utils import logging

            logs = ["metrics.jsonl", self.args.rollout_log or ""]
            if not resume_from_checkpoint:
                moved = set_aside_earlier_logs(out, logs)
                if moved:
                    logging.get_logger(__name__).warning(
                        f"{out} held the logs of an earlier run; this run starts over, so they were moved to {moved} "
                        "(resume_from_checkpoint goes on from a checkpoint instead)")
            else:
                moved = None if step is None else set_aside_earlier_logs(out, logs, after_step=step)
                if moved:
                    logging.get_logger(__name__).warning(
                        f"the logs of the steps after {step} (the earlier run went on past its checkpoint, and this "
                        f"run trains those steps again) were moved to {moved}")
        return super().train(resume_from_checkpoint, *args, **kwargs)

    @staticmethod
    def env_kwargs(args: ARPOConfig) -> dict[str, Any]:
        """gym.make keyword arguments: ``env_kwargs`` with ``max_tool_calls`` when it is set, and the run's output
        folder hidden from the local sandbox (its rollout trees hold the tasks' answers, and a task comes back every
        epoch)."""
        kwargs = dict(args.env_kwargs or {})
        if args.max_tool_calls is not None:
            kwargs["max_tool_calls"] = args.max_tool_calls
        return hide_from_sandbox(args.env_id, kwargs, args.output_dir) if args.output_dir else kwargs

    # Generation -----------------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        m = self.num_generations if mode == "train" else self.num_generations_eval
        # One generation a step on every process, DAPO's redraws inside it: entering it gathers the parameters under
        # ZeRO-3 and FSDP 2, a collective, and each process redraws as often as its own groups need.
        with self._generator() as generator:
            trees = self._roll_out(inputs, m, mode, generator)
            if mode == "train" and self.args.dynamic_sampling:
                trees = self._resample_uniform_groups(inputs, trees, m, generator)
        self._pending = self._as_trl_rollout(trees)
        self._pending_trees = trees if mode == "train" else None
        self._log_rollout_metrics(trees)
        output = super()._generate_and_score_completions(inputs)  # computes the rewards, then our advantages
        if mode == "train":
            output["advantages"] = self._advantage_tensor(output["completion_ids"].size(1))
            self._write_trees(trees)
        self._pending = self._pending_trees = self._trained = None
        return output

    def _rollout_output(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's rollout_func: the trajectories `_generate_and_score_completions` has just rolled out."""
        if self._pending is None:
            raise RuntimeError("ARPOTrainer's rollout output was requested outside a generation step")
        if len(self._pending["completion_ids"]) != len(prompts):
            raise RuntimeError(f"{len(prompts)} prompts but {len(self._pending['completion_ids'])} trajectories")
        return self._pending

    def _roll_out(self, inputs: list[dict[str, Any]], m: int, mode: str, generator: Any,
                  call: int = 0) -> list[RolloutTree]:
        """One tree per group of `m` rows, with the step's `generator` (`_generator`). Seeded by (seed, step,
        process, call): a resumed run samples alike."""
        args = self.args
        if len(inputs) % m:
            raise ValueError(f"{len(inputs)} rows is not a whole number of groups of {m}")
        tasks = [row_task(inputs[i]) for i in range(0, len(inputs), m)]
        branching = args.branching and mode == "train"
        temperature = args.eval_temperature if mode == "eval" and args.eval_temperature is not None \
            else args.temperature
        config = from_trainer(args, num_generations=m, num_global=min(args.num_global, m) if branching else m,
                              temperature=temperature, branching=branching,
                              seed=_seed(args.seed, self.state.global_step, self.accelerator.process_index, call))
        engine = (ARPORollout if branching else GRPORollout)(generator, self.make_env, config)
        before = generator.stats.generated_tokens, generator.stats.prefill_tokens
        with self._token_meter(generator, mode):
            trees = engine.run(tasks)
        self._log_metric("arpo/tokens_generated", float(generator.stats.generated_tokens - before[0]))
        self._log_metric("arpo/tool_calls", float(engine.tool_calls))  # run once each: a shared prefix's once
        self._log_metric("arpo/tokens_encoded", float(generator.stats.prefill_tokens - before[1]))
        for tree in trees:
            if len(tree.trajectories) != m:
                raise RuntimeError(f"the rollout produced {len(tree.trajectories)} trajectories, not M={m}")
        return trees

    def _token_meter(self, generator: Any, mode: str) -> Any:
        """The rollout's tokens so far and their rate on TRL's progress bar (the main process's), so that a step of
        minutes shows work under way."""
        from transformers.trainer_callback import ProgressCallback

        from arpo_algo.generation.throughput import TokenMeter

        bar = next((getattr(c, "training_bar", None) for c in self.callback_handler.callbacks
                    if isinstance(c, ProgressCallback)), None)
        if bar is None or mode != "train" or not self.accelerator.is_main_process:
            return nullcontext()
        return TokenMeter(generator.stats, lambda line: bar.set_postfix_str(f"rollout: {line}"))

    def _generator(self) -> Any:
        """A context yielding a `Generator` over the current weights."""
        args = self.args
        if args.use_vllm:
            if self.state.global_step != self._last_loaded_step:
                self._sync_vllm_weights()
                self._last_loaded_step = self.state.global_step
            if self.vllm_mode == "colocate":
                from arpo_algo.generation.vllm_generator import VLLMGenerator

                return nullcontext(VLLMGenerator(self.vllm_generation.llm, self._tokenizer))
            return nullcontext(self._server_generator())
        return HFGeneration(self)

    def _sync_vllm_weights(self) -> None:
        """Push the trained weights into vLLM: TRL's sync, except where it cannot work
        (`arpo_algo.generation.weight_sync`): a colocated engine on the CPU reloads in place; a server with
        ``vllm_weight_sync="disk"`` (the default without CUDA) reloads from a safetensors file the trainer writes to
        ``output_dir/vllm-weights``."""
        from arpo_algo.generation.weight_sync import ServerWeightSync, reload_engine_weights

        gen = self.vllm_generation
        if self.vllm_mode == "server":
            if _server_weight_sync(self.args) == "nccl":
                gen.sync_weights()
            else:  # every process walks the parameters (gathers are collective); the main one writes and reloads
                weights = gen._iter_named_params()
                if self.accelerator.is_main_process:
                    ServerWeightSync(gen.vllm_client, _weights_folder(self.args)).push(weights)
                else:
                    for _ in weights:
                        pass
            self.accelerator.wait_for_everyone()  # each process generates through its own client, after the push
            return
        if torch.cuda.is_available():
            gen.sync_weights()
            return
        runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
        reload_engine_weights(runner, ((name, param.data) for name, param in gen._iter_named_params()))
        gen.llm.reset_prefix_cache()

    def _server_generator(self) -> Any:
        from arpo_algo.generation.vllm_generator import VLLMServerGenerator

        if self._server_client is None:
            client = getattr(self.vllm_generation, "vllm_client", None)
            if client is None:  # only the main process holds TRL's client (it syncs weights); others just generate
                from trl.generation.vllm_client import VLLMClient

                gen = self.vllm_generation
                base_url = gen.server_base_url or f"http://{gen.server_host}:{gen.server_port}"
                client = VLLMClient(base_url=base_url, connection_timeout=gen.server_timeout)
            self._server_client = client
        return VLLMServerGenerator(self._server_client, self._tokenizer)

    def _resample_uniform_groups(self, inputs: list[dict[str, Any]], trees: list[RolloutTree], m: int,
                                 generator: Any) -> list[RolloutTree]:
        """DAPO's dynamic sampling: groups whose rewards are all equal are replaced, in `inputs` too, by groups for
        questions drawn from the training set, for up to `dynamic_sampling_rounds` draws, with the step's
        `generator`."""
        uniform = [g for g, tree in enumerate(trees) if _uniform(tree)]
        replaced = 0
        for draw in range(1, self.args.dynamic_sampling_rounds + 1):
            if not uniform:
                break
            rng = np.random.default_rng(_seed(self.args.seed, self.state.global_step, self.accelerator.process_index,
                                              draw))
            picks = rng.integers(len(self.train_dataset), size=len(uniform))
            rows = [dict(self.train_dataset[int(i)]) for i in picks]
            fresh = self._roll_out([row for row in rows for _ in range(m)], m, "train", generator, call=draw)
            still = []
            for g, row, tree in zip(uniform, rows, fresh):
                if _uniform(tree):
                    still.append(g)
                    continue
                inputs[g * m:(g + 1) * m] = [dict(row) for _ in range(m)]
                trees[g] = tree
                replaced += 1
            uniform = still
        self._log_metric("dapo/groups_replaced", float(replaced))
        self._log_metric("dapo/groups_uniform", float(len(uniform)))
        return trees

    def _as_trl_rollout(self, trees: list[RolloutTree]) -> dict[str, Any]:
        """Token ids, log-probs and env_mask for TRL. A finished (not truncated) trajectory gets the EOS token,
        masked out of the loss, so TRL does not count it as clipped."""
        eos = self.eos_token_ids[0]
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                     "env_reward", "tool_calls")}
        for tree in trees:
            # Hard attribution keeps the full mask too: copies of shared tokens are silenced through their
            # advantage (`arpo_algo.core.advantages`), so every loss type keeps its own normalisation.
            for tr in tree.trajectories:
                mask = list(tr.mask)
                ids, logprobs = list(tr.completion_ids), list(tr.logprobs)
                if not tr.truncated:
                    ids, logprobs, mask = ids + [eos], logprobs + [0.0], mask + [0]
                out["prompt_ids"].append(list(tr.prompt_ids))
                out["completion_ids"].append(ids)
                out["logprobs"].append(logprobs)
                out["env_mask"].append(mask)
                out["env_reward"].append(tr.reward)
                out["tool_calls"].append(tr.tool_calls)
        return out

    # Advantages -----------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
                           ) -> torch.Tensor:
        """TRL's rewards ([global batch, functions], gathered from every process); then ARPO's advantages from them,
        here rather than after TRL's step so that their metrics are logged with this step."""
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        infinite = torch.isinf(rewards_per_func).nonzero()
        if len(infinite):  # its group's advantages would be NaN, and after the step the model's weights
            row, col = infinite[0].tolist()
            value = rewards_per_func[row, col].item()
            raise ValueError(f"reward function {self.reward_func_names[col]!r} gave {value} (completion {row} of the "
                             "step's batch): a reward is a finite number, or None where the function does not apply")
        if getattr(self, "_pending_trees", None) is not None:
            self._trained = self._advantages(self._pending_trees, rewards_per_func)
        return rewards_per_func

    def _advantages(self, trees: list[RolloutTree], rewards_per_func: torch.Tensor) -> list[Any]:
        """Replace TRL's advantages: the estimator over the rewards TRL computed (the env's plus any extra reward
        functions, weighted, over the whole batch of every process), then the attribution over each of this
        process's trees: one float per trajectory (soft) or one array per trajectory of per-token values (hard)."""
        m = self.num_generations
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = torch.nansum(rewards_per_func * weights, dim=1).cpu().numpy().astype(np.float64)
        if self.args.advantage_estimator == "reinforce_pp":
            everything = reinforce_pp_advantages(rewards)
        else:
            scale = self.scale_rewards
            if isinstance(scale, bool):
                scale = "group" if scale else "none"
            everything = grpo_advantages(rewards.reshape(-1, m), scale=scale).reshape(-1)
        n = len(trees) * m
        adv = everything[self.accelerator.process_index * n:(self.accelerator.process_index + 1) * n]
        for tree, group in zip(trees, adv.reshape(len(trees), m)):
            for tr, a in zip(tree.trajectories, group):
                tr.reward_parts = {**tr.reward_parts, "advantage": float(a)}
        if self.args.advantage_attribution == "soft":
            self._log_metric("arpo/advantage_abs", float(np.mean(np.abs(adv))) if n else 0.0)
            return adv.tolist()
        trained: list[Any] = []
        masks_truncated = self.args.mask_truncated_completions
        for g, tree in enumerate(trees):
            eligible = [not (masks_truncated and tr.truncated) for tr in tree.trajectories]
            trained += hard_token_advantages(tree, adv[g * m:(g + 1) * m].tolist(), eligible, self.loss_type)
        trajectories = [tr for tree in trees for tr in tree.trajectories]
        loss_values = [values[np.asarray(tr.mask, dtype=bool)] for tr, values in zip(trajectories, trained)]
        flat = np.concatenate(loss_values) if loss_values else np.zeros(0)
        self._log_metric("arpo/advantage_abs", float(np.abs(flat).mean()) if flat.size else 0.0)
        return trained

    def _advantage_tensor(self, width: int) -> torch.Tensor:
        """The advantages of `_advantages` as TRL's input ((B,) or (B, T)); also shown in TRL's completions table,
        in place of the GRPO advantages TRL computed there: per trajectory for soft attribution, and for hard the
        mean of the per-token values over the trajectory's loss tokens (copies of shared tokens count 0)."""
        from accelerate.utils import gather_object

        device = self.accelerator.device
        trees = self._pending_trees
        if self.args.advantage_attribution == "soft":
            shown = [float(a) for a in self._trained]
            tensor = torch.tensor(shown, dtype=torch.float32, device=device)
        else:
            tensor = torch.zeros(len(self._trained), width, dtype=torch.float32)
            shown = []
            trajectories = [tr for tree in trees for tr in tree.trajectories]
            for row, (tr, values) in enumerate(zip(trajectories, self._trained)):
                # after the completion: the EOS appended for TRL and padding, masked from the loss; 0 keeps them inert
                tensor[row, : len(values)] = torch.from_numpy(values.astype(np.float32))
                own = values[np.asarray(tr.mask, dtype=bool)]
                shown.append(float(own.mean()) if own.size else 0.0)
                tr.reward_parts["advantage_trained_mean"] = shown[-1]
            tensor = tensor.to(device)
        everything = gather_object(shown)
        logged = self._logs["advantages"]
        for _ in range(min(len(everything), len(logged))):
            logged.pop()
        logged.extend(everything)
        return tensor

    # Logs -----------------------------------------------------------------------------------------------------------
    def _log_rollout_metrics(self, trees: list[RolloutTree]) -> None:
        trajectories = [tr for tree in trees for tr in tree.trajectories]
        if not trajectories:
            return
        self._log_metric("arpo/tool_calls_per_trajectory", float(np.mean([t.tool_calls for t in trajectories])))
        self._log_metric("arpo/branches_per_question", float(np.mean([tree.branches for tree in trees])))
        self._log_metric("arpo/accuracy", float(np.mean([bool(t.reward_parts.get("correct")) for t in trajectories])))
        self._log_metric("arpo/format_valid", float(np.mean([bool(t.reward_parts.get("format_ok"))
                                                              for t in trajectories])))
        self._log_metric("arpo/truncated", float(np.mean([t.truncated for t in trajectories])))
        # answers the scorer gave up on (scored 0, not judged wrong)
        self._log_metric("arpo/scoring_errors", float(np.mean([bool(t.reward_parts.get("scoring_errors"))
                                                                for t in trajectories])))
        for part in ("total", "score", "bonus"):  # the parts of arpo_env.rewards.HierarchicalReward
            values = [float(t.reward_parts[part]) for t in trajectories if part in t.reward_parts]
            if values:
                self._log_metric(f"arpo/reward_{part}", float(np.mean(values)))
        decisions = [d for t in trajectories for d in t.decisions]
        if decisions:
            self._log_metric("arpo/delta_h_mean", float(np.mean([d["delta_h"] for d in decisions])))
            self._log_metric("arpo/delta_h_max", float(np.max([d["delta_h"] for d in decisions])))
            self._log_metric("arpo/branch_probability", float(np.mean([d["p"] for d in decisions])))
        windows = []  # per segment, H/k (the mean per-token entropy); a window shared by several trajectories once
        for tree in trees:
            starts = {n.id: n.start for n in tree.nodes}
            for t in tree.trajectories:
                windows += [(where, float(np.mean(values)))
                            for where, values in entropy_windows(t.segments, t.entropies, starts.get(t.node, 0))]
        start = [v for where, v in windows if where == "start"]
        after = [v for where, v in windows if where == "after_tool"]
        if start:
            self._log_metric("arpo/entropy_start", float(np.mean(start)))
        if after:
            self._log_metric("arpo/entropy_after_tool", float(np.mean(after)))
        # which estimator and timing measured these (the trees say it too, in their stats)
        self._log_metric("arpo/entropy_top_logprobs", float(self.args.entropy_top_logprobs))
        self._log_metric("arpo/entropy_lagged", float(self.args.entropy_timing == "lagged"))

    def _write_trees(self, trees: list[RolloutTree]) -> None:
        """Every process's trees, gathered to the main process and appended to one file (each tree records its
        rank), so a run on many processes logs all of its rollouts in one place."""
        if not self.args.rollout_log:
            return
        from accelerate.utils import gather_object

        rank = self.accelerator.process_index
        for tree in trees:
            tree.stats = {**tree.stats, "step": self.state.global_step + 1, "rank": rank,
                          "attribution": self.args.advantage_attribution, "algorithm": self.args.algorithm}
        everything = gather_object(list(trees)) if self.accelerator.num_processes > 1 else trees
        if self.accelerator.is_main_process:
            os.makedirs(self.args.output_dir, exist_ok=True)
            write_jsonl(everything, os.path.join(self.args.output_dir, self.args.rollout_log))


def checkpoint_step(output_dir: str, resume_from_checkpoint: str | bool) -> int | None:
    """The step a run resumed from `resume_from_checkpoint` (a folder, or True: the last one in `output_dir`, as
    transformers takes it) goes on after; None when it cannot be read (transformers then says why)."""
    from transformers.trainer_utils import get_last_checkpoint

    try:
        folder = get_last_checkpoint(output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        with open(os.path.join(str(folder), "trainer_state.json"), encoding="utf-8") as f:
            step = json.load(f)["global_step"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _line_step(line: str) -> Any:
    """The step a log line belongs to: a metrics entry's ``step``, a rollout tree's ``stats.step``; None for a line
    that is no JSON object (one a killed writer cut short)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    stats = value.get("stats")
    return value.get("step", stats.get("step") if isinstance(stats, dict) else None)


def set_aside_earlier_logs(output_dir: str, names: list[str], after_step: int | None = None) -> str | None:
    """Move the files `names` (the run's logs, relative to `output_dir`) that are there to a new folder
    ``output_dir/earlier-runs/TIME`` and return it; None when there was none to move. Nothing is lost, and `arpo view
    output_dir/earlier-runs/TIME` shows that run.

    With `after_step` (a run resumed from the checkpoint of that step), only the lines of later steps move, and lines
    cut short by a kill: the earlier run trained those steps past its last checkpoint, and the resumed run trains and
    logs them again (`arpo view` showed both copies of their trees)."""
    found = []
    for name in dict.fromkeys(n for n in names if n):
        path = os.path.join(output_dir, name)
        inside = os.path.commonpath([os.path.abspath(output_dir), os.path.abspath(path)]) == os.path.abspath(output_dir)
        if inside and os.path.isfile(path):
            found.append((name, path))

    def lines(path: str, mode: str = "r") -> Any:  # lines end at "\n" alone (see `jsonl`)
        return open(path, mode, encoding="utf-8", errors="surrogateescape", newline="\n")

    if after_step is not None:  # each file split in one pass: the lines up to after_step stay, the others move
        split = []
        for name, path in found:
            moving = 0
            with lines(path) as src, lines(path + ".kept", "w") as kept, lines(path + ".later", "w") as later:
                for line in filter(str.strip, src):
                    step = _line_step(line)
                    if isinstance(step, (int, float)) and step <= after_step:
                        kept.write(line if line.endswith("\n") else line + "\n")
                    else:
                        moving += 1
                        later.write(line if line.endswith("\n") else line + "\n")
            if moving:
                split.append((name, path))
            else:
                os.remove(path + ".kept")
                os.remove(path + ".later")
        found = split
    if not found:
        return None
    base = os.path.join(output_dir, "earlier-runs", time.strftime("%Y%m%d-%H%M%S"))
    folder, n = base, 1
    while os.path.exists(folder):
        n += 1
        folder = f"{base}-{n}"
    for name, path in found:
        target = os.path.join(folder, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if after_step is None:
            os.replace(path, target)
        else:
            os.replace(path + ".later", target)
            os.replace(path + ".kept", path)
    return folder


class MetricsFile(TrainerCallback):
    """Append every log (one JSON object per line, with the step and the Unix time) to ``output_dir/metrics.jsonl``:
    a record a killed and resumed run keeps adding to, and what a viewer can plot."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        with jsonl.append(os.path.join(args.output_dir, "metrics.jsonl")) as f:
            f.write(json.dumps({"step": state.global_step, "time": round(time.time(), 3), **logs}, default=float)
                    + "\n")


def _env_maker(env_id: str, env_kwargs: dict[str, Any]) -> Callable[[], Any]:
    def make() -> Any:
        import gymnasium as gym

        import arpo_env  # noqa: F401

        return gym.make(env_id, **env_kwargs).unwrapped

    return make


@contextmanager
def _vllm_engine_options(args: ARPOConfig) -> Iterator[None]:
    """While TRL sets up vLLM: pass a colocated engine ``vllm_engine_kwargs`` (GRPOConfig has no field for them), with
    `arpo_algo.generation.vllm_generator.cpu_engine_defaults` where no CUDA device is present (no chunked prefill,
    eager); for a server synced through a folder, check that the server can reload from one instead of opening TRL's
    NCCL group."""
    if not args.use_vllm:
        yield
        return
    import trl.generation.vllm_generation as generation

    if args.vllm_mode == "server":
        if _server_weight_sync(args) == "nccl":
            yield
            return
        from arpo_algo.generation.weight_sync import ServerWeightSync

        client = generation.VLLMClient

        class FolderSyncClient(client):  # type: ignore[misc, valid-type]
            def init_communicator(self, device: Any = 0) -> None:
                ServerWeightSync(self, _weights_folder(args)).check()

        generation.VLLMClient = FolderSyncClient
        try:
            yield
        finally:
            generation.VLLMClient = client
        return
    from arpo_algo.generation.vllm_generator import cpu_engine_defaults, private_rpc_folder

    private_rpc_folder()
    options = dict(args.vllm_engine_kwargs or {})
    if not torch.cuda.is_available():
        cpu_engine_defaults(options)
    engine = generation.LLM
    generation.LLM = functools.partial(engine, **options)
    try:
        yield
    finally:
        generation.LLM = engine


def _server_weight_sync(args: ARPOConfig) -> str:
    if args.vllm_weight_sync != "auto":
        return args.vllm_weight_sync
    return "nccl" if torch.cuda.is_available() else "disk"


def _weights_folder(args: ARPOConfig) -> str:
    return os.path.join(args.output_dir, "vllm-weights")


def _seed(base: int, step: int, rank: int, call: int) -> int:
    return (base * 1_000_003 + step * 10_007 + rank * 101 + call) % (2**31)


def _uniform(tree: RolloutTree) -> bool:
    rewards = [t.reward for t in tree.trajectories]
    return max(rewards) - min(rewards) < 1e-9
