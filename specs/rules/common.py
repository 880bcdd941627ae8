"""Rules every family shares (privacy, sampling, data, model, execution), and the entry point that runs
every family's rules on a spec. Each message names its fields and the fix."""
from __future__ import annotations

from typing import List, Optional

from specs.rules.kl import kl_problems
from specs.rules.nonsmooth import nonsmooth_problems
from specs.rules.standard import standard_problems
from specs.traits import (COLUMN_SOURCES, has_columns, reads_text, ESTIMATORS, JOURNAL_ESTIMATORS, JOURNAL_OPTIMIZERS, KL_OPTIMIZERS, MODELS,
                          NONSMOOTH_ESTIMATORS, OPTIMIZERS, SOURCES, STANDARD, family_of, kinds, known_range)


def cross_field_problems(spec) -> List[str]:
    """Rules that involve more than one field; each message names its fields and the fix."""
    problems: List[str] = []
    opt = spec.optimizer
    theory = (opt.kind == "o2nc" and opt.preset != "manual") or opt.kind in KL_OPTIMIZERS
    if opt.steps == "auto" and opt.epochs is None and not theory:
        problems.append("optimizer: give epochs or steps (steps: auto needs epochs)")
    if opt.kind == "o2nc" and opt.epochs is not None:
        problems.append("optimizer.epochs: o2nc runs a single pass; give steps, or steps: auto with preset: theory")
    if opt.kind in KL_OPTIMIZERS and opt.epochs is not None:
        problems.append(f"optimizer.epochs: {opt.kind} plans its own releases from the theorem; remove epochs "
                        "(steps: auto)")
    if opt.steps != "auto" and opt.epochs is not None:
        problems.append("optimizer: give one of epochs or steps, not both")
    if spec.mechanism.kind == "none" and spec.privacy is not None:
        problems.append("privacy: mechanism.kind none trains without privacy; remove the privacy section")
    if spec.mechanism.kind != "none" and spec.privacy is None:
        problems.append("privacy: required key is missing (epsilon, delta, accountant, neighboring)")
        return problems
    if spec.privacy is not None and spec.privacy.allow_large_delta and spec.privacy.delta == "auto":
        problems.append("privacy.allow_large_delta: delta auto is 1/N, never above it; remove allow_large_delta")
    if spec.privacy is not None and spec.data.declared_private_rows is not None:
        # N is public here, so the spec alone is refused; otherwise (replace_one) when its rows are counted
        problem = spec.delta_problem()
        if problem:
            problems.append(problem)
    if spec.budget is not None and not (spec.privacy and not spec.privacy.insecure_deterministic):
        problems.append("budget: only private runs are charged to a dataset's budget; remove budget")
    problems += _block_problems(spec)
    problems += _tune_problems(spec)
    problems += _transcript_problems(spec)
    if spec.budget is not None and spec.privacy is not None and spec.privacy.epsilon > spec.budget.lifetime_epsilon:
        problems.append("privacy.epsilon: larger than budget.lifetime_epsilon; lower it or raise the budget")
    if spec.privacy is not None and spec.privacy.neighboring == "replace_one" and spec.sampling.kind == "poisson":
        problems.append(
            "privacy.neighboring: replace_one is not accounted for poisson sampling; use add_remove "
            "with sampling.kind: poisson, or sampling.kind: fixed_size or full_batch"
        )
    if spec.privacy is not None and spec.sampling.kind == "full_batch" and spec.privacy.neighboring != "replace_one":
        # a full-batch step is normalised by the number of rows, which add/remove neighbours change
        problems.append("privacy.neighboring: sampling.kind full_batch divides by the number of private rows, "
                        "which add/remove neighbours change; set neighboring: replace_one")
    if spec.privacy is not None and spec.sampling.kind == "fixed_size":
        if spec.privacy.neighboring != "replace_one":
            problems.append("privacy.neighboring: sampling.kind fixed_size is accounted under replace_one only "
                            "(its batch size is public); set neighboring: replace_one or use sampling.kind: poisson")
        if spec.privacy.accountant != "rdp":
            problems.append(f"privacy.accountant: {spec.privacy.accountant} has no accounting for sampling without "
                            "replacement (sampling.kind fixed_size); use accountant: rdp")
    if spec.privacy is not None and spec.privacy.accountant == "zcdp" and spec.sampling.kind == "poisson":
        # fixed_size is refused above; zCDP has no tight bound for any subsampled step
        problems.append("privacy.accountant: zcdp has no bound for Poisson-subsampled steps; use rdp or pld, "
                        "or sampling.kind: full_batch with neighboring: replace_one")
    declared = spec.data.declared_private_rows
    if (spec.privacy is not None and spec.privacy.neighboring == "add_remove" and spec.sampling.kind == "poisson"
            and declared is None):
        problems.append("data.declared_private_rows: required with neighboring add_remove: Poisson's rate "
                        "expected_batch_size / N, steps from epochs and delta auto must not move with an added or "
                        "removed row; declare N, a public figure for the number of private rows")
    if declared is not None and spec.sampling.kind == "poisson" and spec.sampling.expected_batch_size > declared:
        problems.append(f"sampling.expected_batch_size: {spec.sampling.expected_batch_size} is more than "
                        f"data.declared_private_rows {declared}; the rate expected_batch_size / N must be at most 1")
    est = spec.estimator
    split = spec.data.split
    if family_of(spec) != STANDARD and not MODELS[spec.model.kind].sized_from_shapes:
        # the nonsmooth and KL plans read the model's dimension before training (components/families:
        # needs_dimension), which only a model sized from the data's shapes gives; their theory is for small problems
        sized = kinds(MODELS, sized_from_shapes=True)
        problems.append(f"model.kind: {spec.model.kind} is a pretrained model, which optimizer.kind {opt.kind} cannot "
                        "plan (its plan needs the dimension of a model sized from the data's shapes); train it with "
                        f"optimizer.kind {' or '.join(kinds(OPTIMIZERS, family=STANDARD))}, or use model.kind "
                        f"{', '.join(sized[:-1])} or {sized[-1]}")
    problems += nonsmooth_problems(spec)
    problems += kl_problems(spec)
    if est.kind not in NONSMOOTH_ESTIMATORS and getattr(est, "radius", "auto") != "auto" and est.directions != "sphere":
        problems.append("estimator.radius: only used with directions: sphere; remove it or set directions: sphere")
    ex = spec.execution
    if ex.backend == "ray" and ex.device == "cuda" and ex.gpus_per_worker == 0:
        problems.append("execution.device: cuda with backend ray needs gpus_per_worker > 0 (workers draw the "
                        "driver's directions on the same kind of device); set gpus_per_worker or device: cpu")
    if ex.workers_per_node is not None and ex.workers % ex.workers_per_node:
        problems.append(f"execution.workers_per_node: {ex.workers_per_node} does not divide execution.workers "
                        f"({ex.workers}); workers are placed as workers / workers_per_node whole nodes")
    problems += standard_problems(spec)
    if ESTIMATORS[est.kind].uses_public and not split.has_public:
        problems.append(f"estimator.kind: {est.kind} uses public data; set data.split.public > 0")
    if getattr(est, "public_warm_start", None) is not None and not split.has_public:
        problems.append("estimator.public_warm_start: needs public data; set data.split.public > 0")
    if split.kind in ("fraction", "hashed"):
        if split.imbalance is not None and split.public == 0.0:
            problems.append("data.split.imbalance: needs a public fraction > 0")
        if split.test == 0 and spec.data.source.kind != "synthetic":
            problems.append("data.split.test: 0 leaves nothing to evaluate on; only a synthetic source (exact "
                            "evaluation) may hold no test rows")
        if split.public > 0 and split.test + split.public * (1 - split.test) >= 1.0:
            problems.append("data.split: public and test fractions leave no private rows")
    source = spec.data.source
    if split.kind == "column" and not has_columns(source):
        problems.append(f"data.split.kind: column reads a column of a {COLUMN_SOURCES} source; use "
                        f"data.source.kind: {COLUMN_SOURCES}")
    if split.kind == "column" and has_columns(source):
        if split.column == source.label or (source.features is not None and split.column in source.features):
            problems.append(f"data.split.column: {split.column!r} is the label or a feature; name the column "
                            "that flags public rows")
        if split.column == source.text:
            problems.append(f"data.split.column: {split.column!r} is the text column")
    if split.kind == "source":
        problems += _public_source_problems(source, split.public_source)
    file_text = reads_text(source)
    # hf, causal_lm and masked_lm read token ids made by their own tokenizer
    text, hf = source.kind == "text" or file_text, MODELS[spec.model.kind].reads == "tokens"
    completions = SOURCES[source.kind].rows == "completions"
    if hf and not text and not completions:
        problems.append(f"model.kind: {spec.model.kind} reads token ids; use data.source.kind: text, or a file or "
                        "sql source with a text column")
    if file_text and source.text == source.label:
        problems.append("data.source.text: the label column cannot also be the text")
    if text and hf and source.tokenizer not in (None, spec.model.weights):
        problems.append(f"data.source.tokenizer: {source.tokenizer!r} is not the model's ({spec.model.weights!r}); "
                        "the ids must index the model's own vocabulary")
    if text and not hf:
        field = "data.source.text" if file_text else "data.source.kind: text"
        problems.append(f"{field} gives token ids, which model.kind {spec.model.kind} cannot read; use model.kind: "
                        f"{' or '.join(kinds(MODELS, reads='tokens'))}")
    problems += _prompt_problems(spec, completions)
    # 'auto' standardises with the public rows, except pixels of a known range (digits, images) and text (ids)
    fixed_range = known_range(source)
    scale = getattr(source, "scale", "none")
    if scale == "fixed" and not fixed_range:
        problems.append("data.source.scale: fixed is only known for digits and images; use public or none")
    if not file_text and (scale == "public" or (scale == "auto" and not fixed_range)) and not split.has_public:
        problems.append("data.source.scale: public standardisation needs data.split.public > 0; set scale: none")
    return problems


def _transcript_problems(spec) -> List[str]:
    """tracking.register_as: transcript registers the journal in place of the weights, so the journal must be the
    whole trajectory, from public initial weights a replay rebuilds (flows/record/transcript.py)."""
    if spec.tracking.register_as != "transcript":
        return []
    est, opt = spec.estimator.kind, spec.optimizer.kind
    if est not in JOURNAL_ESTIMATORS or opt not in JOURNAL_OPTIMIZERS:
        return [f"tracking.register_as: transcript rebuilds the weights by replaying the journal of (seed, "
                f"coefficient) steps, which is the whole trajectory only for estimator.kind "
                f"{' or '.join(JOURNAL_ESTIMATORS)} with optimizer.kind {' or '.join(JOURNAL_OPTIMIZERS)} (found {est} "
                f"with {opt}); use register_as: weights"]
    if spec.data.blocks is not None and getattr(spec.estimator, "public_warm_start", None) is not None:
        return ["tracking.register_as: transcript cannot rebuild a public warm start on a window of data.blocks (its "
                "public rows move with the window); remove estimator.public_warm_start or use register_as: weights"]
    return []


def _prompt_problems(spec, completions: bool) -> List[str]:
    """A language model's prompt and the rows it reads: label words with labelled text, one word per class;
    a completion prompt with (prompt, completion) rows, and those rows with nothing else."""
    prompt = getattr(spec.model, "prompt", None)
    generation = prompt is not None and prompt.kind == "completion"
    problems = []
    if completions and not generation:
        found = f"model.kind {spec.model.kind}" + (f" with prompt.kind {prompt.kind}" if prompt is not None else "")
        problems.append(f"data.source.kind: completions gives (prompt, completion) rows, read only by model.kind "
                        f"causal_lm with prompt.kind: completion (found {found}); use that model, or a text source")
    if generation and not completions:
        problems.append("model.prompt.kind: completion scores each row's completion; use data.source.kind: "
                        "completions (prompt and completion columns), or prompt.kind: label_words for labelled text")
    source = spec.data.source
    declared = _declared_classes(source)
    if prompt is not None and prompt.kind == "label_words" and declared is not None \
            and len(prompt.words) != len(declared[1]):
        field, classes = declared
        problems.append(f"model.prompt.words: {len(prompt.words)} words for the {len(classes)} data.source.{field}; "
                        f"give one word per {'topic' if field == 'topics' else 'class'}, in the order of the {field}")
    return problems


def _declared_classes(source) -> Optional[tuple]:
    """(field, names) where the spec itself names a source's classes in the model's order: a file's or an image
    folder's classes, a text corpus's selected topics; None where the source knows them (a packaged set, a
    whole corpus)."""
    if source.kind in ("file", "images", "sql"):
        return "classes", [str(c) for c in source.classes]
    if source.kind == "text" and source.topics is not None:
        return "topics", list(source.topics)
    return None


def _block_problems(spec) -> List[str]:
    """data.blocks and budget.window go together, on a file whose rows can be matched as it grows."""
    blocks, budget = spec.data.blocks, spec.budget
    window = budget.window if budget is not None else None
    if blocks is None:
        return ["budget.window: chooses among data.blocks; give data.blocks or remove budget.window"] if window else []
    problems = []
    if budget is None or window is None:
        problems.append("data.blocks: a block's budget is kept in the ledger and read through a window; give budget "
                        "with budget.window (e.g. {blocks: 7})")
    elif spec.data.declared_private_rows != blocks.declared_units * window.blocks:
        per = "declared_persons" if blocks.person else "declared_private_rows"
        problems.append(f"data.declared_private_rows: with data.blocks it is data.blocks.{per} x "
                        f"budget.window.blocks = {blocks.declared_units * window.blocks}; remove it")
    source = spec.data.source
    if not has_columns(source):
        problems.append(f"data.blocks: reads an arrival column of a {COLUMN_SOURCES} source, not data.source.kind "
                        f"{source.kind}")
    else:
        taken = {source.label: "data.source.label", **{c: "data.source.features" for c in source.features or ()}}
        if source.text is not None:
            taken[source.text] = "data.source.text"
        if spec.data.split.kind == "column":
            taken[spec.data.split.column] = "data.split.column"
        for column in blocks.columns:
            if column in taken:
                problems.append(f"data.blocks: column {column!r} is public metadata and cannot also be "
                                f"{taken[column]}")
    if blocks.partitioned and source.kind == "sql":
        problems.append("data.blocks.partitioned: a table has no files per period; name its arrival column "
                        "(data.blocks.arrival)")
    if blocks.partitioned and source.kind == "file" and source.format == "hf_disk":
        problems.append("data.source.format: a partitioned folder holds csv, parquet or jsonl files, one per period; "
                        "use auto or one of those")
    if spec.data.split.kind not in ("hashed", "column"):
        problems.append(f"data.split.kind: {spec.data.split.kind} moves rows between parts as blocks arrive; use "
                        "hashed or column with data.blocks")
    problems += _person_problems(spec)
    if window is not None and window.kind == "with_budget" and spec.privacy is not None \
            and spec.privacy.neighboring != "add_remove":
        problems.append("budget.window.kind: with_budget chooses blocks with room for the planned run before any "
                        "row is read, and under replace_one the plan needs the private count; use add_remove")
    if spec.privacy is not None and spec.privacy.delta == "auto":
        problems.append("privacy.delta: a block's lifetime (epsilon, delta) is fixed when it is first charged, so "
                        "delta must be a number with data.blocks, not auto")
    return problems


def _person_problems(spec) -> List[str]:
    """A person-level run (data.blocks.person) samples persons and clips each sampled person's summed rows:
    only what can do that is allowed, each refused in one line."""
    if not spec.person_level:
        return []
    problems = []
    if not ESTIMATORS[spec.estimator.kind].person_level:
        allowed = ", ".join(kinds(ESTIMATORS, person_level=True))
        problems.append(f"estimator.kind: {spec.estimator.kind} has no person-level clipping (a person's rows summed, "
                        f"then clipped); with data.blocks.person use one of {allowed}, or drop person for event level")
    if spec.sampling.kind != "poisson":
        problems.append(f"sampling.kind: a person-level run samples persons with poisson (add_remove), not "
                        f"{spec.sampling.kind}")
    if spec.privacy is not None and spec.privacy.neighboring != "add_remove":
        problems.append("privacy.neighboring: a person-level run is accounted for adding or removing a person: "
                        "use add_remove")
    if spec.data.split.kind != "hashed":
        problems.append(f"data.split.kind: a person-level run splits by person (hashed on the person column), so no "
                        f"person has rows in two parts; use hashed, not {spec.data.split.kind}")
    return problems


def _tokens(source) -> Optional[tuple]:
    """What a source's rows are made of: None for numbers, (tokenizer, length) for token ids, (completions,
    length) for a causal LM's prompts and completions."""
    if source.kind == "text" or reads_text(source):
        return (source.tokenizer, source.max_length)
    if SOURCES[source.kind].rows == "completions":
        return ("completions", source.max_length)
    return None


def _public_source_problems(source, public) -> List[str]:
    problems = []
    if _tokens(source) != _tokens(public):
        problems.append("data.split.public_source: its rows must be read like the main source's (both numbers, "
                        "or both text with the same tokenizer and max_length)")
    if public.kind == "file" and source.kind == "file" and [str(c) for c in public.classes] != [
            str(c) for c in source.classes]:
        problems.append("data.split.public_source.classes: must be data.source.classes, in the same order")
    mine, theirs = _declared_classes(source), _declared_classes(public)
    if "text" in (source.kind, public.kind) and mine is not None and theirs is not None and mine[1] != theirs[1]:
        # a label is a position among the classes: another selection would give a public row another class
        problems.append(f"data.split.public_source.{theirs[0]}: must be data.source.{mine[0]}, in the same order")
    elif source.kind == public.kind == "text" and (mine is None) != (theirs is None):
        problems.append("data.split.public_source.topics: must be data.source.topics, in the same order (select "
                        "the same topics in both, or in neither)")
    if (source.kind == "images") != (public.kind == "images") or (source.kind == "images" and (
            public.image_shape != source.image_shape or public.classes != source.classes)):
        problems.append("data.split.public_source: images need public images of the same classes (in the same "
                        "order), mode and size")
    if getattr(public, "scale", "auto") != "auto":
        problems.append("data.split.public_source.scale: the main source's scale applies to both; remove it")
    return problems


def _tune_problems(spec) -> List[str]:
    """A search inside the guarantee: RDP (the only accountant dp-accounting composes repeat-and-select in),
    the standard family (the others plan their settings from the theorem), a private run on fixed rows."""
    tune = spec.tune
    if tune is None:
        return []
    problems = []
    if spec.privacy is None or spec.privacy.insecure_deterministic:
        problems.append("tune: a search is a private run's (privacy, a mechanism, noise from the OS): its selection "
                        "is what the guarantee covers")
    elif spec.privacy.accountant != "rdp":
        problems.append(f"privacy.accountant: a tune's selection is accounted in RDP (Papernot & Steinke), and "
                        f"{spec.privacy.accountant} has no bound for it; use accountant: rdp")
    if family_of(spec) != STANDARD:
        problems.append(f"tune: {spec.optimizer.kind} plans its settings from its theorem; tune searches the "
                        "standard family's estimators and optimizers (sgd, adam)")
    return problems
