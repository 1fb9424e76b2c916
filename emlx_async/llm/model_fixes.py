"""Fixes of mlx-lm's model code that Engine.load applies, so more families replay natively.

Each ``fix_*`` takes a loaded mlx-lm model, swaps the classes of the modules
whose code cannot be traced over a position array or batched (a same-named
subclass calling mlx-lm's own method where it can), and says whether it
changed anything. Call them on a model you hand to ``Engine`` yourself.
"""

from __future__ import annotations

import functools

from .. import InvalidArgument


def fix_batch_masks(model) -> bool:
    """Make a batch of mlx-lm's gemma2 give each row its own logits; whether it changed anything.

    Its attention splits the query heads into {B, kv_heads, repeats, L, S} scores by hand and
    adds the {B, 1, L, S} mask of a batch to them as it is, so the mask's rows land on the
    key-value heads: a batch is wrong (mlx-lm's BatchGenerator too) or fails to broadcast.
    Each attention module becomes a subclass that gives the mask a repeats axis first
    ({B, 1, 1, L, S}). Done at load, before any worker runs the model (it is read-only
    afterwards); batch mode's load check (replay_step.check_batch_against_rows) holds it."""
    try:
        from mlx_lm.models import gemma2
    except ImportError:
        return False
    return _swap_calls(model, {gemma2.Attention: _gemma2_batch_attention})


def fix_position_arrays(model) -> bool:
    """Let mlx-lm's llama4, afm7 and gpt_bigcode take their position as an array (the replayed
    step's, and mlx-lm's batch caches'); whether it changed anything.

    llama4 builds its chunked layers' mask from Python-int positions (``mx.arange(start,
    end)`` off its first ChunkedKVCache), and its layers without rope scale their queries by
    a temperature of ``mx.arange(offset + 1, ...)``: a step traced over a position array
    fails in both. afm7's key-reusing layers rotate their queries at the reused keys' length
    less the new tokens' (a shape: the position only where the cache holds exactly the
    tokens so far, so over a fixed buffer, or mlx-lm's left-padded batch, the wrong one).
    gpt_bigcode computes its learned positions' ids in numpy (``np.arange(offset, ...)``).
    Where caches' offsets are arrays (the step's stand-ins, mlx-lm's batch caches) those
    modules ask the first chunked cache for the chunk mask (``make_chunk_mask``, as other
    models ask theirs for masks) and compute the temperature from the array (llama4), rotate
    the reusing layers' queries at the last cache's offset before the call (afm7), and add
    the offset array to ``mx.arange`` (gpt_bigcode, as mlx-lm's gpt2 does); mlx-lm's own
    caches (int offsets) take mlx-lm's code as it is. Keyed on those classes: no cache
    stand-in can give ``mx.arange`` or numpy an array, or a shape that follows the position.
    Done at load, before any worker runs the model; the replayed step's load check
    (replay_step.check_against_model) holds it."""
    try:
        from mlx_lm.models import afm7, gpt_bigcode, llama4
    except ImportError:
        return False
    return _swap_calls(model, {llama4.LlamaModel: _llama4_model, llama4.Attention: _llama4_attention,
                               afm7.AFMModel: _afm7_model, gpt_bigcode.GPTBigCodeModel: _gpt_bigcode_model})


def fix_block_sparse_masks(model) -> bool:
    """Let mlx-lm's phi3small's block-sparse layers take one token over a fixed buffer; whether
    it changed anything.

    mlx-lm's keys end at the token (no mask for one): those layers place the query in the
    keys' last block and add the mask they are given as numbers. Over a fixed buffer (or a
    left-padded batch) the mask is a boolean of the row's keys: given one for one token, they
    count the row's keys for the positions, place the query in its own block, and hide the
    rest. Done at load, before any worker runs the model; the replayed step's load check
    (replay_step.check_against_model) holds it within the first block, the tests past it."""
    try:
        from mlx_lm.models import phi3small
    except ImportError:
        return False
    return _swap_calls(model, {phi3small.Attention: _phi3small_block_sparse}, method="_block_sparse_attention")


def batch_prefill_refusal(model) -> str | None:
    """Why a batch of `model` cannot prefill its rows as each alone, where no load-time check
    can see it (the checks step one token); None for every other model.

    mlx-lm's phi3small's block-sparse layers let a prompt's queries see every key of their
    block, later ones too (its causal mask is added as numbers): a batch's prefill pads a row
    that ends in a chunk with tokens after its end (batch mode's, mlx-lm's BatchGenerator's),
    which that row's queries would see."""
    try:
        from mlx_lm.models import phi3small
    except ImportError:
        return None
    if any(isinstance(m, phi3small.Attention) and m.block_sparse for _, m in model.named_modules()):
        return ("its block-sparse layers let a prompt's queries see every key of their block, so a "
                "batch's padding after a row's end would reach that row's logits")
    return None


def fix_expert_picks(model) -> bool:
    """Let mlx-lm's dbrx pick its experts with array ops; whether it changed anything.

    Its mixture of experts reads each token's experts in Python (``inds.tolist()``), which a
    traced step cannot. Each SparseMoeBlock's experts become one stacked layer, mlx-lm's
    SwitchGLU (``switch_mlp``; w1, v1 and w2 its gate, up and down projections, QuantizedLinear
    experts its QuantizedSwitchLinear of their bits), and the block a subclass that routes as
    mlx-lm's does and reads only each token's picked experts (``gather_mm``/``gather_qmm``),
    weighted and summed as mlx-lm's. A block whose experts are some other layer, or unquantized
    in a dtype MLX's gather_mm cannot take here (its CPU's: float32 only), stays mlx-lm's, and
    tracing it raises NotTraceable naming why, so the Python step serves it (running every
    expert instead would read all the experts' weights for each token: slower for one stream).
    Stacked layer by layer, each evaluated (about one layer's experts above the model); the
    per-expert names come back with ``mlx_lm_weights``. Done at load, before any worker runs
    the model."""
    try:
        from mlx_lm.models import dbrx
    except ImportError:
        return False
    fixed = False
    for _, module in model.named_modules():
        if type(module) is dbrx.SparseMoeBlock:
            stacked, why = _stacked_experts(module.experts)
            if stacked is None:
                module.experts_not_stacked = why  # its trace refused naming why: the Python step serves it
                module.__class__ = _with_call(dbrx.SparseMoeBlock, _dbrx_own_experts, "__call__")
            else:
                import mlx.core as mx

                mx.eval(stacked.parameters())
                del module["experts"]  # its arrays freed as this layer's are stacked
                module.switch_mlp = stacked
                module.__class__ = _with_call(dbrx.SparseMoeBlock, _dbrx_switch_experts, "__call__")
            fixed = True
    return fixed


# mlx-lm's dbrx MLP's layers, as its SwitchGLU's: swiglu(w1(x), v1(x)) is silu(gate) * up.
_DBRX_ROLES = {"w1": "gate_proj", "v1": "up_proj", "w2": "down_proj"}
_DBRX_ROLE_OF = {name: role for role, name in _DBRX_ROLES.items()}  # SwitchGLU's layer -> dbrx's


def _stacked_experts(experts):
    """(mlx-lm's SwitchGLU holding `experts`' (dbrx MLPs) weights stacked {experts, out, in}, None),
    or (None, why not): a layer neither a bias-free Linear (of a dtype gather_mm takes) nor a
    bias-free QuantizedLinear, or the experts' layers differ."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwiGLU, SwitchGLU, SwitchLinear

    switch = {}
    for role, name in _DBRX_ROLES.items():
        layers = [getattr(expert, role) for expert in experts]
        kinds = {(type(layer), getattr(layer, "bits", None), getattr(layer, "group_size", None),
                  getattr(layer, "mode", None), tuple(sorted(layer.keys()))) for layer in layers}
        if len(kinds) != 1:
            return None, f"its experts' {role} layers differ"
        kind, bits, group_size, mode, keys = kinds.pop()
        dtype = layers[0]["weight"].dtype
        if kind is nn.Linear and keys == ("weight",) and not _gathers(dtype):
            return None, (f"MLX's gather_mm cannot take its experts' {str(dtype).split('.')[-1]} weights on "
                          f"{mx.default_device()} (its CPU takes float32 only)")
        if kind is nn.Linear and keys == ("weight",):
            linear = SwitchLinear.__new__(SwitchLinear)  # no random weights made to be replaced
            nn.Module.__init__(linear)
        elif kind is nn.QuantizedLinear and keys in (("biases", "scales", "weight"), ("scales", "weight")):
            linear = QuantizedSwitchLinear.__new__(QuantizedSwitchLinear)
            nn.Module.__init__(linear)
            linear.group_size, linear.bits, linear.mode, linear.global_scale = group_size, bits, mode, None
            linear.biases = None
        else:
            return None, f"its experts' {role} layers are {kind.__name__}s, which mlx-lm's switch layers do not stack"
        for key in keys:
            setattr(linear, key, mx.stack([layer[key] for layer in layers]))
        if kind is nn.QuantizedLinear:
            linear.freeze()
        switch[name] = linear
    glu = SwitchGLU.__new__(SwitchGLU)
    nn.Module.__init__(glu)
    for name, linear in switch.items():
        setattr(glu, name, linear)
    glu.activation = SwiGLU()
    return glu, None


@functools.cache
def _gathers(dtype) -> bool:
    """Whether MLX's gather_mm runs in `dtype` on the default device (its CPU's takes float32 only)."""
    import mlx.core as mx

    try:
        mx.eval(mx.gather_mm(mx.ones((1, 1, 1, 1), dtype), mx.ones((1, 1, 1), dtype), rhs_indices=mx.array([[0]])))
    except (RuntimeError, ValueError):
        return False
    return True


def mlx_lm_weights(model) -> dict:
    """`model`'s weights under mlx-lm's own names (what its ``load`` reads): a dbrx's stacked
    experts (fix_expert_picks) split back into ``experts.{e}.w1`` ... (views, no copy)."""
    from mlx.utils import tree_flatten

    weights = {}
    for key, value in tree_flatten(model.parameters()):
        head, found, tail = key.rpartition(".switch_mlp.")
        name, _, leaf = tail.partition(".")
        if not found or name not in _DBRX_ROLE_OF or not _is_switch_dbrx(model, head):
            weights[key] = value
            continue
        for e in range(value.shape[0]):
            weights[f"{head}.experts.{e}.{_DBRX_ROLE_OF[name]}.{leaf}"] = value[e]
    return weights


def mlx_lm_layer_paths(model, path: str) -> list[str]:
    """The paths mlx-lm's own `model` has for its layer at `path`: a dbrx's stacked experts'
    one per expert, any other the path itself."""
    head, found, name = path.rpartition(".switch_mlp.")
    if not found or name not in _DBRX_ROLE_OF or not _is_switch_dbrx(model, head):
        return [path]
    experts = _module_at(model, head).switch_mlp[name]["weight"].shape[0]
    return [f"{head}.experts.{e}.{_DBRX_ROLE_OF[name]}" for e in range(experts)]


def _is_switch_dbrx(model, path: str) -> bool:
    """Whether `path` is a dbrx block whose experts fix_expert_picks stacked."""
    try:
        from mlx_lm.models import dbrx
    except ImportError:
        return False
    return type(_module_at(model, path)) is _with_call(dbrx.SparseMoeBlock, _dbrx_switch_experts, "__call__")


def _module_at(model, path: str):
    module = model
    for part in path.split(".") if path else []:
        try:
            module = module[int(part)] if isinstance(module, list) else module[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return None
    return module


def _swap_calls(model, calls: dict, method: str = "__call__") -> bool:
    """Give each of `model`'s modules whose class is a key of `calls` that value as its `method`
    (a subclass, of the same name); whether any was found."""
    fixed = False
    for _, module in model.named_modules():
        call = calls.get(type(module))
        if call is not None:
            module.__class__ = _with_call(type(module), call, method)
            fixed = True
    return fixed


@functools.cache
def _with_call(base: type, call, method: str) -> type:
    """`base` whose `method` is ``call(self, base's own method, *args)`` (made once each)."""

    def patched(self, *args, **kwargs):
        return call(self, getattr(super(with_call, self), method), *args, **kwargs)

    with_call = type(base.__name__, (base,), {method: patched, "__qualname__": base.__qualname__,
                                              "__module__": base.__module__})
    return with_call


def _afm7_model(self, mlx_lm_call, inputs, cache=None):
    """afm7.AFMModel rotating its key-reusing layers' queries at an array offset."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention

    if cache is None or not isinstance(cache[-1].offset, mx.array):
        return mlx_lm_call(inputs, cache)
    # The position of this call's first token, where its keys were rotated (mlx-lm's S - L,
    # its cache holding exactly the tokens so far); read before the layers write (a batch
    # cache's offset moves on).
    offset = cache[-1].offset
    h = self.embedding(inputs)
    mask = create_attention_mask(h, cache[0])
    for layer, c in zip(self.layers, cache):
        h = layer(h, mask, cache=c)
    keys, values = cache[-1].keys_and_values()
    for layer in self.kv_reuse_layers:
        attention, x = layer.self_attn, layer.input_layernorm(h)
        B, L, _ = x.shape
        queries = attention.q_proj(x).reshape(B, L, attention.n_heads, -1).transpose(0, 2, 1, 3)
        queries = attention.q_norm(attention.rope(queries, offset=offset))
        output = scaled_dot_product_attention(queries, keys, values, cache=None, scale=attention.scale, mask=mask)
        h = h + attention.out_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return self.output_norm(h)


def _llama4_model(self, mlx_lm_call, inputs, cache=None):
    """llama4.LlamaModel asking its first chunked cache for the chunk mask where positions are arrays."""
    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask

    if cache is None or not isinstance(cache[0].offset, mx.array):
        return mlx_lm_call(inputs, cache)
    h = self.embed_tokens(inputs)
    chunk_mask = cache[0].make_chunk_mask(h.shape[1])  # mlx-lm's: same chunk, not after the token
    global_mask = create_attention_mask(h, cache[3])
    for idx, (layer, c) in enumerate(zip(self.layers, cache)):
        h = layer(h, chunk_mask if (idx + 1) % 4 != 0 else global_mask, cache=c)
    return self.norm(h)


def _llama4_attention(self, mlx_lm_call, x, mask=None, cache=None):
    """llama4.Attention computing its rope-less layers' query temperature from an array offset."""
    import mlx.core as mx
    from mlx_lm.models.base import scaled_dot_product_attention

    if cache is None or self.use_rope or not self.attn_temperature_tuning or not isinstance(cache.offset, mx.array):
        return mlx_lm_call(x, mask, cache)  # nothing read off the offset as an int
    B, L, _ = x.shape
    queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
    keys = keys.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    values = values.reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
    # mlx-lm's mx.arange(offset + 1, offset + L + 1), one row of positions per offset.
    positions = mx.reshape(cache.offset, (-1, 1)) + 1 + mx.arange(L)
    scales = mx.log(mx.floor(positions / self.floor_scale) + 1.0) * self.attn_scale + 1.0
    queries = (queries * scales.reshape(-1, 1, L, 1)).astype(queries.dtype)
    keys, values = cache.update_and_fetch(keys, values)
    output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
    return self.o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _gpt_bigcode_model(self, mlx_lm_call, inputs, cache=None):
    """gpt_bigcode.GPTBigCodeModel taking its positions' ids from an array offset."""
    import mlx.core as mx

    if cache is None or not isinstance(cache[0].offset, mx.array):
        return mlx_lm_call(inputs, cache)
    from mlx_lm.models.base import create_attention_mask

    h = self.wte(inputs)
    mask = create_attention_mask(h, cache[0])
    h = h + self.wpe(mx.arange(inputs.shape[1]) + cache[0].offset[..., None])  # mlx-lm's gpt2's ids
    for layer, c in zip(self.h, cache):
        h = layer(h, mask, cache=c)
    return self.ln_f(h)


def _phi3small_block_sparse(self, mlx_lm_call, queries, keys, values, scale, mask):
    """phi3small.Attention's block-sparse attention given a boolean mask of each row's keys
    {B, 1, L, S} (the step's stand-ins, mlx-lm's batch caches, left-padded): as mlx-lm's of the row alone."""
    import mlx.core as mx

    if not (isinstance(mask, mx.array) and mask.dtype == mx.bool_ and mask.ndim == 4):
        return mlx_lm_call(queries, keys, values, scale, mask)
    B, _, L, _ = queries.shape
    size = self.blocksparse_block_size
    keys_of_row = mask[..., -1:, :]  # {B, 1, 1, S}: its last query sees all the row's keys
    counted = mx.cumsum(keys_of_row.astype(mx.int32), axis=-1)
    k_block = mx.floor((counted - 1) / size)  # MLX cannot export an int //
    # mlx-lm puts a row's L queries in its keys' last ceil(L / size) blocks, aligned to their end
    q_blocks = -(-L // size)
    row_blocks = mx.floor((counted[..., -1:] + size - 1) / size)
    q_block = row_blocks - q_blocks + mx.floor(mx.arange(q_blocks * size - L, q_blocks * size).reshape(1, 1, L, 1) / size)
    heads = mx.arange(1, self.n_heads + 1).reshape(1, -1, 1, 1)
    strided = (k_block + heads) % self.blocksparse_vert_stride == 0  # {B, heads, 1, S}
    seen = keys_of_row & (q_block >= k_block) & ((q_block - k_block < self.blocksparse_num_local_blocks) | strided)
    queries = mx.reshape(scale * queries, (B, self.n_kv_heads, self.n_q_per_kv, L, -1))
    scores = queries @ mx.swapaxes(mx.expand_dims(keys, 2), -1, -2)
    if L > 1:  # mlx-lm adds a row's causal mask as numbers (one token alone gets none)
        scores = scores + mx.expand_dims(mask, 2).astype(scores.dtype)
    seen = seen.reshape(-1, self.n_kv_heads, self.n_q_per_kv, L, seen.shape[-1])  # {B, heads, L, S} split as the queries
    # the lowest number, not -inf (as MLX's attention): a row's padding queries see no key, and
    # must not write NaNs into its padding's keys and values
    scores = mx.where(seen, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    output = mx.softmax(scores, axis=-1, precise=True) @ mx.expand_dims(values, 2)
    return mx.reshape(output, (B, self.n_heads, L, -1))


def _dbrx_own_experts(self, mlx_lm_call, x):
    """dbrx.SparseMoeBlock as mlx-lm's (its experts not stacked), a trace of it refused naming why."""
    from .. import NotTraceable
    from ..replay import reads_a_value

    try:
        return mlx_lm_call(x)
    except (ValueError, RuntimeError) as exc:
        if not reads_a_value(exc):
            raise  # not MLX's refusal of its inds.tolist() while traced
        raise NotTraceable(f"dbrx picks each token's experts in Python (inds.tolist()) and its experts could "
                           f"not be stacked to be read with array ops: {self.experts_not_stacked}; running every expert "
                           f"would read {self.num_experts} experts' weights for {self.num_experts_per_tok}, "
                           "so the Python step, which reads only the picked ones, serves it") from exc


def _dbrx_switch_experts(self, _mlx_lm_call, x):
    """dbrx.SparseMoeBlock routed as mlx-lm's, reading only each token's picked experts
    (its stacked SwitchGLU, as mlx-lm's MoE families do)."""
    import mlx.core as mx

    ne, shape = self.num_experts_per_tok, x.shape
    x = x.reshape(-1, shape[-1])
    gates = mx.softmax(self.router(x).astype(mx.float32), axis=-1)
    inds = mx.stop_gradient(mx.argpartition(-gates, kth=ne - 1, axis=-1)[:, :ne])
    scores = mx.take_along_axis(gates, inds, axis=-1)
    scores = (scores / mx.linalg.norm(scores, ord=1, axis=-1, keepdims=True)).astype(x.dtype)
    picked = self.switch_mlp(x, inds)  # {tokens, picks, d_model}: mlx-lm's yt, tokens first
    return (picked * scores[..., None]).sum(axis=1).reshape(shape)


def fix_weight_rewrites(model) -> list[str]:
    """Keep a model from rewriting its own weights in every call; the weights it rewrote.

    mlx-lm's gemma3n casts and clips two coefficient matrices of each layer in its forward
    and assigns the results back (``self.prediction_coefs.weight = mx.clip(...)``): lazy
    arrays of the calling thread, which another thread calling the model at the same time
    reads before they are evaluated (MLX: "There is no Stream(cpu, n) in current thread",
    or a crash). The rewrite gives the same values every time, so it is done once here
    (a one-token call), evaluated, and later assignments to those weights are dropped.
    A rewrite that changes the weights again on a second call is left as it is, and
    ValueError says so: such a model cannot serve two requests at once."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    before = dict(tree_flatten(model.parameters()))  # held: an id alone may be reused once freed
    _one_token_call(model)
    rewritten = {key: value for key, value in tree_flatten(model.parameters()) if before.get(key) is not value}
    if not rewritten:
        return []
    mx.eval(list(rewritten.values()))
    _one_token_call(model)
    again = dict(tree_flatten(model.parameters()))
    if any(not mx.array_equal(again[key], value).item() for key, value in rewritten.items()):
        raise InvalidArgument(f"the model rewrites its weights ({', '.join(sorted(rewritten))}) with other "
                              "values in each call")
    model.update(tree_unflatten(list(rewritten.items())))
    for key in rewritten:
        *path, name = key.split(".")
        owner = model
        for part in path:
            owner = owner[int(part)] if isinstance(owner, list) else owner[part]
        owner.__class__ = _fixed_weights(type(owner))
        object.__setattr__(owner, "_fixed_weights", frozenset(getattr(owner, "_fixed_weights", ())) | {name})
    return sorted(rewritten)


def _one_token_call(model) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    mx.eval(model(mx.array([[0]], dtype=mx.int32), cache=make_prompt_cache(model)))


@functools.cache
def _fixed_weights(base: type) -> type:
    """`base` with assignments to the weights named in ``_fixed_weights`` dropped (made once per class)."""

    class FixedWeights(base):  # type: ignore[misc, valid-type]
        def __setattr__(self, name, value):
            if name in getattr(self, "_fixed_weights", ()):
                return  # the same values, computed once at load
            super().__setattr__(name, value)

    FixedWeights.__name__ = FixedWeights.__qualname__ = base.__name__
    return FixedWeights


def _gemma2_batch_attention(self, mlx_lm_call, x, mask=None, cache=None):
    """gemma2.Attention with a batch's mask put on the rows."""
    import mlx.core as mx

    if isinstance(mask, mx.array) and mask.ndim == 4 and self.repeats > 1:
        mask = mx.expand_dims(mask, 2)  # {B, 1, L, S} -> {B, 1, 1, L, S}
    return mlx_lm_call(x, mask, cache)


__all__ = ["batch_prefill_refusal", "fix_batch_masks", "fix_block_sparse_masks", "fix_expert_picks", "fix_position_arrays", "fix_weight_rewrites", "mlx_lm_layer_paths", "mlx_lm_weights"]
