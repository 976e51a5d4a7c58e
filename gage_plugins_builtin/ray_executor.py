"""The Ray executor (``--executor ray``, the extra ``ray``): the model as replicas on a Ray cluster.

The model backend is built and opened once per replica, each a Ray actor holding
``num_cpus`` / ``num_gpus`` of the cluster (from the model args, with ``replicas=N``). The
driver, this process, still reads the rows, judges, scores and writes every record into the
run folder: a Ray run is an ordinary run folder, so resume, report, compare, rescore and
merge work on it unchanged. :class:`RayBackend` stands in for the backend in the engine: a
window of requests is cut into chunks, each replica holds at most two chunks at once
(back-pressure: no more rows are read than are in flight), and outputs are handed on as each
chunk comes back. A replica that dies (its process killed, its node lost) has its chunks sent
to the others, and a replacement starts (``replica_restarts``, default one per replica, in
all); it takes chunks once it has opened the model with the run's settings. Each request is
answered once, so nothing is lost and nothing written twice. When every replica is gone and
no replacement is left the run stops as it does when a backend stops it (the rows not
answered carry the reason and run again on ``--resume``).

``data_parallel_size=N`` (vLLM's spelling) means ``replicas=N``: one engine per replica,
``tensor_parallel_size`` kept inside each and, unless ``num_gpus`` says otherwise, that many
GPUs per replica. vLLM runs no data parallelism inside one offline engine.

Registered through ``gage_register_executors``; nothing here imports Ray until a run opens it.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import uuid
from collections import deque
from typing import Any, Callable, Iterator, Mapping, Sequence

from gage_eval.api import Backend, FatalBackendError, GageError, ModelOutput, Request, running

# model args the executor takes (never passed to the backend)
EXECUTOR_KEYS = ("replicas", "num_cpus", "num_gpus", "replica_restarts")
CHUNKS_IN_FLIGHT = 2  # per replica: one running, one waiting, so no replica idles between chunks
WINDOW_CHUNKS = 4  # a window holds this many chunks per replica: its drain idles at most the last ones


class Plan:
    """How many replicas, what each holds (``replicas``, ``num_cpus``, ``num_gpus``) and how many
    replacements for lost ones a run may start (``replica_restarts``, default: ``replicas``)."""

    def __init__(self, replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0, restarts: int | None = None):
        self.replicas, self.num_cpus, self.num_gpus = replicas, num_cpus, num_gpus
        self.restarts = replicas if restarts is None else restarts

    def describe(self) -> str:
        each = f"{_num(self.num_cpus)} CPU" + (f", {_num(self.num_gpus)} GPU" if self.num_gpus else "")
        return f"{self.replicas} Ray replica{'s' if self.replicas != 1 else ''} ({each} each)"


class RayExecutor(running.Executor):
    """``--executor ray``: the replica plan from the model args, :class:`RayBackend` for the engine."""

    model_args = EXECUTOR_KEYS
    placement_args = (*EXECUTOR_KEYS, "data_parallel_size")  # vLLM's spelling of the replica count

    def plan(self, args: Mapping[str, Any], where: str = "--model-args") -> tuple[dict, Plan]:
        rest = {k: v for k, v in args.items() if k not in EXECUTOR_KEYS}
        dp = rest.pop("data_parallel_size", None)
        replicas = _number(args.get("replicas", dp if dp not in (None, "") else 1), "replicas", where, int, 1)
        if dp not in (None, "") and "replicas" in args and _number(dp, "data_parallel_size", where, int, 1) != replicas:
            raise GageError(f"{where}: data_parallel_size={dp} and replicas={args['replicas']} disagree; "
                            "give one of them (both mean the number of model replicas)")
        tp = rest.get("tensor_parallel_size")
        default_gpus = _number(tp, "tensor_parallel_size", where, int, 1) if tp not in (None, "") else 0
        num_gpus = _number(args.get("num_gpus", default_gpus), "num_gpus", where, float, 0)
        num_cpus = _number(args.get("num_cpus", 1), "num_cpus", where, float, 0)
        if num_gpus > 1 and num_gpus != int(num_gpus):
            raise GageError(f"{where}: num_gpus={args['num_gpus']}: above 1 it must be a whole number of GPUs")
        restarts = _number(args.get("replica_restarts", replicas), "replica_restarts", where, int, 0)
        return rest, Plan(replicas, num_cpus, num_gpus, restarts)

    def refusal(self, args: Mapping[str, Any], options: Mapping[str, Any], where: str = "--model-args") -> str | None:
        """In this process ``replicas`` / ``num_cpus`` / ``num_gpus`` have no meaning: a
        ``replicas`` above 1 is refused with what to use instead, so that no one waits for a run
        they believe four times as fast."""
        given = [k for k in EXECUTOR_KEYS if k in args]
        if given:
            replicas = _number(args.get("replicas", 1), "replicas", where, int, 1)
            hint = (f"replicas={replicas} runs the model as {replicas} replicas on a Ray cluster: add --executor ray"
                    if replicas > 1 else "they only apply with --executor ray")
            return f"{where}: {', '.join(given)}: {hint}"
        if options.get("ray_address"):
            return "--ray-address joins a Ray cluster for --executor ray; add --executor ray"
        return None

    def backend(self, proto: Backend, name: str, build: Callable[[], Backend], plan: Plan,
                options: Mapping[str, Any]) -> Backend:
        return RayBackend(proto, name, build, plan, options.get("ray_address") or None)


def _number(value: Any, key: str, where: str, cast: type, minimum: float) -> Any:
    try:
        number = cast(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or (cast is float and not math.isfinite(number)):
        kind = "a whole number" if cast is int else "a number"
        raise GageError(f"{where}: {key} must be {kind} of at least {_num(minimum)}, not {value!r}")
    return number


def _num(x: float) -> str:
    return str(int(x)) if float(x) == int(x) else str(x)


class Replica:
    """One replica of the model backend, inside a Ray actor: built by ``build``, the core's
    picklable builder (it loads the plugins again in the actor's process), and opened there."""

    def __init__(self, build: Callable[[], Backend]):
        self.backend = build()

    def open(self) -> dict:
        try:
            self.backend.open()
        except GageError as exc:
            return {"error": str(exc)}
        except Exception as exc:  # a message, not a remote traceback
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"model_id": self.backend.model_id, "settings": self.backend.settings(),
                "open_note": getattr(self.backend, "open_note", None)}

    def run(self, requests: list[Request]) -> tuple[list[tuple[int, ModelOutput]], str | None, bool]:
        """The chunk's outputs, why the stream stopped early (if it did) and whether that stop
        is fatal (the backend cannot take more requests)."""
        got: list[tuple[int, ModelOutput]] = []
        stream = getattr(self.backend, "stream", None)  # (a backend not derived from Backend: run whole)
        try:
            for j, out in (stream(requests) if stream is not None else enumerate(self.backend.run(requests))):
                got.append((j, out))
        except GageError as exc:  # FatalBackendError among them: the backend takes no more requests
            return got, str(exc), True
        except Exception as exc:
            return got, f"{type(exc).__name__}: {exc}", False
        return got, None, False

    def close(self) -> None:
        self.backend.close()


class RayBackend(Backend):
    """The model backend as ``plan.replicas`` Ray actors; the engine sees one backend.

    ``proto`` (kept as ``wrapped``) is the backend built in the driver and never opened: it
    answers what the engine asks before ``open()`` (capabilities, secrets, the chunk size) and
    checks the arguments before any actor starts."""

    def __init__(self, proto: Backend, name: str, build: Callable[[], Backend], plan: Plan,
                 address: str | None = None):
        # what each replica runs, built here and never opened; the response cache keys on it
        self.wrapped, self.plan, self.address = proto, plan, address
        self.build = build
        self.name = getattr(proto, "name", name)
        self.transport_args = tuple(getattr(proto, "transport_args", ()) or ())
        self.capabilities = frozenset(getattr(proto, "capabilities", frozenset()))
        self.secrets = tuple(getattr(proto, "secrets", ()) or ())
        self.concurrency = getattr(proto, "concurrency", None)
        self.chunk = max(1, int(getattr(proto, "max_batch", 64) or 64))
        self.max_batch = self.chunk * plan.replicas * WINDOW_CHUNKS
        self._model_id: str | None = None
        self._settings: dict | None = None
        self.open_note: str | None = plan.describe()
        self.actors: list[Any] = []  # the replicas open and taking chunks
        self.dead: list[str] = []  # why each lost replica was lost, in order
        self.restarts_left = plan.restarts
        self._opening: dict[Any, Any] = {}  # a replacement's open() call -> the replacement
        self._started = 0  # replicas started (their names' numbers)
        self._ray: Any = None
        self._actor: Any = None  # the Replica actor class
        self._tag = f"gage-eval-{os.getpid()}-{uuid.uuid4().hex[:6]}"  # `ray list actors` shows whose they are
        self._started_ray = False

    @property
    def model_id(self) -> str:  # type: ignore[override]
        return self._model_id or str(getattr(self.wrapped, "model_id", "unknown"))

    def settings(self) -> dict:
        # the replicas' settings after open(): what the model computed with (the cache keys on them)
        return dict(self._settings) if self._settings is not None else dict(self.wrapped.settings() or {})

    def open(self) -> None:
        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            _reachable(self.address)
            # Ray's notice that its token authentication is on (good news, not a problem) is
            # printed on every start; it is not the run's business
            logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         logging_level=logging.WARNING)
            except Exception as exc:
                where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                hint = ("; a cluster started with token authentication (`ray start`'s default) needs "
                        "RAY_AUTH_MODE=token in this shell, and its token (~/.ray/auth_token or RAY_AUTH_TOKEN)"
                        if self.address and os.environ.get("RAY_AUTH_MODE") != "token" else "")
                raise GageError(f"--executor ray: could not start or join {where}: {_first_line(exc)}{hint}") from None
            self._started_ray = True
        self._check_resources(ray)
        self._actor = ray.remote(Replica)
        self.actors = [self._start() for _ in range(self.plan.replicas)]
        try:
            infos = ray.get([a.open.remote() for a in self.actors])
        except ray.exceptions.RayError as exc:
            raise GageError(f"--executor ray: a model replica failed to start: {_first_line(exc)}") from None
        for k, info in enumerate(infos):
            if "error" in info:
                raise GageError(f"--executor ray: replica {k} could not open the model: {info['error']}")
        self._model_id, self._settings = infos[0]["model_id"], infos[0]["settings"]
        note = infos[0].get("open_note")
        self.open_note = self.plan.describe() + (f"; {note}" if note else "")

    def _start(self) -> Any:
        name = f"{self._tag}-replica-{self._started}"
        self._started += 1
        return self._actor.options(num_cpus=self.plan.num_cpus, num_gpus=self.plan.num_gpus, max_concurrency=1,
                                   name=name).remote(self.build)

    def _lost(self, actor: Any, why: str) -> None:
        """A replica is gone: its chunks go to the others; a replacement starts while the run's
        budget of them (``replica_restarts``) lasts."""
        if actor in self.actors:
            self.actors.remove(actor)
        self.dead.append(why)
        if self.restarts_left > 0:
            self.restarts_left -= 1
            new = self._start()
            self._opening[new.open.remote()] = new
            then = f"; starting a replacement ({self.restarts_left} more allowed)"
        else:
            then = "; no replacement is started (replica_restarts spent)"
        self._warn(f"a Ray replica is gone ({why}); its rows go to the {len(self.actors)} left{then}")

    def _opened(self, ref: Any) -> None:
        """A replacement finished opening: it takes chunks, or it is lost in turn (a failure, or
        settings other than the run's: its answers would not be the run's model's)."""
        new = self._opening.pop(ref)
        try:
            info = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            info = {"error": _first_line(exc)}
        if "error" not in info and info.get("settings") != self._settings:
            info = {"error": "its settings differ from the run's"}
        if "error" in info:
            try:
                self._ray.kill(new)
            except Exception:
                pass
            self._lost(new, f"a replacement could not open the model: {info['error']}")
            return
        self.actors.append(new)
        self._warn(f"a replacement Ray replica is ready ({len(self.actors)} replicas)")

    def _check_resources(self, ray: Any) -> None:
        """Refuse a plan the cluster can never place (its actors would wait for ever)."""
        have = ray.cluster_resources()
        for key, each in (("CPU", self.plan.num_cpus), ("GPU", self.plan.num_gpus)):
            need = each * self.plan.replicas
            if need > have.get(key, 0) + 1e-9:
                raise GageError(f"--executor ray: {self.plan.describe()} need {_num(need)} {key} in all, and the "
                                f"Ray cluster has {_num(have.get(key, 0))}; lower replicas or num_{key.lower()}s "
                                f"(--model-args), or join a bigger cluster with --ray-address")

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, ModelOutput]]:
        """Chunks of the window to the replicas, at most :data:`CHUNKS_IN_FLIGHT` each, outputs
        handed on as each chunk returns; a lost replica's chunks go to the others (and to its
        replacement once that is open)."""
        ray = self._ray
        if not requests:
            return
        size = max(1, min(self.chunk, math.ceil(len(requests) / max(1, len(self.actors)))))
        todo = deque((s, min(s + size, len(requests))) for s in range(0, len(requests), size))
        inflight: dict[Any, tuple[Any, tuple[int, int]]] = {}
        load: dict[int, int] = {}
        try:
            while todo or inflight:
                for a in self.actors:
                    while todo and load.get(id(a), 0) < CHUNKS_IN_FLIGHT:
                        s, e = todo.popleft()
                        inflight[a.run.remote(list(requests[s:e]))] = (a, (s, e))
                        load[id(a)] = load.get(id(a), 0) + 1
                if not inflight and not self._opening:
                    raise FatalBackendError(self._all_dead())
                (ref,), _ = ray.wait([*inflight, *self._opening], num_returns=1)
                if ref in self._opening:
                    self._opened(ref)
                    continue
                a, (s, e) = inflight.pop(ref)
                load[id(a)] -= 1
                try:
                    got, stopped, fatal = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the replica is gone: its chunks go elsewhere
                    if a in self.actors:
                        self._lost(a, _first_line(exc))
                    todo.appendleft((s, e))
                    continue
                except ray.exceptions.RayError as exc:
                    got, stopped, fatal = [], _first_line(exc), False
                yield from self._answers(got, stopped, fatal, s, e)
        finally:
            for ref in inflight:  # an interrupt or a stop: the replicas drop what they hold
                try:
                    ray.cancel(ref)
                except Exception:
                    pass

    def _answers(self, got: list, stopped: str | None, fatal: bool, s: int, e: int
                 ) -> Iterator[tuple[int, ModelOutput]]:
        """A returned chunk's outputs, each request once; the ones it did not answer carry why."""
        answered = set()
        for j, out in got:
            if isinstance(j, int) and 0 <= j < e - s and j not in answered:
                answered.add(j)
                yield s + j, out
        if fatal:
            raise FatalBackendError(stopped or "the model backend stopped")
        for j in range(e - s):
            if j not in answered:
                yield s + j, ModelOutput(error=stopped or f"backend returned no output for request {j} of the chunk")

    def stats(self) -> dict:
        """The replicas: how many the run started with, lost and replaced; and why each was lost."""
        replaced = self.plan.restarts - self.restarts_left
        return {"replicas": self.plan.replicas, "lost": len(self.dead), "replaced": replaced,
                "lost_why": list(self.dead)} if self.dead else {"replicas": self.plan.replicas, "lost": 0}

    def run(self, requests: Sequence[Request]) -> list[ModelOutput]:
        outputs: list[ModelOutput | None] = [None] * len(requests)
        for j, out in self.stream(requests):
            outputs[j] = out
        return [o if o is not None else ModelOutput(error="no output") for o in outputs]

    def _all_dead(self) -> str:
        return (f"every Ray replica of the model is gone ({len(self.dead)} lost, no replacement left; last: "
                f"{self.dead[-1] if self.dead else 'none started'})")

    def _warn(self, message: str) -> None:
        print(f"gage-eval: warning: {message}", file=sys.stderr)

    def close(self) -> None:
        ray = self._ray
        if ray is None:
            return
        try:
            if self.actors:
                ray.get([a.close.remote() for a in self.actors], timeout=60)
        except Exception:
            pass
        for a in [*self.actors, *self._opening.values()]:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors, self._opening = [], {}
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False


def _reachable(address: str | None, timeout: float = 5.0) -> None:
    """An address ``host:port`` (or ``ray://host:port``) that takes no connection is refused at
    once: Ray itself waits a minute or more for a cluster that is not there."""
    if not address or address == "auto":
        return
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise GageError(f"--ray-address: expected HOST:PORT, ray://HOST:PORT or auto, not {address!r}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise GageError(f"--ray-address {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                        "start one with `ray start --head`, or leave --ray-address out for a local one") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_ray() -> Any:
    try:
        import ray
        import ray.exceptions  # noqa: F401
    except ImportError:
        raise GageError("--executor ray needs Ray: pip install 'gage-eval[ray]'") from None
    return ray

