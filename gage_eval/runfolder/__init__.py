"""Writing the run folder ``runs/<run_id>/`` (its layout and strict readers are the API's
:mod:`gage_eval.api.runfolder`): locking and resume checks (``rundir``), reading records back
and the event log (``records``), the core writers of samples/ and summary.json and the run's
plugin writers (``writers``) and the reproducibility fingerprint (``repro``).
Stands on :mod:`gage_eval.config` and :mod:`gage_eval.api`."""
