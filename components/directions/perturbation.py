"""Forward passes at perturbed points: ``perturbed`` runs a model at x + scale * v without writing x, each
module perturbed only while it runs (its own parameters into the directions' scratch stack, an embedding
table's looked-up rows only, a large Linear layer's weight a block of output rows at a time), and the update
x <- x + scale * u. The directions themselves (seeds to tensors, cache slots, the scratch) are
``engine.py``'s.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Dict, Iterator, List, Optional, Tuple

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


class _ModuleSwaps:
    """The per-module swaps of one perturbed forward in regenerate mode (``perturbed``): each module's own
    parameters written as p + scale * v into the directions' scratch stacks just before that module runs and
    given back right after; ``seen`` collects the tensors that took part, for ``check``."""

    def __init__(self, model: nn.Module, directions: Directions, direction, scale: float):
        self.directions, self.direction, self.scale = directions, direction, scale
        self.seed = direction if isinstance(direction, int) else getattr(direction, "seed", None)
        self.index = index = directions.index_of
        capacity = directions._capacities.get(id(model))
        if capacity is None:
            capacity = directions._capacities[id(model)] = perturbation_capacity(model, index)
        self.stacks = {}
        for key, n in capacity.items():
            same = [p for p in directions.params if (p.device, p.dtype) == key]
            if n and same:
                self.stacks[key] = directions.stack(same[0], n)
        self.storage_ptrs = [(s.buffer.data_ptr(), s.buffer.data_ptr() + s.buffer.numel() * s.buffer.element_size())
                             for s in self.stacks.values()]
        if self.seed is not None:
            directions._scale(self.seed)  # a sphere's norm pass: once, before any module runs
        self.detached = directions.detached()
        self.handles: list = []
        self.swapped: List[tuple] = []  # (module, name, parameter, stack) swapped by a pre-hook
        self.seen: set = set()
        self.replaced: List[nn.Module] = []  # forwards replaced by a block-of-rows forward
        self.wrapped: List[nn.Module] = []  # forwards wrapped to run at the perturbed parameters
        self.wrapped_calls = 0

    def install(self, model: nn.Module) -> None:
        """Each module owning direction tensors gets the cheapest way of running perturbed that is exact for
        it: a large Linear layer a block of rows at a time, an embedding table a hook on its looked-up rows,
        any other its own forward wrapped, or hooks around a forward already replaced on the instance."""
        directions, index = self.directions, self.index
        split = directions._splits.get(id(model))
        if split is None:
            split = directions._splits[id(model)] = _split_rows(model, index)
        for module, owned in directions.owned_by_module(model):
            if id(module) in split:
                bias = module.bias
                module.forward = functools.partial(self.split_forward, module, split[id(module)], module.weight.detach(),
                                                   None if bias is None else bias.detach(),
                                                   bias is not None and id(bias) in index)
                self.replaced.append(module)
            elif owned and row_lookup(module):
                self.handles.append(module.register_forward_hook(
                    row_hook(directions, self.direction, index[id(module.weight)], self.scale, self.seen)))
            elif owned and "forward" not in vars(module):
                # not Module.__setattr__: no checks needed
                module.__dict__["forward"] = functools.partial(self.wrapped_forward, module, self._entries(owned),
                                                               [id(p) for _, p in owned], type(module).forward,
                                                               module._parameters)
                self.wrapped.append(module)
            elif owned:  # a forward already replaced on the instance is left as it is: hooks around it
                entries = self._entries(owned)
                self.handles.append(module.register_forward_pre_hook(functools.partial(self.pre, entries)))
                self.handles.append(module.register_forward_hook(functools.partial(self.post, entries)))

    def remove(self) -> None:
        """Every module as it was, even after a forward raised half way; the stacks empty."""
        for h in self.handles:
            h.remove()
        for module in self.replaced:
            del module.forward  # the class's forward again
        for module in self.wrapped:
            module.__dict__.pop("forward", None)
        for module, name, p, _stack in self.swapped:
            module._parameters[name] = p
        for stack in self.stacks.values():
            stack.offset = 0

    def check(self) -> None:
        """After forwards that ran: every direction tensor was used through its own module's forward."""
        if not (self.swapped or self.replaced or self.wrapped_calls):
            return
        missed = [i for i, p in enumerate(self.directions.params) if id(p) not in self.seen]
        if missed:
            # a parameter read outside its own module's forward would be evaluated unperturbed and bias
            # the finite differences silently; refuse instead
            raise RuntimeError(
                f"perturbed forward: {len(missed)} trainable parameter tensor(s) (first: #{missed[0]}) were not "
                "used through their own module's forward; freeze unused parameters (requires_grad=False)")

    def _entries(self, owned) -> List[tuple]:
        # what each call needs, looked up once: a module runs once a forward, a step runs two
        return [(name, p, self.index[id(p)], self.stacks[(p.device, p.dtype)]) for name, p in owned]

    def write(self, p: torch.Tensor, i: int, out: torch.Tensor) -> None:
        if self.seed is None:
            torch.add(p, self.direction.tensor(i), alpha=self.scale, out=out)
        else:
            self.directions.perturb_into(self.seed, i, p, out, self.scale)

    def write_span(self, p: torch.Tensor, i: int, start: int, stop: int, out: torch.Tensor) -> None:
        if self.seed is None:
            torch.add(p.reshape(-1)[start:stop], self.direction.tensor(i).reshape(-1)[start:stop], alpha=self.scale,
                      out=out.view(-1))
        else:
            self.directions.perturb_span_into(self.seed, i, p, start, stop, out, self.scale)

    def pre(self, entries, module: nn.Module, _args) -> None:
        """Forward pre-hook: the module's own parameters swapped for their perturbed values."""
        for name, p, i, stack in entries:
            view = stack.take_shape(p.shape)
            self.write(self.detached[i], i, view)
            module._parameters[name] = view
            self.swapped.append((module, name, p, stack))
            self.seen.add(id(p))

    def post(self, entries, module: nn.Module, _args, out):
        """Forward hook: the parameters back, their scratch given back (the output off it)."""
        for name, p, _i, stack in reversed(entries):
            module._parameters[name] = p
            stack.give_back(p)
        return _off_scratch(out, self.storage_ptrs)

    def wrapped_forward(self, module: nn.Module, entries, ids, forward, params, /, *args, **kwargs):
        """The module's own forward run at its perturbed parameters: the hooks' work without the hooks,
        whose dispatch costs more than the swap itself (a 32-layer decoder has 290 such modules)."""
        taken = 0
        try:
            for name, p, i, stack in entries:
                view = stack.take_shape(p.shape)
                taken += 1
                self.write(self.detached[i], i, view)
                params[name] = view
            self.seen.update(ids)
            self.wrapped_calls += 1
            out = forward(module, *args, **kwargs)
        finally:
            for name, p, _i, stack in reversed(entries[:taken]):
                params[name] = p
                stack.give_back(p)
        copied = _off_scratch(out, self.storage_ptrs)
        return out if copied is None else copied

    def split_forward(self, module: nn.Linear, rows: int, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      trained_bias: bool, /, x: torch.Tensor) -> torch.Tensor:
        """The Linear layer's forward at its perturbed weight (``weight``, ``bias``: its own, detached), a
        block of output rows at a time: each block of (W + scale v) is written into the stack, multiplied,
        and given back."""
        index, stacks = self.index, self.stacks
        n, width = weight.shape
        self.seen.add(id(module.weight))
        if trained_bias:
            self.seen.add(id(module.bias))
        out = None
        for a in range(0, n, rows):
            e = min(n, a + rows)
            stack = stacks[(weight.device, weight.dtype)]
            w = stack.take_shape((e - a, width))
            self.write_span(weight, index[id(module.weight)], a * width, e * width, w)
            b = None if bias is None else bias[a:e]
            if trained_bias:
                b = stacks[(bias.device, bias.dtype)].take_shape((e - a,))
                self.write_span(bias, index[id(module.bias)], a, e, b)
            y = nn.functional.linear(x, w, b)
            if trained_bias:
                stacks[(bias.device, bias.dtype)].give_back(b)
            stack.give_back(w)
            if out is None:
                out = y.new_empty(y.shape[:-1] + (n,))
            out[..., a:e] = y
        return out


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
    swaps = _ModuleSwaps(model, directions, direction, scale)
    swaps.install(model)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        swaps.remove()  # restore even if a forward raised half way
    if not failed:
        swaps.check()
