"""Scoring answers: math equivalence (`math_text` normalises, `math_equivalence` decides, `tractable` refuses what
no computer can evaluate), QA metrics, the LLM judge and its chat client, and the pool of killable worker processes
that bounds scoring in time and memory (`worker_pool`)."""
