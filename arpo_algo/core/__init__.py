"""The paper's maths, torch-free: rollout settings (`config`), entropy (`entropy`), the branching decision
(`branching`), trees of trajectories (`tree`) and advantages (`advantages`)."""
