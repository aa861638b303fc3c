r"""``arpo eval``: the paper's 13 benchmarks, one command, a table in the paper's layout.

Every sample is an episode of the matching environment — math (`ARPO-Math-v0`, Python), knowledge QA
(`ARPO-QA-v0`, search and Python) or deep search (`ARPO-DeepSearch-v0`, search, browse and Python) — with the
paper's evaluation settings unless overridden: temperature 0.6, top-p 0.95, up to 5 tool calls for math and 10
for the search tasks, 500 items for GSM8K and MATH, all items elsewhere. ``--mode direct`` is the no-tool baseline.

How each column is scored (the table says which was used):

* math (AIME24, AIME25, MATH500, GSM8K, MATH): math-verify equivalence of the boxed answer with the gold one;
* HotpotQA, 2Wiki, MuSiQue, Bamboogle: token F1 against the best gold alias;
* WebWalker, GAIA, HLE, xbench: an LLM judge (``--judge URL``, an OpenAI-compatible endpoint), else F1;
  HLE's multiple-choice items compare the option: its letter, or the whole text of one option.

The answer is extracted as the benchmarks do, whatever the transcript's format: the last ``<answer>`` (its
``\boxed{}``), else the last ``\boxed{}`` the model wrote (never one inside a tool result), with ``\text{…}`` and
similar wrappers unwrapped before QA and multiple-choice scoring. A transcript that breaks the training format is
still scored, and counted in the table's *format failures* column (the training reward's −1 gate is the env's,
not the benchmark's). With ``--judge``, samples whose judge was unreachable (or answered neither correct nor
incorrect) are scored by F1 and counted as *judge fallbacks*. Pass@1 is the mean over ``--runs`` K runs; the
spread is the standard deviation of the K run means. Results: ``samples.jsonl`` (one line per sample and run, with
the full transcript; appended, so a run that is stopped and started again only does the missing samples),
``results.md`` and ``results.csv``.
"""
