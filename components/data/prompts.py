"""Rows a language model reads through a prompt (model.kind causal_lm or masked_lm): the template filled with a
row's text, as token ids, with the positions whose output the loss reads.

A row's features are an int64 array [3, max_length]: token ids, the attention mask, and ``read``, 1 where
the model's output is read:

- label words, masked LM: the template's [MASK] (LM-BFF);
- label words, causal LM: the prompt's last token, whose output predicts the next token, the answer (MeZO);
- completion (causal LM): every position whose next token is one of the completion's tokens.

Rows are padded on the right, so a causal LM's positions never depend on the padding, and the attention
mask hides it from a masked LM: padding does not change a row's loss. The string is tokenised whole (the
model reads text as it was trained on it) and, when too long, the row's text is cut at its end, never the
template nor a completion. The answer follows the template after one space, or directly when the template
ends in whitespace: the same rule for a label word and for a completion.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

TEXT_SLOT = "{text}"
MASK = "[MASK]"  # a template's mark for the tokenizer's own mask token
PROBE = "x"  # the text a template is filled with to find how its label words tokenise


@dataclass(frozen=True)
class Prompt:
    """What turns a row into a language model's ids: the objective (causal, masked), the task (label_words,
    completion) and the template."""

    objective: str
    task: str
    template: str

    @property
    def layout(self) -> str:
        """What a row's ids depend on beyond the tokenizer and length, for its fingerprint's layout."""
        digest = hashlib.sha256(self.template.encode("utf-8")).hexdigest()[:16]
        return f"template={self.objective}:{self.task}:{digest}"


def prompt_of(model) -> Optional[Prompt]:
    """The ``model`` section's prompt as plain values, or None for a model read without one."""
    prompt = getattr(model, "prompt", None)
    if prompt is None:
        return None
    return Prompt("causal" if model.kind == "causal_lm" else "masked", prompt.kind, prompt.template)


def answer_gap(prompt_text: str) -> str:
    """What separates a prompt from its answer: one space, none after whitespace (or an empty prompt)."""
    return "" if not prompt_text or prompt_text[-1].isspace() else " "


def _mask_token(tokenizer) -> str:
    if tokenizer.mask_token is None:
        raise ValueError("model.prompt.template: the model's tokenizer has no mask token for [MASK]; save a masked "
                         "LM's tokenizer with the model")
    return tokenizer.mask_token


def _filled(prompt: Prompt, tokenizer, text: str) -> Tuple[str, int]:
    """(the template with [MASK] as the tokenizer's mask token and ``text`` in its slot, where the text starts)."""
    template = prompt.template
    if prompt.objective == "masked":
        template = template.replace(MASK, _mask_token(tokenizer))
    start = template.index(TEXT_SLOT)
    return template[:start] + text + template[start + len(TEXT_SLOT):], start


def _answer_tokens(offsets, special, boundary: int, where: str) -> List[int]:
    """Indices of the tokens at or after character ``boundary`` (the answer); a token across it is refused,
    since the answer's tokens would then depend on the prompt's last characters."""
    for i, (a, b) in enumerate(offsets):
        if not special[i] and a < boundary < b:
            raise ValueError(f"{where}: the tokenizer joins the prompt's last characters with the answer into one "
                             "token; end the template with a space or a newline")
    return [i for i, (a, b) in enumerate(offsets) if not special[i] and a >= boundary and b > a]


def label_word_ids(tokenizer, prompt: Prompt, words: Sequence[str]) -> List[int]:
    """The token id of each label word as it stands where the answer goes (at [MASK], or after the prompt of
    a causal LM), found by tokenising the template around it; a word that is not exactly one token of the
    vocabulary (several pieces, or the unknown token) is refused in one line naming it."""
    ids = []
    for word in words:
        if prompt.objective == "masked":
            around = prompt.template.replace(TEXT_SLOT, PROBE)
            start = around.index(MASK)
            text = around[:start] + word + around[start + len(MASK):]
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            pieces = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < start + len(word) and b > start]
        else:
            around = prompt.template.replace(TEXT_SLOT, PROBE)
            text = around + answer_gap(around) + word
            enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            pieces = _answer_tokens(enc["offset_mapping"], [0] * len(enc["input_ids"]), len(around),
                                    "model.prompt.template")
        shown = [text[a:b] for a, b in (enc["offset_mapping"][i] for i in pieces)]
        if len(pieces) != 1 or shown[0].strip() != word:
            raise ValueError(f"model.prompt.words: {word!r} is {len(pieces)} tokens of the model's tokenizer "
                             f"({' + '.join(repr(p) for p in shown)}); each label word must be one token: choose "
                             "another word")
        token = enc["input_ids"][pieces[0]]
        if tokenizer.unk_token_id is not None and token == tokenizer.unk_token_id:
            raise ValueError(f"model.prompt.words: {word!r} is not in the model's vocabulary (it reads as the unknown "
                             "token); choose another word")
        ids.append(int(token))
    if len(set(ids)) != len(ids):
        raise ValueError("model.prompt.words: two label words are the same token of the model's tokenizer; give "
                         "distinct words")
    return ids


def _row(tokenizer, prompt: Prompt, text: str, completion: Optional[str], max_length: int,
         encoded=None) -> Tuple[List[int], List[int]]:
    """(ids, read positions) of one row; ``encoded``: its tokenisation already made (a batch's)."""
    causal = prompt.objective == "causal"
    where = "data.source.max_length"
    for _ in range(16):  # each pass cuts the text by the overflow; re-tokenising the cut text may differ a little
        filled, start = _filled(prompt, tokenizer, text)
        whole = filled if completion is None else filled + answer_gap(filled) + completion
        enc = encoded or tokenizer(whole, return_offsets_mapping=True, return_special_tokens_mask=True)
        encoded = None
        ids, offsets, special = list(enc["input_ids"]), list(enc["offset_mapping"]), list(enc["special_tokens_mask"])
        while causal and special and special[-1]:  # the answer comes next: no end-of-text token before it
            ids, offsets, special = ids[:-1], offsets[:-1], special[:-1]
        if len(ids) <= max_length:
            break
        over = len(ids) - max_length
        in_text = [i for i, (a, b) in enumerate(offsets)
                   if not special[i] and a >= start and b <= start + len(text) and b > a]
        if not in_text:
            answer = " and a row's completion" if completion is not None else ""
            raise ValueError(f"{where}: {max_length} tokens do not hold the template{answer}; raise max_length "
                             "or shorten the template")
        text = "" if over >= len(in_text) else text[:offsets[in_text[len(in_text) - over]][0] - start].rstrip()
    else:
        raise ValueError(f"{where}: a row could not be cut to {max_length} tokens; raise max_length")
    if completion is not None:
        answer = _answer_tokens(offsets, special, len(filled), "model.prompt.template")
        if not answer:
            raise ValueError("data.source.completion: a row's completion gives no token; drop empty completions")
        if answer[0] == 0:
            raise ValueError("model.prompt.template: a completion needs a prompt token before it; give the template "
                             "some text, or rows a prompt")
        return ids, [i - 1 for i in answer]
    if causal:
        return ids, [len(ids) - 1]
    mask_id = tokenizer.convert_tokens_to_ids(_mask_token(tokenizer))
    masks = [i for i, t in enumerate(ids) if t == mask_id]
    # the template's [MASK]: where it starts in the filled string (a row's text could hold the token too)
    template = prompt.template.replace(MASK, _mask_token(tokenizer))
    at = template.index(_mask_token(tokenizer))
    if template.index(TEXT_SLOT) < at:
        at += len(text) - len(TEXT_SLOT)
    if not masks:
        raise ValueError(f"{where}: {max_length} tokens do not hold the template's [MASK]; raise max_length")
    return ids, [min(masks, key=lambda i: abs(offsets[i][0] - at))]


def encode_prompted(texts: List[str], tokenizer, max_length: int, prompt: Prompt,
                    completions: Optional[List[str]] = None) -> np.ndarray:
    """int64 [n, 3, max_length]: each row's ids (the template filled with its text, then its completion if
    given), padded on the right; its attention mask; 1 at the positions the loss reads."""
    if (completions is not None) != (prompt.task == "completion"):
        raise ValueError("model.prompt.kind: completion reads (prompt, completion) rows (data.source.kind: "
                         "completions), and label_words labelled text")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    out = np.zeros((len(texts), 3, max_length), dtype=np.int64)
    out[:, 0] = pad
    wholes = []
    for i, text in enumerate(texts):
        filled, _ = _filled(prompt, tokenizer, text)
        wholes.append(filled if completions is None else filled + answer_gap(filled) + completions[i])
    batch = tokenizer(wholes, return_offsets_mapping=True, return_special_tokens_mask=True) if wholes else None
    for i, text in enumerate(texts):
        enc = {k: batch[k][i] for k in ("input_ids", "offset_mapping", "special_tokens_mask")}
        ids, read = _row(tokenizer, prompt, text, None if completions is None else completions[i], max_length, enc)
        out[i, 0, :len(ids)] = ids
        out[i, 1, :len(ids)] = 1
        out[i, 2, read] = 1
    return out
