"""Forward passes at perturbed points: ``perturbed`` runs a model at x + scale * v without writing x, each
module perturbed only while it runs (its own parameters into the directions' scratch stack, an embedding
table's looked-up rows only, a large Linear layer's weight a block of output rows at a time), and the update
x <- x + scale * u. The directions themselves (seeds to tensors, cache slots, the scratch) are
``engine.py``'s.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Iterator, List, Tuple

import torch
from torch import nn

from components.directions.chunks import CHUNK
from components.directions.engine import Directions, row_hook
from components.directions.streams import row_lookup

# A plain Linear layer whose weight has at least SPLIT_MIN elements, and more than twice what any other module
# perturbs, is perturbed a block of output rows at a time in regenerate mode (``_split_rows``): a small
# decoder's LM head is a quarter or more of its weights, and perturbed whole it would be most of regenerate
# mode's memory above inference. Blocks start at multiples of SPLIT_ALIGN elements, as the whole tensor's
# vectorised arithmetic does, and hold at least a chunk (CHUNK elements: few matrix products a forward).
SPLIT_MIN = 1 << 18
SPLIT_ALIGN = 64


def direction_tensor(directions: Directions, direction, i: int) -> torch.Tensor:
    """Tensor ``i`` of a ``Seeded``/``Dense`` direction (a bare int is a seed)."""
    if isinstance(direction, int):
        return directions.tensor(direction, i)
    seed = getattr(direction, "seed", None)
    if seed is not None:
        return directions.tensor(seed, i)
    return direction.tensor(i)


def add_direction_(directions: Directions, seed: int, scale: float) -> None:
    """In place: x <- x + scale * u(seed). Used for updates (not for the +-lambda query points)."""
    with torch.no_grad():
        directions.add_all_(seed, scale)


def _splittable(module: nn.Module, index: Dict[int, int]) -> bool:
    """A plain Linear layer (its own forward, not replaced on the instance) with a large trainable weight."""
    weight = getattr(module, "weight", None)
    return (isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward
            and "forward" not in vars(module) and weight is not None and id(weight) in index
            and weight.dim() == 2 and weight.numel() >= SPLIT_MIN)


def _own(module: nn.Module, index: Dict[int, int]) -> int:
    return sum(p.numel() for p in module._parameters.values() if p is not None and id(p) in index)


def _split_rows(model: nn.Module, index: Dict[int, int]) -> Dict[int, int]:
    """id(module) -> output rows a block, for each Linear layer perturbed a block of rows at a time: one
    whose weight is at least SPLIT_MIN elements and over twice the most any other module perturbs, in
    blocks of about that most (at least CHUNK elements) aligned to SPLIT_ALIGN elements."""
    large = [m for m in model.modules() if _splittable(m, index)]
    if not large:
        return {}
    ids = {id(m) for m in large}
    others = max((_own(m, index) for m in model.modules() if id(m) not in ids and not row_lookup(m)), default=0)
    block = max(others, CHUNK)
    rows = {}
    for m in large:
        out_features, in_features = m.weight.shape
        # blocks of whole chunks where a block that size fits: a block cutting a chunk would draw it twice,
        # once for each block (on a CPU, an LM head's draws were half a direction more a step)
        whole = math.lcm(in_features, CHUNK)
        if whole <= block:
            r = block // whole * whole // in_features
        else:
            # rows whose elements are a multiple of SPLIT_ALIGN, so that every block starts on one
            step = SPLIT_ALIGN // math.gcd(SPLIT_ALIGN, in_features)
            r = max(step, block // in_features // step * step)
        if m.weight.numel() > 2 * block and r < out_features:
            rows[id(m)] = r
    return rows


def perturbation_capacity(model: nn.Module, index: Dict[int, int]) -> Dict[Tuple[torch.device, torch.dtype], int]:
    """Scratch needed at once: a module's own perturbed parameters plus the largest need of a child
    (children run inside their parent's forward). Embedding tables need none; a Linear layer perturbed a
    block of rows at a time (``_split_rows``) needs one block of its weight and bias."""
    split = _split_rows(model, index)

    def need(module: nn.Module) -> Dict:
        own: Dict = {}
        if id(module) in split:
            rows = split[id(module)]
            for p in (module.weight, module.bias):
                if p is not None and id(p) in index:
                    key = (p.device, p.dtype)
                    own[key] = own.get(key, 0) + rows * (p.shape[1] if p.dim() > 1 else 1)
        elif not row_lookup(module):
            for p in module._parameters.values():
                if p is not None and id(p) in index:
                    key = (p.device, p.dtype)
                    own[key] = own.get(key, 0) + p.numel()
        child_max: Dict = {}
        for child in module.children():
            for key, n in need(child).items():
                child_max[key] = max(child_max.get(key, 0), n)
        for key, n in child_max.items():
            own[key] = own.get(key, 0) + n
        return own

    return need(model)


def _aliases(value, spans) -> bool:
    """Whether ``value`` is a tensor whose data lies in one of the scratch buffers' byte ``spans``."""
    if not isinstance(value, torch.Tensor):
        return False
    ptr = value.data_ptr()
    return any(lo <= ptr < hi for lo, hi in spans)


def _off_scratch(out, spans):
    """A module's output with copies of what in it lies in the scratch buffers (a module returning a view of
    its own perturbed parameter must not keep scratch memory), or None when nothing does."""
    if _aliases(out, spans):
        return out.clone()
    if isinstance(out, (tuple, list)) and any(_aliases(o, spans) for o in out):
        return type(out)(o.clone() if _aliases(o, spans) else o for o in out)
    return None


@contextlib.contextmanager
def perturbed(model: nn.Module, directions: Directions, direction, scale: float) -> Iterator[None]:
    """Run the model's forward passes at x + scale * v without writing x (v: a seed, ``Seeded`` or ``Dense``).

    A direction cached for this step (cache mode) swaps all parameters at once (``Directions.swapped``).
    Otherwise each module's own parameters are swapped for ``p + scale * v`` (written into a reusable scratch
    stack) just before that module runs and swapped back right after, so only the parameters of the
    modules currently running exist perturbed (memory of inference + about one module's parameters) and
    the parameters are restored bit for bit: x itself is never modified, unlike MeZO's in-place
    +lambda, -2lambda, +lambda, which drifts by rounding in floating point. An embedding table is not
    swapped: the rows its forward looked up get ``scale * v`` added (a transformer's word embeddings are
    most of its parameters, and a batch reads a few hundred of their rows). A large Linear layer (a small
    decoder's LM head, ``_split_rows``) runs a block of output rows at a time, each block perturbed into the
    stack in turn: the same values, a block's memory.
    """
    seed = direction if isinstance(direction, int) else getattr(direction, "seed", None)
    cached = directions._cache.get(seed) if seed is not None else None
    if cached is not None:
        with directions.swapped(model, seed, scale):  # no per-module hooks and no per-module scratch
            yield
        return
    index = directions.index_of
    capacity = directions._capacities.get(id(model))
    if capacity is None:
        capacity = directions._capacities[id(model)] = perturbation_capacity(model, index)
    stacks = {}
    for key, n in capacity.items():
        same = [p for p in directions.params if (p.device, p.dtype) == key]
        if n and same:
            stacks[key] = directions.stack(same[0], n)
    storage_ptrs = [(s.buffer.data_ptr(), s.buffer.data_ptr() + s.buffer.numel() * s.buffer.element_size())
                    for s in stacks.values()]
    if seed is not None:
        directions._scale(seed)  # a sphere's norm pass: once, before any module runs
    handles = []
    swapped: List[tuple] = []
    seen = set()

    def write(p: torch.Tensor, i: int, out: torch.Tensor) -> None:
        if seed is None:
            torch.add(p, direction.tensor(i), alpha=scale, out=out)
        else:
            directions.perturb_into(seed, i, p, out, scale)

    detached = directions.detached()

    def make_hooks(owned):
        # what each hook call needs, looked up once: a module runs once a forward, a step runs two
        entries = [(name, p, index[id(p)], stacks[(p.device, p.dtype)]) for name, p in owned]

        def pre(module, _args):
            for name, p, i, stack in entries:
                view = stack.take_shape(p.shape)
                write(detached[i], i, view)
                module._parameters[name] = view
                swapped.append((module, name, p, stack))
                seen.add(id(p))

        def post(module, _args, out):
            for name, p, _i, stack in reversed(entries):
                module._parameters[name] = p
                stack.give_back(p)
            return _off_scratch(out, storage_ptrs)

        return pre, post

    wrapped_calls = [0]

    def wrap_forward(module: nn.Module, owned):
        """The module's own forward run at its perturbed parameters: ``make_hooks``' work without the hooks,
        whose dispatch costs more than the swap itself (a 32-layer decoder has 290 such modules)."""
        entries = [(name, p, index[id(p)], stacks[(p.device, p.dtype)]) for name, p in owned]
        ids = [id(p) for _, p in owned]
        forward, params = type(module).forward, module._parameters

        def perturbed_forward(*args, **kwargs):
            taken = 0
            try:
                for name, p, i, stack in entries:
                    view = stack.take_shape(p.shape)
                    taken += 1
                    write(detached[i], i, view)
                    params[name] = view
                seen.update(ids)
                wrapped_calls[0] += 1
                out = forward(module, *args, **kwargs)
            finally:
                for name, p, _i, stack in reversed(entries[:taken]):
                    params[name] = p
                    stack.give_back(p)
            copied = _off_scratch(out, storage_ptrs)
            return out if copied is None else copied

        return perturbed_forward

    def write_span(p: torch.Tensor, i: int, start: int, stop: int, out: torch.Tensor) -> None:
        if seed is None:
            torch.add(p.reshape(-1)[start:stop], direction.tensor(i).reshape(-1)[start:stop], alpha=scale,
                      out=out.view(-1))
        else:
            directions.perturb_span_into(seed, i, p, start, stop, out, scale)

    def split_forward(module: nn.Linear, rows: int):
        """The Linear layer's forward at its perturbed weight, a block of output rows at a time: each block
        of (W + scale v) is written into the stack, multiplied, and given back."""
        weight, bias = module.weight.detach(), module.bias
        trained_bias = bias is not None and id(bias) in index
        bias = None if bias is None else bias.detach()
        n, width = weight.shape

        def forward(x: torch.Tensor) -> torch.Tensor:
            seen.add(id(module.weight))
            if trained_bias:
                seen.add(id(module.bias))
            out = None
            for a in range(0, n, rows):
                e = min(n, a + rows)
                stack = stacks[(weight.device, weight.dtype)]
                w = stack.take_shape((e - a, width))
                write_span(weight, index[id(module.weight)], a * width, e * width, w)
                b = None if bias is None else bias[a:e]
                if trained_bias:
                    b = stacks[(bias.device, bias.dtype)].take_shape((e - a,))
                    write_span(bias, index[id(module.bias)], a, e, b)
                y = nn.functional.linear(x, w, b)
                if trained_bias:
                    stacks[(bias.device, bias.dtype)].give_back(b)
                stack.give_back(w)
                if out is None:
                    out = y.new_empty(y.shape[:-1] + (n,))
                out[..., a:e] = y
            return out

        return forward

    split = directions._splits.get(id(model))
    if split is None:
        split = directions._splits[id(model)] = _split_rows(model, index)
    replaced, wrapped = [], []
    for module, owned in directions.owned_by_module(model):
        if id(module) in split:
            module.forward = split_forward(module, split[id(module)])
            replaced.append(module)
        elif owned and row_lookup(module):
            handles.append(module.register_forward_hook(row_hook(directions, direction, index[id(module.weight)],
                                                                  scale, seen)))
        elif owned and "forward" not in vars(module):
            module.__dict__["forward"] = wrap_forward(module, owned)  # not Module.__setattr__: no checks needed
            wrapped.append(module)
        elif owned:  # a forward already replaced on the instance is left as it is: hooks around it
            pre, post = make_hooks(owned)
            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post))
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for h in handles:
            h.remove()
        for module in replaced:
            del module.forward  # the class's forward again
        for module in wrapped:
            module.__dict__.pop("forward", None)
        for module, name, p, _stack in swapped:  # restore even if a forward raised half way
            module._parameters[name] = p
        for stack in stacks.values():
            stack.offset = 0
    if (swapped or replaced or wrapped_calls[0]) and not failed:
        missed = [i for i, p in enumerate(directions.params) if id(p) not in seen]
        if missed:
            # a parameter read outside its own module's forward would be evaluated unperturbed and bias
            # the finite differences silently; refuse instead
            raise RuntimeError(
                f"perturbed forward: {len(missed)} trainable parameter tensor(s) (first: #{missed[0]}) were not "
                "used through their own module's forward; freeze unused parameters (requires_grad=False)")
