"""Where generated code runs: the local bubblewrap sandbox (``local``) and, only with
``--allow-unsandboxed-code``, this machine itself (``unsandboxed``)."""
