"""Recomputation of a block's activations in the backward pass, on JAX (`--remat`).

`keras.remat` (JAX's checkpoint) keeps only a block's input, but it leaves the order of the
backward pass to XLA. XLA's CPU scheduler orders ops depth first: when something needs every
gradient at once (global-norm gradient clipping, keras-vit's default), it runs each block's
recomputation and input gradient before any weight gradient, so every recomputed activation is
alive at once and the saving is lost (a ViT-S/16 step at batch 32: 3.66 GiB of temporaries
with `keras.remat`, 3.56 GiB without it). Two zero-valued data dependences fix the order: the
recomputation waits for the block's output gradient, and the gradient handed to the block
before waits for this block's weight gradients (0.74 GiB). XLA keeps them: it does not fold
`x * 0` for floats, as NaN * 0 is NaN.
"""


def recomputed(f):
    """`f(x, *weights) -> (y, extra)`, differentiable in `x` and `weights`, with nothing of it
    kept for the backward pass but `x` and `weights`: `f` runs again there (JAX only)."""
    import jax
    import jax.numpy as jnp

    def zero_from(*arrays):  # one element of each: a dependence that costs nothing
        return sum((jnp.ravel(a)[0].astype("float32") for a in arrays), jnp.float32(0)) * 0

    @jax.custom_vjp
    def run(x, *weights):
        return f(x, *weights)

    def forward(x, *weights):
        return f(x, *weights), (x, weights)

    def backward(saved, cotangents):
        x, weights = saved
        dy = cotangents[0]
        x = x + zero_from(dy).astype(x.dtype)  # recompute only once the output's gradient exists
        _, vjp = jax.vjp(lambda x, *w: f(x, *w)[0], x, *weights)
        dx, *dweights = vjp(dy)
        dx = dx + zero_from(*dweights).astype(dx.dtype)  # this block's weight gradients first
        return (dx, *dweights)

    run.defvjp(forward, backward)
    return run
