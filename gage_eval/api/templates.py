"""Task templates: sandboxed Jinja2 (:mod:`gage_eval.api.sandbox`) with a fast path for plain
``{{ field }}`` templates, and undefined-name errors that say what is there. Tasks' prompt
templates and judges' prompts render through :class:`Template`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from gage_eval.api.errors import GageError

_env = None


def template_env():
    """The one sandboxed, size-bounded Jinja2 environment (see :mod:`gage_eval.api.sandbox`)."""
    global _env
    if _env is None:
        from gage_eval.api.sandbox import BoundedEnvironment

        _env = BoundedEnvironment()
    return _env


_MISSING = object()
_DICT_ATTRS = frozenset(dir(dict))
_SPECIAL_NAMES = frozenset({"self", "loop", "caller", "varargs", "kwargs", "super"})


def _plain_fields(ast: Any) -> tuple | None:
    """The template's output as parts when it is only literal text and ``{{ name }}``,
    ``{{ name.key }}`` or ``{{ name['key'] }}`` fields (``Question: {{ question }}\nAnswer:``):
    a str is literal text, a ``(name, key)`` pair a field (key None for a bare name). Else None.

    For such a template, when every field's value is a ``str`` (a variable, or a plain ``dict``
    looked into by a key that is no dict attribute), Jinja's output is the text and those very
    strings joined: literal text is written as parsed (the lexer already dropped the trailing
    newline and applied ``-`` whitespace control), the sandbox's finalize passes a string
    through, and ``str()`` of a str is itself. Every other case (a missing name or key, None, a
    number, a subclass) still renders through Jinja, so undefined errors, ``'None'`` and number
    formatting stay Jinja's own."""
    from jinja2 import nodes

    if len(ast.body) != 1 or type(ast.body[0]) is not nodes.Output:
        return None
    if any(n.name in _SPECIAL_NAMES for n in ast.find_all(nodes.Name)):
        return None  # {{ self }} is the template itself in Jinja, not a variable
    parts: list = []
    for expr in ast.body[0].nodes:
        if type(expr) is nodes.TemplateData:
            parts.append(expr.data)
        elif type(expr) is nodes.Name and expr.ctx == "load":
            parts.append((expr.name, None))
        elif type(expr) is nodes.Getattr and type(expr.node) is nodes.Name and expr.node.ctx == "load":
            parts.append((expr.node.name, expr.attr))
        elif (type(expr) is nodes.Getitem and type(expr.node) is nodes.Name and expr.node.ctx == "load"
              and type(expr.arg) is nodes.Const and type(expr.arg.value) is str):
            parts.append((expr.node.name, expr.arg.value))
        else:
            return None
    if not any(type(p) is tuple for p in parts):
        return None  # literal text alone: rare, and Jinja is cheap there
    return tuple(parts)


def _field_value(variables: dict, name: str, key: str | None) -> Any:
    value = variables.get(name, _MISSING)
    if key is None:
        return value
    if type(value) is dict and key not in _DICT_ATTRS:
        return value.get(key, _MISSING)
    return _MISSING


class Template:
    """A compiled template that names its file and line in every error.

    Loading raises :class:`GageError` (a syntax error, include/import/extends); rendering
    raises ``ValueError`` for every failure (the engine writes such a row with stage
    ``template``). ``where`` is the template file, or for a template written inline in
    task.yaml a description such as ``task.yaml: request.choice``.
    """

    def __init__(self, source: str, where: str, *, is_file: bool = False):
        from jinja2 import TemplateSyntaxError

        from gage_eval.api.sandbox import refused_tag

        self.where = where
        self._is_file = is_file
        self._multiline = "\n" in source.strip()
        env = template_env()
        try:
            ast = env.parse(source)
            tag = refused_tag(ast)
            if tag is not None:
                raise GageError(f"{self._at(tag.lineno)}: include/import/extends are not supported: "
                                f"write the template in one file")
            code = env.compile(ast, filename=where)
        except TemplateSyntaxError as exc:
            raise GageError(f"{self._at(exc.lineno)}: template syntax error: {exc.message}") from None
        except (RecursionError, SyntaxError, MemoryError):
            raise GageError(f"{where}: the template is nested too deeply to compile") from None
        self._template = env.template_class.from_code(env, code, env.make_globals(None), None)
        self._parts = _plain_fields(ast)
        # {{ NAME.KEY }} alone (the default choice template): (NAME, KEY) for render_field
        self.lone_field = self._parts[0] if self._parts is not None and len(self._parts) == 1 \
            and self._parts[0][1] is not None and self._parts[0][1] not in _DICT_ATTRS else None
        import gage_eval.api.sandbox as sandbox

        self._sandbox = sandbox  # its MAX_SIZE read at each render, as the Jinja path does


    @classmethod
    def from_file(cls, path: Path) -> "Template":
        try:
            source = path.read_bytes().decode("utf-8-sig")
        except OSError as exc:
            raise GageError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            line = exc.object.count(b"\n", 0, exc.start) + 1
            raise GageError(f"{path}:{line}: not UTF-8 text: {exc.reason}") from None
        return cls(source, str(path), is_file=True)

    def _at(self, line: int | None) -> str:
        if not line:
            return self.where
        if self._is_file:
            return f"{self.where}:{line}"
        return f"{self.where} (line {line})" if self._multiline else self.where

    def render(self, **variables: Any) -> str:
        if self._parts is not None:  # text and {{ name }} / {{ name.key }}: Jinja's answer without running it
            out = self._fast(variables)
            if out is not None:
                return out
        from gage_eval.api.sandbox import MAX_SIZE, TemplateLimit

        try:
            parts, size = [], 0
            for chunk in self._template.generate(**variables):
                size += len(chunk)
                if size > MAX_SIZE:
                    raise TemplateLimit(f"template output larger than {MAX_SIZE} characters")
                parts.append(chunk)
            return "".join(parts)
        except Exception as exc:  # whatever a template does wrong is this row's error, never a traceback
            raise ValueError(self._describe(exc, variables)) from None

    def render_dict(self, variables: dict) -> str:
        """``render(**variables)`` for variables already in a dict (a plain-field template reads
        them without the keyword-argument copy)."""
        if self._parts is not None:
            out = self._fast(variables)
            if out is not None:
                return out
        return self.render(**variables)

    def render_field(self, value: Any, variables: Mapping[str, Any], **more: Any) -> str:
        """``render(NAME=value, **more, **variables)`` for a template that is :attr:`lone_field`
        ``(NAME, KEY)`` alone: a plain dict's str under KEY is the answer, found without building
        the keyword arguments; anything else renders through :meth:`render`."""
        if type(value) is dict:
            text = value.get(self.lone_field[1])
            if type(text) is str and len(text) <= self._sandbox.MAX_SIZE:
                return text
        return self.render(**{self.lone_field[0]: value}, **more, **variables)

    def _fast(self, variables: dict) -> str | None:
        parts = self._parts
        if len(parts) == 1:  # {{ option.content }}, the default choice template
            value = _field_value(variables, *parts[0])
            return value if type(value) is str and len(value) <= self._sandbox.MAX_SIZE else None
        out = []
        for part in parts:
            if type(part) is str:
                out.append(part)
            else:
                name, key = part
                value = variables.get(name, _MISSING)  # _field_value, inlined (a per-row path)
                if key is not None:
                    value = value.get(key, _MISSING) if type(value) is dict and key not in _DICT_ATTRS else _MISSING
                if type(value) is not str:
                    return None
                out.append(value)
        text = "".join(out)
        return text if len(text) <= self._sandbox.MAX_SIZE else None

    def _describe(self, exc: Exception, variables: Mapping[str, Any]) -> str:
        from jinja2 import TemplateError, UndefinedError
        from jinja2.sandbox import SecurityError

        from gage_eval.api.sandbox import TemplateLimit

        line = None
        tb = exc.__traceback__
        while tb is not None:  # the innermost frame of the template's own code
            if tb.tb_frame.f_code.co_filename == self.where:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = self._at(line)
        if isinstance(exc, UndefinedError):
            return f"{where}: {undefined_message(exc, variables)}"
        if isinstance(exc, SecurityError):
            return f"{where}: not allowed in a template: {exc.message}"
        if isinstance(exc, RecursionError):
            return f"{where}: recursion too deep (a macro that calls itself?)"
        if isinstance(exc, TemplateError):
            return f"{where}: {exc.message}"
        if isinstance(exc, MemoryError):
            return f"{where}: out of memory while rendering"
        if isinstance(exc, (TemplateLimit, OverflowError)):
            return f"{where}: {exc}"
        return f"{where}: {type(exc).__name__}: {exc}"


MAX_NAMES_LISTED = 30


def undefined_message(exc: Exception, variables: Mapping[str, Any]) -> str:
    """What an undefined variable, key or attribute error says: the name looked up, and the
    names that are there (the template's variables, or the keys of the value looked into),
    the value named by its path from the variables where it is found (``'sample.metadata'``)."""
    from jinja2.utils import missing

    from gage_eval.api.sandbox import UndefinedName

    available = _listed(list(variables)) if variables else "none (the template gets no variables)"
    if not isinstance(exc, UndefinedName):
        return f"{exc.message}; available: {available}"
    obj, name = exc.obj, exc.name
    if obj is missing:
        return f"{name!r} is undefined; available: {available}"
    path = _path_of(obj, variables)
    label = f"{path!r}" if path else f"a {_kind(obj)}"
    if isinstance(obj, Mapping):
        keys = [str(k) for k in obj]
        return f"{label} has no key {name!r}; " + (f"its keys: {_listed(keys)}" if keys else "it is empty")
    if isinstance(obj, (list, tuple, str)) and isinstance(name, int):
        return f"{label} has no item {name} (it has {len(obj)})"
    return f"{label} ({_kind(obj)}) has no attribute {name!r}" if path else f"{label} has no attribute {name!r}"


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return {str: "string", bool: "boolean", int: "number", float: "number"}.get(type(value), type(value).__name__)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_LISTED])
    return shown + (f", ... ({len(names)} in all)" if len(names) > MAX_NAMES_LISTED else "")


def _path_of(target: Any, variables: Mapping[str, Any], budget: int = 5000) -> str | None:
    """The shortest path (``sample.options[0]``) from the variables to ``target`` itself, if any."""
    queue = [(str(k), v) for k, v in variables.items()]
    for path, value in queue:  # the queue grows while it is read: breadth first
        if value is target:
            return path
        if len(queue) > budget:
            continue
        if isinstance(value, Mapping):
            queue.extend((f"{path}.{k}" if isinstance(k, str) and k.isidentifier() else f"{path}[{k!r}]", v)
                         for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            queue.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None
