"""Generation: the `Generator` protocol (`protocol`), its backends (transformers: `hf_generator`; vLLM:
`vllm_generator`, `weight_sync`), packed linear layers for the CPU, model loading (`models`) and `factory`."""
