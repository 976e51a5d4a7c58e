"""Writing the run folder ``runs/<run_id>/`` (its layout and strict readers are the API's
:mod:`gage_eval.api.runfolder`): locking and resume checks (``rundir``), the record shapes and
appenders (``records``), the core writers of samples/, instances/ and summary.json (``writers``,
with the Every Eval Ever formats in ``eee``) and the reproducibility fingerprint (``repro``).
Stands on :mod:`gage_eval.config` and :mod:`gage_eval.api`."""
