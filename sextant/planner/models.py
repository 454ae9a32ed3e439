"""Model descriptions the planner understands: transformer shapes written as numbers (presets
and sextant workload files) and small MLPs, reduced to the per-token figures the estimator
needs (parameters, FLOPs, activation bytes, communication bytes).

Nothing is downloaded: every preset is the published architecture written out here, with the
paper or model card it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from sextant.core.errors import UserError

MAX_PLAN_WIDTH = 1 << 22
"""The planner's bound on any width, head count, vocabulary or sequence length: 64 times the
largest published d_ff (MT-NLG's 81,920) and 32 times a 128K context. The training bounds
(sextant.workloads.spec.MAX_WIDTH) stay with run, compare and check, which build the model."""
MAX_PLAN_LAYERS = 1 << 16
MAX_PLAN_GLOBAL_BATCH = 1 << 24
"""Sequences per step: 16 times the largest published batches."""
PLAN_BOUNDS = {
    "n_layers": MAX_PLAN_LAYERS,
    "d_model": MAX_PLAN_WIDTH,
    "n_heads": MAX_PLAN_WIDTH,
    "n_kv_heads": MAX_PLAN_WIDTH,
    "d_ff": MAX_PLAN_WIDTH,
    "vocab_size": MAX_PLAN_WIDTH,
    "seq_len": MAX_PLAN_WIDTH,
    "global_batch": MAX_PLAN_GLOBAL_BATCH,
}
"""What a planned transformer's integer hyper-parameters may be (each at least 1)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class TransformerShape:
    """A decoder-only transformer, by its published hyper-parameters."""

    name: str
    """Preset or workload name."""
    n_layers: int
    """Transformer blocks (L)."""
    d_model: int
    """Hidden size (h)."""
    n_heads: int
    """Query heads (a)."""
    n_kv_heads: int
    """Key/value heads (= n_heads without grouped-query attention)."""
    d_ff: int
    """MLP hidden width (f)."""
    vocab_size: int
    """Vocabulary (V)."""
    seq_len: int
    """Training sequence length (s)."""
    head_dim: int = 0
    """Per-head width; 0 means d_model // n_heads."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices (Llama, PaLM) instead of two (GPT)."""
    tied_embeddings: bool = False
    """Output projection shares the input embedding (GPT-3, PaLM)."""
    learned_positions: bool = False
    """A learned position table of seq_len x d_model (GPT); False for rotary."""
    biases: bool = False
    """Linear layers carry biases (GPT) or not (Llama, PaLM)."""
    layernorm: bool = True
    """LayerNorm (scale and bias) if True, RMSNorm (scale only) if False."""
    dropout: bool = False
    """Dropout after attention and MLP (stores 1-byte masks: Korthikanti et al. 2022 §4.1)."""
    global_batch: int = 1
    """Default global batch in sequences (the published one, where known)."""
    source: str = ""
    """Where the numbers come from."""
    n_experts: int = 0
    """Mixture-of-experts: experts per layer (0 = a dense MLP). Every layer is an MoE layer."""
    top_k: int = 1
    """Experts each token is routed to."""
    capacity_factor: float = 1.0
    """Expert capacity over the even share (GShard / Switch): compute and activations of the
    experts are padded to it; model FLOPs count the routed tokens only."""
    moe_d_ff: int = 0
    """Hidden width of one expert's MLP (0 = d_ff)."""
    n_shared_experts: int = 0
    """Experts every token passes through beside its top_k routed ones (DeepSeekMoE's shared
    experts, moe_d_ff wide): dense parameters, replicated across expert-parallel ranks."""
    n_dense_layers: int = 0
    """The first layers keep a dense MLP of d_ff instead of experts (DeepSeek-V3: 3)."""
    q_lora_rank: int = 0
    """Multi-head latent attention (MLA, DeepSeek-V2/V3): the query's compression width
    (d_c'); 0 = queries projected directly. MLA is on when kv_lora_rank > 0."""
    kv_lora_rank: int = 0
    """MLA: the joint key-value compression width (d_c); 0 = standard attention."""
    rope_head_dim: int = 0
    """MLA: the per-head width of the decoupled rotary query and key (d_h^R)."""
    v_head_dim: int = 0
    """MLA: the per-head value width (0 = head_dim)."""

    def __post_init__(self) -> None:
        for key, most in PLAN_BOUNDS.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise UserError(f"model.{key} must be an integer in [1, {most}]. "
                                f"Received: {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(
                "n_kv_heads must divide n_heads. "
                f"Received: n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
            )
        for key in ("moe_d_ff", "head_dim", "n_experts", "n_shared_experts", "n_dense_layers",
                    "q_lora_rank", "kv_lora_rank", "rope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"model.{key} must be an integer >= 0. Received: {value!r}")
        if self.n_experts:
            if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int) or (
                self.n_experts < 1
            ):
                raise UserError(f"model.n_experts must be an integer >= 0. Received: "
                                f"{self.n_experts!r}")
            if not (isinstance(self.top_k, int) and 1 <= self.top_k <= self.n_experts):
                raise UserError(
                    f"model.top_k must be an integer in [1, n_experts]. Received: "
                    f"top_k={self.top_k!r}, n_experts={self.n_experts}"
                )
            cf = self.capacity_factor
            if not (isinstance(cf, (int, float)) and not isinstance(cf, bool) and 1.0 <= cf
                    <= 64.0):
                raise UserError(f"model.capacity_factor must be in [1, 64]. Received: {cf!r}")
        if self.n_dense_layers >= self.n_layers or (self.n_dense_layers and not self.n_experts):
            raise UserError(
                "n_dense_layers needs experts and must be below n_layers. Received: "
                f"n_dense_layers={self.n_dense_layers}, n_layers={self.n_layers}, "
                f"n_experts={self.n_experts}"
            )
        if self.kv_lora_rank and self.n_kv_heads != self.n_heads:
            raise UserError(
                "multi-head latent attention (kv_lora_rank > 0) has a key and value per "
                f"head: n_kv_heads must equal n_heads. Received: n_kv_heads={self.n_kv_heads}, "
                f"n_heads={self.n_heads}"
            )
        if not self.head_dim and self.d_model % self.n_heads:
            raise UserError(
                f"n_heads must divide d_model. Received: d_model={self.d_model}, "
                f"n_heads={self.n_heads}"
            )

    @property
    def hd(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    # --- parameters ---------------------------------------------------------------------

    def _mlp_params(self, f: int) -> int:
        h = self.d_model
        mlp = (3 if self.gated_mlp else 2) * h * f
        if self.biases:
            mlp += (2 * f if self.gated_mlp else f) + h
        return mlp

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_dim(self) -> int:
        """Per-head width of a query and a key (MLA: the non-rotary part plus d_h^R)."""
        return self.hd + (self.rope_head_dim if self.mla else 0)

    @property
    def v_dim(self) -> int:
        """Per-head width of a value."""
        return (self.v_head_dim or self.hd) if self.mla else self.hd

    def _attention_tensors(self) -> list[tuple[int, int]]:
        """(weight, bias) elements of each attention matrix in Megatron-LM's layout: fused
        QKV and the output projection; for MLA (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1) the
        query down- and up-projections (W^DQ; W^UQ with W^QR), the joint key-value
        down-projection with the rotary key (W^DKV, W^KR), the key and value
        up-projections (W^UK, W^UV) and the output; the two compression norms are in
        _norms."""
        h, nh = self.d_model, self.n_heads
        if not self.mla:
            q, kv = nh * self.hd, self.n_kv_heads * self.hd
            return [(h * (q + 2 * kv), q + 2 * kv), (q * h, h)]
        q_up = nh * self.qk_dim
        out = [(h * self.q_lora_rank, 0), (self.q_lora_rank * q_up, 0)] if self.q_lora_rank \
            else [(h * q_up, 0)]
        return out + [
            (h * (self.kv_lora_rank + self.rope_head_dim), 0),
            (self.kv_lora_rank * nh * (self.hd + self.v_dim), 0),
            (nh * self.v_dim * h, 0),
        ]

    def _norms(self) -> int:
        """One layer's norms: before attention and MLP (scale, plus bias for LayerNorm),
        and MLA's norms of the compressed query and key-value."""
        per = 2 * self.d_model if self.layernorm else self.d_model
        mla = (self.q_lora_rank + self.kv_lora_rank) if self.mla else 0
        return 2 * per + mla

    def _attention_params(self) -> int:
        return sum(w + (b if self.biases else 0) for w, b in self._attention_tensors())

    def layer_tensors(self) -> tuple[int, ...]:
        """Elements of each parameter tensor of one (MoE, where there are experts) layer in
        Megatron-LM's layout (ModelCost.layer_tensors): the attention's matrices, the MLP's
        two weights (gate and up fused) per expert (routed and shared) or for the dense
        MLP, a bias beside each weight where the model has biases, the router, and the
        norms."""
        h = self.d_model
        f = self.moe_d_ff or self.d_ff
        up = (2 if self.gated_mlp else 1) * f
        weights = self._attention_tensors()
        weights += [(h * up, up), (f * h, h)] * ((self.n_experts + self.n_shared_experts) or 1)
        out = [w for w, _ in weights] + ([b for _, b in weights if b] if self.biases else [])
        if self.n_experts:
            out.append(h * self.n_experts)  # the router
        norms = [h] * (4 if self.layernorm else 2)
        if self.mla:
            norms += [n for n in (self.q_lora_rank, self.kv_lora_rank) if n]
        return tuple(out + norms)

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is experts (all but the first n_dense_layers; 0 when dense)."""
        return self.n_layers - self.n_dense_layers if self.n_experts else 0

    def _per_layer(self, total: int) -> float:
        """A sum over the layers as a per-layer figure: exact (an int) when every layer is
        the same, the mean over the layers when some keep a dense MLP."""
        return total // self.n_layers if total % self.n_layers == 0 else total / self.n_layers

    def expert_params(self) -> float:
        """The routed experts of one layer, all of them (0 for a dense model); the mean over
        the layers when the first ones are dense."""
        if not self.n_experts:
            return 0
        return self._per_layer(
            self.moe_layers * self.n_experts * self._mlp_params(self.moe_d_ff or self.d_ff)
        )

    def _moe_dense_part(self) -> int:
        """An MoE layer without its routed experts: the router and the shared experts."""
        fe = self.moe_d_ff or self.d_ff
        return self.d_model * self.n_experts + self.n_shared_experts * self._mlp_params(fe)

    def dense_layer_params(self) -> float:
        """One layer without its routed experts: attention, norms, and the dense MLP or the
        router and shared experts (the mean over the layers when they differ)."""
        base = self._attention_params() + self._norms()
        if not self.n_experts:
            return base + self._mlp_params(self.d_ff)
        dense = self.n_dense_layers * self._mlp_params(self.d_ff)
        return self._per_layer(self.n_layers * base + dense
                               + self.moe_layers * self._moe_dense_part())

    def _layers_total(self, routed_per_moe_layer: int) -> int:
        """Parameters of all layers with `routed_per_moe_layer` routed experts each."""
        fe = self.moe_d_ff or self.d_ff
        base = self._attention_params() + self._norms()
        if not self.n_experts:
            return self.n_layers * (base + self._mlp_params(self.d_ff))
        return (
            self.n_layers * base
            + self.n_dense_layers * self._mlp_params(self.d_ff)
            + self.moe_layers * (self._moe_dense_part() + routed_per_moe_layer * self._mlp_params(fe))
        )

    def layer_params(self) -> float:
        return self._per_layer(self._layers_total(self.n_experts))

    def active_layer_params(self) -> float:
        """Parameters a token passes through in one layer (the top_k routed experts and the
        shared ones of an MoE layer; the mean over the layers when they differ)."""
        return self._per_layer(self._layers_total(self.top_k if self.n_experts else 0))

    def active_params(self) -> int:
        """Parameters a token passes through: every layer's active part, the embedding, the
        output projection and the final norm."""
        return (
            self._layers_total(self.top_k if self.n_experts else 0)
            + self.embedding_params()
            + self.head_params()
            + self.final_norm_params()
        )

    def embedding_params(self) -> int:
        """Input embedding plus learned positions (looked up, not multiplied)."""
        return self.vocab_size * self.d_model + (
            self.seq_len * self.d_model if self.learned_positions else 0
        )

    def head_params(self) -> int:
        """Separate output projection (0 when tied to the input embedding)."""
        return 0 if self.tied_embeddings else self.vocab_size * self.d_model

    def final_norm_params(self) -> int:
        return 2 * self.d_model if self.layernorm else self.d_model

    def total_params(self) -> int:
        return (
            self._layers_total(self.n_experts)
            + self.embedding_params()
            + self.head_params()
            + self.final_norm_params()
        )

    def _lora_matrices(self) -> tuple[tuple[str, float], ...]:
        """(projection, in + out per layer) for each projection LoRA may target (ModelCost.
        lora_matrices): PEFT's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and
        down_proj, every expert's MLP counted; with MLA, q the query projections, k and v
        the key and value up-projections; qkv, GPT-2's fused attention input (c_attn). A GPT
        MLP has no gate."""
        h, nh = self.d_model, self.n_heads
        fe = self.moe_d_ff or self.d_ff
        # MLP matrices per layer, the mean over the layers when the first ones are dense.
        mlps = ((self.moe_layers * (self.n_experts + self.n_shared_experts) * (h + fe)
                 + self.n_dense_layers * (h + self.d_ff)) / self.n_layers
                if self.n_experts else float(h + self.d_ff))
        if self.mla:
            q = (float(h + self.q_lora_rank + self.q_lora_rank + nh * self.qk_dim)
                 if self.q_lora_rank else float(h + nh * self.qk_dim))
            k = float(self.kv_lora_rank + nh * self.hd)
            v = float(self.kv_lora_rank + nh * self.v_dim)
            o = float(nh * self.v_dim + h)
        else:
            q, kv = float(h + nh * self.hd), float(h + self.n_kv_heads * self.hd)
            k, v, o = kv, kv, float(nh * self.hd + h)
        out = [("q", q), ("k", k), ("v", v), ("o", o)]
        if not self.mla:  # GPT-2's fused c_attn: one matrix, in h, out q + k + v
            out.append(("qkv", float(h + (nh + 2 * self.n_kv_heads) * self.hd)))
        if self.gated_mlp:
            out.append(("gate", mlps))
        return tuple(out + [("up", mlps), ("down", mlps)])

    def describe(self) -> str:
        kv = f", {self.n_kv_heads} kv heads" if self.n_kv_heads != self.n_heads else ""
        return (
            f"{self.n_layers} layers, hidden {self.d_model}, {self.n_heads} heads{kv}, "
            f"ffn {self.d_ff}{' (gated)' if self.gated_mlp else ''}, vocab {self.vocab_size}, "
            f"seq {self.seq_len}{self._describe_extras()}"
        )

    def _describe_extras(self) -> str:
        """MLA and the DeepSeekMoE layout, where the model has them."""
        parts = []
        if self.n_shared_experts or self.n_dense_layers:
            parts.append(
                f"{self.n_experts} experts of {self.moe_d_ff or self.d_ff} top-{self.top_k}"
                f" + {self.n_shared_experts} shared, first {self.n_dense_layers} layers dense"
            )
        if self.mla:
            parts.append(f"MLA (kv rank {self.kv_lora_rank}, q rank {self.q_lora_rank})")
        return "".join(f", {p}" for p in parts)

    def cost(self, *, flash_attention: bool = True) -> ModelCost:
        """Reduce the shape to the per-token figures of the estimator.

        FLOPs (Chowdhery et al. 2022, PaLM, appendix B; Kaplan et al. 2020 §2.1): a training
        token costs 6 FLOPs per parameter (2 forward, 4 backward) plus
        12 * L * (heads * head_dim) * s for the attention scores and their product with the
        values (the causal mask is not discounted, as in that formula). Embedding lookups are
        not multiplies and are left out of N; the output projection is in (tied or not).

        Activation bytes per token per layer (Korthikanti et al. 2022, "Reducing Activation
        Recomputation in Large Transformer Models", §4.1 and Table 2, 16-bit activations):
        the GPT case s*b*h*(34 + 5*a*s/h) splits into a part outside the tensor-parallel
        region that TP alone does not divide (LayerNorm inputs 4h, QKV and MLP inputs 4h,
        dropout masks 2h: the "10"), a part TP divides (Q, K, V 6h, projection input 2h,
        GeLU input and output 16h: the "24") and the attention-score part 5*a*s. It is
        written here per term so that grouped-query attention, gated MLPs and the absence of
        dropout change the right terms; for a GPT shape it reduces to Table 2 exactly.
        """
        h, f, s = self.d_model, self.d_ff, self.seq_len
        q, kv = self.n_heads * self.hd, self.n_kv_heads * self.hd
        # Per token, the widths of Q and K (MLA: with the rotary part) and of V and the
        # projection input (MLA materialises a key and a value per head for training).
        q_w, v_w = self.n_heads * self.qk_dim, self.n_heads * self.v_dim
        k_w = q_w if self.mla else kv
        kv_w = v_w if self.mla else kv
        masks = 2 * h if self.dropout else 0  # two 1-byte dropout masks of h per token
        replicated = 4 * h + 2 * h + 2 * h + masks  # LN inputs, QKV input, MLP input, masks
        mlp_inner: float = (6 if self.gated_mlp else 4) * f  # gate, up, product | GeLU in, out
        if self.n_experts:
            # Each token's k expert MLPs, padded to the capacity, its shared experts and the
            # router logits; the mean over the layers when the first ones are dense.
            fe = self.moe_d_ff or f
            per = 6 if self.gated_mlp else 4
            moe = per * fe * (self.top_k * self.capacity_factor + self.n_shared_experts)
            moe += 4 * self.n_experts
            mlp_inner = (self.moe_layers * moe + self.n_dense_layers * per * f) / self.n_layers
        split = 2 * q_w + 2 * k_w + 2 * kv_w + 2 * v_w + mlp_inner  # Q, K, V, proj input, MLP
        # Softmax output 2as (+ dropout mask as and dropout output 2as): Korthikanti's 5as.
        scores = (5 if self.dropout else 2) * self.n_heads * s
        attn_flops = 6 * self.n_layers * (q_w + v_w) * s  # QK^T and PV, forward and backward
        layer_mm = self.active_layer_params()
        # N of "6N": every parameter but the looked-up embedding and position tables (the
        # norms' few parameters are counted too, as sextant/workloads/init.py counts them); for MoE the
        # parameters a token is routed through (top_k experts).
        matmul = self.n_layers * layer_mm + self.vocab_size * h + self.final_norm_params()
        # Capacity padding: the experts compute (capacity_factor - 1) more slots, hardware
        # FLOPs only.
        fe = self.moe_d_ff or f
        padding = (
            6.0 * self.moe_layers * self.top_k * (self.capacity_factor - 1.0) * self._mlp_params(fe)
            if self.n_experts
            else 0.0
        )
        # Operator-level selective checkpointing as torchtitan runs it ("selective op" AC,
        # torchtitan/parallelisms/parallelize_llama.py at commit 0413364: "Saves output of all
        # compute ops, except every second mm"): the layer's matmuls in execution order (Q, K,
        # V, attention output; MLP in (gate, up), MLP out), the odd ones' outputs kept, the even
        # ones recomputed with every elementwise op; the attention kernel's output is kept.
        fe_op = (self.moe_d_ff or f) * (self.top_k * self.capacity_factor if self.n_experts else 1)
        mlp_in = [(h, fe_op), (h, fe_op)] if self.gated_mlp else [(h, fe_op)]
        mms: list[tuple[float, float, bool]] = [(h, q, True), (h, kv, True), (h, kv, True),
                                                (q, h, False)]
        mms += [(k, m_, True) for k, m_ in mlp_in] + [(fe_op, h, False)]
        op_flops = sum(2 * k * m_ for i, (k, m_, _) in enumerate(mms) if i % 2 == 1)
        op_split = 2 * q + sum(2 * m_ for i, (_, m_, col) in enumerate(mms) if i % 2 == 0 and col)
        op_rep = 2 * h + sum(2 * m_ for i, (_, m_, col) in enumerate(mms) if i % 2 == 0 and not col)
        # Forward FLOPs of one layer per token: 2 per matmul parameter + 4*s*q (QK^T, PV).
        layer_fwd = 2 * layer_mm + 2 * s * (q_w + v_w) + padding / (3.0 * self.n_layers)
        return ModelCost(
            name=self.name,
            family="transformer",
            n_layers=self.n_layers,
            layer_params=float(self.layer_params()),
            embed_params=float(self.embedding_params()),
            head_params=float(self.head_params()),
            tied_copy_params=float(self.vocab_size * h if self.tied_embeddings else 0),
            other_params=float(self.final_norm_params()),
            total_params=float(self.total_params()),
            tokens_per_sample=s,
            model_flops_per_token=6.0 * matmul + attn_flops,
            full_recompute_flops_per_token=float(self.n_layers * layer_fwd),
            # Selective recomputation re-runs QK^T, softmax and the product with V.
            selective_recompute_flops_per_token=float(self.n_layers * 2 * s * (q_w + v_w)),
            # FlashAttention's backward recomputes S = QK^T (Dao 2023, Algorithm 2).
            flash_recompute_flops_per_token=float(self.n_layers * 2 * s * q_w)
            if flash_attention
            else 0.0,
            act_replicated=float(replicated),
            act_split=float(split),
            act_scores=0.0 if flash_attention else float(scores),
            act_checkpoint=float(2 * h),
            act_op_replicated=float(op_rep),
            act_op_split=float(op_split),
            # FP8 linear inputs (1 byte, not 2): QKV and MLP inputs (h each, outside the TP
            # region), the projection input (q) and the MLP-out input (the product or GeLU
            # output: 2 fe of mlp_inner's 6 fe gated, 4 fe otherwise), each half its bytes.
            act_fp8_saving_replicated=float(2 * h),
            act_fp8_saving_split=float(q + (mlp_inner - 4 * self.n_experts if self.n_experts
                                            else mlp_inner) / (6 if self.gated_mlp else 4)),
            op_recompute_flops_per_token=float(self.n_layers * op_flops),
            logits_bytes_per_token=float(4 * self.vocab_size),
            hidden=h,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            supports_model_parallel=True,
            describe=self.describe(),
            attention_flops_per_token=float(attn_flops),
            padding_flops_per_token=float(padding),
            n_experts=self.n_experts,
            top_k=self.top_k,
            capacity_factor=float(self.capacity_factor),
            expert_params=float(self.expert_params()),
            largest_module_params=float(
                max(self.vocab_size * h, h * q, h * f)  # separate Q/K/V, gate/up (HF layout)
            ),
            layer_tensors=tuple(float(x) for x in self.layer_tensors()),
            lora_matrices=self._lora_matrices(),
            gemms=(
                (float(h), float(q + 2 * kv), True),
                (float(q), float(h), False),
                (float(h), float((2 if self.gated_mlp else 1) * fe), True),
                (float(fe), float(h), False),
            ),
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class MLPShape:
    """A multi-layer perceptron (a sextant 'mlp' workload): data parallel only."""

    name: str
    input_dim: int
    hidden: tuple[int, ...]
    num_classes: int
    global_batch: int = 1
    source: str = ""

    def widths(self) -> list[int]:
        return [self.input_dim, *self.hidden, self.num_classes]

    def total_params(self) -> int:
        w = self.widths()
        return sum(a * b + b for a, b in pairwise(w))

    def describe(self) -> str:
        return "MLP " + "-".join(str(x) for x in self.widths())

    def cost(self, *, flash_attention: bool = True) -> ModelCost:
        w = self.widths()
        n = float(self.total_params())
        # Per sample, each layer keeps its input and its pre-activation for the backward pass;
        # expressed in 16-bit bytes like the transformer terms (scaled for fp32 later).
        acts = float(sum(2 * (a + b) for a, b in pairwise(w)))
        return ModelCost(
            name=self.name,
            family="mlp",
            n_layers=1,
            layer_params=n,
            embed_params=0.0,
            head_params=0.0,
            tied_copy_params=0.0,
            other_params=0.0,
            total_params=n,
            tokens_per_sample=1,
            model_flops_per_token=6.0 * n,
            full_recompute_flops_per_token=2.0 * n,
            selective_recompute_flops_per_token=0.0,
            flash_recompute_flops_per_token=0.0,
            act_replicated=acts,
            act_split=0.0,
            act_scores=0.0,
            act_checkpoint=2.0 * self.input_dim,
            act_op_replicated=acts,
            op_recompute_flops_per_token=n,
            logits_bytes_per_token=4.0 * self.num_classes,
            hidden=self.input_dim,
            n_heads=1,
            n_kv_heads=1,
            supports_model_parallel=False,
            describe=self.describe(),
            largest_module_params=float(max(a * b + b for a, b in pairwise(w))),
            layer_tensors=tuple(float(x) for a, b in pairwise(w) for x in (a * b, b)),
            gemms=tuple((float(a), float(b), True) for a, b in pairwise(w)),
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelCost:
    """Per-token figures of one model (all the estimator reads)."""

    name: str
    family: str
    n_layers: int
    layer_params: float
    """Parameters of one repeated block (all of the model for an MLP)."""
    embed_params: float
    """Input embedding (+ learned positions): on the first pipeline stage."""
    head_params: float
    """Untied output projection: on the last stage."""
    tied_copy_params: float
    """Copy of a tied embedding the last stage keeps when pp > 1 (Megatron-LM)."""
    other_params: float
    """Final norm."""
    total_params: float
    tokens_per_sample: int
    model_flops_per_token: float
    """Training FLOPs per token without recomputation (PaLM appendix B)."""
    full_recompute_flops_per_token: float
    """Extra FLOPs per token of re-running every layer's forward."""
    selective_recompute_flops_per_token: float
    """Extra FLOPs per token of re-running the attention core only."""
    flash_recompute_flops_per_token: float
    """Extra FLOPs FlashAttention's backward spends recomputing the scores."""
    act_replicated: float
    """Activation bytes per token per layer outside the TP region (Korthikanti's 10h)."""
    act_split: float
    """Activation bytes per token per layer inside the TP region (Korthikanti's 24h)."""
    act_scores: float
    """Attention-score bytes per token per layer (Korthikanti's 5as; 0 with flash)."""
    act_checkpoint: float
    """Bytes per token per layer kept under full recomputation (the layer input, 2h)."""
    logits_bytes_per_token: float
    """fp32 logits for the loss on the last stage (Korthikanti §4.3: 4sbv)."""
    hidden: int
    n_heads: int
    n_kv_heads: int
    supports_model_parallel: bool
    describe: str
    attention_flops_per_token: float = 0.0
    """The attention core's share of model_flops_per_token (QK^T and PV: 12 L q s)."""
    padding_flops_per_token: float = 0.0
    """MoE capacity padding: expert FLOPs computed on empty slots (hardware FLOPs only)."""
    act_op_replicated: float = 0.0
    act_op_split: float = 0.0
    """Activation bytes per token per layer kept under operator-level selective checkpointing
    (recompute "op": every other matmul output, the attention output and the layer input),
    outside and inside the tensor-parallel region."""
    op_recompute_flops_per_token: float = 0.0
    """FLOPs recomputed under "op" checkpointing: the even-numbered matmuls of every layer."""
    act_fp8_saving_replicated: float = 0.0
    act_fp8_saving_split: float = 0.0
    """Bytes per token per layer that FP8 training saves by keeping the four linear layers'
    inputs in FP8 (memory.activation_bytes_per_layer), outside and inside the TP region."""
    n_experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.0
    expert_params: float = 0.0
    """One layer's expert MLP parameters, all experts (0 for a dense model)."""
    largest_module_params: float = 0.0
    """Parameters of the largest single module (one weight matrix or the embedding table):
    what DeepSpeed's ZeRO-3 estimator calls the largest layer."""
    gemms: tuple[tuple[float, float, bool], ...] = ()
    """Matrix multiplies of one layer as (K, M, column_parallel): a token's row of K values
    times a K x M weight. Tensor parallelism splits M of a column-parallel GEMM (QKV, MLP in)
    and K of a row-parallel one (attention output, MLP out), Shoeybi et al. 2019 §3."""
    lora_matrices: tuple[tuple[str, float], ...] = ()
    """The projections a LoRA adapter may target (q, k, v, o, gate, up, down) as
    (name, in + out summed over that projection's matrices in one layer, the mean over the
    layers): an adapter of rank r on it holds r x that many parameters per layer. Empty: the
    model has no such projections (an MLP)."""
    trainable_share: float = 1.0
    """Parameters that train (gradients, optimizer state) over the parameters held: 1, or
    under LoRA the adapters over the base (finetune.adapted), spread evenly over the devices."""
    frozen_bytes: float = 0.0
    """Bytes of each frozen base parameter (LoRA's base dtype); 0: nothing is frozen."""
    weight_grad_passes: float = 1.0
    """Weight-gradient GEMMs per layer and micro-batch: 1, or 0 when the matrices are frozen
    (LoRA: only the input gradients flow back through them)."""
    adapter_params: float = 0.0
    """LoRA's trainable adapter parameters, all layers (0: no adapters)."""
    layer_tensors: tuple[float, ...] = ()
    """Elements of each parameter tensor of one layer as Megatron-LM lays them out (QKV in
    one weight, the gated MLP's gate and up in one; each GEMM weight, each bias, each norm's
    scale and bias), unsplit by tensor parallelism: 12 tensors for a GPT layer, 6 for a Llama
    one. What a stack that gathers every tensor on its own issues collectives for
    (PlanOptions.zero3_gather)."""


def preset(name: str) -> TransformerShape:
    from sextant.planner.presets import ALIASES, PRESETS  # the data imports this module

    key = ALIASES.get(name, name)
    if key not in PRESETS:
        allowed = ", ".join([*PRESETS, *ALIASES])
        raise UserError(f"unknown model preset {name!r}; allowed: {allowed}")
    return PRESETS[key]


def megatron_gpt(
    *,
    n_layers: int,
    d_model: int,
    n_heads: int,
    seq_len: int = 2048,
    vocab_size: int = 51200,
    global_batch: int = 1,
    name: str = "gpt",
) -> TransformerShape:
    """The GPT shapes of Narayanan et al. 2021 (Table 1: V = 51,200, s = 2048, ffn = 4h)."""
    return TransformerShape(
        name=name,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_ff=4 * d_model,
        vocab_size=vocab_size,
        seq_len=seq_len,
        tied_embeddings=True,
        learned_positions=True,
        biases=True,
        dropout=True,
        global_batch=global_batch,
        source="Narayanan et al. 2021, Table 1",
    )
