"""The registered environments: math with a Python interpreter (`math`), and question answering and deep search
with search, browse and Python (`qa`). Each is a `arpo_env.env.ToolEnv` with its dataset, tools and reward."""
