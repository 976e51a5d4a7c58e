"""The reproducibility record of a run (summary.json ``run.reproducibility``): what produced the
numbers besides the settings and the gage-eval and plugin versions (``run.versions``).

The model libraries' versions come from their installed metadata, never by importing them; the
GPU is named only when torch is already imported by the run (a transformers or vllm backend),
so a dummy or HTTP run never pays for torch. Task folder and data file hashes are the run's
inputs.json fingerprints (:func:`gage_eval.runfolder.rundir.fingerprint`), not computed again; the
templates (small files) are hashed here, and a task folder's git commit is read from the
repository's files without running git.
"""
from __future__ import annotations

import hashlib
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

LIBRARIES = ("torch", "transformers", "vllm", "aiohttp", "datasets", "jinja2", "numpy")
TEMPLATE_SUFFIXES = (".jinja", ".jinja2", ".j2")


def library_versions(names: Iterable[str] = LIBRARIES) -> dict[str, str]:
    """The installed version of each library that is installed (importlib.metadata, no import)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def cpu_model() -> str | None:
    """/proc/cpuinfo's first ``model name`` on Linux, else platform.processor(); None if unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_model() -> dict | None:
    """The CUDA device's name and the device count, only when torch is already imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        return {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    except Exception:  # a broken CUDA setup must not break the summary
        return None


def git_commit(folder: Path) -> str | None:
    """The commit checked out in the git repository holding ``folder`` (read from .git; a
    worktree's or submodule's ``.git`` file followed), or None outside a repository."""
    folder = Path(folder).resolve()
    for parent in (folder, *folder.parents):
        dot = parent / ".git"
        if dot.is_dir():
            return _head_commit(dot)
        if dot.is_file():
            try:
                text = dot.read_text(encoding="utf-8").strip()
            except OSError:
                return None
            if text.startswith("gitdir:"):
                gitdir = Path(text[len("gitdir:"):].strip())
                return _head_commit(gitdir if gitdir.is_absolute() else parent / gitdir)
            return None
    return None


def _head_commit(gitdir: Path) -> str | None:
    try:
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not head.startswith("ref:"):
        return head if _is_sha(head) else None
    ref = head[len("ref:"):].strip()
    common = gitdir
    if (gitdir / "commondir").is_file():  # a linked worktree: refs live in the main repository
        try:
            common = (gitdir / (gitdir / "commondir").read_text(encoding="utf-8").strip()).resolve()
        except OSError:
            pass
    for base in dict.fromkeys((gitdir, common)):
        try:
            sha = (base / ref).read_text(encoding="utf-8").strip()
            if _is_sha(sha):
                return sha
        except OSError:
            pass
        try:
            for line in (base / "packed-refs").read_text(encoding="utf-8").splitlines():
                sha, _, name = line.partition(" ")
                if name.strip() == ref and _is_sha(sha):
                    return sha
        except OSError:
            pass
    return None  # a branch with no commit yet


def _is_sha(text: str) -> bool:
    return len(text) in (40, 64) and all(c in "0123456789abcdef" for c in text)


def templates(folder: Path, request: Mapping[str, Any]) -> dict[str, str]:
    """sha256 of each Jinja2 template file in the task folder (by relative name) and of an inline
    choice template (``request.choice``)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.suffix in TEMPLATE_SUFFIXES and p.is_file() and "__pycache__" not in p.parts:
            out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    choice = request.get("choice")
    if isinstance(choice, str):
        out["request.choice"] = hashlib.sha256(choice.encode()).hexdigest()
    return out


def seeds(options: Any, runs: list) -> dict:
    """The run's seed, each task's few-shot sampler seed (with --num-fewshot) and a generation
    seed set in a task's request."""
    out: dict[str, Any] = {"run": options.seed}
    fewshot, generation = {}, {}
    for tr in runs:
        sampler = getattr(getattr(tr, "builder", None), "sampler", None)
        if sampler is not None:
            fewshot[tr.name] = sampler.seed
        gen_seed = (tr.spec.request.get("generation") or {}).get("seed")
        if gen_seed is not None:
            generation[tr.name] = gen_seed
    if fewshot:
        out["fewshot"] = fewshot
    if generation:
        out["generation"] = generation
    return out


def task_record(spec: Any, fingerprint: Mapping[str, Any]) -> dict:
    folder = Path(spec.folder)
    out = {"folder": fingerprint["task_folder"]["path"], "sha256": fingerprint["task_folder"]["sha256"],
           "templates": templates(folder, spec.request), "data": dict(fingerprint.get("data") or {})}
    commit = git_commit(folder)
    if commit:
        out["git_commit"] = commit
    return out


def reproducibility(options: Any, runs: list, inputs: Mapping[str, Mapping[str, Any]] | None) -> dict:
    """``run.reproducibility`` of summary.json (schemas/summary.schema.json)."""
    inputs = inputs or {}
    return {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
               "platform": platform.platform()},
        "cpu": cpu_model(),
        "gpu": gpu_model(),
        "libraries": library_versions(),
        "tasks": {tr.name: task_record(tr.spec, inputs[tr.name]) for tr in runs if tr.name in inputs},
        "seeds": seeds(options, runs),
    }


def changed_environment(run_dir: Path) -> list[str]:
    """What differs between the software a run folder's summary.json recorded and this
    process's (gage-eval, Python, the model libraries, the plugins loaded), as ``name: then -> now`` lines; empty
    when nothing differs or nothing was recorded. A resume warns with these: its rows would
    mix two environments."""
    from gage_eval import __version__
    from gage_eval.api.errors import GageError
    from gage_eval.api.runfolder import RunFolder
    from gage_eval.plugins import load_plugins, plugin_versions

    try:  # (a summary unreadable or of another shape: nothing to compare, the resume goes on)
        run = RunFolder(run_dir).summary(missing_ok=True, check=False).get("run") or {}
    except GageError:
        return []
    if not isinstance(run, dict):
        return []
    then: dict[str, Any] = {"gage-eval": (run.get("versions") or {}).get("gage_eval")}
    recorded = run.get("reproducibility") or {}
    then["python"] = (recorded.get("python") or {}).get("version")
    then.update(recorded.get("libraries") or {})
    then.update({f"plugin {k}": v for k, v in ((run.get("versions") or {}).get("plugins") or {}).items()})
    pm = load_plugins()[0]  # (the plugins this resume loads, as run.versions.plugins lists them)
    now: dict[str, Any] = {"gage-eval": __version__, "python": platform.python_version(), **library_versions(),
                           **{f"plugin {k}": v for k, v in plugin_versions().items() if pm.get_plugin(k) is not None}}
    return [f"{name}: {then[name]} -> {now.get(name, 'not installed')}"
            for name in sorted(then) if then[name] is not None and then[name] != now.get(name, "not installed")]


def warn_changed_environment(run_dir: Path) -> None:
    """On resume: say what software changed since the run began (not refused: an upgrade rarely
    changes scores, but the rows written before and after may differ)."""
    changed = changed_environment(run_dir)
    if changed:
        print(f"gage-eval: warning: --resume {run_dir}: the software differs from the run's start "
              f"({'; '.join(changed)}); rows written before and after may differ", file=sys.stderr)
