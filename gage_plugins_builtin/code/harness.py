"""The test harness run inside a sandbox (``python harness.py``), stdlib only: reads its job (the
tests, their expected outputs, the nonce) from stdin, in no file the program could read, runs the
program against its tests and prints one verdict line, ``<nonce> <json>``, on the real stdout.

Modes: ``check`` (HumanEval: the program holds its test and ``check(entry_point)``; it passes when
it runs to the end, as OpenAI's reference evaluation decides), ``function`` (each test calls
``entry_point(<input>)`` and compares with ``<output>``, both Python expressions), ``stdio`` (each
test runs the program with ``input`` on stdin and compares its stdout with ``output``).

The nonce keeps what a program prints from passing for the verdict; it does not stop a program that
goes looking for it: in ``check`` and ``function`` modes the program runs in this process (as in
OpenAI's reference, whose program can reach its result list), so it can read the nonce from the
harness's frames and print a verdict of its own, replace what the harness calls (``json.dumps``,
``builtins.eval``) or return an object equal to anything: each passes (shown). Only ``stdio`` mode,
whose program is a child process (this one not dumpable), keeps the verdict out of its reach."""
import builtins
import io
import json
import os
import signal
import subprocess
import sys


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def _short(text, n=200):
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


def _failure(exc):
    if isinstance(exc, Timeout):
        return {"status": "timeout", "reason": "timed out"}
    if isinstance(exc, AssertionError):
        return {"status": "fail", "reason": _short("AssertionError" + (f": {exc}" if str(exc) else ""))}
    return {"status": "error", "reason": _short(f"{type(exc).__name__}: {exc}")}


def _timed(timeout, fn, *args):
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _guard():
    """What OpenAI's reference evaluation disables before a completion runs (its reliability_guard),
    so a completion that calls one fails here as it fails there."""
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
                 "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    import shutil
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


class _NoInput(io.StringIO):
    def read(self, *a, **k):
        raise OSError("stdin is not readable")

    readline = readlines = read


def run_check(job, source):
    out = io.StringIO()
    saved = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr, sys.stdin = out, out, _NoInput()
    try:
        _timed(job["timeout"], exec, compile(source, "program.py", "exec"), {})
        result = {"status": "pass"}
    except BaseException as exc:  # noqa: B036 (a SystemExit fails the check, as in the reference)
        result = _failure(exc)
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved
    return [result]


def run_function(job, source):
    scope = {"__name__": "__main__"}
    try:
        _timed(job["timeout"], exec, compile(source, "program.py", "exec"), scope)
        fn = scope[job["entry_point"]]
    except KeyError:
        return [{"status": "error", "reason": f"the program defines no {job['entry_point']!r}"}] * len(job["tests"])
    except BaseException as exc:  # noqa: B036
        return [_failure(exc)] * len(job["tests"])
    literals = {"true": True, "false": False, "null": None}
    results = []
    for test in job["tests"]:
        try:
            expected = eval(test["output"], dict(literals))
            got = _timed(job["timeout"], eval, f"__f__({test['input']})", {**literals, "__f__": fn})
            results.append({"status": "pass"} if got == expected else
                           {"status": "fail", "reason": _short(f"expected {expected!r}, got {got!r}")})
        except BaseException as exc:  # noqa: B036
            results.append(_failure(exc))
    return results


def _lines(text):
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_stdio(job, program):
    try:  # not dumpable: the program, a child run as the same user, cannot read this memory (/proc/PPID/mem)
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # prctl(PR_SET_DUMPABLE, 0) (Linux; elsewhere, where it cannot, not)
    except (ImportError, OSError, AttributeError):
        pass
    results = []
    for test in job["tests"]:
        try:
            done = subprocess.run([sys.executable, program], input=test["input"], capture_output=True, text=True,
                                  timeout=job["timeout"], errors="replace")
        except subprocess.TimeoutExpired:
            results.append({"status": "timeout", "reason": "timed out"})
            continue
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            results.append({"status": "error", "reason": _short(tail[0])})
        elif _lines(done.stdout) == _lines(test["output"]):
            results.append({"status": "pass"})
        else:
            results.append({"status": "fail", "reason": _short(f"expected {test['output']!r}, got {done.stdout!r}")})
    return results


def main():
    job = json.loads(sys.stdin.read())  # (no file: the program could read the expected outputs from it)
    real_stdout = os.fdopen(os.dup(1), "w")
    signal.signal(signal.SIGALRM, _alarm)
    with open(job["program"], encoding="utf-8") as fh:
        source = fh.read()
    if job["mode"] == "stdio":
        results = run_stdio(job, job["program"])
    else:
        if job.get("guard"):
            _guard()
        results = (run_check if job["mode"] == "check" else run_function)(job, source)
    real_stdout.write(f"\n{job['nonce']} {json.dumps(results)}\n")
    real_stdout.flush()
    os._exit(0)  # no atexit handler or thread of the program's runs after its verdict


if __name__ == "__main__":
    main()
