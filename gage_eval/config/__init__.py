"""Settings: the run's options (:class:`~gage_eval.config.options.RunOptions`, one place per setting,
the flags over the run config over the environment over the defaults), the defaults themselves and
the ``k=v,...`` argument syntax. Stands on :mod:`gage_eval.api` alone."""
