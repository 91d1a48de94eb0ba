"""A tokenizer over the Rust ``tokenizers`` library that loads without importing transformers.

``AutoTokenizer.from_pretrained`` costs seconds of a cold start (transformers 5 imports
torch.distributed, accelerate and its modeling modules on the way). ``FastTokenizer`` is the
part of transformers' tokenizer API that edge-llm and its users call (vocabulary, special
tokens, encode / decode, chat templates) over a ``tokenizers.Tokenizer``. ``from_dir`` builds
it from what ``tokenizer_files.read_tokenizer_dir`` reads, which reproduces transformers'
loading rules for the folders ``fast_path_refusal()`` (re-exported here) accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .chat_template import render_chat
from .tokenizer_files import fast_path_refusal, read_tokenizer_dir

__all__ = ["FastTokenizer", "clean_up_tokenization", "fast_path_refusal"]

# Texts longer than this are encoded through ``encode_batch``, which releases the GIL (the
# single-text ``encode`` holds it: a 1M-character prompt held it for ~2 s on 2 cores, so a
# server thread encoding it stalled the event loop just as much).
GIL_FREE_CHARS = 2048


class FastTokenizer:
    """The part of transformers' tokenizer API that edge-llm and its users call, over a
    ``tokenizers.Tokenizer`` (``backend_tokenizer``). Build it with ``from_dir``.

    Special tokens read as attributes (``bos_token``, ``eos_token_id``, also model-specific ones
    such as ``image_token``) and are None when unset. Outputs equal ``AutoTokenizer``'s for the
    folders ``fast_path_refusal`` accepts.
    """

    def __init__(self, backend: Any, config: Mapping[str, Any], special_tokens: Mapping[str, Any],
                 extra_special_tokens: Sequence[Any], chat_template: str | dict[str, str] | None,
                 name_or_path: str = "") -> None:
        self.backend_tokenizer = backend
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._cleanup_bpe = bool(config.get(
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))
        self.split_special_tokens = bool(config.get("split_special_tokens", False))
        self.model_max_length = config.get("model_max_length")
        self._special = {k: v for k, v in special_tokens.items() if v is not None}
        self._special_names = tuple(special_tokens)
        self._extra_special = [str(t) for t in extra_special_tokens]
        backend.encode_special_tokens = self.split_special_tokens

    # ---- loading ------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path) -> FastTokenizer:
        """Load ``path`` (a folder ``fast_path_refusal`` accepts; ValueError otherwise)."""
        path = Path(path)
        return cls(*read_tokenizer_dir(path), str(path))

    # ---- vocabulary ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """Base vocabulary size, added tokens excluded."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {t.content: i for i, t in sorted(self.added_tokens_decoder.items())}

    # ---- special tokens -----------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        # only reached for names not set on the instance: special tokens and their ids
        base = name.removesuffix("_ids").removesuffix("_id") if name.endswith(("_id", "_ids")) \
            else name
        if base == "extra_special_tokens":
            tokens = list(self.__dict__.get("_extra_special", []))
            return self.convert_tokens_to_ids(tokens) if name != base else tokens
        if base in self.__dict__.get("_special_names", ()):
            value = self.__dict__["_special"].get(base)
            if value is None:
                return None
            return self.convert_tokens_to_ids(str(value)) if name != base else str(value)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens as strings (the variables a chat template sees)."""
        return {k: str(v) for k, v in self._special.items()}

    @property
    def all_special_tokens(self) -> list[str]:
        out: list[str] = []
        for token in [*(str(self._special[k]) for k in self._special_names if k in self._special),
                      *self._extra_special]:
            if token not in out:
                out.append(token)
        return out

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    # ---- encode / decode ----------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text (the post-processor's special tokens when asked)."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes one string, got {type(text).__name__}.")
        if len(text) > GIL_FREE_CHARS:  # same ids; the batch call lets other threads run
            return self.backend_tokenizer.encode_batch(
                [text], add_special_tokens=add_special_tokens)[0].ids
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(self, token_ids: Any, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str | list[str]:
        """Text of ``token_ids`` (an id, a sequence of ids, or a batch of sequences: a list)."""
        ids = token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(seq, skip_special_tokens, clean_up_tokenization_spaces)
                    for seq in ids]
        text = self.backend_tokenizer.decode([int(i) for i in ids],
                                             skip_special_tokens=skip_special_tokens)
        clean = (self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None
                 else clean_up_tokenization_spaces)
        is_bpe = type(self.backend_tokenizer.model).__name__ == "BPE"
        if clean and (not is_bpe or self._cleanup_bpe):  # the clean-up corrupts BPE text
            text = clean_up_tokenization(text)
        return text

    def batch_decode(self, sequences: Iterable[Any], skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces)
                for s in sequences]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False
                              ) -> str | None | list[str | None]:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """Ids of tokens; an unknown token maps to the unk token's id (None without one)."""
        if isinstance(tokens, str):
            found = self.backend_tokenizer.token_to_id(tokens)
            if found is None and self._special.get("unk_token") is not None:
                found = self.backend_tokenizer.token_to_id(str(self._special["unk_token"]))
            return found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self.backend_tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    # ---- chat ---------------------------------------------------------------------------------
    def get_chat_template(self, chat_template: str | None = None,
                          tools: list[dict] | None = None) -> str:
        """The template text: ``chat_template`` (a template, or a name among several), else the
        tokenizer's own ("tool_use" when tools are given and it exists, else "default")."""
        own = self.chat_template
        if isinstance(own, dict):
            if chat_template is not None and chat_template in own:
                return own[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in own:
                    return own["tool_use"]
                if "default" in own:
                    return own["default"]
                raise ValueError("This model has multiple chat templates with no default "
                                 f"specified; name one of {sorted(own)}.")
        if chat_template is not None:
            return chat_template
        if own is None:
            raise ValueError("Cannot use chat template functions because tokenizer.chat_template "
                             "is not set and no template argument was passed.")
        return own

    def apply_chat_template(
        self, conversation: Any, tools: list[dict] | None = None,
        documents: list[dict] | None = None, chat_template: str | None = None,
        add_generation_prompt: bool = False, continue_final_message: bool | str = False,
        tokenize: bool = True, return_dict: bool = True, **kwargs: Any,
    ) -> Any:
        """The rendered chat (``tokenize=False``), else its ids without added special tokens:
        ``{"input_ids", "attention_mask"}`` (``return_dict``, transformers 5's default) or the
        list. Extra keyword arguments become template variables (over the special tokens)."""
        if kwargs.get("return_assistant_tokens_mask") or kwargs.get("return_tensors"):
            raise ValueError("return_assistant_tokens_mask and return_tensors need transformers' "
                             "tokenizer.")
        source = self.get_chat_template(chat_template, tools)
        text = render_chat(source, conversation, add_generation_prompt=add_generation_prompt,
                           continue_final_message=continue_final_message, tools=tools,
                           documents=documents, variables={**self.special_tokens_map, **kwargs})
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids

    def __repr__(self) -> str:
        return (f"FastTokenizer(name_or_path={self.name_or_path!r}, vocab={len(self)}, "
                f"special_tokens={self.special_tokens_map})")


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: no space before punctuation and contractions."""
    for old, new in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                     (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"),
                     (" 're", "'re")):
        text = text.replace(old, new)
    return text
