"""Secrets never reach an output file or a log.

A value is secret by its key (:data:`SECRET_KEY`: ``api_key``, ``hf_token``, ``password``,
``cookie``, every ``header_NAME`` and every value of a ``headers`` mapping, ...) or by being
a known secret string (a backend's ``secrets``). URL user-info (``http://user:PASS@host``)
is secret wherever it appears, and so are the value in ``header_NAME=VALUE`` text (a
command line) and the value of a URL query parameter whose name looks secret
(:func:`is_secret_query_name`: ``?api-key=K``, Azure's form, ``?sig=...``, ``?token=...``).
"""
from __future__ import annotations

import re
import urllib.parse
from typing import Any

REDACTED = "***"

# a key is secret when it is one of these words or ends in one (``openai_api_key``, ``hf_token``,
# ``x-auth``), or names an HTTP header (``header_Cookie``); the special-token names of tokenizers
# (``pad_token``) and counts (``max_tokens``, ``pad_token_id``) are not secrets
SECRET_KEY = re.compile(
    r"^header[_-]."
    r"|(?:^|[_\-.\s])(?:(?:api|secret|private|access|client|session)[_-]?key|apikey"
    r"|(?<!pad.)(?<!eos.)(?<!bos.)(?<!unk.)(?<!sep.)(?<!cls.)(?<!mask.)token"
    r"|secret|password|passwd|passphrase|authorization|auth|bearer|credentials?|cookie)$", re.I)
HEADERS_KEY = re.compile(r"^(?:http[_-])?headers$", re.I)  # a mapping NAME: VALUE whose values are all secret
# scheme://user[:password]@ up to the netloc's last '@', as urllib reads it
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s?#]+@")
HEADER_ARG = re.compile(r"(?i)(?<![\w-])(header_[^=,\s]+=)[^,'\"\n]+")  # a value may hold spaces ("Bearer X")
# query parameters that carry a credential under a name SECRET_KEY does not catch: a bare ``key``
# (Google APIs), ``code`` (Azure Functions), ``sig``/``signature`` (Azure SAS, AWS presigned
# ``X-Amz-Signature``), ``subscription-key`` (Azure API Management); ``api-key``, ``access_token``,
# ``token``, ``x-api-key``, ``password``, ``client_secret`` ... are SECRET_KEY's
SECRET_QUERY_NAME = re.compile(r"^(?:key|code|sig)$|(?:^|[_\-.])(?:signature|subscription[_-]?key)$", re.I)
# ?name=value / &name=value in free text; the value ends where a URL ends in a message or a
# command line does (an argument's comma, a closing quote or bracket)
QUERY_PARAM = re.compile(r"([?&])([^=&#?\s'\"<>]+)=([^&#\s'\"<>,;)\]}]*)")
SHORT = 6  # secrets shorter than this are masked only as whole words (a key "1" must not eat "HTTP 401")


def is_secret_key(key: Any) -> bool:
    key = str(key)
    return bool(SECRET_KEY.search(key)) and not key.endswith("_env")


def is_secret_query_name(name: Any) -> bool:
    """A URL query parameter named ``name`` (percent-encoded or not) carries a credential."""
    name = urllib.parse.unquote_plus(str(name))
    return is_secret_key(name) or bool(SECRET_QUERY_NAME.search(name))


# mappings keyed by names the user chose, not by settings, and how many levels of names: tasks
# (a task "auth"), --data and per-task settings by task, metrics, templates and data files, slices
# by data_tag column, value and metric (a value "password"); what lies under a name is redacted as usual
NAME_LEVELS = {"tasks": 1, "data": 1, "fewshot_data": 1, "task_overrides": 1, "metrics": 1, "templates": 1,
               "slices": 3}


def redact(value: Any, secrets: tuple[str, ...] = (), _names: int = 0) -> Any:
    """A copy of ``value`` with secret keys masked, URL user-info and known secret strings removed."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _names:
                out[k] = redact(v, secrets, _names - 1)
            elif is_secret_key(k) and v not in (None, ""):
                out[k] = REDACTED
            elif HEADERS_KEY.match(str(k)) and isinstance(v, dict):
                out[k] = {name: REDACTED if x not in (None, "") else x for name, x in v.items()}
            else:
                out[k] = redact(v, secrets, NAME_LEVELS.get(str(k), 0))
        return out
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    if isinstance(value, str):  # known secrets first: stripping a header value may split one
        return strip_credentials(scrub(value, secrets))
    return value


def scrub(text: str, secrets: tuple[str, ...], min_len: int = 6) -> str:
    """``text`` with each known secret of at least ``min_len`` characters masked."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        if len(secret) >= min_len:
            text = text.replace(secret, REDACTED)
    return text


def mask(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every secret masked: long ones wherever they are, short ones as whole words.

    For messages a component writes itself: nothing it knows to be secret survives, and a
    short secret (``1``, ``abc``) does not eat into the words around it.
    """
    text = scrub(text, secrets, min_len=SHORT)
    short = sorted({s for s in secrets if s and len(s) < SHORT}, key=len, reverse=True)
    if short:
        pattern = "|".join(re.escape(s) for s in short)
        text = re.sub(rf"(?<![A-Za-z0-9])(?:{pattern})(?![A-Za-z0-9])", REDACTED, text)
    return text


def strip_credentials(text: str) -> str:
    """URL user-info (``http://user:PASS@host`` -> ``http://***@host``), secret query values
    (``?api-key=K`` -> ``?api-key=***``) and ``header_NAME=VALUE`` values masked in free text."""
    if "@" in text:
        text = URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    if "=" in text and ("?" in text or "&" in text):
        text = QUERY_PARAM.sub(_masked_param, text)
    if "header_" in text or "HEADER_" in text:
        text = HEADER_ARG.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def _masked_param(m: re.Match) -> str:
    if m.group(3) and is_secret_query_name(m.group(2)):
        return f"{m.group(1)}{m.group(2)}={REDACTED}"
    return m.group(0)


def query_secrets(url: str) -> list[tuple[str, str]]:
    """The ``(name, value)`` of each query parameter of ``url`` whose name looks secret, as
    written (percent-encoded); empty values left out."""
    query = urllib.parse.urlsplit(url).query
    pairs = (part.partition("=") for part in query.split("&") if part)
    return [(urllib.parse.unquote_plus(name), value) for name, _, value in pairs
            if value and is_secret_query_name(name)]


def masked_url(url: str) -> str:
    """``url`` with each secret query value masked (``?api-key=***&api-version=1``), read as a
    URL rather than as free text: a value may hold any character."""
    parts = urllib.parse.urlsplit(url)
    if not parts.query:
        return url
    query = "&".join(f"{name}={REDACTED}" if value and is_secret_query_name(name) else part
                     for part in parts.query.split("&") for name, _, value in [part.partition("=")])
    return urllib.parse.urlunsplit(parts._replace(query=query))


def secret_forms(value: str) -> list[str]:
    """A query value as written and as a server or a client library may print it: decoded
    (``%2B`` -> ``+``, ``+`` -> space) and encoded again."""
    decoded = urllib.parse.unquote(value)
    forms = [value, decoded, urllib.parse.unquote_plus(value), urllib.parse.quote(decoded, safe=""),
             urllib.parse.quote_plus(decoded, safe="")]
    return list(dict.fromkeys(f for f in forms if f))


def url_credentials(url: str) -> tuple[str, str | None, str | None]:
    """``url`` without its user-info, and the user and password it held (percent-decoded)."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return urllib.parse.urlunsplit(parts._replace(netloc=host)), user, password
