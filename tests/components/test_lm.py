"""Language models through a prompt (model.kind causal_lm, masked_lm): label words and completions, read
offline from a save_pretrained folder, at low precision with exact restoration after every perturbation.
The models are tiny and random (tests/components/tiny_lm.py): only the mechanics are checked here."""
import copy

import pandas as pd
import pytest
import torch
from torch.nn import functional as F

import specs
from components import builders, models, pretrained
from components.data.prompts import Prompt, encode_prompted
from components.directions import Directions, perturbed
from components.queries import Update
from components.optimizers.sgd import Sgd
from tests.components import tiny_lm


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lms")
    return {arch: tiny_lm.save_model(root / arch, arch) for arch in ("llama", "gpt2", "bert")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    pd.DataFrame(tiny_lm.reviews(120)).to_csv(root / "reviews.csv", index=False)
    pd.DataFrame(tiny_lm.completions(60)).to_json(root / "qa.jsonl", orient="records", lines=True)
    return root


TEMPLATES = {"causal_lm": "{text} it was", "masked_lm": "{text} it was [MASK] ."}


def spec_dict(folders, files, arch, *, precision="fp32", trainable="all", task="label_words", **model):
    kind = "masked_lm" if arch == "bert" else "causal_lm"
    source = {"kind": "file", "path": str(files / "reviews.csv"), "label": "label", "classes": ["neg", "pos"],
              "text": "text", "max_length": 16}
    prompt = {"kind": "label_words", "template": TEMPLATES[kind], "words": ["bad", "good"]}
    if task == "completion":
        source = {"kind": "completions", "path": str(files / "qa.jsonl"), "prompt": "q", "completion": "a",
                  "max_length": 16}
        prompt = {"kind": "completion", "template": "{text}"}
    return {"name": "lm", "seed": 1,
            "data": {"declared_private_rows": 100, "source": source, "split": {"kind": "fraction", "test": 0.2}},
            "model": {"kind": kind, "path": str(folders[arch]), "precision": precision, "trainable": trainable,
                      "prompt": prompt, **model},
            "estimator": {"kind": "two_point", "queries": 1, "smoothing": 1e-2}, "mechanism": {"kind": "none"},
            "sampling": {"kind": "poisson", "expected_batch_size": 8},
            "optimizer": {"kind": "sgd", "lr": 0.1, "steps": 2}}


def built(d):
    spec = specs.spec_from_dict(d)
    data = builders.load_data(spec)
    builders.check_model(spec, data.n_features, data.n_classes, 2**40)
    return spec, data, builders.build_model(spec, data.n_features, data.n_classes)


# ---------------------------------------------------------------- the spec and the folder
@pytest.mark.parametrize("model, source, message", [
    ({"prompt": {"kind": "label_words", "template": "it was", "words": ["bad", "good"]}}, None,
     r"^model.prompt.template: needs the row's slot \{text\} exactly once"),
    ({"kind": "masked_lm", "prompt": {"kind": "label_words", "template": "{text} it was", "words": ["bad", "good"]}},
     None, r"^model.prompt.template: a masked LM reads its answer at \[MASK\], which must appear exactly once"),
    ({"prompt": {"kind": "label_words", "template": "{text} it was [MASK]", "words": ["bad", "good"]}}, None,
     r"^model.prompt.template: a causal LM reads its answer as the next token after the prompt, not at \[MASK\]"),
    ({"prompt": {"kind": "label_words", "template": "{text} it was", "words": ["bad", "bad"]}}, None,
     r"^model.prompt.words: must be distinct"),
    ({"prompt": {"kind": "label_words", "template": "{text} it was", "words": ["bad", "fine", "good"]}}, None,
     r"^model.prompt.words: 3 words for the 2 data.source.classes; give one word per class"),
    ({"kind": "masked_lm", "prompt": {"kind": "completion"}}, None,
     r"^model: prompt.kind: completion generates text, which needs a causal LM"),
    ({"prompt": {"kind": "completion"}}, None, r"^model.prompt.kind: completion scores each row's completion; use "
                                               r"data.source.kind: completions"),
    ({}, {"kind": "completions", "path": "qa.jsonl", "prompt": "q", "completion": "a"},
     r"^data.source.kind: completions gives \(prompt, completion\) rows, read only by model.kind causal_lm with "
     r"prompt.kind: completion \(found model.kind causal_lm with prompt.kind label_words\)"),
    ({"precision": "int8"}, None, r"^model.precision: Input should be 'fp32', 'bf16' or 'fp16'"),
])
def test_spec_errors_are_one_line_naming_the_field(tmp_path, model, source, message):
    d = spec_dict({"llama": tmp_path, "bert": tmp_path}, tmp_path, "llama")
    d["model"].update(model)
    if source is not None:
        d["data"]["source"] = source
    with pytest.raises(specs.SpecError, match=message) as err:
        specs.spec_from_dict(d)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["llama", "bert"])
@pytest.mark.parametrize("section", [
    {"estimator": {"kind": "zo_naive", "radius": 0.05}, "sampling": {"kind": "single_pass"},
     "optimizer": {"kind": "o2nc", "preset": "theory"}, "assumptions": {"lipschitz": 1.0, "initial_gap": 1.0}},
    {"estimator": {"kind": "full_gradient"}, "mechanism": {"kind": "adaptive_gaussian"},
     "sampling": {"kind": "full_batch"}, "optimizer": {"kind": "adaptive_noisy_gd"},
     "assumptions": {"lipschitz": 1.0, "smoothness": 1.0}},
])
def test_the_nonsmooth_and_kl_families_refuse_a_language_model_at_validation(tmp_path, arch, section):
    """Their plans read the model's dimension from the data's shapes before training, which a pretrained model
    does not have (and their theory is for small problems): refused in one line, with what is allowed."""
    d = spec_dict({"llama": tmp_path, "bert": tmp_path}, tmp_path, arch)
    d.update(section, mechanism=section.get("mechanism", {"kind": "gaussian", "clip": 1.0}),
             privacy={"epsilon": 8.0, "delta": 1e-5, "neighboring": "replace_one"})
    kind, opt = d["model"]["kind"], section["optimizer"]["kind"]
    with pytest.raises(specs.SpecError, match=rf"^model.kind: {kind} is a pretrained model, which optimizer.kind "
                                              rf"{opt} cannot plan .*; train it with optimizer.kind sgd or adam, or "
                                              r"use model.kind linear, mlp, cnn or objective$") as err:
        specs.spec_from_dict(d)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch, words, message", [
    ("llama", ["bad", "good !"], r"^model.prompt.words: 'good !' is 2 tokens of the model's tokenizer \('good' \+ "
                                 r"'!'\); each label word must be one token: choose another word$"),
    ("bert", ["bad", "good."], r"^model.prompt.words: 'good.' is 2 tokens"),
    ("bert", ["bad", "superb"], r"^model.prompt.words: 'superb' is not in the model's vocabulary"),
])
def test_a_label_word_that_is_not_one_token_is_refused_before_the_run(folders, files, arch, words, message):
    d = spec_dict(folders, files, arch)
    d["model"]["prompt"]["words"] = words
    spec = specs.spec_from_dict(d)
    with pytest.raises(ValueError, match=message):
        builders.check_model(spec, 0, 2, 2**40)
    with pytest.raises(ValueError, match=message):
        builders.build_model(spec, 0, 2)


def test_the_folder_must_hold_the_kinds_architecture_and_every_weight(folders, files, tmp_path):
    d = spec_dict(folders, files, "llama")
    d["model"].update(kind="masked_lm", prompt={"kind": "label_words", "template": TEMPLATES["masked_lm"],
                                                "words": ["bad", "good"]})
    with pytest.raises(ValueError, match=r"^model.kind: masked_lm, but .*llama holds a 'llama' model, a causal LM; "
                                         r"use model.kind: causal_lm$"):
        builders.check_model(specs.spec_from_dict(d), 0, 2, 2**40)
    import shutil

    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(folders["llama"], partial)
    weights = load_file(partial / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "layers.1.mlp" not in k}, partial / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=r"^model.path: .*partial: 3 weights missing \(first: "
                                           r"model.layers.1.mlp.down_proj.weight\); save the whole model there"):
        pretrained.language_model(str(partial), "causal")
    d = spec_dict(folders, files, "llama", trainable="bias")
    with pytest.raises(ValueError, match=r"^model.trainable: bias leaves nothing to train in .*llama \(a llama model "
                                         r"without such parameters\); use all_but_embeddings or lora$"):
        builders.check_model(specs.spec_from_dict(d), 0, 2, 2**40)


# ---------------------------------------------------------------- label words
@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_label_word_loss_is_the_cross_entropy_over_the_words_logits_of_the_models_own_forward(folders, files, arch):
    """One row by hand: the model's own forward (its *ForCausalLM / *ForMaskedLM, unpadded), the logits of the
    two label words where the answer goes, cross-entropy against the row's class."""
    state = torch.random.get_rng_state()
    spec, data, model = built(spec_dict(folders, files, arch))
    assert torch.equal(state, torch.random.get_rng_state())  # nothing drawn from the global RNG
    tok = pretrained.tokenizer(str(folders[arch]))
    words = [tok.convert_tokens_to_ids(w) for w in ("bad", "good")]
    x, y = torch.as_tensor(data.test.features[:4]), torch.as_tensor(data.test.labels[:4])
    got = models.per_example_loss(model, x, y)
    assert got.dtype == torch.float32 and got.shape == (4,)
    for i in range(4):
        n = int(x[i, 1].sum())
        with torch.inference_mode():
            logits = model.lm(input_ids=x[i:i + 1, 0, :n]).logits[0]
        at = n - 1 if arch == "llama" else int(x[i, 2].argmax())
        if arch == "bert":
            assert int(x[i, 0, at]) == tok.mask_token_id
        want = -torch.log_softmax(logits[at, words].float(), dim=0)[int(y[i])]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-6)
    accuracy = models.evaluate(model, x, y)["accuracy"]  # the zero-shot score: argmax over the label words
    assert accuracy == float((model(x).argmax(dim=1) == y).float().mean())


@pytest.mark.parametrize("arch, task", [("llama", "label_words"), ("gpt2", "label_words"), ("bert", "label_words"),
                                        ("llama", "completion")])
def test_padding_does_not_change_a_rows_loss(folders, files, arch, task):
    spec, data, model = built(spec_dict(folders, files, arch, task=task))
    x, y = torch.as_tensor(data.test.features[:6]), torch.as_tensor(data.test.labels[:6])
    assert int(x[:, 1].sum(dim=1).min()) < x.shape[2]  # some rows are padded already
    alone = torch.cat([models.per_example_loss(model, x[i:i + 1, :, :int(x[i, 1].sum())], y[i:i + 1])
                       for i in range(6)])
    padded = torch.cat([x, torch.zeros(6, 3, 5, dtype=x.dtype)], dim=2)
    for rows in (x, padded):
        torch.testing.assert_close(models.per_example_loss(model, rows, y), alone, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- completions
def test_completion_loss_is_the_mean_cross_entropy_of_its_tokens_and_exact_match_is_greedy_decoding(folders, files):
    spec, data, model = built(spec_dict(folders, files, "llama", task="completion"))
    tok = pretrained.tokenizer(str(folders["llama"]))
    x = torch.as_tensor(data.test.features[:3])
    for i in range(3):  # by hand: the completion's tokens, each predicted from the position before it
        read = x[i, 2].nonzero().flatten()
        with torch.inference_mode():
            logits = model.lm(input_ids=x[i:i + 1, 0, :int(x[i, 1].sum())]).logits[0]
        want = F.cross_entropy(logits[read].float(), x[i, 0, read + 1])
        torch.testing.assert_close(models.per_example_loss(model, x[i:i + 1], torch.zeros(1)), want.reshape(1))
    # rows whose completion is the model's own greedy continuation match exactly; the same with a word changed don't
    prompt = Prompt("causal", "completion", "{text}")
    starts = ["the movie was very", "a plot is so"]
    greedy = []
    for text in starts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
                                    pad_token_id=0)
        greedy.append(tok.decode(out[0, ids.shape[1]:]))
    other = [" ".join(["fine" if w != "fine" else "poor" for w in g.split()][:1] + g.split()[1:]) for g in greedy]
    rows = torch.as_tensor(encode_prompted(starts * 2, tok, 12, prompt, completions=greedy + other))
    got = models.evaluate(model, rows, torch.zeros(4, dtype=torch.long))
    assert got["exact_match"] == 0.5
    assert model.metrics(rows[:2], 8)["exact_match"] == 1.0 and model.metrics(rows[2:], 8)["exact_match"] == 0.0


def test_a_template_too_long_for_max_length_is_one_line(folders, files):
    tok = pretrained.tokenizer(str(folders["llama"]))
    prompt = Prompt("causal", "completion", "question : {text} answer :")
    with pytest.raises(ValueError, match=r"^data.source.max_length: 4 tokens do not hold the template and a row's "
                                         r"completion; raise max_length"):
        encode_prompted(["the movie"], tok, 4, prompt, completions=["good ."])
    rows = encode_prompted(["the movie was very very very good"], tok, 9, prompt, completions=["good ."])
    assert tok.decode(rows[0, 0]) == "<s> question : the movie answer : good ."  # the text is cut, not the rest


# ---------------------------------------------------------------- what is trained
def test_trainable_variants(folders, files):
    _, _, gpt2 = built(spec_dict(folders, files, "gpt2", trainable="all_but_embeddings"))
    frozen = {n for n, p in gpt2.named_parameters() if not p.requires_grad}
    assert frozen == {"lm.transformer.wte.weight", "lm.transformer.wpe.weight"}  # the LM head is wte, tied
    _, _, bert = built(spec_dict(folders, files, "bert", trainable="bias"))
    chosen = {n for n, p in bert.named_parameters() if p.requires_grad}
    assert chosen and all(n.endswith("bias") for n in chosen) and "lm.cls.predictions.bias" in chosen
    spec, data, plain = built(spec_dict(folders, files, "llama"))
    _, _, lora = built(spec_dict(folders, files, "llama", trainable="lora", lora={"rank": 2}))
    chosen = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert len(chosen) == 2 * 2 * 2 and all(".lora_" in n for n in chosen)  # q_proj, v_proj of 2 layers: A and B
    x = torch.as_tensor(data.test.features[:4])
    with torch.inference_mode():  # B = 0: the adapted model computes the pretrained function
        torch.testing.assert_close(lora(x), plain(x), rtol=0, atol=1e-6)


# ---------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_thousand_perturbations_leave_low_precision_weights_bit_identical(folders, dtype):
    """``perturbed`` never writes the weights (it swaps in scratch copies), so they are restored exactly: 1,000
    perturbed forward passes (+lambda and -lambda alternately, regenerated directions) and 200 in cache mode
    leave every bit as it was. MeZO's in-place +lambda, -2 lambda, +lambda would not (checked below)."""
    from components.models.lm import LabelWordClassifier

    lm = pretrained.language_model(str(folders["gpt2"]), "causal", str(dtype).split(".")[1])
    model = LabelWordClassifier(lm, True, "lm_head", [tiny_lm.VOCAB["bad"], tiny_lm.VOCAB["good"]])
    params = models.trainable_parameters(model)
    assert {p.dtype for p in params} == {dtype}
    bits = [p.detach().clone().view(torch.int16) for p in params]
    directions = Directions(params, "gaussian")
    rows = torch.zeros(2, 3, 6, dtype=torch.long)
    rows[:, 0] = torch.arange(7, 19).reshape(2, 6)
    rows[:, 1], rows[:, 2, -1] = 1, 1
    with torch.inference_mode():
        plain = model(rows)
        for cycle in range(1000):
            with perturbed(model, directions, cycle, 1e-3 if cycle % 2 else -1e-3):
                out = model(rows)
            if cycle == 0:  # the forward did run at the perturbed point
                assert not torch.equal(out, plain)
        for cycle in range(200):
            with directions.cached([cycle]), perturbed(model, directions, cycle, 1e-3):
                model(rows)
    assert all(torch.equal(p.detach().view(torch.int16), b) for p, b in zip(params, bits))
    with torch.no_grad():  # the in-place alternative drifts within a few hundred cycles at this precision
        for cycle in range(200):
            for scale in (1e-3, -2e-3, 1e-3):
                directions.add_all_(cycle, scale)
    assert not all(torch.equal(p.detach().view(torch.int16), b) for p, b in zip(params, bits))


def test_bf16_updates_are_deterministic_and_replay_bit_for_bit(folders, files):
    """sgd adds directions drawn in the weights' dtype from public seeds: two replicas (and a replay of the
    journal) end bit-identical, and the loss is float32 whatever the weights' precision."""
    d = spec_dict(folders, files, "llama", precision="bf16")
    spec, data, a = built(d)
    _, _, b = built(d)
    x, y = torch.as_tensor(data.test.features[:4]), torch.as_tensor(data.test.labels[:4])
    assert a(x).dtype == torch.float32 and models.per_example_loss(a, x, y).dtype == torch.float32
    start = [p.detach().clone() for p in models.trainable_parameters(a)]
    for model in (a, b):
        opt = Sgd(Directions(models.trainable_parameters(model), "gaussian"), lr=0.5)
        for step in range(3):
            opt.apply(Update(terms=((100 + step, 0.3 - 0.2 * step),)))
    pa, pb = models.trainable_parameters(a), models.trainable_parameters(b)
    assert all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(pa, pb))
    assert sum(not torch.equal(p, s) for p, s in zip(pa, start)) == len(start)  # every tensor moved
    from components.optimizers.sgd import replay
    from components.runtime.loop import JournalEntry

    with torch.no_grad():
        for p, s in zip(pb, start):
            p.copy_(s)
    replay(Directions(pb, "gaussian"), [JournalEntry(s, 100 + s, 0.3 - 0.2 * s) for s in range(3)], lr=0.5)
    assert all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(pa, pb))


@pytest.mark.parametrize("arch, estimator", [("llama", {"kind": "first_order"}), ("bert", {"kind": "two_point"})])
def test_a_short_private_bf16_run_moves_only_trainable_parameters(folders, files, arch, estimator):
    from components.randomness import private_generator

    d = spec_dict(folders, files, arch, precision="bf16", trainable="all_but_embeddings")
    d["estimator"] = {**estimator, **({"queries": 2, "smoothing": 1e-2} if estimator["kind"] == "two_point" else {})}
    d["mechanism"], d["privacy"] = {"kind": "gaussian", "clip": 1.0}, {"epsilon": 8.0, "delta": 1e-5}
    d["optimizer"]["lr"] = 1.0  # large enough to move bf16 weights: an update under half their ulp is lost
    spec = specs.spec_from_dict(d)
    data = builders.load_data(spec)
    resolved, _, _ = builders.resolve_privacy(spec, len(data.private))
    loop = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                               sampling_generator=private_generator(2))
    before = {n: p.detach().clone() for n, p in loop.model.named_parameters()}
    loop.loop.run(2)
    moved = {n for n, p in loop.model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in loop.model.named_parameters() if p.requires_grad}
    assert moved and moved <= trainable
    assert all(torch.isfinite(p).all() for p in loop.model.parameters())


def test_a_prompted_text_source_keeps_its_rows_identity_apart(folders, files):
    """The prompt is part of a row's layout: rows read through another template are other content."""
    d = spec_dict(folders, files, "llama")
    first = builders.load_data(specs.spec_from_dict(d))
    d["model"]["prompt"]["template"] = "{text} so it was"
    second = builders.load_data(specs.spec_from_dict(copy.deepcopy(d)))
    assert first.layout != second.layout and "template=causal:label_words:" in first.layout
    assert first.private.features.shape[1:] == (3, 16)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_master_weights_keep_the_updates_bf16_rounding_would_lose_and_replay_and_resume_exactly(
        folders, files, optimizer):
    """Updates below half a bf16 unit in the last place are lost when added to the weights in place; with
    float32 master copies (model.master_weights, the default) the weights are the float32 trajectory rounded,
    a replay of the journal makes the same copies, and a resume from the optimizer's state (a checkpoint, a
    Ray worker) continues bit for bit."""
    from components.optimizers.adam import Adam
    from components.optimizers.sgd import replay
    from components.runtime.loop import JournalEntry

    d = spec_dict(folders, files, "llama", precision="bf16")
    lr, steps, momentum = 2e-4, 12, 0.5 if optimizer == "sgd" else None

    def trained(master: bool, resume_at=None, momentum=momentum, seed=lambda step: 100 + step, lr=lr):
        _, _, model = built(d)
        params = models.trainable_parameters(model)
        start = [p.detach().clone() for p in params]
        make = (lambda: Sgd(Directions(params, "gaussian"), lr=lr, momentum=momentum or 0.0, master_weights=master)) \
            if optimizer == "sgd" else (lambda: Adam(Directions(params, "gaussian"), lr=lr, master_weights=master))
        opt = make()
        for step in range(steps):
            if step == resume_at:  # the optimizer's state into a new one, as a resumed run or a Ray worker
                state = opt.state_dict()
                opt = make()
                opt.load_state_dict(state)
            opt.apply(Update(terms=((seed(step), 0.01),)))
        return params, start

    kept, start = trained(master=True)
    resumed, _ = trained(master=True, resume_at=5)
    assert all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(kept, resumed))
    assert any(not torch.equal(p, s) for p, s in zip(kept, start))
    if optimizer == "adam":
        return
    _, _, model = built(d)
    params = models.trainable_parameters(model)
    replay(Directions(params, "gaussian"), [JournalEntry(s, 100 + s, 0.01) for s in range(steps)], lr=lr,
           momentum=momentum, master_weights=True)
    assert all(torch.equal(p.view(torch.int16), q.view(torch.int16)) for p, q in zip(kept, params))
    # twelve steps along one direction, each ~1e-5 per weight, under half a bf16 unit of most weights (~6e-5
    # at 0.02), together over it: in place most are lost; the copies hold the float32 sum, rounded once
    same = dict(momentum=0.0, seed=lambda step: 100, lr=1e-3)
    kept, start = trained(master=True, **same)
    in_place, _ = trained(master=False, **same)
    direction = Directions(models.trainable_parameters(built(d)[2]), "gaussian")
    exact = [s.float() for s in start]
    for step in range(steps):
        for i, x in enumerate(exact):
            x.add_(direction.tensor(100, i).float(), alpha=-1e-3 * 0.01)
    assert all(torch.equal(p, x.to(torch.bfloat16)) for p, x in zip(kept, exact))
    error = lambda params: sum(float((p.float() - x).abs().sum()) for p, x in zip(params, exact))  # noqa: E731
    assert error(in_place) > 2 * error(kept)  # 1.74 against 0.48 here
