"""Chat templates: a model's Jinja chat template, rendered as transformers 5 renders it.

A chat model was trained on text laid out by its template, so the router must lay a chat
out byte for byte as `tokenizer.apply_chat_template` would, without importing transformers
(most of a second and some 60 MB more in the router). What a template sees and may do is
therefore transformers' own (transformers/utils/chat_template_utils.py,
`_cached_compile_jinja_template` and `render_jinja_template`), copied here:

- jinja2's ImmutableSandboxedEnvironment (a template is the checkpoint author's code),
  with trim_blocks, lstrip_blocks and the loopcontrols extension ({% break %}, {% continue %});
- `tojson` as json.dumps (no HTML escaping, non-ASCII kept; indent, separators, sort_keys),
  `raise_exception(message)`, `strftime_now(format)`, a `dict` that only constructs, and a
  `namespace` that refuses underscore names; `{% generation %}` blocks render their body
  (transformers tracks them for training masks, which a server never asks for);
- the variables: messages, tools, documents, add_generation_prompt, the tokenizer's named
  special tokens (bos_token, eos_token, ...), and the caller's extra ones over those;
- the messages: keys whose value is None dropped; a reasoning under an older name
  (thinking, reasoning) also given as reasoning_content and thinking.

One difference, on purpose: a message's content given as OpenAI parts is flattened to its
text parts joined by newlines before rendering (transformers passes the list on, and most
templates only concatenate strings). Not copied: continue_final_message and
sanitize_control_tokens (a control token written in a message is encoded as that token, as
transformers does by default).

Where a checkpoint's template comes from, as transformers' from_pretrained finds it:
chat_template.jinja (and additional_chat_templates/*.jinja, by name), else the
"chat_template" of tokenizer_config.json (a string, or a list of {"name", "template"});
the one named "default" is used, "tool_use" when the request has tools and there is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from router.requests.text import preset_of

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""transformers' SPECIAL_TOKENS_ATTRIBUTES: the special tokens every template may name."""
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; templates read the first (and gpt-oss's the second)."""


class ChatTemplateError(ValueError):
    """A chat its template could not render (the template refused it, or the chat lacks
    what the template reads), or a template that does not compile: said in one line."""


class _Refusal(jinja2.TemplateError):
    """What a template's raise_exception(message) raises."""


@dataclass(frozen=True, eq=False)
class ChatTemplate:
    """A model's compiled chat template with the special tokens it may name and the
    tokenizer its text is encoded with."""

    template: jinja2.Template
    """The template used without tools, or when there is no tool_use one."""
    tokenizer: Any
    """The `tokenizers.Tokenizer` of `token_ids`."""
    special_tokens: dict[str, str] = field(default_factory=dict)
    """bos_token, eos_token, ... as the tokenizer's config names them."""
    tool_template: jinja2.Template | None = None
    """The template named "tool_use", for requests with tools."""

    @classmethod
    def load(cls, model: str, tokenizer: Any) -> ChatTemplate | None:
        """The chat template of `model` (a checkpoint directory, or a preset `name[@seed]`),
        or None when it has none, or when there is no tokenizer to encode with. A template
        that does not compile is a ChatTemplateError."""
        if not model or tokenizer is None:
            return None
        root = Path(model)
        if root.is_dir():
            templates = _checkpoint_templates(root)
            config = _read_json(root / "tokenizer_config.json")
            return cls.from_sources(templates, tokenizer, special_tokens(config, root)) if templates else None
        if root.exists():
            return None
        from runtime.engine.preset_tokenizer import CHAT_TEMPLATE, tokenizer_config

        cfg = preset_of(model)
        if cfg is None:
            return None
        return cls.from_sources({"default": CHAT_TEMPLATE}, tokenizer, special_tokens(tokenizer_config(cfg)))

    @classmethod
    def from_sources(cls, templates: dict[str, str], tokenizer: Any,
                     special: dict[str, str] | None = None) -> ChatTemplate:
        """Compile named template sources ("default", optionally "tool_use", others unused)."""
        if "default" not in templates:
            raise ChatTemplateError(f"{len(templates)} chat templates and none named 'default': {sorted(templates)}")
        tool_use = templates.get("tool_use")
        return cls(compile_template(templates["default"]), tokenizer, dict(special or {}),
                   compile_template(tool_use) if tool_use is not None else None)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, *,
               tools: list[dict] | None = None, documents: list[dict] | None = None, **kwargs: Any) -> str:
        """The chat as text, byte for byte what transformers' apply_chat_template(messages,
        tokenize=False, ...) gives; extra kwargs are variables the template may read."""
        _check_objects("tools", tools)
        _check_objects("documents", documents)
        template = self.tool_template if tools is not None and self.tool_template is not None else self.template
        chat = normalize_messages(messages)
        try:
            return template.render(messages=chat, tools=tools, documents=documents,
                                   add_generation_prompt=add_generation_prompt, **{**self.special_tokens, **kwargs})
        except _Refusal as exc:
            raise ChatTemplateError(_one_line(f"the chat template refused this chat: {exc.message}")) from None
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, ArithmeticError) as exc:
            failed = f"the chat template failed on this chat: {type(exc).__name__}: {exc}"
            raise ChatTemplateError(_one_line(failed)) from None

    def token_ids(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """The rendered chat's token ids, encoded without adding special tokens (the template
        writes its own), as apply_chat_template(tokenize=True) encodes it."""
        text = self.render(messages, add_generation_prompt, **kwargs)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def normalize_messages(messages: Any) -> list[dict]:
    """The messages as the template sees them: objects, None values dropped, content parts
    flattened to text, reasoning aliased (as transformers' _alias_reasoning_fields)."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"message {i} is a {type(message).__name__}, not an object")
        message = {key: value for key, value in message.items() if value is not None}
        if isinstance(message.get("content"), list):
            message["content"] = _flatten(i, message["content"])
        reasoning = next((message[key] for key in REASONING_FIELDS if key in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _flatten(index: int, parts: list) -> str:
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ChatTemplateError(f"message {index} has a content part of type {kind!r}; only text parts "
                                    f"(with a string 'text') are served")
        texts.append(part["text"])
    return "\n".join(texts)


def _check_objects(name: str, values: Any) -> None:
    if values is not None and (not isinstance(values, list) or not all(isinstance(v, dict) for v in values)):
        raise ChatTemplateError(f"{name} must be a list of objects")


def special_tokens(config: dict, root: Path | None = None) -> dict[str, str]:
    """The named special tokens a template may read, from a tokenizer_config.json body as
    transformers reads it: the seven named ones and any other `*_token` key (a string, or an
    added token's {"content": ...}), and the names of an `extra_special_tokens` object; a
    special_tokens_map.json beside it overrides them when the config has no added_tokens_decoder."""
    config = dict(config)
    if root is not None and "added_tokens_decoder" not in config:
        config.update(_read_json(root / "special_tokens_map.json"))
    found = {key: _token_text(value) for key, value in config.items() if key.endswith("_token")}
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        found.update({key: _token_text(value) for key, value in extra.items()})
    return {key: text for key, text in found.items() if text is not None}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _checkpoint_templates(root: Path) -> dict[str, str]:
    """Template sources by name, as transformers' from_pretrained finds them: the files
    first (then tokenizer_config.json's are not read), else the config's."""
    templates = {}
    if (root / "chat_template.jinja").is_file():
        templates["default"] = (root / "chat_template.jinja").read_text(encoding="utf-8")
    for path in sorted((root / "additional_chat_templates").glob("*.jinja")):
        templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if templates:
        return templates
    source = _read_json(root / "tokenizer_config.json").get("chat_template")
    if isinstance(source, str):
        return {"default": source}
    if isinstance(source, list):
        try:
            return {entry["name"]: entry["template"] for entry in source}
        except (TypeError, KeyError) as exc:
            raise ChatTemplateError(f"{root}/tokenizer_config.json: a chat_template entry lacks {exc}") from None
    return {}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ChatTemplateError(f"{path} is not JSON: {exc}") from None
    return body if isinstance(body, dict) else {}


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """`source` compiled in transformers' environment; a syntax error is a ChatTemplateError."""
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        failed = f"the chat template does not compile: line {exc.lineno}: {exc.message}"
        raise ChatTemplateError(_one_line(failed)) from None


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers'
    AssistantTracker, without the tracking)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """`dict(...)` in a template: a constructor and fromkeys, nothing to reach through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's own signature: `self` may be a keyword
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace cannot hold underscore names, as {name!r}")


def _raise_exception(message: str) -> None:
    raise _Refusal(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_TemplateNamespace)
    return env
