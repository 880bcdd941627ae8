"""Tiny language models built from a transformers config (random weights, nothing downloaded), saved with a
word-level tokenizer into a folder as save_pretrained writes one; and small labelled reviews and (prompt,
completion) rows in their vocabulary."""
import itertools
from pathlib import Path

import torch

DETERMINERS = ["the", "this", "that", "a"]
NOUNS = ["movie", "film", "plot", "acting", "story"]
VERBS = ["was", "is"]
ADVERBS = ["very", "quite", "really", "so", "truly"]
GOOD, BAD = ["good", "great", "fine"], ["bad", "awful", "poor"]
WORDS = DETERMINERS + NOUNS + VERBS + ADVERBS + GOOD + BAD + ["it", ".", "!", "question", "answer", ":", "?"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
VOCAB = {w: i for i, w in enumerate(SPECIAL + WORDS)}


def tokenizer(causal: bool):
    """A word-level fast tokenizer: a causal LM's adds <s> in front (as Llama's does), a masked LM's [CLS] and
    [SEP] around the text and has a [MASK] token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if causal:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", VOCAB["<s>"])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="<s>",
                                       eos_token="</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def save_model(folder: Path, architecture: str, layers: int = 2) -> Path:
    """A hidden-32 model of ``architecture`` (llama, gpt2: causal; bert: masked) and its tokenizer in ``folder``."""
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)

    size = dict(vocab_size=len(VOCAB), bos_token_id=VOCAB["<s>"], eos_token_id=VOCAB["</s>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if architecture == "llama":
            model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                                 num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, pad_token_id=0, **size))
        elif architecture == "gpt2":  # tied: the LM head is the token embedding table
            model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=layers, n_head=4, n_positions=64, **size))
        else:
            model = BertForMaskedLM(BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                               num_attention_heads=4, max_position_embeddings=64, pad_token_id=0,
                                               vocab_size=len(VOCAB)))
    model.save_pretrained(folder)
    tokenizer(architecture != "bert").save_pretrained(folder)
    return folder


def reviews(n: int):
    """``n`` distinct one-sentence reviews (text, label), alternating neg and pos."""
    good = itertools.product(DETERMINERS, NOUNS, VERBS, ADVERBS, GOOD)
    bad = itertools.product(DETERMINERS, NOUNS, VERBS, ADVERBS, BAD)
    rows = []
    for i in range(n):
        words = next(good if i % 2 else bad)
        rows.append({"text": " ".join(words) + " .", "label": "pos" if i % 2 else "neg"})
    return rows


def completions(n: int):
    """``n`` distinct (prompt, completion) rows: a review's start, and its last word with a full stop."""
    return [{"q": row["text"].rsplit(" ", 2)[0], "a": " ".join(row["text"].rsplit(" ", 2)[1:])}
            for row in reviews(n)]
