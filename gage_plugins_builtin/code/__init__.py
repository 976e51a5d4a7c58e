"""Code that runs: the code_exec metric, the harness it runs in a sandbox, humaneval's rows."""
