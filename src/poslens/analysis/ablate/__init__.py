"""``poslens ablate``: where position comes from, causally.

Modules: :mod:`.config` (``AblateConfig``, the layer selection), :mod:`.losses` (per-token losses,
paired statistics), :mod:`.replay` (``LayerReplay``), :mod:`.run` (``run_ablate``: the run and its
run directory).

The other commands measure positional structure in attention maps: correlations. ``ablate``
switches a source of position off (:mod:`poslens.capture.engine.intervene`: RoPE, one RoPE frequency band,
the massive q/k dimensions, the attention sink, keys beyond a window), in every layer at once, in a
list of layers, or in one layer at a time, and measures what the model loses: its next-token loss
on the same sequences, paired with the unmodified model, overall and by position.

Layer selection (``layers``): ``"each"`` (one condition per decoder layer, from 0), ``"all"`` (one
condition, every layer together), a list ``"0,3,5-7"`` (one condition, those layers together) or
``"each:0-5"`` (one condition per listed layer).

**Loss.** ``loss[n, t]``: the cross-entropy of token ``t`` of sequence ``n`` given tokens
``0 .. t - 1`` (``t = 1 .. S - 1``), from the model's own logits in float32 (as transformers' loss
with labels computes it). A condition's effect is the paired difference ``loss_c - loss_0`` with the
unmodified model on the same tokens. Noise floor: sequence ``n`` belongs to group ``n % G``; the
standard error of a mean difference is the standard deviation of the ``G`` group means over
``sqrt(G)``, and its p-value a two-sided t-test with ``G - 1`` degrees of freedom on them. Positions
are pooled into buckets that double in width (``[1, 2)``, ``[2, 4)``, ``[4, 8)``, ...). A condition
changes the loss *beyond the noise* when its p-value is below :data:`poslens.conventions.NOISE_P`, the layers of one
intervention held together at that false discovery rate (Benjamini–Hochberg).

**Cost.** A layer-at-a-time condition reruns only the layers from the ablated one on: the earlier
layers' outputs of the unmodified forward are replayed (the earlier layers run on one token;
checked bit for bit against the full forward on the first batch; a model where they differ gets
full forwards). The loss is read from the final hidden states a block of positions at a time (one
pass of the LM head, no ``[B, S, V]`` logits). No capture runs unless ``readings`` asks for the
scans of :func:`readings`.
"""

