"""Tools that run the model's code: ``python`` (a program) and ``bash`` (a command line), each call
a job in the registered code sandbox (:mod:`gage_eval.api.execution`; ``local`` is bubblewrap
on this machine: no network, nothing of the host writable, a fresh working folder, limits on time,
memory, processes and output). Nothing the model writes runs in this process.

Each call starts from scratch: a fresh working folder holding the row's ``sandbox.files`` (after
its ``sandbox.setup``, with its ``sandbox.env``), so nothing one call leaves behind is there for the
next; a program that should see a value prints it. The tool turn's text is what the job printed
(stdout, then stderr), with a last line when it did not simply succeed: its exit status, or that it
ran out of time or printed too much (killed). A job the sandbox could not prepare (the row's
``sandbox.image`` it does not run, a ``sandbox.setup`` that failed, the sandbox's own failure) is no
answer to the model: the row's error (:class:`gage_eval.api.tools.RowFailed`), not scored.

A task names the tools in ``request.tool_loop.tools`` and may set them in ``tool_args``::

    tool_loop:
      tools: [python, bash]
      tool_args:
        python: {timeout_s: 10, limits: {memory_mb: 512}}   # sandbox: NAME, sandbox_args: {...} too
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from gage_eval.api import execution, tools


TIMEOUT_S = 30.0  # a call's wall time by default
SHOWN_CHARS = 16_000  # of a call's output, the model is shown at most this much (the end of it cut)
MAX_COMMAND_BYTES = 131_072  # one argument of a process (Linux's MAX_ARG_STRLEN): bash's command line under it


class CodeTool(tools.Tool):
    """One function that runs its argument in the sandbox. Arguments (a task's ``tool_args``):
    ``sandbox`` (default ``local``) and ``sandbox_args``; ``timeout_s`` (wall time a call, also its
    CPU time); ``limits`` over the sandbox's defaults (``memory_mb``, ``processes``, ``disk_mb``,
    ``output_bytes``, ...)."""

    function = ""
    parameter = ""
    description = ""
    parameter_description = ""

    def __init__(self, sample: Mapping[str, Any] | None = None, sandbox: str = "local",
                 sandbox_args: Mapping[str, Any] | None = None, timeout_s: float = TIMEOUT_S,
                 limits: Mapping[str, Any] | None = None):
        super().__init__(sample)
        self.limits = execution.Limits(wall_s=float(timeout_s), cpu_s=float(timeout_s)).replace(**dict(limits or {}))
        self.box = execution.open_sandbox(sandbox, **dict(sandbox_args or {}))  # (after the settings are read)
        self.row = execution.Job.for_row((sample or {}).get("sandbox"), (), limits=self.limits)  # its setting
        self.call_timeout_s = self.limits.wall_s + 60.0  # (Tool.call_timeout_s: the sandbox ends a call first)
        self.calls = 0

    @classmethod
    def check_args(cls, sandbox: Any = "local", sandbox_args: Any = None, timeout_s: Any = TIMEOUT_S,
                   limits: Any = None) -> None:
        """What ``__init__`` would refuse on every row, said at task setup (keys only, no value)."""
        if not _positive(timeout_s):
            raise ValueError("timeout_s: expected a number of seconds above 0")
        if not isinstance(limits, (Mapping, type(None))):
            raise ValueError("limits: expected a mapping of limits")
        execution.Limits().replace(**dict(limits or {}))  # (an unknown limit)
        bad = sorted(str(k) for k, v in dict(limits or {}).items() if not _positive(v))
        if bad:
            raise ValueError(f"limits.{', limits.'.join(bad)}: expected a number above 0")
        execution.check_sandbox(sandbox, sandbox_args, lambda key, problem: ValueError(f"{key}: {problem}"))

    @property
    def files(self) -> Mapping[str, str]:
        """The row's ``sandbox.files``, in every call's fresh folder."""
        return self.row.files

    def functions(self) -> list[str]:
        return [self.function]

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        extra = sorted(set(arguments) - {self.parameter})
        if extra:
            raise TypeError(f"{self.function}() takes one argument, {self.parameter}; not {', '.join(extra)}")
        text = arguments.get(self.parameter)
        if not isinstance(text, str):
            raise TypeError(f"{self.function}() needs {self.parameter} as a string")
        job = self.job(text)
        self.calls += 1
        result = self.box.run(job)
        if result.status == execution.Status.ERROR:  # the row's setting could not be prepared: not the model's doing
            raise tools.RowFailed(f"sandbox {self.box.name}: {result.reason}"[:400])
        return result_text(result, self.limits)

    def job(self, text: str) -> execution.Job:
        raise NotImplementedError

    def definitions(self) -> list[dict]:
        return [{"type": "function", "function": {
            "name": self.function, "description": self.description,
            "parameters": {"type": "object", "required": [self.parameter], "properties": {
                self.parameter: {"type": "string", "description": self.parameter_description}}}}}]

    def state(self) -> dict:
        return {"calls": self.calls}


class PythonTool(CodeTool):
    function, parameter = "python", "code"
    description = ("Run a Python program and read what it prints. Each call is a new program in a fresh "
                   "folder: nothing is kept from one call to the next, and only what it prints (print()) "
                   "comes back. No network.")
    parameter_description = "The Python program to run."

    def job(self, text: str) -> execution.Job:
        return replace(self.row, command=(execution.Job.PYTHON, "-"), stdin=text)


class BashTool(CodeTool):
    function, parameter = "bash", "cmd"
    description = ("Run a bash command line and read its output. Each call starts in a fresh folder: "
                   "nothing is kept from one call to the next. No network.")
    parameter_description = "The command line to run."

    def job(self, text: str) -> execution.Job:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size >= MAX_COMMAND_BYTES:  # (no process could start with it: the model's to read, not the row's error)
            raise ValueError(f"bash() takes a command line under {MAX_COMMAND_BYTES} bytes, not {size}; "
                             f"run a longer program with python")
        return replace(self.row, command=("bash", "-c", text))


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def result_text(result: execution.JobResult, limits: execution.Limits) -> str:
    """The job's output for the model, and how it ended when it did not simply succeed."""
    out = result.stdout
    if result.stderr:
        out += ("" if not out or out.endswith("\n") else "\n") + result.stderr
    if len(out) > SHOWN_CHARS:
        out = out[:SHOWN_CHARS] + f"\n[output cut: {len(out) - SHOWN_CHARS} more characters]"
    status = result.status
    if status == execution.Status.EXITED and result.exit_code == 0:
        return out
    if status == execution.Status.TIMEOUT:
        end = f"[killed: ran past {limits.wall_s:g} s]"
    elif status == execution.Status.OUTPUT_LIMIT:
        end = f"[killed: printed more than {limits.output_bytes} bytes]"
    elif result.exit_code is not None and result.exit_code < 0:
        end = f"[killed by signal {-result.exit_code}]"
    else:
        end = f"[exit status {result.exit_code}]"
    return out + ("" if not out or out.endswith("\n") else "\n") + end
