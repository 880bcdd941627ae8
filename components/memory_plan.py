"""A memory plan before the run: the peak bytes of a training step and of an evaluation, estimated from the
model's config (a language model or encoder built on the meta device: no weight is read) or its shapes, and
the spec; ``check_fits`` refuses a spec whose peak exceeds the device's memory, in one line.

Notation: W = bytes of every parameter and buffer at model.precision (p bytes an element); T = bytes of the
trainable parameters (d of them); b = the rows a step reads; L = tokens per row (data.source.max_length). A
step's peak is W plus the largest of its phases, as its estimator states them: each row below is a term
registered beside the estimator's class with ``holds`` (components/estimators/: two_point.py for two_point and
dpgd_0th, pazo.py, first_order.py, public_first_order.py for dope_sgd and pda_dpmd, gep.py, spider.py and
full_gradient.py; inference, the forward alone, here), and ``estimate`` asks ``step_memory`` for the spec's
kind's; a kind that registered none is refused, never planned as another's:

    inference         A(b)                          the forward's working set
    two_point, regen. A(b) + S                      S: the scratch stack of perturbed parameters, the largest
                                                    module's own trainable ones (``perturbation.perturbation_capacity``;
                                                    plain embedding tables only get their looked-up rows, a
                                                    large Linear layer a block of rows at a time)
    two_point, cache  A(b) + q T + C                q cached directions (2q with execution.prefetch_directions)
                                                    and C, the perturbed copy of every trainable tensor but a
                                                    plain embedding table (``Directions.swapped`` on a CPU)
    first_order       8d + c (T + K) + G(c)         float64 sums, a chunk of c = max(1, 256 MiB // T) rows of
                        + (p+8) t                   per-example gradients (K: each use's of a tensor several
                      16d + 16 t                    modules read, a tied LM head's; dope_sgd: the larger of
                                                    that and T, its centred copy), their saved activations
                                                    G(c), one tensor's clipped sum (t elements: the largest);
                                                    then the release: sums and noisy sums in float64, a
                                                    tensor's noise and its scaled copy
                                                    (``clipped_sums.clipped_gradient_sum``,
                                                    ``GaussianMechanism.release_vector``)
    pazo_*, public    zeroth-order phase + k T + T + G(b')   k public gradients (pazo_p/pazo_s: k; pazo_m,
    gradients                                       dope_sgd, pda_dpmd: 1) by a batched backward on b' rows;
                                                    then what the private phase holds beside its forward:
                                                    the public gradient T (pazo_m, and beside DP-SGD's
                                                    phases dope_sgd, with a chunk's centred copy, and
                                                    pda_dpmd), G in float32 (4kd) and q dense directions
                                                    (pazo_p, whose QR holds k T + 4kd (1 + 6.34)), k + 2
                                                    candidates (pazo_s); pazo_p and pazo_s never cache
                                                    (their directions are not seeded)
    gep               as bench/memory.py's guard: the [b', d] anchor matrix and the [k, d] basis
    dpgd_0th          zeroth-order phase + 4 * 8d   its float64 d-vectors (a d-dimensional release)
    nonsmooth, KL     A(b) + 4 * 8d                 a few float64 d-vectors (the oracles zo_spider, fo_spider,
                                                    zo_naive and full_gradient): small models in practice

    A(b) = b L (3 i + 4 h) p + b L 2 h 4 + b H L^2 4 + logits,  i the MLP width, h the hidden size, H the heads
    G(c) = c L n (3 i + 6 h) p + c L 2 h 4 n + c H L^2 4 n + logits,  n layers (saved for backward)
    logits: label words, b V p (one position a row); completion, b L V 12: the float32 logits and two float32
    tensors of cross-entropy's (measured: 12 bytes an element at fp32 and bf16 alike).

The run adds what it keeps beside the step: the optimizer's state (sgd's momentum T, adam's two moments 2T and
a gradient T formed for each update; with model.master_weights at bf16 / fp16, float32 copies of the trainable
parameters, 4d, and the state float32 beside them), the last checkpoint the loop keeps (T and the optimizer's
state, cloned on the host by ``loop.state_dict``; as much again while the next is formed) and the private rows
on the device; in turn with the step run an evaluation, W + A(min(4096, test rows), or 32
rows of a language model) in inference mode, and with optimizer.init latest_registered the registered model
loaded beside the replica (W).

Batch: Poisson sampling reads a Binomial number of rows, so the plan takes b + 4 sqrt(b) (exceeded with
probability about 3e-5 a step); other samplers read exactly their batch. The coefficients of A and G
are those of a Llama-like decoder layer (norms in float32, a gated MLP); bench/memory.py measures the
terms against torch's own allocations. Ray workers each hold a replica: the plan is of one process.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from components.registry import STEP_MEMORY
from specs.traits import ESTIMATORS as ESTIMATOR_TRAITS
from specs.traits import MODELS as MODEL_TRAITS

if TYPE_CHECKING:  # torch is imported where a model is sized: validating a small model's spec needs none
    import torch
    from torch import nn

GIB = 2 ** 30
MEMORY_ENV = "PRIVZO_DEVICE_MEMORY_BYTES"  # overrides the device's memory (tests; a machine shared with others)
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# torch.linalg.qr of a tall [d, k] matrix on a CPU holds 6.33 times the matrix at its peak (its copy, Q and
# LAPACK's workspace; measured at d = 1.4M, k = 3, float32 and from bf16 gradients alike), rounded up
QR_COPIES = 6.34


def shown(n: int) -> str:
    """Bytes in GiB, or MiB under one GiB (a small model's plan is MiB)."""
    return f"{n / GIB:.3g} GiB" if n >= GIB else f"{n / 2 ** 20:.3g} MiB"


@dataclass(frozen=True)
class Sizes:
    """What the formulas read of a model: bytes and counts, and a transformer's widths (0 for other models)."""

    weights: int  # W: every parameter and buffer, bytes
    trainable: int  # d: trainable parameters
    trainable_bytes: int  # T
    largest: int  # elements of the largest trainable tensor
    scratch: int  # S: bytes of regenerate mode's perturbation stack
    tied: int  # bytes a row's per-example gradients add for tensors used by several modules (a tied LM head)
    swapped: int  # C: bytes of cache mode's perturbed copy
    element: int  # p: bytes of one element
    hidden: int = 0
    inner: int = 0
    layers: int = 0
    heads: int = 0
    vocab: int = 0
    per_row: int = 0  # non-transformer models: activation elements of one row's forward
    transformer: bool = False  # the A and G formulas of a transformer (else per_row's)


@dataclass(frozen=True)
class Settings:
    """What the formulas read of a spec."""

    estimator: str
    batch: int
    length: int = 1
    queries: int = 1
    cache: bool = False
    prefetch: bool = False
    completion: bool = False
    public_batch: int = 0
    public_gradients: int = 0
    anchors: int = 0
    basis: str = "orthonormal"  # PAZO-P's: QR's workspace, or normalised columns
    optimizer_state: int = 0  # bytes the optimizer keeps across steps (a checkpoint clones them too)
    optimizer_step: int = 0  # bytes it forms for each update (Adam's gradient)
    rows_bytes: int = 0  # the private rows on the device
    checkpoint: bool = True
    eval_rows: int = 0  # rows an evaluation pass reads at once
    reload: bool = False  # optimizer.init latest_registered: the registered model is loaded beside the replica
    expected: int = 0  # Poisson sampling's expected batch (then batch is its poisson_high); 0 for other samplers


@dataclass(frozen=True)
class MemoryPlan:
    """The run's estimated peak and what it is made of (bytes)."""

    peak: int
    step: int  # the training step alone, over nothing else (what bench/memory.py measures)
    evaluation: int
    parts: Tuple[Tuple[str, int], ...]  # the run's peak, by part
    sizes: Sizes
    settings: Settings
    batch_note: str
    cause: str  # what dominates, in words

    def describe(self) -> List[str]:
        return [f"peak memory (estimate):   {shown(self.peak)} ({self.cause}); a step {shown(self.step)}, an "
                f"evaluation {shown(self.evaluation)}",
                "  made of:                " + ", ".join(f"{name} {shown(b)}" for name, b in self.parts if b),
                f"  batch:                  {self.batch_note}"]


def _layer(s: Sizes, rows: int, length: int, widths: int) -> int:
    """One transformer layer's activations for ``rows``: ``widths`` hidden-sized tensors and three MLP-sized
    ones at the precision, two float32 hidden-sized ones (the norms), and the float32 attention scores."""
    tokens = rows * length
    scores = rows * s.heads * length ** 2 * 4
    return tokens * ((3 * s.inner + widths * s.hidden) * s.element + 2 * s.hidden * 4) + scores


def _logits(s: Sizes, rows: int, length: int, completion: bool) -> int:
    if not completion:  # the LM head at one position a row (its label words are picked after)
        return rows * s.vocab * s.element
    # the float32 logits at every position (a lower precision's own are freed once upcast), and cross-entropy's
    # two float32 tensors of that size (log-softmax over the vocabulary and a contiguous copy for it)
    return rows * length * s.vocab * 12


def _activations(s: Sizes, rows: int, length: int, completion: bool) -> int:
    """A(rows): a forward's working set (inference): one layer at a time, and the logits."""
    if not s.transformer:
        return rows * s.per_row * 4
    return _layer(s, rows, length, 4) + _logits(s, rows, length, completion)


def _saved(s: Sizes, rows: int, length: int, completion: bool) -> int:
    """G(rows): what a backward pass keeps from its forward: every layer's, and the logits."""
    if not s.transformer:
        return 2 * rows * s.per_row * 4
    return s.layers * _layer(s, rows, length, 6) + _logits(s, rows, length, completion)


def chunk_rows(s: Sizes, batch: int, share: int = 1) -> int:
    """Rows per vectorised per-example-gradient pass (evaluate._per_example_gradients)."""
    from components.queries.clipped_sums import PER_EXAMPLE_GRADIENT_BYTES

    return min(batch, max(1, PER_EXAMPLE_GRADIENT_BYTES // max(1, s.trainable_bytes * share)))


def forward(s: Sizes, st: Settings, rows: int) -> int:
    """A(rows) of the spec's rows: a forward's working set."""
    return _activations(s, rows, st.length, st.completion)


def backward(s: Sizes, st: Settings, rows: int) -> int:
    """G(rows) of the spec's rows: what a backward pass keeps from its forward."""
    return _saved(s, rows, st.length, st.completion)


def public_phase(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The public gradients' phase and it in words: k T + T + G(b'), k public gradients by a batched backward
    on b' rows; 0 without public gradients."""
    k, T = st.public_gradients, s.trainable_bytes
    return ((k + 1) * T + backward(s, st, st.public_batch) if k else 0,
            f"{st.estimator}: {k} public gradient(s) of {s.trainable:,} parameters by a backward on "
            f"{st.public_batch} rows")


def float64_vectors(s: Sizes, st: Settings) -> Tuple[int, str]:
    """A(b) + 4 * 8d: the forward beside a few float64 d-vectors (the nonsmooth and KL oracles, small models in
    practice)."""
    d = s.trainable
    return forward(s, st, st.batch) + 4 * 8 * d, f"{st.estimator}: float64 vectors of {d:,} parameters"


@dataclass(frozen=True)
class StepMemory:
    """What an estimator kind holds during a step, stated beside its class (``holds``)."""

    term: Callable[[Sizes, Settings], Tuple[int, str]]  # the step's peak above W, and what dominates it in words
    public_gradients: int = 0  # public gradients a step forms where its spec does not count them (public_batches)


def holds(*kinds: str, public_gradients: int = 0):
    """Registers the decorated ``term(sizes, settings) -> (bytes, words)`` as what ``kinds`` hold during a step
    (a term of the module docstring's table)."""
    def add(term):
        STEP_MEMORY.register(*kinds)(StepMemory(term, public_gradients))
        return term
    return add


def step_memory(kind: str) -> StepMemory:
    """What ``kind`` holds during a step, as its module registered it. A kind that registered nothing is refused:
    a default would plan its step as some other estimator's."""
    try:
        return STEP_MEMORY[kind]
    except ValueError:
        raise LookupError(f"estimator.kind {kind!r}: no memory term is registered beside its class "
                          f"(memory_plan.holds); those with one: {', '.join(sorted(STEP_MEMORY.kinds()))}") from None


@holds("inference")
def _inference(s: Sizes, st: Settings) -> Tuple[int, str]:
    """Forward passes only: the baseline bench/memory.py measures against (no estimator's)."""
    return forward(s, st, st.batch), f"inference on {st.batch} rows"


def estimate(s: Sizes, st: Settings, batch_note: str = "") -> MemoryPlan:
    """The plan of a model of sizes ``s`` trained as ``st`` says (the formulas of the module's docstring)."""
    extra, cause = step_memory(st.estimator).term(s, st)
    evaluation = _activations(s, st.eval_rows, st.length, st.completion)
    # the last checkpoint, kept for a retried chunk: the trainable parameters and the optimizer's state, cloned
    checkpoint = s.trainable_bytes + st.optimizer_state if st.checkpoint else 0
    # what runs in turn over what is kept: the step, an evaluation, or the next checkpoint formed beside the last
    moments = [(extra, "the step", cause), (evaluation, "an evaluation", f"an evaluation of {st.eval_rows} rows"),
               (checkpoint, "the next checkpoint", f"the last checkpoint and the next, each {s.trainable:,} "
                                                   "parameters and the optimizer's state, beside the weights"),
               (st.optimizer_step, "the update", "the optimizer's update"),
               (s.weights if st.reload else 0, "the registered weights", "a second copy of the weights while the "
                                                                         "registered version loads")]
    largest, name, cause = max(moments, key=lambda m: m[0])
    parts = (("weights", s.weights), (name, largest), ("optimizer state", st.optimizer_state),
             ("last checkpoint", checkpoint), ("private rows", st.rows_bytes))
    return MemoryPlan(sum(b for _, b in parts), s.weights + extra, s.weights + evaluation, parts, s, st,
                      batch_note or f"{st.batch} rows", cause)


# ------------------------------------------------------------------------------------------- model sizes
def _capacity_bytes(model: nn.Module, element: int) -> int:
    from components.directions import perturbation_capacity

    index = {id(p): i for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    return sum(perturbation_capacity(model, index).values()) * element


def _swapped_bytes(model: nn.Module, element: int) -> int:
    """Cache mode's perturbed copy: every trainable tensor but those only looked up by row (a table tied to an
    LM head is copied whole), as ``Directions.swapped`` decides on a CPU."""
    from components.directions import row_lookup

    row_only = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and p.requires_grad:
                row_only[id(p)] = row_only.get(id(p), True) and row_lookup(m)
    return sum(p.numel() for p in model.parameters() if p.requires_grad and not row_only[id(p)]) * element


def config_widths(config) -> dict:
    """A transformer config's widths, by the names Llama, GPT-2, OPT and BERT give them."""
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None)), 0)  # noqa: E731
    hidden = get("hidden_size", "n_embd", "d_model")
    return dict(hidden=hidden, inner=get("intermediate_size", "n_inner", "ffn_dim") or 4 * hidden,
                layers=get("num_hidden_layers", "n_layer"), heads=get("num_attention_heads", "n_head"),
                vocab=get("vocab_size"))


def module_sizes(model: nn.Module, element: int, lora=None, lm_config=None, per_row: int = 0,
                 vocab_head: bool = True) -> Sizes:
    """Sizes of a (meta) model whose ``requires_grad`` flags say what trains, at ``element`` bytes an element.
    ``lora``: (rank, targets) adapters not yet added, counted from the layers' widths (peft keeps them in
    float32)."""
    params = list(model.parameters())
    weights = sum(p.numel() for p in params) * element + sum(b.numel() * b.element_size() for b in model.buffers())
    trainable = [p for p in params if p.requires_grad]
    d, largest = sum(p.numel() for p in trainable), max((p.numel() for p in trainable), default=0)
    uses: dict = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and p.requires_grad:
                uses[id(p)] = uses.get(id(p), 0) + 1
    # a tensor read by k modules (an embedding tied to the LM head): vmap's backward forms each use's
    # per-example gradient before adding them, k more of it a row (measured: bench/memory.py --model decoder)
    tied = sum(p.numel() * uses[id(p)] for p in trainable if uses[id(p)] > 1) * element
    scratch, swapped = _capacity_bytes(model, element), _swapped_bytes(model, element)
    if lora is not None:
        from components.models.hf import linear_widths

        rank, targets = lora
        widths = [w for name, m in model.named_modules() if (w := linear_widths(m)) is not None
                  and name.rsplit(".", 1)[-1] in targets]
        adapters = [rank * sum(w) for w in widths]  # A [rank, in] and B [out, rank] of each targeted layer
        d += sum(adapters)
        largest = max([largest] + [rank * max(w) for w in widths])
        weights += sum(adapters) * 4
        scratch = max([scratch] + [rank * max(w) * 4 for w in widths])  # one adapter Linear runs at a time
        swapped += sum(adapters) * 4
        trainable_bytes = (d - sum(adapters)) * element + sum(adapters) * 4
    else:
        trainable_bytes = d * element
    dims = config_widths(lm_config) if lm_config is not None else {}
    if dims and not vocab_head:
        dims["vocab"] = 0  # an encoder's pooled head: no logits over a vocabulary
    return Sizes(weights, d, trainable_bytes, largest, scratch, tied, swapped, element, per_row=per_row,
                 transformer=lm_config is not None, **dims)


def _spec_sizes(spec, n_features: Optional[int], n_classes: Optional[int]) -> Optional[Sizes]:
    """The spec's model sizes: from its config for a pretrained model, from the data's shapes otherwise (None
    when they are not known yet)."""
    model = spec.model
    if not MODEL_TRAITS[model.kind].pretrained and (n_features is None or n_classes is None):
        return None
    import torch
    from torch import nn

    if MODEL_TRAITS[model.kind].pretrained:
        from components import pretrained

        lora = (model.lora.rank, tuple(model.lora.targets)) if model.lora is not None else None
        if model.kind == "hf":
            from components.models.hf import TextClassifier, freeze_

            encoder = pretrained.encoder_skeleton(model.weights)
            with torch.device("meta"):
                head = nn.Linear(config_widths(encoder.config)["hidden"], n_classes or 2)
            classifier = TextClassifier(encoder, head)
            freeze_(classifier, "head" if lora else model.trainable)
            return module_sizes(classifier, 4, lora, encoder.config, vocab_head=False)
        from components.data.prompts import prompt_of
        from components.models.decoder_skeleton import decoder_skeleton
        from components.models.lm import freeze_lm_

        objective = prompt_of(model).objective
        # a Llama-like decoder from its config.json with torch's layers; any other model from transformers'
        lm = decoder_skeleton(pretrained.model_path(model.path)) if objective == "causal" else None
        if lm is None:
            lm = pretrained.language_model_skeleton(model.path, objective)
        if lora:
            for p in lm.parameters():
                p.requires_grad_(False)
        else:
            freeze_lm_(lm, model.trainable, model.path)
        return module_sizes(lm, PRECISION_BYTES[model.precision], lora, lm.config)
    # the model registry itself, as builders.meta_model asks it (shapes only): the planner stays below the
    # builders, which import the estimators, so an estimator's module may import the planner
    from components.registry import MODELS

    meta = MODELS[model.kind](spec, n_features, n_classes, None)
    per_row = sum(m.out_features for m in meta.modules() if isinstance(m, nn.Linear)) + n_features
    per_row += sum(m.out_channels * n_features for m in meta.modules() if isinstance(m, nn.Conv2d))
    return module_sizes(meta, 4, per_row=per_row)


def poisson_high(expected: int) -> int:
    """The rows a Poisson batch of ``expected`` rows stays under but for about 3e-5 of steps: 4 standard
    deviations above (the Binomial's is at most sqrt(expected))."""
    return expected + math.ceil(4 * math.sqrt(expected))


def _batch(spec, n_private: Optional[int]) -> Tuple[int, str]:
    sampling = spec.sampling
    if sampling.kind == "poisson":
        b = sampling.expected_batch_size
        high = poisson_high(b)
        if spec.person_level:  # how many rows a person holds is theirs to say, not public: one a person planned
            return high, (f"{high} persons, one row each: Poisson's expected {b} + 4 standard deviations; a person "
                          "with more rows adds to it (their rows are in the batch whole)")
        return high, f"{high} rows: Poisson's expected {b} + 4 standard deviations (exceeded about 3e-5 of steps)"
    if sampling.kind == "fixed_size":
        return sampling.batch_size, f"{sampling.batch_size} rows (fixed_size)"
    if sampling.kind == "single_pass":
        start = sampling.start_batch if isinstance(sampling.start_batch, int) else sampling.step_batch
        return max(start, sampling.step_batch), "single_pass: the larger of start_batch and step_batch"
    n = n_private or spec.data.declared_private_rows or 0
    return max(n, 1), f"{n} rows (full_batch: every private row)"


def settings_of(spec, sizes: Sizes, n_private: Optional[int] = None, n_eval: Optional[int] = None,
                on_host: bool = True) -> Tuple[Settings, str]:
    """What the spec says of the step. ``on_host``: the device is the host's memory, which then also holds the
    loop's checkpoints (on a GPU they are host copies)."""
    import inspect

    from components.devices import CACHE_LIMIT_BYTES
    from components.data.prompts import prompt_of
    from components.models import evaluate
    from components.models.lm import EVAL_BATCH_SIZE

    est = spec.estimator
    batch, note = _batch(spec, n_private)
    length = getattr(spec.data.source, "max_length", None) or 1
    # only seeded directions are cached (PAZO-P's and PAZO-S's are dense combinations of public gradients)
    mode = getattr(est, "perturbation", "regenerate") if ESTIMATOR_TRAITS[est.kind].seeded_directions else "regenerate"
    queries = getattr(est, "queries", 1)
    prefetch = spec.execution.prefetch_directions
    if mode == "auto":  # builders.use_direction_cache's rule, on the trainable bytes at the run's precision
        slots = queries * (2 if prefetch else 1) + 1
        mode = "cache" if slots * sizes.trainable_bytes <= CACHE_LIMIT_BYTES else "regenerate"
    prompt = prompt_of(spec.model)
    opt = spec.optimizer
    # with model.master_weights at bf16 / fp16 the optimizer steps float32 copies of the trainable parameters,
    # and keeps its state beside them in float32
    master = bool(getattr(spec.model, "master_weights", False)) and sizes.element < 4
    updated = 4 * sizes.trainable if master else sizes.trainable_bytes
    moments = 2 if opt.kind == "adam" else (1 if getattr(opt, "momentum", 0.0) else 0)
    state = moments * updated + (updated if master else 0)
    n = n_private or spec.data.declared_private_rows or 0
    # a language model's rows are int64 [n, 3, L] (ids, mask, read positions), an encoder's [n, 2, L]
    rows = n * (2 if spec.model.kind == "hf" else 3) * length * 8 if sizes.transformer else 0
    # an evaluation reads min(4096, test rows) rows at once (a language model 32): unknown before the rows are
    # counted, it is left out of the plan until then rather than guessed
    eval_rows = EVAL_BATCH_SIZE if prompt is not None else (0 if n_eval is None else min(
        n_eval, inspect.signature(evaluate).parameters["batch_size"].default))
    return Settings(est.kind, batch, length, queries, cache=mode == "cache", prefetch=prefetch,
                    completion=prompt is not None and prompt.task == "completion",
                    public_batch=getattr(est, "public_batch_size", 0),
                    public_gradients=getattr(est, "public_batches", step_memory(est.kind).public_gradients),
                    anchors=getattr(est, "anchors", 0), basis=getattr(est, "basis", "orthonormal"),
                    optimizer_state=state,
                    optimizer_step=updated if opt.kind == "adam" else 0, rows_bytes=rows, checkpoint=on_host,
                    eval_rows=eval_rows, reload=opt.init == "latest_registered",
                    expected=spec.sampling.expected_batch_size if spec.sampling.kind == "poisson" else 0), note


def plan(spec, n_features: Optional[int] = None, n_classes: Optional[int] = None,
         n_private: Optional[int] = None, n_eval: Optional[int] = None) -> Optional[MemoryPlan]:
    """The spec's memory plan, from the model's config (no weight read) or the data's shapes; None for a model
    sized by shapes not given yet (privzo calibrate and the run's preflight give them)."""
    sizes = _spec_sizes(spec, n_features, n_classes)
    if sizes is None:
        return None
    from components.devices import device_for

    settings, note = settings_of(spec, sizes, n_private, n_eval, on_host=device_for(spec).type == "cpu")
    return estimate(sizes, settings, note)


# ------------------------------------------------------------------------------------------- the device
def device_memory(device: torch.device) -> Tuple[int, str]:
    """Bytes the run may use on ``device``, and where the number comes from: PRIVZO_DEVICE_MEMORY_BYTES when
    set; a GPU's free memory (torch.cuda.mem_get_info); the machine's available RAM (/proc/meminfo's
    MemAvailable, else the physical pages)."""
    override = os.environ.get(MEMORY_ENV)
    if override:
        return int(override), MEMORY_ENV
    if device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return free, f"free on {torch.cuda.get_device_name(device)} (of {total / GIB:.3g} GiB)"
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024, "available RAM"  # kB
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical RAM"


def _alternatives(memory_plan: MemoryPlan, memory: int) -> List[str]:
    """Changes of the spec that would fit, each with its estimate."""
    s, st = memory_plan.sizes, memory_plan.settings
    if s.weights > memory:
        return [f"nothing with these weights, which alone need {shown(s.weights)}: a smaller model"
                + (", or model.precision: bf16" if s.transformer and s.vocab and s.element == 4 else "")]
    out = []
    if st.estimator != "two_point" or st.cache:
        alt = estimate(s, dataclasses.replace(st, estimator="two_point", cache=False, public_gradients=0))
        if alt.peak <= memory:
            out.append(f"estimator.kind: two_point with perturbation: regenerate (about {shown(alt.peak)})")
    if st.cache:  # a term that reads no cache plans the same peak again, which does not fit
        alt = estimate(s, dataclasses.replace(st, cache=False))
        if alt.peak <= memory:
            out.append(f"perturbation: regenerate (about {shown(alt.peak)})")
    expected = st.expected or st.batch
    while expected > 1:
        expected //= 2
        batch = poisson_high(expected) if st.expected else expected
        alt = estimate(s, dataclasses.replace(st, batch=batch))
        if alt.peak <= memory:
            field = "sampling.expected_batch_size" if st.expected else "a batch of"
            out.append(f"{field} {expected} (about {shown(alt.peak)})")
            break
    if s.transformer and s.vocab:
        out.append("model.trainable: lora or bias" + (", or model.precision: bf16" if s.element == 4 else ""))
    elif s.transformer:
        out.append("model.trainable: head, bias or lora")
    elif not out:
        out.append("a smaller model")
    return out


def refusal(memory_plan: MemoryPlan, memory: int, source: str) -> Optional[str]:
    """The one-line refusal of a plan over ``memory`` bytes, or None when it fits."""
    if memory_plan.peak <= memory:
        return None
    return (f"execution: the run needs about {shown(memory_plan.peak)} at its peak ({shown(memory_plan.sizes.weights)} "
            f"of weights and {memory_plan.cause}), the device has {shown(memory)} ({source}); what fits: "
            + "; or ".join(_alternatives(memory_plan, memory)))


def checked(spec, n_features: Optional[int] = None, n_classes: Optional[int] = None,
            n_private: Optional[int] = None, n_eval: Optional[int] = None) -> Optional[Tuple[MemoryPlan, int, str]]:
    """(the spec's plan, the device's memory, where that number comes from), refused in one line (ValueError)
    when the plan's peak exceeds that memory; None when the model's size needs the data's shapes (not given)."""
    memory_plan = plan(spec, n_features, n_classes, n_private, n_eval)
    if memory_plan is None:
        return None
    from components.devices import device_for

    memory, source = device_memory(device_for(spec))
    message = refusal(memory_plan, memory, source)
    if message:
        raise ValueError(message)
    return memory_plan, memory, source


def check_fits(spec) -> None:
    """Before any row is read (privzo validate, the run's start): a model sized by its config is planned and
    refused when it cannot fit; a model sized by the data's shapes waits for ``check_data``."""
    checked(spec)


def check_data(spec, data) -> Tuple[List[str], str]:
    """With the data's shapes and counts (privzo calibrate, the run's preflight): the plan's lines (the same
    for the same spec and data on any machine), and apart from them the line of the memory this machine has
    now, which the plan was held against; or the one-line refusal (ValueError)."""
    test = getattr(data, "test", None)
    memory_plan, memory, source = checked(spec, data.n_features, data.n_classes, len(data.private),
                                          None if test is None else len(test))
    return memory_plan.describe(), f"this machine: device memory {shown(memory)} ({source}): the estimate fits"
