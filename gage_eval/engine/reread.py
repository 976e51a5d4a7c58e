"""A stored run's task rows read again from its data, as the run read them: its config.json, the
task folder, the plugins' loader and preprocessor, the row checks. The report needs the images a
samples file keeps only as hashes; plugins reach this through
:meth:`gage_eval.api.RunFolder.reread_samples`, to which the engine and the command line hand it
(``api.runfolder.use_reread``)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from gage_eval.api.errors import GageError
from gage_eval.config.options import load_options
from gage_eval.engine.taskrun import TaskRun
from gage_eval.tasks.resolve import resolve_tasks
from gage_eval.plugins import load_plugins, stored_option_keys
from gage_eval.tasks.rows import RowChecker


def reread_samples(run_dir: Path, task: str) -> Iterator[dict]:
    """The checked Sample records of ``task`` in the run folder ``run_dir``, in the data's order."""
    opts = load_options(run_dir, None, stored_option_keys())
    opts.tasks = [task]
    opts.data = {k: v for k, v in opts.data.items() if k == task}
    _, registry = load_plugins()
    for spec, failure in resolve_tasks(opts, registry):
        if spec.name != task or failure:
            continue
        tr = TaskRun(spec, registry, opts)
        if tr.failure:
            raise GageError(tr.failure)
        allowed = tuple(Path(p).expanduser().resolve() for p in opts.allow_paths)
        checker = RowChecker(tr.name, tr.preprocess, base_dir=tr.data_dir, allowed_dirs=allowed,
                             allow_urls=opts.allow_urls)
        for index, locator, record in tr.rows():
            row = checker.check(locator, index, record)
            if row.ok:
                yield row.sample

