"""Every Eval Ever records of a run: ``instances/<task>.jsonl`` and, in 0.3.0,
``eee_aggregate.json``, written by the ``instances`` writer (on by default; ``--eee-version``
picks the version): 0.2.0 in :mod:`.v020`, 0.3.0 in :mod:`.v030`, the writer in :mod:`.writer`."""
