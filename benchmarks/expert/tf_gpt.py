"""An expert's TensorFlow/Keras GPT training loop, sharing no code with sextant.

    python benchmarks/expert/tf_gpt.py [--mode keras|fused] [shape flags]

Written as TensorFlow's custom-training-loop tutorials write it: a keras.Model of Keras
layers, tf.GradientTape, keras.optimizers.AdamW (weight decay excluded from the 1-D
variables, learning rate from a LearningRateSchedule: warm-up + cosine), the step under
tf.function(jit_compile=True), batches made as tensors before the loop.

--mode keras: attention with keras.layers.MultiHeadAttention(use_causal_mask=True), as the
  TensorFlow Transformer tutorial does (separate q/k/v projections: the same parameter count
  as a fused qkv).
--mode fused: the same model with one fused qkv Dense and the attention written with
  tf.matmul + a causal mask + softmax (the minGPT/nanoGPT form), no MultiHeadAttention.

Thread pools: intra-op = --threads (inter-op left to TensorFlow's default).
"""

from __future__ import annotations

import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import lr_at, parse, report  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402


class FusedAttention(keras.layers.Layer):
    def __init__(self, d: int, n_heads: int, resid_init) -> None:  # noqa: ANN001
        super().__init__()
        self.n_heads, self.d = n_heads, d
        self.qkv = keras.layers.Dense(3 * d, kernel_initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.proj = keras.layers.Dense(d, kernel_initializer=resid_init)

    def call(self, x):  # noqa: ANN001, ANN201
        B, T = tf.shape(x)[0], x.shape[1]
        hd = self.d // self.n_heads
        q, k, v = tf.split(self.qkv(x), 3, axis=-1)

        def heads(t):  # noqa: ANN001, ANN202
            return tf.transpose(tf.reshape(t, (B, T, self.n_heads, hd)), (0, 2, 1, 3))

        q, k, v = heads(q), heads(k), heads(v)
        att = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(hd))
        mask = tf.linalg.band_part(tf.ones((T, T), tf.bool), -1, 0)
        att = tf.nn.softmax(tf.where(mask, att, -1e9), axis=-1)
        y = tf.reshape(tf.transpose(tf.matmul(att, v), (0, 2, 1, 3)), (B, T, self.d))
        return self.proj(y)


class Block(keras.layers.Layer):
    def __init__(self, a, fused: bool) -> None:  # noqa: ANN001
        super().__init__()
        normal = keras.initializers.RandomNormal(stddev=0.02)
        resid = keras.initializers.RandomNormal(stddev=0.02 / math.sqrt(2 * a.n_layers))
        self.ln1 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.ln2 = keras.layers.LayerNormalization(epsilon=1e-5)
        self.fused = fused
        if fused:
            self.attn = FusedAttention(a.d_model, a.n_heads, resid)
        else:
            self.attn = keras.layers.MultiHeadAttention(
                num_heads=a.n_heads, key_dim=a.d_model // a.n_heads,
                kernel_initializer=normal)
        self.fc = keras.layers.Dense(a.d_ff, kernel_initializer=normal)
        self.fc_proj = keras.layers.Dense(a.d_model, kernel_initializer=resid)

    def call(self, x):  # noqa: ANN001, ANN201
        h = self.ln1(x)
        x = x + (self.attn(h) if self.fused else self.attn(h, h, use_causal_mask=True))
        return x + self.fc_proj(keras.activations.gelu(self.fc(self.ln2(x)), approximate=True))


class GPT(keras.Model):
    def __init__(self, a, fused: bool) -> None:  # noqa: ANN001
        super().__init__()
        normal = keras.initializers.RandomNormal(stddev=0.02)
        self.wte = keras.layers.Embedding(a.vocab, a.d_model, embeddings_initializer=normal)
        self.wpe = keras.layers.Embedding(a.seq_len, a.d_model, embeddings_initializer=normal)
        self.blocks = [Block(a, fused) for _ in range(a.n_layers)]
        self.ln_f = keras.layers.LayerNormalization(epsilon=1e-5)
        self.head = keras.layers.Dense(a.vocab, use_bias=False, kernel_initializer=normal)

    def call(self, idx):  # noqa: ANN001, ANN201
        x = self.wte(idx) + self.wpe(tf.range(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, a) -> None:  # noqa: ANN001
        self.table = tf.constant([lr_at(a, k) for k in range(a.steps)], tf.float32)

    def __call__(self, step):  # noqa: ANN001, ANN204
        return tf.gather(self.table, tf.minimum(tf.cast(step, tf.int32), self.table.shape[0] - 1))


def main() -> None:
    a = parse(__doc__.splitlines()[0], modes=("keras", "fused"))
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    keras.utils.set_random_seed(a.seed)
    model = GPT(a, fused=a.mode == "fused")
    model(tf.zeros((1, a.seq_len), tf.int32))  # build the variables
    n_params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    opt = keras.optimizers.AdamW(learning_rate=WarmupCosine(a), beta_1=a.beta1, beta_2=a.beta2,
                                 epsilon=a.eps, weight_decay=a.weight_decay)
    opt.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables
                                            if len(v.shape) < 2])
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(jit_compile=True)
    def train_step(x, y):  # noqa: ANN001, ANN202
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    rng = np.random.default_rng(a.seed + 1)
    data = rng.integers(0, a.vocab, (a.steps, a.batch, a.seq_len + 1), dtype=np.int32)
    batches = [(tf.constant(d[:, :-1]), tf.constant(d[:, 1:])) for d in data]

    times, losses, ends = [], [], []
    for x, y in batches:
        t0 = time.perf_counter()
        loss = train_step(x, y)
        times.append(time.perf_counter() - t0)
        ends.append(time.time())  # wall clock, to align with a run beside it (--concurrent)
        losses.append(loss)
    report(a, "tensorflow", n_params, times, [float(v) for v in losses], mode=a.mode,
           step_end_unix=ends)


if __name__ == "__main__":
    main()
