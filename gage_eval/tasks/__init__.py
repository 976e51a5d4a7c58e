"""Tasks: task-folder discovery and the validated task spec (``spec``), the row pipeline that
reads, checks and preprocesses a task's data (``rows``), few-shot examples (``fewshot``), the
requests a Sample becomes (``requests``) and a run's task names as specs (``resolve``). Stands on
the plugin manager, settings and the API."""
