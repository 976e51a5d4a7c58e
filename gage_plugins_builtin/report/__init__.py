"""The HTML report, a feature of the builtin plugin: the page (``page``, its template in
``templates/``), the ``report`` writer on by default that writes ``report.html`` at a run's end
(``writer``; ``--no-report`` turns it off) and the command ``gage-eval report`` (``command``)."""
