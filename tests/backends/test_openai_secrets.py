"""Credentials of the openai backend are secret wherever they appear.

The key, URL user-info and every header value reach the server and nothing else: not the
settings, not an error message, not a file of the run folder, not the console. A stored
``***`` is refused, never sent. Also the redaction helpers themselves (gage_eval/api/secrets.py).
"""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from gage_eval.api.backend import Request
from gage_eval.api.errors import FatalBackendError, GageError
from gage_eval.api.secrets import (REDACTED, is_secret_key, is_secret_query_name, mask, masked_url, query_secrets, redact,
                              scrub, strip_credentials, url_credentials)
from gage_plugins_builtin.backends.openai_backend import openai_backend
from openai_fake_server import FakeServer

ROOT = Path(__file__).resolve().parents[2]
TASKS = Path(__file__).resolve().parent / "openai_fault_tasks"
FAST = "model=fake-model,timeout=2,read_timeout=1,max_retries=1,backoff=0.01,backoff_max=0.02,breaker_seconds=0.2"
PASSWORD, COOKIE, XAUTH, KEY = "pw-CANARY-5e1f", "CANARY-cookie-77aa", "CANARY-xauth-19c3", "sk-CANARY-key-4b2d"
CANARIES = (PASSWORD, COOKIE, XAUTH, KEY, "CANARY")


# -- redact.py --------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["api_key", "OPENAI_API_KEY", "hf_token", "access_token", "token", "Authorization",
                                 "password", "db_password", "client_secret", "Cookie", "Set-Cookie", "X-Auth",
                                 "x-api-key", "X-Auth-Token", "credentials", "header_X-Team", "header_Cookie"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["pad_token_id", "pad_token", "eos_token", "max_tokens", "tokenizer", "tokens",
                                 "api_key_env", "authenticated", "sort_key", "base_url", "extra_headers", "model"])
def test_keys_that_are_not_secret(key):
    assert not is_secret_key(key)


def test_redact_masks_secret_keys_header_maps_and_url_user_info():
    config = {"model_args": {"base_url": f"http://bob:{PASSWORD}@h:8000/v1", "header_Cookie": COOKIE,
                             "pad_token_id": 2, "max_tokens": 16, "api_key_env": "MY_KEY"},
              "judge_args": {"headers": {"X-Auth": XAUTH, "X-Empty": ""}},
              "command": f"gage-eval --model-args base_url=http://bob:{PASSWORD}@h/v1,header_X-Auth={XAUTH},x=1",
              "notes": [f"see https://u:{PASSWORD}@h/x"]}
    out = redact(config)
    text = json.dumps(out)
    assert not any(c in text for c in CANARIES), text
    assert out["model_args"] == {"base_url": "http://***@h:8000/v1", "header_Cookie": REDACTED, "pad_token_id": 2,
                                 "max_tokens": 16, "api_key_env": "MY_KEY"}
    assert out["judge_args"]["headers"] == {"X-Auth": REDACTED, "X-Empty": ""}
    assert out["command"] == "gage-eval --model-args base_url=http://***@h/v1,header_X-Auth=***,x=1"
    assert redact({"text": "mail bob@example.org, see http://h/v1"})["text"] == "mail bob@example.org, see http://h/v1"


def test_scrub_and_mask():
    assert scrub("key abcdefgh and abc", ("abcdefgh", "abc")) == "key *** and abc"  # short ones kept (min_len 6)
    assert mask("HTTP 401: key 1 and abcdefgh; abcx", ("1", "abcdefgh", "abc")) == "HTTP 401: key *** and ***; abcx"
    assert mask("a longer-secret-1234 here", ("longer-secret-1234", "secret")) == "a *** here"


def test_a_key_in_the_query_string_is_sent_with_every_request_and_shown_nowhere(monkeypatch):
    """Azure's form, ``base_url=https://host/v1?api-key=K``: the query follows each request's path
    (``/v1/models?...``, ``/v1/chat/completions?...``); settings, errors, counts hold ``***``."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    sig = urllib.parse.quote(QSIG, safe="")
    with FakeServer(echo_headers=True, require_query={"api-key": QKEY, "sig": QSIG, "api-version": "7"}) as a, \
            FakeServer(echo_headers=True, require_query={"api-key": KEY}) as b:
        backend = openai_backend(base_url=f"{a.url}?api-version=7&api-key={QKEY}&sig={sig}|{b.url}/?api-key={KEY}",
                                 max_retries=1, backoff=0.01, endpoint_backoff=0.01)
        try:
            backend.open()  # model discovery carries the query too
            out = backend.run([Request(kind="generate", sample_id=str(i), prompt=f"{f}\nx{i}")
                               for i, f in enumerate(["", "[[faults:400]]", "", "[[faults:400]]"])])
        finally:
            backend.close()
        assert a.rejected == 0 and b.rejected == 0 and backend.model_id == "fake-model"
        assert a.log and b.log  # both endpoints answered, each with its own key
        errors = [o.error for o in out if o.error]
    assert len(errors) == 2 and all("you sent" in e and "api-key=***" in e for e in errors), errors
    assert {QKEY, QSIG, sig, KEY, "CANARY%2Bsig/5b%3D%3D"} <= set(backend.secrets)  # the last: as aiohttp sends it
    assert backend.settings()["base_url"] == [f"{a.url}?api-version=7&api-key=***&sig=***", f"{b.url}?api-key=***"]
    shown = json.dumps([backend.settings(), backend.endpoint_counts(), backend.stats(), errors])
    assert not any(c in shown for c in (QKEY, QSIG, sig, KEY, "CANARY")), shown


def test_a_query_key_on_a_dead_server_is_in_no_message(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    backend = openai_backend(base_url=f"http://127.0.0.1:9?api-key={QKEY}", timeout=2, max_retries=0)
    try:
        assert backend.base_url == "http://127.0.0.1:9/v1?api-key=***"  # /v1 goes before the query
        with pytest.raises(GageError) as exc:
            backend.open()
        out = openai_backend(base_url=f"http://127.0.0.1:9?api-key={QKEY}", model="m", timeout=2, max_retries=0)
        try:
            error = out.run([Request(kind="generate", sample_id="a", prompt="q")])[0].error
        finally:
            out.close()
    finally:
        backend.close()
    assert "http://127.0.0.1:9/v1/models" in str(exc.value) and "http://127.0.0.1:9/v1/completions:" in error
    assert QKEY not in str(exc.value) + error


def test_url_credentials():
    assert url_credentials("http://h:1/v1") == ("http://h:1/v1", None, None)
    assert url_credentials("https://u%40x:p%3Aw@h:1/v1") == ("https://h:1/v1", "u@x", "p:w")
    assert url_credentials("http://tok@h/v1") == ("http://h/v1", "tok", None)
    assert strip_credentials("http://u:p@ss@h/v1 and ftp://x@y") == "http://***@h/v1 and ftp://***@y"


QKEY, QSIG = "CANARY-query-key-3d9a", "CANARY+sig/5b=="  # a SAS signature holds + / =


@pytest.mark.parametrize("name", ["api-key", "api_key", "key", "Key", "code", "sig", "token", "access_token",
                                  "X-Amz-Signature", "subscription-key", "Ocp-Apim-Subscription-Key", "x-api-key",
                                  "client_secret", "password", "auth", "api%2Dkey"])
def test_secret_query_names(name):
    assert is_secret_query_name(name)


@pytest.mark.parametrize("name", ["api-version", "model", "deployment", "max_tokens", "pad_token", "sort_key",
                                  "keys", "region", "se", "sp", "format"])
def test_query_names_that_are_not_secret(name):
    assert not is_secret_query_name(name)


def test_query_secrets_are_masked_in_text_settings_and_urls():
    url = f"https://h.example/openai/v1?api-version=2024-02-01&api-key={QKEY}"
    assert strip_credentials(f"GET {url}/models failed") == \
        "GET https://h.example/openai/v1?api-version=2024-02-01&api-key=*** failed"
    assert strip_credentials(f"--model-args base_url={url},model=m") == \
        "--model-args base_url=https://h.example/openai/v1?api-version=2024-02-01&api-key=***,model=m"
    assert strip_credentials(f"url='http://h/v1?x=1&sig={QSIG}' ok") == "url='http://h/v1?x=1&sig=***' ok"
    assert strip_credentials("a=b?c and http://h/v1?key=&api-version=1") == "a=b?c and http://h/v1?key=&api-version=1"
    assert redact({"model_args": {"base_url": url}}) == \
        {"model_args": {"base_url": "https://h.example/openai/v1?api-version=2024-02-01&api-key=***"}}
    sas = f"https://h/v1?sv=2022&sig={urllib.parse.quote(QSIG, safe='')}&se=2030"
    assert masked_url(sas) == "https://h/v1?sv=2022&sig=***&se=2030"
    assert query_secrets(sas) == [("sig", urllib.parse.quote(QSIG, safe=""))]


# -- the backend: credentials sent, never shown --------------------------------------------------

def test_url_user_info_is_sent_as_basic_auth_and_shown_nowhere(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # the default key yields to the URL's credentials
    with FakeServer(fault="500") as server:
        url = server.url.replace("://", f"://bob:{PASSWORD}@")
        backend = openai_backend(base_url=url, timeout=2, max_retries=0, header_Cookie=COOKIE,
                                 **{"header_X-Auth": XAUTH})
        try:
            backend.open()  # model discovery with a URL password and a key: no crash
            out = backend.run([Request(kind="generate", sample_id="a", prompt="q\nx")])
        finally:
            backend.close()
        assert backend.model_id == "fake-model"
        basic = "Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
        assert server.model_lookups[0]["authorization"] == basic
        sent = server.log[0]["headers"]
        assert sent["authorization"] == basic and sent["cookie"] == COOKIE and sent["x-auth"] == XAUTH
    assert {PASSWORD, f"bob:{PASSWORD}", COOKIE, XAUTH, KEY} <= set(backend.secrets)
    shown = json.dumps([backend.settings(), backend.model_id, backend.base_url, out[0].error])
    assert not any(c in shown for c in CANARIES), shown
    assert backend.base_url == server.url and backend.settings()["auth_scheme"] == "basic"
    assert backend.settings()["extra_headers"] == ["Cookie", "X-Auth"]


def test_a_server_quoting_the_credentials_back_is_scrubbed(monkeypatch):
    monkeypatch.setenv("GAGE_TEST_SECRET_KEY", KEY)
    with FakeServer(echo_headers=True) as server:
        backend = openai_backend(base_url=server.url, model="fake-model", api_key_env="GAGE_TEST_SECRET_KEY",
                                 max_retries=1, backoff=0.01, header_Cookie=COOKIE, **{"header_X-Auth": XAUTH})
        try:
            out = backend.run([Request(kind="generate", sample_id=p, prompt=f"[[faults:{p}*5]]\nx")
                               for p in ("400", "500", "503")])
            errors = [o.error for o in out]
            server.fault = "401"
            with pytest.raises(FatalBackendError) as fatal:
                backend.run([Request(kind="generate", sample_id="b", prompt="q\nx")])
        finally:
            backend.close()
        assert KEY in json.dumps(server.log[0]["headers"])  # the key went out ...
    text = json.dumps(errors + [str(fatal.value)])
    assert "you sent" in text and "api_key_env=GAGE_TEST_SECRET_KEY" in text
    assert not any(c in text for c in CANARIES), text  # ... and came back masked


def test_url_user_info_and_an_explicit_key_are_refused_cleanly(monkeypatch):
    monkeypatch.setenv("GAGE_TEST_SECRET_KEY", KEY)
    with pytest.raises(GageError) as exc:
        openai_backend(base_url=f"http://bob:{PASSWORD}@h/v1", api_key_env="GAGE_TEST_SECRET_KEY")
    assert "drop one" in str(exc.value) and not any(c in str(exc.value) for c in CANARIES)
    with pytest.raises(GageError, match="header_Authorization"):
        openai_backend(base_url=f"http://bob:{PASSWORD}@h/v1", header_Authorization=f"Bearer {KEY}")
    with pytest.raises(GageError) as exc:
        openai_backend(base_url=f"ftp://bob:{PASSWORD}@h/v1")
    assert "http://" in str(exc.value) and PASSWORD not in str(exc.value)


def test_explicit_authorization_header_wins_over_the_default_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    b = openai_backend(base_url="http://h/v1", model="m", header_Authorization=f"Token {XAUTH}")
    assert b._headers()["Authorization"] == f"Token {XAUTH}" and b.settings()["auth_scheme"] == "header"
    assert KEY in b.secrets and f"Token {XAUTH}" in b.secrets


@pytest.mark.parametrize("args, env, named", [
    ({"base_url": "http://***@h/v1"}, {}, "base_url"),
    ({"base_url": "http://bob:***@h/v1"}, {}, "base_url"),
    ({"base_url": "http://h/v1", "header_Cookie": REDACTED}, {}, "header_Cookie"),
    ({"base_url": "http://h/v1", "headers": {"X-Auth": REDACTED}}, {}, "header_X-Auth"),
    ({"base_url": "http://h/v1", "api_key_env": "GAGE_STORED_KEY"}, {"GAGE_STORED_KEY": REDACTED}, "GAGE_STORED_KEY"),
    ({"base_url": "http://h/v1"}, {"OPENAI_API_KEY": REDACTED}, "OPENAI_API_KEY"),
    ({"base_url": "http://h/v1?api-version=1&api-key=***"}, {}, "api-key query parameter"),
    ({"base_url": "http://h/v1?sig=%2A%2A%2A"}, {}, "sig query parameter"),
])
def test_the_redacted_placeholder_is_never_sent(args, env, named, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(GageError, match=f"{named}.*placeholder"):
        openai_backend(model="m", **args)


# -- the real command line: no canary in any file or console line ------------------------------------

def run_cli(server_url: str, out: Path, model_args: str, env: dict) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "gage_eval.cli", "--tasks", "http_rows", "--include-path", str(TASKS), "--model",
            "openai", "--model-args", f"base_url={server_url},{FAST},{model_args}", "-o", str(out), "--run-id", "r"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), **env})


def assert_no_canary(out: Path, proc: subprocess.CompletedProcess) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in files) and any(p.name == "summary.json" for p in files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert not any(c in text for c in CANARIES), (path, text[:2000])
    for text in (proc.stdout, proc.stderr):
        assert not any(c in text for c in CANARIES), text
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("fault, status", [("500", 3), ("401", 3)])
def test_cli_run_writes_no_credential(fault, status, tmp_path):
    """URL password, Cookie and X-Auth headers (and the unused default key) through a failing run."""
    with FakeServer(fault=fault, echo_headers=True) as server:
        url = server.url.replace("://", f"://bob:{PASSWORD}@")
        proc = run_cli(url, tmp_path, f"header_Cookie={COOKIE},header_X-Auth={XAUTH}", {"OPENAI_API_KEY": KEY})
        sent = server.log[0]["headers"]
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert sent["cookie"] == COOKIE and sent["x-auth"] == XAUTH and sent["authorization"].startswith("Basic ")
    assert_no_canary(tmp_path, proc)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["model_args"]["base_url"].startswith("http://***@127.0.0.1:")
    assert config["model_args"]["header_Cookie"] == REDACTED


def test_cli_run_with_a_key_writes_no_credential(tmp_path):
    with FakeServer(fault="401", echo_headers=True) as server:
        proc = run_cli(server.url, tmp_path, f"api_key_env=GAGE_TEST_SECRET_KEY,header_Cookie={COOKIE},header_X-Auth={XAUTH}",
                       {"GAGE_TEST_SECRET_KEY": KEY})
        sent = server.log[0]["headers"]
    assert proc.returncode == 3 and "401 Unauthorized" in proc.stdout + proc.stderr
    assert sent["authorization"] == f"Bearer {KEY}"
    assert_no_canary(tmp_path, proc)


def test_cli_refuses_two_credentials_without_showing_them(tmp_path):
    with FakeServer() as server:
        url = server.url.replace("://", f"://bob:{PASSWORD}@")
        proc = run_cli(url, tmp_path, "api_key_env=GAGE_TEST_SECRET_KEY", {"GAGE_TEST_SECRET_KEY": KEY})
        assert server.log == [] and server.model_lookups == []
    assert proc.returncode == 2 and "drop one" in proc.stderr
    for text in (proc.stdout, proc.stderr):
        assert not any(c in text for c in CANARIES) and "Traceback" not in text
