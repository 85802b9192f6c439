"""The drafter's workload (torch, Python 3.8+ syntax; shipped with ``envbisect.agent.drafter``):
the DFlash decoder layers, their masks, the chunked loss and ``Trainer``, one drafter."""

from __future__ import annotations

import math
import threading

from envbisect.agent.drafter_params import ShapePlan

# Shipped with this module by the bundle (see envbisect.transport.bundle).
AGENT_REQUIRES = ("envbisect.agent.drafter_params",)

FLEX_EAGER_CALLS = [0]  # flex_attention calls that ran outside a compiled graph
_MASK_LOCK = threading.Lock()  # mask_build "locked"
TL = threading.local()  # per drafter thread: attention calls that ran outside a graph
# compile kwargs -> torch.compile(flex_attention), shared by all drafters
_COMPILED_FLEX: dict[str, object] = {}
_COMPILED_FLEX_LOCK = threading.Lock()


def _count_eager_attention():
    TL.eager_attn = getattr(TL, "eager_attn", 0) + 1


def compile_kwargs(p):
    kw = {"backend": p["compile_backend"]}
    if p["compile_mode"]:
        kw["mode"] = p["compile_mode"]
    return kw


def flex_kernel_options(p):
    """flex_attention's ``kernel_options`` for the ``flex_decoding`` knob. "off" forces the
    main flex kernel for every query length: inductor lowers a query shorter than 128 rows to
    the flex-decoding kernel, and once varying data lengths make that length symbolic (the
    recompile marks it dynamic) torch 2.11's decoding autotune has no valid choice for the
    shape and the compile fails with NoValidChoicesError (benchmarks/device/flex_decoding.py).
    "auto" leaves the choice to torch."""
    if p.get("flex_decoding", "off") == "off":
        return {"FORCE_USE_FLEX_ATTENTION": True}
    return None


def _compiled_flex(torch, flex_attention, kw):
    """One compiled flex_attention per process, as a model file's module-level
    ``flex_attention = torch.compile(flex_attention)`` gives every thread."""
    key = tuple(sorted(kw.items()))

    def flex_call(q, k, v, block_mask=None, enable_gqa=False, kernel_options=None):
        if not torch.compiler.is_compiling():  # dynamo ran it unoptimized: scores materialized
            FLEX_EAGER_CALLS[0] += 1
            _count_eager_attention()
        return flex_attention(
            q, k, v, block_mask=block_mask, enable_gqa=enable_gqa, kernel_options=kernel_options
        )

    with _COMPILED_FLEX_LOCK:
        if key not in _COMPILED_FLEX:
            _COMPILED_FLEX[key] = torch.compile(flex_call, **kw)
        return _COMPILED_FLEX[key]


# ----------------------------------------------------------------------------- the model


def build_model_classes(torch):
    """The Drafter module class, built on ``torch`` (imported by the caller, so this module
    imports without it)."""
    nn = torch.nn
    RMSNorm, rope = _norm_and_rope(torch)
    DecoderLayer = _decoder_layer_class(torch, RMSNorm, rope)

    class Drafter(nn.Module):
        """Trainable part: fc + hidden_norm, the decoder layers and the final norm."""

        def __init__(self, p):
            super().__init__()
            h = p["hidden"]
            self.fc = nn.Linear(p["target_layers"] * h, h, bias=False)
            self.hidden_norm = RMSNorm(h)
            self.layers = nn.ModuleList([DecoderLayer(p) for _ in range(p["layers"])])
            self.norm = RMSNorm(h)
            hd = p["head_dim"]
            inv = 1.0 / (1000000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv, persistent=False)

        def forward(self, noise_emb, target_hidden, q_pos, k_pos, attend):
            ctx = self.hidden_norm(self.fc(target_hidden))
            x = noise_emb
            for layer in self.layers:
                x = layer(x, ctx, q_pos, k_pos, self.inv_freq, attend)
            return self.norm(x)

    return Drafter


def _norm_and_rope(torch):
    """(RMSNorm module class, rope function): the Qwen3 pieces every layer uses."""

    class RMSNorm(torch.nn.Module):
        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (xf * self.weight.float()).to(x.dtype)

    def rope(x, pos, inv_freq):
        # x: (B, L, h, d); pos: (B, L)
        freqs = pos.unsqueeze(-1).float() * inv_freq  # (B, L, d/2)
        cos = torch.cos(freqs).unsqueeze(2)
        sin = torch.sin(freqs).unsqueeze(2)
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype)

    return RMSNorm, rope


def _decoder_layer_class(torch, RMSNorm, rope):
    """One decoder layer: q/k-normed GQA attention over cat(context, noise), then SwiGLU."""
    nn = torch.nn
    F = torch.nn.functional

    class Attention(nn.Module):
        def __init__(self, p):
            super().__init__()
            h, nh, nkv, hd = p["hidden"], p["heads"], p["kv_heads"], p["head_dim"]
            self.nh, self.nkv, self.hd = nh, nkv, hd
            self.q_proj = nn.Linear(h, nh * hd, bias=False)
            self.k_proj = nn.Linear(h, nkv * hd, bias=False)
            self.v_proj = nn.Linear(h, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, h, bias=False)
            self.q_norm = RMSNorm(hd)
            self.k_norm = RMSNorm(hd)

        def forward(self, x, ctx, q_pos, k_pos, inv_freq, attend):
            b, t, _ = x.shape
            s = ctx.shape[1]
            q = self.q_norm(self.q_proj(x).view(b, t, self.nh, self.hd))
            kv_in = torch.cat([ctx, x], dim=1)  # KV injection: context, then the noise blocks
            k = self.k_norm(self.k_proj(kv_in).view(b, s + t, self.nkv, self.hd))
            v = self.v_proj(kv_in).view(b, s + t, self.nkv, self.hd)
            q = rope(q, q_pos, inv_freq).transpose(1, 2)
            k = rope(k, k_pos, inv_freq).transpose(1, 2)
            v = v.transpose(1, 2)
            o = attend(q, k, v)  # (b, nh, t, hd)
            return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd))

    class MLP(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.gate_proj = nn.Linear(p["hidden"], p["intermediate"], bias=False)
            self.up_proj = nn.Linear(p["hidden"], p["intermediate"], bias=False)
            self.down_proj = nn.Linear(p["intermediate"], p["hidden"], bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self, p):
            super().__init__()
            self.input_layernorm = RMSNorm(p["hidden"])
            self.self_attn = Attention(p)
            self.post_attention_layernorm = RMSNorm(p["hidden"])
            self.mlp = MLP(p)

        def forward(self, x, ctx, q_pos, k_pos, inv_freq, attend):
            x = x + self.self_attn(self.input_layernorm(x), ctx, q_pos, k_pos, inv_freq, attend)
            return x + self.mlp(self.post_attention_layernorm(x))

    return DecoderLayer


# ----------------------------------------------------------------------------- masks


def dflash_mask_dense(torch, anchors, ctx_len, block_size):
    """Boolean (B, T, S+T) mask, True = may attend. T = anchors * block_size.

    Query slot q belongs to block q // block_size; it sees context positions strictly
    before that block's anchor and every slot of its own block, nothing of other blocks.
    """
    b, n = anchors.shape
    t = n * block_size
    q_block = torch.arange(t, device=anchors.device) // block_size  # (T,)
    kv = torch.arange(ctx_len + t, device=anchors.device)  # (S+T,)
    anchor_of_q = anchors[:, q_block]  # (B, T)
    ctx_ok = (kv[None, None, :] < ctx_len) & (kv[None, None, :] < anchor_of_q[:, :, None])
    kv_block = (kv - ctx_len).clamp(min=0) // block_size
    own = (kv[None, :] >= ctx_len) & (kv_block[None, :] == q_block[:, None])  # (T, S+T)
    return ctx_ok | own[None]


def dflash_mask_mod(anchors, ctx_len, block_size):
    """The same mask as a flex_attention mask_mod."""

    def mask_mod(b, h, q_idx, kv_idx):
        blk = q_idx // block_size
        in_ctx = kv_idx < ctx_len
        before_anchor = kv_idx < anchors[b, blk]
        own = (kv_idx - ctx_len) // block_size == blk
        return (in_ctx & before_anchor) | (~in_ctx & own)

    return mask_mod


def attended_pairs(anchors, block_size):
    """Number of (query, key) pairs the mask lets through, summed over the batch."""
    # a block with anchor a: block_size queries x (a context keys + block_size own keys)
    return int((anchors.sum().item() + anchors.numel() * block_size) * block_size)


def _block_mask(create_block_mask, anchors, ctx_len, block_size, compiled):
    """The DFlash mask of one batch as a flex_attention BlockMask (``create_block_mask`` is
    passed in: this module imports without torch)."""
    b, n = anchors.shape
    t = n * block_size
    mod = dflash_mask_mod(anchors, ctx_len, block_size)
    kw = {"device": anchors.device}
    if compiled:
        kw["_compile"] = True
    try:
        return create_block_mask(mod, b, None, t, ctx_len + t, **kw)
    except TypeError:  # older torch without _compile
        kw.pop("_compile", None)
        return create_block_mask(mod, b, None, t, ctx_len + t, **kw)


# ----------------------------------------------------------------------------- loss


def make_chunk_loss(torch):
    def chunk_loss(h, weight, labels, wts):
        """Weighted CE of one chunk and its gradient w.r.t. h (lm_head is frozen)."""
        logits = (h @ weight.t()).float()
        lse = torch.logsumexp(logits, dim=-1)
        tgt = logits.gather(1, labels.unsqueeze(1)).squeeze(1)
        loss = ((lse - tgt) * wts).sum()
        probs = torch.exp(logits - lse.unsqueeze(1))
        onehot = torch.zeros_like(probs).scatter_(1, labels.unsqueeze(1), 1.0)
        grad_logits = ((probs - onehot) * wts.unsqueeze(1)).to(h.dtype)
        return loss, grad_logits @ weight

    return chunk_loss


def equal_chunks(n, chunk):
    """(chunk size, padded rows): the fewest chunks of at most ``chunk`` rows, all equal."""
    count = max(1, -(-n // chunk))
    size = -(-n // count)
    return size, size * count


def make_linear_ce(torch, chunk_fn, chunk):
    """Chunked, fused lm_head + weighted cross-entropy: never holds all logits at once.

    The gradient w.r.t. the hidden states is computed chunk by chunk in the forward pass
    (the lm_head weight needs none), so the FLOPs are exactly fwd + input-grad matmuls.
    """

    class LinearCE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, weight, labels, wts):
            n = h.shape[0]
            # equal chunks, the last one padded with zero-weight rows: one shape, so the
            # compiled chunk function compiles once instead of again for a shorter tail
            size, padded = equal_chunks(n, chunk)
            norm = wts.sum()
            if padded > n:
                extra = padded - n
                h = torch.cat([h, h.new_zeros(extra, h.shape[1])])
                labels = torch.cat([labels, labels.new_zeros(extra)])
                wts = torch.cat([wts, wts.new_zeros(extra)])
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad = torch.empty_like(h)
            for i in range(0, padded, size):
                loss_i, grad_i = chunk_fn(
                    h[i : i + size], weight, labels[i : i + size], wts[i : i + size]
                )
                total = total + loss_i
                grad[i : i + size] = grad_i
            ctx.save_for_backward(grad[:n], norm)
            return total / norm

        @staticmethod
        def backward(ctx, g):
            grad, norm = ctx.saved_tensors
            return grad * (g / norm).to(grad.dtype), None, None, None

    return LinearCE.apply


# ----------------------------------------------------------------------------- one drafter


class Trainer:
    """One drafter with its optimizer, batches and step function."""

    def __init__(self, torch, p, index=0, lengths=None):
        self.torch = torch
        self.p = p
        self.index = index
        self.device = torch.device(p["device"])
        self.on_gpu = self.device.type == "cuda"
        self.dtype = getattr(torch, p["dtype"])
        torch.manual_seed(p["seed"] + index)
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(p["seed"] * 1000 + index)
        Drafter = build_model_classes(torch)
        self.model = Drafter(p).to(self.device)
        # Frozen embedding and lm_head of the target, kept in the compute dtype.
        h, v = p["hidden"], p["vocab"]
        self.embed = (torch.randn(v, h, generator=self.gen, device=self.device) * 0.02).to(
            self.dtype
        )
        self.lm_head = (torch.randn(v, h, generator=self.gen, device=self.device) * 0.02).to(
            self.dtype
        )
        self.mask_token = v - 1
        opt_kw = {"lr": p["lr"], "weight_decay": 0.0}
        if self.on_gpu:
            opt_kw["fused"] = True
        self.opt = torch.optim.AdamW(self.model.parameters(), **opt_kw)
        self.shapes = ShapePlan(dict(p, seed=p["seed"] + index), lengths)
        bs, gamma = p["block_size"], p["gamma"]
        self.slot_w = torch.tensor(
            [math.exp(-(k - 1) / gamma) for k in range(1, bs)],
            dtype=torch.float32,
            device=self.device,
        )
        chunk_fn = make_chunk_loss(torch)
        self.forward = self.model
        self.flex = None  # the flex_attention this drafter calls
        if p["compile"]:
            kw = compile_kwargs(p)
            unit = p["compile_unit"]
            if unit == "model":
                self.forward = torch.compile(self.model, **kw)
            elif unit == "layer":
                for layer in self.model.layers:
                    layer.compile(**kw)  # regional: one graph, reused by every layer
            chunk_fn = torch.compile(chunk_fn, **kw)
        self.linear_ce = make_linear_ce(torch, chunk_fn, int(p["loss_chunk"]))
        self.attend_factory = self._attention_factory()
        self.fixed_batch = None  # mask_build "once": the batch whose mask every step reuses
        self.fixed_attend = None
        self.mask_builds = 0
        self.steps_done = 0

    # -- attention backends
    def _attention_factory(self):
        """``factory(anchors, ctx_len) -> attend(q, k, v)`` for the configured backend."""
        if self.p["attn"] == "sdpa":
            return self._sdpa_factory()
        return self._flex_factory()

    def _sdpa_factory(self):
        """Dense-mask scaled_dot_product_attention (K/V heads repeated for GQA)."""
        torch, p = self.torch, self.p
        F = torch.nn.functional
        bs = p["block_size"]
        gqa = p["heads"] != p["kv_heads"]
        rep = p["heads"] // p["kv_heads"]
        # the "flex" compile unit leaves sdpa eager by design: not a fallback
        sdpa_compiled = p["compile_unit"] != "flex"

        def factory(anchors, ctx_len):
            mask = dflash_mask_dense(torch, anchors, ctx_len, bs).unsqueeze(1)

            def attend(q, k, v):
                if not torch.compiler.is_compiling() and sdpa_compiled:
                    _count_eager_attention()
                if gqa:
                    k = k.repeat_interleave(rep, dim=1)
                    v = v.repeat_interleave(rep, dim=1)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            return attend

        return factory

    def _flex_factory(self):
        """flex_attention with a block mask built per batch (compiled per ``mask_compile``)."""
        torch, p = self.torch, self.p
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bs = p["block_size"]
        gqa = p["heads"] != p["kv_heads"]
        compiled_mask = bool(p["mask_compile"])
        options = flex_kernel_options(p)
        flex = flex_attention
        if p["compile"] and p["compile_unit"] == "flex":
            flex = _compiled_flex(torch, flex_attention, compile_kwargs(p))

        def factory(anchors, ctx_len):
            block_mask = _block_mask(create_block_mask, anchors, ctx_len, bs, compiled_mask)

            def attend(q, k, v):
                if not torch.compiler.is_compiling() and flex is flex_attention:
                    FLEX_EAGER_CALLS[0] += 1  # the unfused path: scores materialized
                    _count_eager_attention()
                if gqa:
                    return flex(
                        q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options=options
                    )
                return flex(q, k, v, block_mask=block_mask, kernel_options=options)

            return attend

        return factory

    def build_attend(self, batch):
        """The step's attention (its mask built now, as the mask_build knob says)."""
        if self.fixed_attend is not None:
            return self.fixed_attend
        self.mask_builds += 1
        if self.p["mask_build"] == "locked":
            with _MASK_LOCK:
                return self.attend_factory(batch["anchors"], batch["length"])
        return self.attend_factory(batch["anchors"], batch["length"])

    def prebuild_mask(self):
        """mask_build "once": build one batch and its mask now; every step reuses both."""
        length, n, _ = self.shapes.next()
        self.fixed_batch = self.make_batch(length, n)
        self.fixed_attend = None
        self.fixed_attend = self.build_attend(self.fixed_batch)

    def next_batch(self):
        """(batch, real tokens) of the next step."""
        if self.fixed_batch is not None:
            p = self.p
            return self.fixed_batch, self.fixed_batch["length"] * p["batch"]
        length, n, real = self.shapes.next()
        return self.make_batch(length, n), real

    # -- batches
    def make_batch(self, length, n_anchors):
        """Random tokens, target hidden states and sampled anchors for one step."""
        torch, p, dev, g = self.torch, self.p, self.device, self.gen
        b, bs, v = p["batch"], p["block_size"], p["vocab"]
        tokens = torch.randint(0, v - 1, (b, length), device=dev, generator=g)
        hidden = torch.randn(
            b, length, p["target_layers"] * p["hidden"], device=dev, generator=g, dtype=self.dtype
        )
        # anchors among valid positions 1 .. length-bs (a full block must fit), sorted
        scores = torch.rand(b, length - bs, device=dev, generator=g)
        anchors = scores.topk(n_anchors, dim=1).indices.sort(dim=1).values + 1
        slots = torch.arange(bs, device=dev)
        pos = anchors.unsqueeze(-1) + slots  # (b, n, bs)
        noise_ids = torch.full((b, n_anchors, bs), self.mask_token, device=dev, dtype=torch.long)
        noise_ids[:, :, 0] = tokens.gather(1, anchors)
        labels = tokens.gather(1, pos[:, :, 1:].reshape(b, -1)).reshape(b, n_anchors, bs - 1)
        return {
            "length": length,
            "anchors": anchors,
            "hidden": hidden,
            "noise_ids": noise_ids.reshape(b, -1),
            "q_pos": pos.reshape(b, -1),
            "k_pos": torch.cat(
                [torch.arange(length, device=dev).expand(b, length), pos.reshape(b, -1)], dim=1
            ),
            "labels": labels,
        }

    def step(self, batch):
        """One optimizer step; returns the loss tensor (not synchronized)."""
        torch, p = self.torch, self.p
        b, bs = p["batch"], p["block_size"]
        attend = self.build_attend(batch)
        noise_emb = self.embed[batch["noise_ids"]]
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if self.on_gpu else _null_ctx()
        with ctx:
            out = self.forward(noise_emb, batch["hidden"], batch["q_pos"], batch["k_pos"], attend)
        n = batch["anchors"].shape[1]
        h = out.view(b, n, bs, -1)[:, :, 1:, :].reshape(-1, out.shape[-1]).to(self.dtype)
        wts = self.slot_w.repeat(b * n)
        loss = self.linear_ce(h, self.lm_head, batch["labels"].reshape(-1), wts)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def flops(self, batch):
        """Counted training FLOPs of one step (matmuls and attention; see module notes)."""
        p = self.p
        b, length, bs = p["batch"], batch["length"], p["block_size"]
        n = batch["anchors"].shape[1]
        t = n * bs
        h, nh, nkv, hd, inter = (
            p["hidden"],
            p["heads"],
            p["kv_heads"],
            p["head_dim"],
            p["intermediate"],
        )
        fc = 2.0 * b * length * p["target_layers"] * h * h
        per_layer = 2.0 * b * t * h * nh * hd * 2  # q_proj, o_proj
        per_layer += 2.0 * b * (length + t) * h * nkv * hd * 2  # k_proj, v_proj on ctx + noise
        per_layer += 2.0 * b * t * h * inter * 3  # SwiGLU
        attn = 4.0 * hd * nh * attended_pairs(batch["anchors"], bs)
        lm = 2.0 * b * n * (bs - 1) * h * p["vocab"]
        # trainable matmuls: fwd + 2x bwd; fc sees no input grad; lm_head frozen: input grad only
        return 3.0 * p["layers"] * (per_layer + attn) + 2.0 * fc + 2.0 * lm


class _null_ctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
