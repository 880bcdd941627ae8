"""Public pretraining recipe: a small Llama-architecture decoder and its byte-level BPE tokenizer, pretrained on
English text that ships on this machine, saved with ``save_pretrained`` for ``model.kind: causal_lm``.

No pretrained decoder ships in any package privzo installs, and public pretraining followed by private
fine-tuning is the setting DPZero and PAZO study anyway. The public corpus is read from two places only:

- the English manual pages of the installed Debian packages (``/usr/share/man/man1`` .. ``man8``, roff
  markup stripped, prose lines kept), read in a seeded random order until ``--corpus-mb`` is reached;
- the docstrings of the Python standard library (``ast`` over the interpreter's own ``lib/python3.X``, tests
  and ``site-packages`` excluded).

Never the evaluation task's data: nothing of chatterbot-corpus (nor any other site-packages file) is read.

    .venv/bin/python recipes/pretrain_decoder.py     # ~/.privzo/models/privzo-decoder-v1, unless it is there

makes the decoder of the language-model examples (specs/examples/chatterbot_lm_*.yaml) and of
docs/results_lm.md: 4 layers, hidden 256, 1,500 steps of 8 x 128 tokens on 16 MB of text, 1 thread (about 10
minutes on a 2-core machine), the chatterbot topics' label words kept one token each. It is cached: run again
with the same settings it prints where the decoder is and stops; a folder made with other settings is refused
(choose another --out). ``--minutes`` instead of ``--steps`` sets the steps from the speed of a few throw-away
steps timed first (the steps are printed, and ``--steps N`` repeats the run exactly).

It prints the corpus (documents, MB, tokens), the model (parameters), the steps, the time and the final training
and held-out losses. Given the same settings (seed, corpus, sizes, steps and threads) the run repeats exactly.
Nothing here downloads anything; the output folder is outside the repository, written whole or not at all.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

SPECIAL = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
# the label words of chatterbot's 21 topics (specs/examples/chatterbot_lm_*.yaml take theirs from these)
LABEL_WORDS = ["AI", "me", "code", "computers", "conversation", "emotions", "food", "gossip", "greetings", "health",
               "history", "humor", "literature", "money", "movies", "politics", "psychology", "science", "sports",
               "support", "trivia"]
MAN = Path("/usr/share/man")
ROFF_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")  # \fB, \fI, \fR, \f(CW, \f[B]
ROFF_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|[*nk]\(?..?|s[-+]?\d+|[&|^/,:%!~0-9]|.)")
PROSE = re.compile(r"[A-Za-z][a-z]+")


def man_text(path: Path) -> str:
    """A man page's prose: text lines and the text of font macros (.B, .I, .BR ...), escapes removed; a page
    that only points at another (.so) is empty."""
    try:
        raw = gzip.decompress(path.read_bytes()).decode("utf-8", errors="ignore") if path.suffix == ".gz" \
            else path.read_text(encoding="utf-8", errors="ignore")
    except (OSError, EOFError):
        return ""
    lines, paragraph = [], []
    for line in raw.splitlines():
        if line.startswith(".so "):
            return ""
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].partition(" ")
            if macro in ("B", "I", "BR", "BI", "IR", "IB", "RB", "RI", "SM") and rest:
                line = rest.replace('"', "")
            else:  # a paragraph break, a section heading, a comment: end the paragraph
                if paragraph:
                    lines.append(" ".join(paragraph))
                    paragraph = []
                continue
        line = ROFF_ESCAPE.sub(lambda m: "-" if m.group(0) in ("\\-", "\\(hy", "\\(en", "\\(em") else "",
                               ROFF_FONT.sub("", line)).strip()
        if line:
            paragraph.append(line)
    if paragraph:
        lines.append(" ".join(paragraph))
    # prose: paragraphs of several words, mostly letters (option tables and code are mostly not)
    keep = [p for p in lines if len(PROSE.findall(p)) >= 6 and sum(c.isalpha() or c == " " for c in p) > 0.8 * len(p)]
    return "\n".join(keep)


def stdlib_docstrings() -> list:
    """One document per standard-library module: its module, class and function docstrings."""
    lib = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    docs = []
    for path in sorted(lib.rglob("*.py")):
        parts = path.relative_to(lib).parts
        if parts[0] in ("site-packages", "test", "idlelib", "lib2to3") or "tests" in parts or "test" in parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        strings = [ast.get_docstring(node, clean=True) for node in ast.walk(tree)
                   if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        text = "\n".join(s for s in strings if s and len(PROSE.findall(s)) >= 4)
        if text:
            docs.append(text)
    return docs


def corpus(corpus_mb: float, seed: int) -> tuple:
    """(documents, where each came from): the standard library's docstrings, then man pages in a seeded order
    until ``corpus_mb`` megabytes of text in all."""
    docs = stdlib_docstrings()
    count = {"python stdlib docstrings": len(docs)}
    pages = sorted(p for section in range(1, 9) for p in (MAN / f"man{section}").glob("*") if p.is_file())
    random.Random(seed).shuffle(pages)
    size, count["man pages"] = sum(len(d.encode()) for d in docs), 0
    for page in pages:
        if size >= corpus_mb * 1e6:
            break
        text = man_text(page)
        if len(text) > 200:
            docs.append(text)
            size += len(text.encode())
            count["man pages"] += 1
    random.Random(seed).shuffle(docs)
    return docs, count, size


def train_tokenizer(docs: list, vocab: int, keep_words=()):
    """Byte-level BPE (no unknown token); ``<s>`` in front of every text, as Llama's tokenizer does. Each of
    ``keep_words`` (a later prompt task's label words) becomes one token after a space: the tokenizer's training
    text, never the model's, gets each word a thousand times."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs + [" " + " ".join([word] * 1000) for word in keep_words], trainer)
    split = [w for w in keep_words if len(tok.encode(" " + w).ids) != 1]
    if split:
        raise SystemExit(f"--keep-words: {split} are not one token each; raise --vocab")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build_model(vocab: int, layers: int, hidden: int, context: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(8 * hidden / 3) // 32 * 32,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=context, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def schedule(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path.home() / ".privzo" / "models" / "privzo-decoder-v1"))
    p.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    p.add_argument("--minutes", type=float, default=None, help="instead of --steps: this much training time, "
                   "turned into steps")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256, help="a multiple of 64 (heads of 64)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--context", type=int, default=128, help="tokens per training sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--corpus-mb", type=float, default=16.0)
    p.add_argument("--keep-words", nargs="*", default=LABEL_WORDS, help="words to keep as one token after a space "
                   "(the label words of a prompt task; default: chatterbot's topics'); added to the tokenizer's "
                   "training text only")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the run repeats exactly "
                   "given the same number)")
    p.add_argument("--seed", type=int, default=0)
    return p


def settings_of(args) -> dict:
    """What the decoder depends on: every argument but where it is written."""
    return {k: v for k, v in vars(args).items() if k != "out"}


def cached(out: Path, settings: dict, parser) -> bool:
    """True when ``out`` holds a decoder this recipe made with ``settings``; SystemExit when it holds anything
    else (never overwritten)."""
    facts_path = out / "pretraining.json"
    if not out.exists():
        return False
    try:
        facts = json.loads(facts_path.read_text())
        made = facts.get("settings") or settings_of(parser.parse_args(facts["argv"]))
    except (OSError, ValueError, KeyError, SystemExit):
        raise SystemExit(f"{out} exists and is not a decoder this recipe made (no readable pretraining.json); "
                         "remove it or choose another --out")
    if {k: made.get(k) for k in settings} != settings:
        differ = sorted(k for k in settings if made.get(k) != settings[k])
        raise SystemExit(f"{out} holds a decoder made with other settings ({', '.join(differ)}); remove it or "
                         "choose another --out")
    print(f"cached: {out} (made by this recipe with these settings: {facts['steps']} steps, held-out loss "
          f"{facts['heldout_loss']:.3f}); nothing to do")
    return True


def main(argv=None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if cached(out, settings_of(args), parser):
        return 0
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    docs, count, size = corpus(args.corpus_mb, args.seed)
    tokenizer = train_tokenizer(docs, args.vocab, args.keep_words)
    stream = []
    for doc in docs:  # documents separated by </s>; no <s> inside the stream
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    stream = torch.tensor(stream, dtype=torch.long)
    held = max(args.context * 64, len(stream) // 100)  # the last 1% (at least 64 sequences): held out
    train, valid = stream[:-held], stream[-held:]
    print(f"corpus: {', '.join(f'{n} {k}' for k, n in count.items())}; {size / 1e6:.1f} MB; {len(stream):,} tokens "
          f"({len(train):,} train, {len(valid):,} held out); tokenizer: byte-level BPE, {len(tokenizer)} tokens "
          f"({time.perf_counter() - started:.0f} s)")

    def batch_at(step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        starts = torch.randint(0, len(train) - args.context - 1, (args.batch,), generator=g)
        return torch.stack([train[s:s + args.context] for s in starts.tolist()])

    def train_step(model, optimizer, step, steps) -> float:
        for group in optimizer.param_groups:
            group["lr"] = schedule(step, steps, args.lr, warmup=min(100, steps // 10 + 1))
        ids = batch_at(step)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    def new():
        model = build_model(len(tokenizer), args.layers, args.hidden, args.context, args.seed)
        return model, torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    steps = args.steps
    if args.minutes is not None:  # time a few steps of a throw-away copy; the run itself depends only on the steps
        model, optimizer = new()
        train_step(model, optimizer, 0, 10)
        t0 = time.perf_counter()
        for s in range(1, 6):
            train_step(model, optimizer, s, 10)
        steps = max(10, int(args.minutes * 60 / ((time.perf_counter() - t0) / 5)))
    model, optimizer = new()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: Llama, {args.layers} layers, hidden {args.hidden}, {params / 1e6:.2f} M parameters (embeddings "
          f"tied); {steps} steps of {args.batch} x {args.context} tokens, AdamW, lr {args.lr}, seed {args.seed}")
    model.train()
    t0, recent = time.perf_counter(), []
    for step in range(steps):
        recent = (recent + [train_step(model, optimizer, step, steps)])[-50:]
        if step % 200 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {sum(recent) / len(recent):.3f}  ({(time.perf_counter() - t0) / 60:.1f} min)",
                  flush=True)
    minutes = (time.perf_counter() - t0) / 60
    model.eval()
    with torch.no_grad():
        chunks = valid[: len(valid) // args.context * args.context].view(-1, args.context)
        held_loss = sum(float(model(input_ids=c, labels=c).loss) for c in chunks.split(32)) / len(chunks.split(32))
    facts = {"recipe": "recipes/pretrain_decoder.py", "settings": settings_of(args), "steps": steps,
             "parameters": params, "corpus": count, "corpus_mb": round(size / 1e6, 2), "tokens": len(stream),
             "tokens_seen": steps * args.batch * args.context, "train_loss_last50": sum(recent) / len(recent),
             "heldout_loss": held_loss, "train_minutes": minutes}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:  # written beside, then renamed: the folder is whole or absent
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "pretraining.json").write_text(json.dumps(facts, indent=1))
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"final training loss {facts['train_loss_last50']:.3f} (mean of the last {len(recent)} steps), held-out loss "
          f"{held_loss:.3f} (perplexity {math.exp(held_loss):.1f}); {steps * args.batch * args.context:,} tokens seen in "
          f"{minutes:.1f} min of training; saved to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
