"""A request's prompt as token ids: completions' text or ids, chat's messages through the
model's chat template; tokenized once, here at the router (the gRPC front's text
prompts too: router/requests/text.py)."""

from __future__ import annotations

from typing import Any

from router.requests.chat import ChatTemplate, ChatTemplateError
from router.requests.text import encode

from .errors import ApiError, bad_request
from .schema import ChatRequest, CompletionRequest

MAX_TOKEN_ID = (1 << 32) - 1
RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
"""Template variables a request sets through its own fields, never through chat_template_kwargs."""


class Prompts:
    """The served model's tokenizer and chat template (either may be missing)."""

    def __init__(self, tokenizer: Any | None, template: ChatTemplate | None):
        self.tokenizer = tokenizer
        self.template = template

    def completion(self, req: CompletionRequest) -> tuple[tuple[int, ...], str]:
        """(prompt ids, the prompt's text for `echo`) of a completion request."""
        prompt = req.single_prompt()
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise bad_request("this model has no tokenizer (its checkpoint has no tokenizer.json): "
                                  "send the prompt as token ids", "prompt")
            return tuple(encode(self.tokenizer, prompt)), prompt if req.echo else ""
        bad = next((t for t in prompt if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise bad_request(f"prompt: token id {bad} is not a valid token id", "prompt")
        echo = self.tokenizer.decode(prompt) if req.echo and self.tokenizer is not None else ""
        return tuple(prompt), echo

    def chat(self, req: ChatRequest) -> tuple[int, ...]:
        """The prompt ids of a chat request: its messages rendered by the chat template."""
        if self.template is None:
            raise bad_request("this model has no chat template (chat_template.jinja or tokenizer_config.json's "
                              "chat_template): use /v1/completions", "messages")
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        kwargs = req.chat_template_kwargs or {}
        taken = sorted(RESERVED & kwargs.keys())
        if taken:
            raise bad_request(f"chat_template_kwargs may not set {', '.join(taken)} (the request's own fields)",
                              "chat_template_kwargs")
        try:
            ids = self.template.token_ids(messages, add_generation_prompt=req.add_generation_prompt,
                                          **kwargs)
        except ChatTemplateError as exc:
            raise bad_request(f"messages: the chat template refused them: {exc}", "messages") from None
        if not ids:
            raise ApiError(400, "the chat template rendered an empty prompt", param="messages")
        return tuple(ids)
