"""A multi-turn chat over the CLI's one-sequence engine (:mod:`minfer_core.solo`): the conversation is
re-rendered with the model's chat template each turn, and the engine's prefix cache keeps what the
last turn computed, so mostly the new tokens are prefilled."""

from __future__ import annotations

from typing import Callable, Optional

from .chat_template import compile_template, describe_template_error, render_chat
from .batch_engine import BatchEngine
from .engine import Generation
from .errors import UserError
from .sampling import Sampler, SamplerConfig
from .solo import generate


class ChatSession:
    def __init__(self, be: BatchEngine, system: str | None = None, sampling: SamplerConfig | None = None):
        self.be, self.engine = be, be.engine
        engine = self.engine
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
        gen = generate(self.be, ids, n_predict=n_predict, stop=stop, on_text=on_text, sampler=self.sampler)
        self.messages.append({"role": "assistant", "content": gen.text})
        return gen

    def _template_error(self, e: BaseException) -> UserError:
        return UserError(f"{self.engine.path}: chat template: {describe_template_error(e)}")
