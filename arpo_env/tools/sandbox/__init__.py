"""The local Python sandbox: `host` (the env's side: `LocalSandbox`, limits, the template process) and `process`
(the code that runs inside the sandbox's processes, executed as a script)."""
