"""Tasks: the `Task` type (`task`), loaders for named benchmarks and files (`loaders`), and procedural tasks made
from a seed (`procedural`)."""
