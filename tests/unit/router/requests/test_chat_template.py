"""Chat templates rendered as transformers 5 renders them (router/requests/chat.py): byte
for byte against transformers' own apply_chat_template, the oracle, over the presets'
template and the layouts real models use; and the errors a client or a checkpoint causes
said in one line."""

from __future__ import annotations

import json

import pytest

from router.requests.chat import ChatTemplate, ChatTemplateError, special_tokens
from runtime.engine.preset_tokenizer import CHAT_TEMPLATE, preset_tokenizer, tokenizer_config
from runtime.engine.presets import preset_config

transformers = pytest.importorskip("transformers")

TINY = preset_config("tiny")

LLAMA3 = (  # Meta-Llama-3-8B-Instruct's
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Laid out over lines and indented, as templates in chat_template.jinja files are: what
# trim_blocks and lstrip_blocks remove is part of what must match.
FEATURES = """{%- set ns = namespace(system=false, turns=0) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- set ns.system = true %}
    {%- endif %}
{%- endfor %}
{{ bos_token }}
{% if not ns.system %}
<<default system>> {{ model_name | default('unnamed') }}
{% endif %}
{% if tools %}
Tools: {{ tools | tojson }}
Pretty: {{ tools | tojson(indent=2, sort_keys=true) }}
{% endif %}
{% if documents %}
    {% for doc in documents %}
Document {{ loop.index }}: {{ doc['title'] }}
    {% endfor %}
{% endif %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}
        {{ raise_exception('Unknown role: ' + message['role']) }}
    {% endif %}
    {% if message['role'] == 'tool' %}
        {% continue %}
    {% endif %}
    {% if ns.turns >= 6 %}
        {% break %}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
[{{ message['role'] }}]
    {% if message.reasoning_content is defined %}
<think>{{ message.reasoning_content }}</think>
    {% endif %}
    {% generation %}{{ message['content'] | trim }}{% endgeneration %}

    {% if message.tool_calls is defined %}
calls={{ message.tool_calls | tojson }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[assistant]{% if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}

{% endif %}
"""

CHATS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "  And 3+3? \n"}],
    [{"role": "user", "content": "ünïcödé ✓ 🐍 \"quoted\" <b>html</b> {{ not a template }} \t tab\n\nend"}],
    [{"role": "user", "content": "call it"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": "é"}}}]},
     {"role": "tool", "content": "3"}, {"role": "assistant", "content": "It is 3.", "reasoning": "1+2", "name": None}],
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add <two> numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def checkpoint(root, chat_template=None, jinja=None, **config):
    """A checkpoint directory's tokenizer files: the tiny preset's tokenizer, a
    tokenizer_config.json (with `chat_template` in it when given), chat_template.jinja."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "tokenizer.json").write_text(preset_tokenizer(TINY).to_str(), encoding="utf-8")
    body = {**tokenizer_config(TINY), **config}
    if chat_template is not None:
        body["chat_template"] = chat_template
    (root / "tokenizer_config.json").write_text(json.dumps(body), encoding="utf-8")
    if jinja is not None:
        (root / "chat_template.jinja").write_text(jinja, encoding="utf-8")
    return root


def both(root):
    """(transformers' tokenizer, our template) of one checkpoint directory."""
    ours = ChatTemplate.load(str(root), preset_tokenizer(TINY))
    assert ours is not None
    return transformers.AutoTokenizer.from_pretrained(str(root)), ours


def assert_same(hf, ours, chat, compare_ids=True, **kwargs):
    for add in (True, False):
        want = hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=add, **kwargs)
        got = ours.render(chat, add_generation_prompt=add, **kwargs)
        assert got == want, (add, got, want)
        if not compare_ids:
            continue
        ids = hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=add, return_dict=False, **kwargs)
        assert ours.token_ids(chat, add_generation_prompt=add, **kwargs) == list(ids)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, LLAMA3, CHATML, FEATURES], ids=["preset", "llama3", "chatml",
                                                                                      "features"])
def test_renders_byte_equal_to_transformers_from_chat_template_jinja(tmp_path, template):
    hf, ours = both(checkpoint(tmp_path, jinja=template + "\n"))  # files end in a newline, which jinja drops
    chats = CHATS[:3] if template in (CHAT_TEMPLATE, LLAMA3, CHATML) else CHATS
    for chat in chats:
        assert_same(hf, ours, chat)


def test_tools_documents_and_extra_variables_reach_the_template_as_in_transformers(tmp_path):
    hf, ours = both(checkpoint(tmp_path, jinja=FEATURES))
    documents = [{"title": "Doc <A>", "text": "x"}, {"title": "B", "text": "y"}]
    for chat in CHATS:
        assert_same(hf, ours, chat, tools=TOOLS, documents=documents, enable_thinking=False, model_name="pd")
    # A caller's variable overrides a special token of the same name, as in transformers.
    assert_same(hf, ours, CHATS[0], bos_token="[BOS]")
    assert ours.render(CHATS[0], bos_token="[BOS]").startswith("[BOS]\n")


def test_templates_in_tokenizer_config_string_and_list_forms(tmp_path):
    hf, ours = both(checkpoint(tmp_path / "string", chat_template=CHATML))
    assert_same(hf, ours, CHATS[1])
    named = [{"name": "default", "template": LLAMA3}, {"name": "tool_use", "template": FEATURES}]
    hf, ours = both(checkpoint(tmp_path / "list", chat_template=named))
    assert_same(hf, ours, CHATS[1])
    assert_same(hf, ours, CHATS[1], tools=TOOLS)  # with tools: the tool_use template
    assert "Tools: " in ours.render(CHATS[1], tools=TOOLS) and "Tools: " not in ours.render(CHATS[1])
    # A chat_template.jinja outranks the config's, as in transformers.
    hf, ours = both(checkpoint(tmp_path / "both", chat_template=LLAMA3, jinja=CHATML))
    assert ours.render(CHATS[0]) == hf.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True)
    assert ours.render(CHATS[0]).startswith("<|im_start|>")


def test_special_tokens_as_strings_added_token_objects_and_model_specific_names(tmp_path):
    root = checkpoint(tmp_path, jinja="{{ bos_token }}|{{ eos_token }}|{{ image_token }}|{{ pad_token }}",
                      eos_token={"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False,
                                 "rstrip": False, "single_word": False, "special": True},
                      image_token="<image>", add_bos_token=True, pad_token=None)
    hf, ours = both(root)
    # The text only: transformers adds a special token its tokenizer.json lacks (<image>) to
    # the vocabulary; a real checkpoint's tokenizer.json has its special tokens.
    assert_same(hf, ours, CHATS[0], compare_ids=False)
    assert ours.render(CHATS[0]) == "<s>|</s>|<image>|"
    assert special_tokens({"bos_token": {"content": "<s>"}, "add_eos_token": False, "sep_token": None}) == {
        "bos_token": "<s>"}


def test_the_preset_template_through_the_preset_name_and_an_exported_checkpoint(tmp_path):
    from runtime.engine.checkpoint import export_preset

    tok = preset_tokenizer(TINY)
    by_name = ChatTemplate.load("tiny@3", tok)
    exported = export_preset("tiny", tmp_path / "tiny")
    hf, ours = both(exported)
    for chat in CHATS[:3]:
        assert by_name.render(chat) == ours.render(chat)
        assert_same(hf, by_name, chat)
    ids = by_name.token_ids(CHATS[0])
    assert ids[:2] == [TINY.bos_token_id, tok.token_to_id("<|user|>")] and ids[-2:] == [
        tok.token_to_id("<|assistant|>"), tok.token_to_id("\u010a")]  # "\n" as a byte-level token
    assert by_name.render(CHATS[0], add_generation_prompt=False).endswith("Hello<|end|>\n")


def test_content_parts_are_flattened_to_their_text_joined_by_newlines():
    ours = ChatTemplate.load("tiny", preset_tokenizer(TINY))
    parts = [{"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]
    assert ours.render(parts) == ours.render([{"role": "user", "content": "first\nsecond"}])
    with pytest.raises(ChatTemplateError, match="content part of type 'image_url'"):
        ours.render([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatTemplateError, match="content part of type 'str'"):
        ours.render([{"role": "user", "content": ["bare"]}])


@pytest.mark.parametrize("template, chat, needle", [
    (CHAT_TEMPLATE, [{"role": "tool", "content": "x"}],
     "the chat template refused this chat: role tool is not one of system, user, assistant"),
    (FEATURES, [{"role": "robot", "content": "x"}], "refused this chat: Unknown role: robot"),
    ("{{ raise_exception('Roles must alternate\n  user/assistant') }}", CHATS[0],
     "refused this chat: Roles must alternate user/assistant$"),
    (CHATML, [{"role": "user"}], "UndefinedError"),  # no content: '...' + undefined
    (CHATML, [{"role": "user", "content": None}], "UndefinedError"),  # None is dropped, as transformers does
    ("{{ missing.attribute }}", CHATS[0], "'missing' is undefined"),
    (CHATML, [{"role": "user", "content": 5}], "TypeError"),
    ("{{ ''.__class__.__mro__ }}", CHATS[0], "SecurityError"),
    ("{% set ns = namespace(_hidden=1) %}", CHATS[0], "underscore"),
    ("{{ messages.append(1) }}", CHATS[0], "SecurityError"),  # immutable: no changing the chat
], ids=["preset-role", "raise_exception", "multi-line", "no-content", "none-content", "undefined", "type", "sandbox",
        "namespace", "immutable"])
def test_errors_a_client_causes_are_chat_template_errors_in_one_line(tmp_path, template, chat, needle):
    ours = ChatTemplate.load(str(checkpoint(tmp_path, jinja=template)), preset_tokenizer(TINY))
    with pytest.raises(ChatTemplateError, match=needle) as info:
        ours.render(chat)
    assert "\n" not in str(info.value) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("messages", [[], "hello", [["user", "hi"]]], ids=["empty", "string", "not-objects"])
def test_messages_that_are_not_a_chat_are_refused(messages):
    ours = ChatTemplate.load("tiny", preset_tokenizer(TINY))
    with pytest.raises(ChatTemplateError, match="non-empty list|not an object"):
        ours.render(messages)
    with pytest.raises(ChatTemplateError, match="tools must be a list of objects"):
        ours.render(CHATS[0], tools=["add"])


def test_a_template_that_does_not_compile_or_cannot_be_chosen_fails_at_load(tmp_path):
    broken = checkpoint(tmp_path / "broken", jinja="{% for message in messages %}\n{{ message }\n")
    with pytest.raises(ChatTemplateError, match=r"does not compile: line 2: unexpected '}'"):
        ChatTemplate.load(str(broken), preset_tokenizer(TINY))
    unnamed = checkpoint(tmp_path / "unnamed", chat_template=[{"name": "rag", "template": CHATML}])
    with pytest.raises(ChatTemplateError, match="none named 'default': \\['rag'\\]"):
        ChatTemplate.load(str(unnamed), preset_tokenizer(TINY))
    bad_entry = checkpoint(tmp_path / "entry", chat_template=[{"template": CHATML}])
    with pytest.raises(ChatTemplateError, match="lacks 'name'"):
        ChatTemplate.load(str(bad_entry), preset_tokenizer(TINY))


def test_no_template_without_one_or_without_a_tokenizer(tmp_path):
    assert ChatTemplate.load(str(checkpoint(tmp_path / "none")), preset_tokenizer(TINY)) is None
    assert ChatTemplate.load("tiny", None) is None and ChatTemplate.load("", preset_tokenizer(TINY)) is None
    assert ChatTemplate.load("no-such-preset", preset_tokenizer(TINY)) is None


def test_strftime_now_and_loop_controls_are_there():
    from router.requests.chat import compile_template

    assert len(compile_template("{{ strftime_now('%Y-%m-%d') }}").render()) == 10
    looped = compile_template("{% for i in range(9) %}{% if i == 2 %}{% continue %}{% endif %}"
                              "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}").render()
    assert looped == "013"
