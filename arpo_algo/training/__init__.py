"""Training on TRL: `ARPOConfig` (`config`), `ARPOTrainer` (`trainer`), several processes (`distributed`), and the
``arpo train`` and ``arpo sft`` commands (`train`, `sft`)."""
