"""The seed's Python API, kept: ``LLaMA.build(...)`` and batched ``text_completion``."""
from __future__ import annotations

from pathlib import Path

from core.checkpoints import load
from core.engine.engine import Engine
from core.engine.events import Done
from core.engine.settings import SamplingParams
from core.errors import SettingsError
from core.prompt.chat_format import chat_format_for
from core.tokenizer import load_tokenizer


class LLaMA:
    """A loaded model with a batch-oriented API (prompts in, (tokens, texts) out)."""

    def __init__(self, loaded, max_batch_size: int = 8):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.max_batch_size = max_batch_size
        self.engine = Engine(loaded.model, loaded.tokenizer, stop_ids=loaded.stop_ids)

    @staticmethod
    def build(checkpoints_dir: str | Path, tokenizer_path: str | Path | None = None, load_model: bool = True,
              max_seq_len: int | None = None, max_batch_size: int = 8, device: str = "auto",
              dtype: str = "auto") -> "LLaMA":
        """Load any supported checkpoint (Meta folder, HF folder, .gguf).

        Args:
            tokenizer_path: a tokenizer file to use instead of the checkpoint's own.
            load_model: kept for the seed's signature; a model is always needed to generate.
            max_seq_len: cap the context (and so the KV cache) below the model's own.
            max_batch_size: most prompts per text_completion call.
        """
        if not load_model:
            raise SettingsError("LLaMA.build(load_model=False) has nothing to generate with; "
                                "use core.tokenizer.load_tokenizer for tokenization alone")
        loaded = load(checkpoints_dir, device=device, dtype=dtype, max_seq_len=max_seq_len)
        if tokenizer_path is not None:
            tok = load_tokenizer(tokenizer_path)
            if tok.vocab_size > loaded.args.vocab_size:
                raise SettingsError(f"{tokenizer_path} has {tok.vocab_size} tokens but the model only "
                                    f"{loaded.args.vocab_size}")
            loaded.tokenizer, loaded.chat_format = tok, chat_format_for(tok)
            loaded.stop_ids = set(tok.stop_ids) | loaded.chat_format.stop_ids()
        return LLaMA(loaded, max_batch_size)

    def text_completion(self, prompts: list[str], temperature: float = 0.6, top_p: float = 0.9,
                        max_gen_len: int | None = None, seed: int | None = None) -> tuple[list[list[int]], list[str]]:
        """Continue each prompt (BOS + prompt); greedy when temperature is 0.

        Returns:
            (generated token ids per prompt, generated text per prompt)
        """
        if len(prompts) > self.max_batch_size:
            raise SettingsError(f"{len(prompts)} prompts exceed max_batch_size {self.max_batch_size}")
        max_gen = max_gen_len or self.engine.max_context // 2
        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_gen, seed=seed)
        ids = [self.tokenizer.encode(p, bos=True) for p in prompts]
        done = [d for d in self.engine.generate_batch(ids, params) if isinstance(d, Done)]
        done.sort(key=lambda d: d.lane)
        return [d.tokens for d in done], [d.text for d in done]

    def chat_completion(self, dialogs: list[list[dict]], temperature: float = 0.6, top_p: float = 0.9,
                        max_gen_len: int | None = None, seed: int | None = None) -> list[dict]:
        """Reply to each dialog in the model's chat format."""
        if len(dialogs) > self.max_batch_size:
            raise SettingsError(f"{len(dialogs)} dialogs exceed max_batch_size {self.max_batch_size}")
        max_gen = max_gen_len or self.engine.max_context // 2
        params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_gen, seed=seed)
        ids = [self.loaded.chat_format.encode_dialog(d) for d in dialogs]
        strip = bool(getattr(self.tokenizer, "add_dummy_prefix", False))
        done = [d for d in self.engine.generate_batch(ids, params, strip_leading_space=strip) if isinstance(d, Done)]
        done.sort(key=lambda d: d.lane)
        return [{"role": "assistant", "content": d.text} for d in done]
