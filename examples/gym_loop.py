"""A scripted policy plays ARPO-Math-v0 in a plain Gymnasium loop and forks the episode midway.

    python examples/gym_loop.py

The policy writes Python for each problem (parse the numbers, compute), then answers. After the first tool call
it forks the environment: the branch continues from the same interpreter state with a different (wrong) answer,
so you can see both rewards. No model, no network: this is what an RL framework's loop does with our envs.
"""

from __future__ import annotations

import gymnasium as gym

import arpo_env  # noqa: F401  (registers the environments)

PROBLEMS = [
    {"question": "What is 1234 * 5678 + 91?", "answer": "7006743"},
    {"question": "What is the sum of the squares of the integers from 1 to 100?", "answer": "338350"},
    {"question": "How many primes are there below 1000?", "answer": "168"},
]
PROGRAMS = [
    "value = 1234 * 5678 + 91\nvalue",
    "value = sum(k * k for k in range(1, 101))\nvalue",
    "import sympy\nvalue = len(list(sympy.primerange(1000)))\nvalue",
]


def main() -> None:
    env = gym.make("ARPO-Math-v0", max_tool_calls=3)
    for problem, program in zip(PROBLEMS, PROGRAMS):
        obs, info = env.reset(seed=0, options=problem)
        print(f"\n=== {problem['question']}")
        obs, reward, terminated, truncated, info = env.step(f"<think>I will compute it.</think>\n<python>\n{program}\n</python>")
        print(f"tool output: {obs.strip()!r}  ({info['tool_latency_s'] * 1000:.1f} ms)")

        branch = env.unwrapped.fork()  # same transcript, same interpreter variables, independent from now on
        obs, reward, terminated, truncated, info = env.step("<python>print(value)</python>")
        obs, reward, terminated, truncated, info = env.step("<answer>\\boxed{" + obs.split()[1] + "}</answer>")
        print(f"main path: reward {reward:+.1f}  prediction {info['reward_parts']['prediction']}")

        obs, b_reward, *_ = branch.step("<python>value + 1</python>")
        obs, b_reward, b_term, b_trunc, b_info = branch.step("<answer>\\boxed{" + obs.split()[1] + "}</answer>")
        print(f"branch:    reward {b_reward:+.1f}  prediction {b_info['reward_parts']['prediction']} "
              f"(it read `value` from the forked interpreter)")
        branch.close()
    env.close()


if __name__ == "__main__":
    main()
