"""The memory plan (components/memory_plan.py): its ordering of the estimators on a decoder built from its config alone,
the one-line refusal of a spec over the device's memory (privzo validate and the run refuse before any row), and
a small model's plan from its shapes. bench/memory.py --model decoder measures the estimates."""
import dataclasses

import pandas as pd
import pytest
import yaml

import specs
from components import memory_plan
from tests.components import tiny_lm


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("memory")
    pd.DataFrame(tiny_lm.reviews(40)).to_csv(root / "reviews.csv", index=False)
    tiny_lm.save_model(root / "llama", "llama")
    return root


def _spec(files, estimator, **model):
    return {"name": "memory", "seed": 1,
            "data": {"declared_private_rows": 30, "source": {"kind": "file", "path": str(files / "reviews.csv"),
                                                             "label": "label", "classes": ["neg", "pos"],
                                                             "text": "text", "max_length": 16},
                     "split": {"kind": "fraction", "test": 0.2}},
            "model": {"kind": "causal_lm", "path": str(files / "llama"), "trainable": "all",
                      "prompt": {"kind": "label_words", "template": "{text} it was", "words": ["bad", "good"]},
                      **model},
            "estimator": estimator, "mechanism": {"kind": "gaussian", "clip": 1.0},
            "privacy": {"epsilon": 8.0, "delta": 1e-5}, "sampling": {"kind": "poisson", "expected_batch_size": 8},
            "optimizer": {"kind": "sgd", "lr": 0.1, "steps": 2}}


REGENERATE = {"kind": "two_point", "queries": 1, "perturbation": "regenerate"}
CACHE = {"kind": "two_point", "queries": 1, "perturbation": "cache"}
DP_SGD = {"kind": "first_order"}


def test_a_decoder_is_planned_from_its_config_in_the_order_its_estimators_need(files):
    plans = {name: memory_plan.plan(specs.spec_from_dict(_spec(files, est)))
             for name, est in (("regenerate", REGENERATE), ("cache", CACHE), ("first_order", DP_SGD))}
    sizes = plans["regenerate"].sizes
    assert sizes.trainable == 20_896 and sizes.weights >= 4 * sizes.trainable  # the tiny llama, fp32
    inference = memory_plan.estimate(sizes, dataclasses.replace(plans["regenerate"].settings, estimator="inference"))
    steps = {name: p.step for name, p in plans.items()}
    assert steps["first_order"] > steps["cache"] > steps["regenerate"]
    # regenerate holds one module's perturbed parameters over inference; cache a direction and a perturbed copy
    assert steps["regenerate"] - inference.step == sizes.scratch < sizes.trainable_bytes
    assert steps["cache"] - inference.step == sizes.trainable_bytes + sizes.swapped
    assert plans["regenerate"].settings.batch == 8 + 12  # Poisson: 8 + 4 sqrt(8), rounded up
    bf16_spec = specs.spec_from_dict(_spec(files, REGENERATE, precision="bf16"))
    bf16 = memory_plan.plan(bf16_spec)
    assert bf16.sizes.weights < 0.6 * sizes.weights
    # float32 master copies of the trainable parameters, where the model keeps them: the optimizer's state, and
    # cloned into every checkpoint
    masters = 4 * sizes.trainable if getattr(bf16_spec.model, "master_weights", False) else 0
    assert bf16.settings.optimizer_state == masters
    assert dict(bf16.parts)["last checkpoint"] == bf16.sizes.trainable_bytes + masters
    lora = memory_plan.plan(specs.spec_from_dict(_spec(files, DP_SGD, trainable="lora")))
    # rank 8 on q_proj (32 -> 32) and v_proj (32 -> 16) of 2 layers
    assert lora.sizes.trainable == 2 * 8 * (32 + 32 + 32 + 16)
    assert lora.step < plans["first_order"].step


def test_the_public_data_estimators_hold_their_public_gradients_beside_the_private_phase(files):
    """PAZO-M's public gradient, PAZO-S's candidates and PAZO-P's float32 basis sit beside the private forwards;
    PAZO-P's QR holds LAPACK's copies; neither PAZO-P nor PAZO-S caches (their directions are not seeded), and
    DPGD-0th's cache is planned like DPZero's (bench/memory.py measures each within 15%)."""
    def plan(estimator):
        spec = _spec(files, estimator)
        spec["data"]["split"]["public"] = 0.25
        return memory_plan.plan(specs.spec_from_dict(spec))

    base = plan(REGENERATE)
    s, T, d = base.sizes, base.sizes.trainable_bytes, base.sizes.trainable
    act = base.step - s.weights - s.scratch  # A(b): the private forward
    pazo_m = plan({"kind": "pazo_m", "queries": 1, "public_batch_size": 4, "perturbation": "regenerate"})
    assert pazo_m.step - s.weights == s.scratch + max(2 * T + memory_plan._saved(s, 4, 16, False), act + T)
    pazo_p = plan({"kind": "pazo_p", "queries": 2, "public_batches": 3, "public_batch_size": 4, "perturbation": "cache"})
    pazo_s = plan({"kind": "pazo_s", "public_batches": 3, "public_batch_size": 4})
    for p, held in ((pazo_p, 4 * 3 * d + 2 * T), (pazo_s, 5 * T)):
        assert not p.settings.cache and p.step - s.weights >= s.scratch + act + held
    qr = 3 * T + int((1 + memory_plan.QR_COPIES) * 4 * 3 * d)  # the gradients beside G, its copy, Q and the workspace
    assert pazo_p.step - s.weights >= s.scratch + qr
    normalized = plan({"kind": "pazo_p", "queries": 2, "public_batches": 3, "public_batch_size": 4,
                       "basis": "normalized"})
    assert normalized.step < pazo_p.step
    zeroth = plan({"kind": "dpgd_0th", "queries": 1, "perturbation": "cache"})
    assert zeroth.settings.cache and zeroth.step - plan(CACHE).step == 4 * 8 * d


def test_a_spec_over_the_device_memory_is_refused_in_one_line_with_the_numbers(files, monkeypatch):
    dp_sgd = specs.spec_from_dict(_spec(files, DP_SGD))
    planned = memory_plan.plan(dp_sgd)
    need, light = planned.peak, memory_plan.plan(specs.spec_from_dict(_spec(files, REGENERATE))).peak
    device = (need + light) // 2
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(device))
    with pytest.raises(ValueError) as err:
        memory_plan.check_fits(dp_sgd)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"execution: the run needs about {memory_plan.shown(need)} at its peak "
                              f"({memory_plan.shown(planned.sizes.weights)} of weights and first_order: float64 sums and "
                              "per-example gradients of 20,896 trainable parameters")
    assert f"the device has {memory_plan.shown(device)} ({memory_plan.MEMORY_ENV})" in message
    assert "estimator.kind: two_point with perturbation: regenerate (about" in message
    memory_plan.check_fits(specs.spec_from_dict(_spec(files, REGENERATE)))  # fits: no error
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(planned.sizes.weights - 1))
    with pytest.raises(ValueError, match=r"what fits: nothing with these weights, which alone need .* a smaller "
                                         r"model, or model.precision: bf16$"):
        memory_plan.check_fits(dp_sgd)


def test_every_estimator_kind_states_what_it_holds_beside_its_class(tiny_spec_dict, monkeypatch):
    """Each kind the specs accept registers its memory term in the module of its class (memory_plan.holds);
    the planner asks for the spec's kind, and refuses one that registered none rather than plan it as another's."""
    from components.registry import STEP_MEMORY
    from specs.traits import ESTIMATORS

    assert STEP_MEMORY.kinds() == set(ESTIMATORS) | {"inference"}  # inference: the planner's own baseline
    for kind in ESTIMATORS:
        assert memory_plan.step_memory(kind).term.__module__.startswith("components.estimators."), kind
    assert memory_plan.step_memory("inference").term.__module__ == "components.memory_plan"
    sizes = memory_plan.Sizes(2600, 650, 2600, 640, 2560, 0, 2600, 4, per_row=74)
    with pytest.raises(LookupError, match="'nameless': no memory term is registered beside its class"):
        memory_plan.estimate(sizes, memory_plan.Settings("nameless", 8))
    spec = specs.spec_from_dict(tiny_spec_dict)  # two_point
    monkeypatch.delitem(STEP_MEMORY._builders, "two_point")  # a kind the specs accept that registered no term
    with pytest.raises(LookupError, match="'two_point': no memory term is registered beside its class"):
        memory_plan.plan(spec, n_features=64, n_classes=10, n_private=1385, n_eval=360)


def test_the_planner_imports_no_torch_for_a_spec_sized_by_its_shapes():
    """privzo validate plans a small model's spec without torch (its size waits for the data's shapes)."""
    import subprocess
    import sys

    from tests.conftest import EXAMPLES, ROOT

    code = ("import sys, specs; from components import memory_plan; "
            "memory_plan.check_fits(specs.load_spec(sys.argv[1])); "
            "bad = [m for m in ('torch', 'components.estimators') if m in sys.modules]; print(bad); "
            "sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "digits_dpzero.yaml")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_validate_and_calibrate_refuse_it_and_calibrate_prints_the_plan(files, tmp_path, monkeypatch, capsys):
    from flows import cli

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(files, DP_SGD)))
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(2 ** 20))
    for command in ("validate", "calibrate"):
        assert cli.main([command, str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("privzo: error: execution: the run needs about") and "\n" not in err
        assert "the device has 1 MiB" in err
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(2 ** 30))
    assert cli.main(["calibrate", str(path)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[-3].startswith("peak memory (estimate):") and "first_order" in lines[-3]
    # the machine's memory of the moment apart, on stderr: calibrate's stdout is the same for the same spec
    assert err.strip() == f"this machine: device memory 1 GiB ({memory_plan.MEMORY_ENV}): the estimate fits"
    monkeypatch.setenv(memory_plan.MEMORY_ENV, str(2 ** 31))
    assert cli.main(["calibrate", str(path)]) == 0
    assert capsys.readouterr().out == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_a_linear_model_is_planned_from_its_shapes(tiny_spec_dict):
    spec = specs.spec_from_dict(tiny_spec_dict)  # linear on digits, two_point, Poisson batch 64
    assert memory_plan.plan(spec) is None  # its size needs the data's shapes: planned by calibrate and the preflight
    memory_plan.check_fits(spec)  # nothing to check before the rows
    p = memory_plan.plan(spec, n_features=64, n_classes=10, n_private=1385, n_eval=360)
    assert p.sizes.trainable == 650 and p.sizes.weights == 650 * 4
    assert p.settings.batch == 64 + 32 and p.settings.eval_rows == 360
    assert 650 * 4 < p.step < 2 ** 20 and p.peak < 2 ** 21
    tiny_spec_dict["optimizer"] = {"kind": "adam", "lr": 0.01, "steps": 60}
    adam = memory_plan.plan(specs.spec_from_dict(tiny_spec_dict), n_features=64, n_classes=10, n_private=1385, n_eval=360)
    assert (adam.settings.optimizer_state, adam.settings.optimizer_step) == (2 * 650 * 4, 650 * 4)  # moments, gradient
    assert adam.peak > p.peak


def test_a_tied_lm_head_adds_a_per_example_gradient_for_each_use_and_regenerate_a_block_of_it():
    """DP-SGD's per-example gradients of a table tied to the LM head are formed once for each use before
    they are added (bench/memory.py measured it); regenerate mode perturbs the head a block of rows at a time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from components.models.lm import freeze_lm_

    sizes = {}
    for tie in (False, True):
        config = LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=4000, tie_word_embeddings=tie)
        with torch.device("meta"):
            lm = LlamaForCausalLM(config)
        freeze_lm_(lm, "all", "test")
        sizes[tie] = memory_plan.module_sizes(lm, 4, lm_config=config)
    untied, tied = sizes[False], sizes[True]
    assert untied.tied == 0 and tied.tied == 2 * 4000 * 128 * 4
    assert tied.trainable == untied.trainable - 4000 * 128
    # regenerate's scratch is the largest layer's (an MLP matrix), not the 4000 x 128 head
    assert untied.scratch == tied.scratch == 128 * 344 * 4
    first_order = memory_plan.Settings("first_order", 8, 32)
    c = memory_plan.chunk_rows(tied, 8)
    assert (memory_plan.estimate(tied, first_order).step - memory_plan.estimate(dataclasses.replace(tied, tied=0),
                                                                        first_order).step) == c * tied.tied


def test_the_guide_states_what_the_planner_says_of_a_7b_decoder():
    """docs/guide/specs-and-data.md's example: Llama-2-7B's shape in bf16, planned from its config alone."""
    from bench.memory import LARGE, planned_decoder
    from tests.conftest import ROOT
    from transformers import LlamaConfig

    config = LlamaConfig(**LARGE)
    planned = {case: planned_decoder(case, config, "bf16", 16, 128) for case in ("inference", "regenerate", "dp_sgd")}
    guide = " ".join((ROOT / "docs" / "guide" / "specs-and-data.md").read_text().split())
    said = (f"so a step on 7B parameters needs about {planned['dp_sgd'] / 2**30:.0f} GiB in bf16 where DPZero's in "
            f"regenerate mode needs {planned['regenerate'] / 2**30:.0f} GiB, "
            f"{planned['regenerate'] / planned['inference']:.2f}× its inference")
    assert said in guide, said


@pytest.mark.parametrize("arch, extra", [
    ("llama", dict(tie_word_embeddings=True)), ("llama", dict(tie_word_embeddings=False, num_key_value_heads=2)),
    ("llama", dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, head_dim=48)),
    ("mistral", dict(tie_word_embeddings=False, num_key_value_heads=2, head_dim=24)),
    ("qwen2", dict(tie_word_embeddings=True, num_key_value_heads=1))])
def test_a_llama_like_decoder_is_sized_from_its_config_json_as_from_transformers_meta_model(tmp_path, arch, extra):
    """validate plans a Llama-like decoder from config.json with torch's layers (no transformers import): every
    figure of the plan's sizes equals the one from transformers' own meta model, for each trainable set, adapters
    included, and each precision."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from components.models.decoder_skeleton import decoder_skeleton
    from components.models.lm import freeze_lm_

    config = AutoConfig.for_model(arch, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                                  num_attention_heads=4, vocab_size=3000, **extra)
    config.save_pretrained(tmp_path)
    for trainable, lora in (("all", None), ("all_but_embeddings", None), ("lora", (8, ("q_proj", "v_proj"))),
                            ("lora", (4, ("lm_head", "down_proj")))):
        sizes = []
        for build in (lambda: decoder_skeleton(str(tmp_path)), lambda: AutoModelForCausalLM.from_config(config)):
            with torch.device("meta"):
                lm = build()
            if lora:
                for p in lm.parameters():
                    p.requires_grad_(False)
            else:
                freeze_lm_(lm, trainable, "test")
            sizes.append([memory_plan.module_sizes(lm, element, lora, lm.config) for element in (4, 2)])
        assert sizes[0] == sizes[1], (trainable, lora)


def test_a_config_the_skeleton_cannot_size_alone_goes_to_transformers(tmp_path):
    from components.models.decoder_skeleton import decoder_skeleton

    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64}')  # sizes left to defaults
    assert decoder_skeleton(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": 64}')
    assert decoder_skeleton(str(tmp_path)) is None
