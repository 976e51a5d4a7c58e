"""Turning a Sample into a backend Request with the task's templates and the run's prompt controls.

The run's prompt controls (:class:`gage_eval.config.options.RunOptions`), as lm-evaluation-harness applies
its flags of the same names:

- ``system_prompt``: a system message in a chat prompt (merged with a system message the sample
  has: ours first, then "\\n\\n", then the sample's); in a plain prompt the text is put right
  before everything else, with nothing added between (as lm-eval's ``--system_instruction``:
  end it with a newline if the prompt should start on a line of its own).
- ``gen_kwargs`` (generate tasks only): over the task's ``request.generation`` (with any run
  config ``generation`` override) and the sample's own ``generation_params``/``sampling_params``:
  task < sample < run. A ``temperature`` given without ``do_sample`` decides sampling by itself
  (``temperature > 0`` samples), whatever the task said. lm-eval's ``until`` and ``max_gen_toks``
  are read as ``stop`` and ``max_new_tokens``.
- ``num_fewshot``: ``None`` keeps the task as it is (a sample's own ``few_shot_examples`` are
  rendered as conversation turns); ``0`` is zero-shot (a sample's own examples are left out
  too); ``K > 0`` takes K examples from the task's ``fewshot:`` source (:mod:`gage_eval.tasks.fewshot`)
  in place of the sample's own. Each example is the task's own prompt template rendered for
  it, the target delimiter, its answer (the gold choice's text for a log-likelihood task, its
  label or first reference for a generate task) and the few-shot delimiter (default "\\n\\n").
- ``apply_chat_template``: ``None`` follows the task's ``request.chat``; true or false overrides
  it for every task, log-likelihood ones included. A chat log-likelihood request carries the
  conversation in ``messages`` and no ``prompt``: the backend formats the context with the
  model's chat template (:func:`gage_eval.api.loglikelihood.request_context`), and the choices
  follow without the target delimiter, as lm-eval does.
- ``fewshot_as_multiturn`` (chat only): each example is a user turn and an assistant turn;
  without it the examples and the question share one user turn. ``None`` means "whenever the
  chat template is applied", lm-eval 0.4.13's default.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from gage_eval.api.backend import GENERATE, LOGLIKELIHOOD, LOGLIKELIHOOD_ROLLING, Request
from gage_eval.config.defaults import DEFAULT_SEED
from gage_eval.api.errors import GageError
from gage_eval.tasks.fewshot import DEFAULT_DELIMITER, FewShotConfig, FewShotSampler, load_pool
from gage_eval.api.sample import (LETTERS, content_text, label_text, last_user_text, messages_text, reference_texts,
                              render_few_shot, text_segment)
from gage_eval.api.templates import Template
from gage_eval.tasks.spec import TASK_FILE, TaskSpec
from gage_eval.tasks.toolcheck import check_tool_loop

GEN_KEYS = ("max_new_tokens", "stop", "temperature", "top_p", "top_k", "do_sample", "seed")
GEN_ALIASES = {"until": "stop", "max_gen_toks": "max_new_tokens"}  # lm-eval's names


def normalized_gen(gen: Mapping[str, Any] | None) -> dict:
    """Generation settings with lm-eval's key names read as ours and a lone stop string as a list."""
    out = {GEN_ALIASES.get(k, k): v for k, v in (gen or {}).items()}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


class RequestBuilder:
    """Renders a task's templates for each sample; one instance per task per run.

    ``options`` is the run's :class:`~gage_eval.config.options.RunOptions` (None: the task file alone);
    ``registry`` the plugin registry the few-shot source's loader and preprocessor come from
    (loaded when needed and not given). Raises GageError, naming the task file, for prompt
    controls the task cannot take (``--num-fewshot`` without a ``fewshot:`` source, more
    examples than the source has, multi-turn few-shot without a chat template).
    """

    def __init__(self, spec: TaskSpec, options: Any = None, registry: Any = None, metrics: Sequence[Any] = ()):
        req = spec.request
        task_file = spec.folder / TASK_FILE
        where = f"{task_file}: request"
        self.kind: str = req["kind"]
        forced = getattr(options, "apply_chat_template", None)
        self.chat: bool = bool(req.get("chat", False)) if forced is None else bool(forced)
        if self.kind == LOGLIKELIHOOD_ROLLING:
            _check_rolling(spec, options, where)
            self.chat = False  # a text scored whole has no prompt to format (lm-eval ignores the flag too)
        self.prompt = Template.from_file(spec.folder / req["prompt"]) if req.get("prompt") else None
        self.choice = Template(req.get("choice", "{{ option.content }}"), f"{where}.choice")
        # the description keeps its trailing newlines, as lm-eval's templates do (Jinja drops one: give it one more)
        self.description = Template(req["description"] + "\n", f"{where}.description") if req.get("description") \
            else None
        self.params = dict(spec.params)  # a variant's parameters (task.yaml variants)
        self.delimiter: str = req.get("target_delimiter", " ")
        # each choice is a context and the prompt the one continuation after it (lm-eval's multiple input)
        self.contexts: bool = bool(req.get("choices_are_contexts", False))
        if self.contexts and (self.kind != LOGLIKELIHOOD or self.chat):
            raise GageError(f"{where}.choices_are_contexts: only a plain (not chat) loglikelihood request "
                            f"can put its choices in the context")
        self.gen: dict = normalized_gen(req.get("generation"))
        self.tool_loop: dict | None = dict(req["tool_loop"]) if req.get("tool_loop") else None
        if self.tool_loop is not None and (self.kind != GENERATE or not self.chat):
            raise GageError(f"{where}.tool_loop: a tool loop is a chat: it needs kind generate and chat: true")
        if self.tool_loop is not None:  # its tools and tool_args, refused here rather than on every row
            check_tool_loop(spec, self.tool_loop, registry)
        # only a task with a metric that reads unconditioned scores (acc_mutual_info) pays for them
        self.unconditioned = any(getattr(m, "needs_unconditioned", False) for m in metrics)
        self.gen_override: dict = normalized_gen(getattr(options, "gen_kwargs", None))
        self.system_prompt: str | None = getattr(options, "system_prompt", None) or None
        multiturn = getattr(options, "fewshot_as_multiturn", False)  # None: with the chat template (lm-eval 0.4.13)
        self.multiturn = self.chat if multiturn is None else bool(multiturn)
        if self.multiturn and not self.chat:
            raise GageError(f"task {spec.name!r} ({task_file}): --fewshot-as-multiturn puts each example in a "
                            f"chat turn of its own and needs the chat template: add --apply-chat-template "
                            f"(or request.chat: true in the task file)")
        self.num_fewshot: int | None = getattr(options, "num_fewshot", None)
        given = (getattr(options, "fewshot_data", None) or {}).get(spec.name)
        config = FewShotConfig.from_spec(spec, given)
        self.fewshot_delimiter = config.delimiter if config else DEFAULT_DELIMITER
        self.sampler: FewShotSampler | None = None
        self.fewshot_source: dict | None = None  # summary.json's tasks.NAME.source.fewshot (with examples)
        self.fewshot_note: str | None = None  # a console line when the examples are not the task's usual ones
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise GageError(f"--num-fewshot {self.num_fewshot}: give 0 or a positive number of examples")
        if self.num_fewshot:
            self._fewshot(spec, config, options, registry)
        self._next_index = 0

    def _fewshot(self, spec: TaskSpec, config: FewShotConfig | None, options: Any, registry: Any) -> None:
        """The sampler of ``--num-fewshot K`` examples from the task's (or the run's) source."""
        task_file = spec.folder / TASK_FILE
        if config is None:
            raise GageError(f"--num-fewshot {self.num_fewshot}: task {spec.name!r} has no few-shot source; "
                            f"add a 'fewshot:' section to {task_file} (path: a file of solved rows in the "
                            f"task folder, or split: another split of its dataset), or name a file of "
                            f"solved rows with --fewshot-data {spec.name}=PATH")
        if registry is None:
            from gage_eval.plugins import load_plugins

            registry = load_plugins()[1]
        pool = load_pool(spec, config, registry)
        source_key = config.given or f"{task_file}: key 'fewshot'"
        if self.kind == LOGLIKELIHOOD:
            for shot in pool.rows:
                if _gold_index(shot) is None:
                    raise GageError(f"{source_key}: {pool.described}: sample {shot.get('id')!r} has "
                                    f"no answer among its options, so it cannot be a solved example")
        seed = config.seed if config.seed is not None else int(getattr(options, "seed", DEFAULT_SEED))
        self.sampler = FewShotSampler(pool.rows, self.num_fewshot, sampler=config.sampler, seed=seed,
                                      where=f"task {spec.name!r}: {pool.described}",
                                      leave_out=config.leave_out_evaluated)
        self.fewshot_source, self.fewshot_note = pool.source, pool.note

    def variables(self, sample: Mapping[str, Any], messages: list[dict]) -> dict:
        out = {
            "sample": sample,
            "messages": messages,
            "question": last_user_text(messages),
            "options": sample.get("options") or [],
            "metadata": sample.get("metadata") or {},
            "letters": LETTERS,
        }
        if self.params:  # a variant's parameters (a task without variants has none to offer)
            out["params"] = self.params
        return out

    def choices(self, sample: Mapping[str, Any], variables: dict) -> list[str]:
        options = sample.get("options") or []
        if not options:
            raise ValueError("a log-likelihood task needs options on every sample; this one has none")
        choice = self.choice
        if choice.lone_field is not None and choice.lone_field[0] == "option":  # {{ option.content }}
            return [choice.render_field(o, variables, index=i) for i, o in enumerate(options)]
        return [choice.render(option=o, index=i, **variables) for i, o in enumerate(options)]

    def build(self, sample: Mapping[str, Any], index: int | None = None) -> tuple[Request, dict]:
        """The request for one sample, and the rendered pieces to keep in predict_result.

        ``index`` is the row's position in the task's data, which decides its random few-shot
        examples; without it, the count of earlier calls is used (rows built in order)."""
        if index is None:
            index = self._next_index
        self._next_index = index + 1
        if self.num_fewshot is None:  # the sample's own few-shot examples, if it has any
            messages = render_few_shot(sample) if sample.get("few_shot_examples") else list(sample.get("messages") or [])
            shots: list[tuple[str, str, list]] = []
        else:
            messages = list(sample.get("messages") or [])
            shots = [self._example(s) for s in (self.sampler.examples(sample, index) if self.sampler else [])]
        variables = self.variables(sample, messages)
        rendered = self.prompt.render_dict(variables) if self.prompt else None
        sid = str(sample["id"])
        if self.kind == LOGLIKELIHOOD_ROLLING:  # the text alone: no system prompt, examples nor description
            text = rendered if rendered is not None else messages_text(messages)
            return (Request(kind=LOGLIKELIHOOD_ROLLING, sample_id=sid, continuations=(text,)),
                    {"continuations": [text]})
        if self.kind == LOGLIKELIHOOD:
            choices = self.choices(sample, variables)
            unconditioned = unconditioned_context(sample) if self.unconditioned else None
            if self.chat:
                chat = self._chat_messages(messages, rendered, shots, variables)
                conts = tuple(choices)
                return (Request(kind=LOGLIKELIHOOD, sample_id=sid, messages=tuple(chat), continuations=conts,
                                chat=True, modalities=_modalities(chat), unconditioned=unconditioned),
                        {"prompt": last_user_text(chat), "choices": choices, "continuations": list(conts)})
            if self.contexts:
                return self._multiple_input(sid, choices, rendered if rendered is not None else messages_text(messages),
                                            shots, messages)
            context = self._plain(rendered if rendered is not None else messages_text(messages), shots, variables)
            delimiter = self.delimiter
            conts = tuple([delimiter + c for c in choices])
            return (Request(kind=LOGLIKELIHOOD, sample_id=sid, prompt=context, continuations=conts,
                            modalities=_modalities(messages), unconditioned=unconditioned),
                    {"prompt": context, "choices": choices, "continuations": list(conts)})
        gen = self._generation(sample)
        tools = _tools(sample, self.tool_loop) if self.tool_loop or "tools" in sample else {}
        if self.chat:
            chat = self._chat_messages(messages, rendered, shots, variables)
            prompt = last_user_text(chat)  # (read while the api.sample helpers are at hand, then the modalities)
            return (Request(kind=GENERATE, sample_id=sid, messages=tuple(chat), chat=True, gen=gen,
                            modalities=_modalities(chat), **tools),
                    {"prompt": prompt})
        prompt = self._plain(rendered if rendered is not None else messages_text(messages), shots, variables)
        return (Request(kind=GENERATE, sample_id=sid, prompt=prompt, messages=tuple(messages), gen=gen,
                        modalities=_modalities(messages), **tools),
                {"prompt": prompt})

    # -- pieces ------------------------------------------------------------------------------

    def _multiple_input(self, sid: str, choices: list[str], rendered: str, shots: list[tuple[str, str, list]],
                        messages: list[dict]) -> tuple[Request, dict]:
        """Each choice after the few-shot examples is a context; the rendered prompt after the
        target delimiter is the continuation scored after each (``request.choices_are_contexts``).
        The kept ``prompt`` is that rendered text, ``contexts`` the contexts."""
        contexts = tuple(self._plain(c, shots) for c in choices)
        cont = self.delimiter + rendered
        conts = (cont,) * len(contexts)
        return (Request(kind=LOGLIKELIHOOD, sample_id=sid, contexts=contexts, continuations=conts,
                        modalities=_modalities(messages)),
                {"prompt": rendered, "contexts": list(contexts),
                 "choices": choices, "continuations": list(conts)})

    def _generation(self, sample: Mapping[str, Any]) -> dict:
        gen = dict(self.gen)
        for key in ("generation_params", "sampling_params"):
            gen.update({k: v for k, v in normalized_gen(sample.get(key)).items() if k in GEN_KEYS})
        if self.gen_override:
            if "temperature" in self.gen_override and "do_sample" not in self.gen_override:
                gen.pop("do_sample", None)
            gen.update(self.gen_override)
        return gen

    def _example(self, shot: Mapping[str, Any]) -> tuple[str, str, list]:
        """(the example's prompt text, its answer, the media segments of its user messages)."""
        messages = [m for m in shot.get("messages") or [] if m.get("role") != "system"]
        variables = self.variables(shot, messages)
        question = self.prompt.render(**variables) if self.prompt else messages_text(messages)
        if self.kind == LOGLIKELIHOOD and self.contexts:  # the gold context, then the shared continuation
            return self.choices(shot, variables)[_gold_index(shot)], question, []
        if self.kind == LOGLIKELIHOOD:
            answer = self.choices(shot, variables)[_gold_index(shot)]
        else:
            answer = label_text(shot)
        media = [seg for m in messages if m.get("role") == "user" and isinstance(m.get("content"), list)
                 for seg in m["content"] if isinstance(seg, Mapping) and seg.get("type") != "text"]
        return question, answer, media

    def _shots_text(self, shots: list[tuple[str, str, list]]) -> str:
        # an example without an answer adds its prompt alone, as lm-eval does
        return "".join(q + (self.delimiter + a + self.fewshot_delimiter if a != "" else "") for q, a, _ in shots)

    def _head(self, variables: dict) -> str:
        """--system-prompt and the task's description, joined as lm-eval joins them."""
        head = self.system_prompt or ""
        if self.description is not None:
            text = self.description.render_dict(variables)
            head = _join(head, text, self.fewshot_delimiter) if head and text else head or text
        return head

    def _plain(self, question: str, shots: list[tuple[str, str, list]], variables: dict | None = None) -> str:
        head = self._head(variables or {"params": self.params}) if self.description is not None else self.system_prompt
        if not shots and not head:
            return "" + question  # (a str subclass still comes out a str)
        return (head or "") + self._shots_text(shots) + question

    def _chat_messages(self, messages: list[dict], rendered: str | None,
                       shots: list[tuple[str, str, list]], variables: dict) -> list[dict]:
        head = self._head(variables)  # (first: what follows builds the messages from api.sample's helpers)
        system = [m for m in messages if m.get("role") == "system"]
        rest = [m for m in messages if m.get("role") != "system"]
        if rendered is not None:
            rest = _replace_last_user_text(rest, rendered)
        if shots and self.multiturn:
            turns: list[dict] = []
            for question, answer, media in shots:
                turns.append({"role": "user", "content": list(media) + [text_segment(question)]})
                turns.append({"role": "assistant", "content": [text_segment(answer)]})
            rest = turns + rest
        elif shots:
            rest = _prefix_first_user(rest, self._shots_text(shots), [s for _, _, m in shots for s in m])
        if head:
            own = messages_text(system)
            text = head if not own else _join(head, own, self.fewshot_delimiter)
            system = [{"role": "system", "content": [text_segment(text)]}]
        return system + rest


def _check_rolling(spec: TaskSpec, options: Any, where: str) -> None:
    """A perplexity task scores its text whole: refuse what would change the text (as lm-eval does)."""
    if spec.request.get("chat"):
        raise GageError(f"{where}.chat: a loglikelihood_rolling request scores its text as it is, "
                        f"not through a chat template")
    if getattr(options, "num_fewshot", None):
        raise GageError(f"--num-fewshot {options.num_fewshot}: task {spec.name!r} is a perplexity task "
                        f"(loglikelihood_rolling), which takes no few-shot examples")


def unconditioned_context(sample: Mapping[str, Any]) -> str:
    """The context for a sample's unconditioned scores: its ``unconditioned_input`` (a string, or
    messages as their text), else the empty context lm-eval uses for acc_mutual_info."""
    value = sample.get("unconditioned_input")
    if value is None:
        return ""
    return value if isinstance(value, str) else messages_text(value)


def _join(first: str, second: str, delimiter: str) -> str:
    """lm-eval's rule for a system instruction and a description: the delimiter between them unless
    one already has whitespace at the join."""
    return first + second if first[-1:].isspace() or second[:1].isspace() else first + delimiter + second


def _gold_index(sample: Mapping[str, Any]) -> int | None:
    """The position of the correct option: the label as an option id, else the first reference
    that is an option id or an option's text."""
    options = sample.get("options") or []
    ids = [str(o.get("id")) for o in options]
    contents = [content_text(o.get("content")) for o in options]
    wanted = [str(sample["label"])] if sample.get("label") is not None else reference_texts(sample)
    for answer in wanted:
        if answer in ids:
            return ids.index(answer)
        if answer in contents:
            return contents.index(answer)
    return None


def _tools(sample: Mapping[str, Any], loop: Mapping[str, Any] | None = None) -> dict:
    """The sample's Sample v1 ``tools`` and ``tool_choice`` for a generate request (none: nothing),
    and the task's ``tool_loop`` with the row it runs for."""
    tools = sample.get("tools")
    out = {"tool_loop": {**loop, "row": dict(sample)}} if loop else {}
    if not tools:
        return out
    return {**out, "tools": tuple(tools), "tool_choice": sample.get("tool_choice")}


_TEXT_ONLY = frozenset({"text"})


def segment_types(messages: Iterable[Mapping]) -> set[str]:
    """The content segment types used by the messages (``text``, ``image_url``, ...)."""
    found = set()
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            found.add("text")
        elif isinstance(content, list):
            for seg in content:
                if type(seg) is dict or isinstance(seg, Mapping):
                    found.add(seg.get("type", "text"))
    return found



def _modalities(messages: list[dict]) -> frozenset[str]:
    found = segment_types(messages)
    return _TEXT_ONLY if not found or found == _TEXT_ONLY else frozenset(found)


def _prefix_first_user(messages: list[dict], text: str, media: list) -> list[dict]:
    """``text`` put before the first user message's text (and ``media`` before its own media)."""
    out = list(messages)
    for i, message in enumerate(out):
        if message.get("role") == "user":
            content = message.get("content")
            segs = list(content) if isinstance(content, list) else [text_segment(content_text(content))]
            first_text = next((j for j, s in enumerate(segs) if isinstance(s, Mapping) and s.get("type") == "text"),
                              None)
            if first_text is None:
                segs.append(text_segment(text))
            else:
                segs[first_text] = text_segment(text + str(segs[first_text].get("text", "")))
            out[i] = {**message, "content": list(media) + segs}
            return out
    return out + [{"role": "user", "content": list(media) + [text_segment(text)]}]


def _replace_last_user_text(messages: list[dict], text: str) -> list[dict]:
    """Put the rendered prompt in place of the last user message's text; media segments stay first."""
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            content = out[i].get("content")
            media = [s for s in content if isinstance(s, Mapping) and s.get("type") != "text"] \
                if isinstance(content, list) else []
            out[i] = {**out[i], "content": media + [text_segment(text)]}
            return out
    return out + [{"role": "user", "content": [text_segment(text)]}]


__all__ = ["RequestBuilder", "GENERATE", "LOGLIKELIHOOD", "LOGLIKELIHOOD_ROLLING", "normalized_gen"]
