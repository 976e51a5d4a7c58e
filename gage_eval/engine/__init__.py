"""The engine: one row forward. The loop (``loop``, under 300 lines) runs each task's rows through
the stages in their own modules (``taskrun``: a task's rows and backends; ``infer``, ``judging``,
``scoring``; ``summary``; ``progress``, ``rowlog``, ``observers``, ``interrupts``), with where the
model runs (``executor``), ``rescore`` and ``merge``. It
never imports the command line (an import-linter contract)."""
