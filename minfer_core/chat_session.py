"""A multi-turn chat over one engine: the conversation is re-rendered with the model's chat
template each turn and only the tokens not already in the KV cache are prefilled."""

from __future__ import annotations

from typing import Callable, Optional

from .chat_template import compile_template, describe_template_error, render_chat
from .engine import Engine, Generation
from .errors import UserError
from .sampling import Sampler, SamplerConfig


class ChatSession:
    def __init__(self, engine: Engine, system: str | None = None, sampling: SamplerConfig | None = None):
        self.engine = engine
        template = engine.gf.metadata.get("tokenizer.chat_template")
        if not template:
            raise UserError(f"{engine.path}: the model has no chat template (tokenizer.chat_template)")
        if not isinstance(template, str):
            raise UserError(f"{engine.path}: chat template: tokenizer.chat_template is a {type(template).__name__}, "
                            "not text")
        self.template = template
        try:  # a template that does not compile fails here, before the first turn
            compile_template(template)
        except Exception as e:
            raise self._template_error(e) from e
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []
        self.sampler = Sampler(sampling or SamplerConfig())

    def prompt_ids(self) -> list[int]:
        tok = self.engine.tok
        bos = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
        try:
            text = render_chat(self.template, self.messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)
        except Exception as e:  # whatever a template raises (bounds included) is the template's problem
            raise self._template_error(e) from e
        if not text:
            raise UserError(f"{self.engine.path}: chat template: rendered nothing for {len(self.messages)} "
                            "message(s); the model's tokenizer.chat_template is broken")
        ids = tok.encode(text, add_special=False, parse_special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids = [tok.bos_id] + ids
        return ids

    def send(self, user: str, n_predict: int = -1, stop=(), on_text: Optional[Callable[[str], None]] = None) -> Generation:
        """Add a user turn, generate the assistant's reply, and keep it in the conversation."""
        self.messages.append({"role": "user", "content": user})
        try:
            ids = self.prompt_ids()
        except UserError:
            self.messages.pop()
            raise
        if len(ids) >= self.engine.model.n_ctx:
            self.messages.pop()
            raise UserError(f"conversation is {len(ids)} tokens, context is {self.engine.model.n_ctx}: raise -c")
        gen = self.engine.generate(ids, n_predict=n_predict, stop=stop, on_text=on_text, sampler=self.sampler)
        self.messages.append({"role": "assistant", "content": gen.text})
        return gen

    def _template_error(self, e: BaseException) -> UserError:
        return UserError(f"{self.engine.path}: chat template: {describe_template_error(e)}")
