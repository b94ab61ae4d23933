"""Built-in statistics that are modules of their own.

Each module defines one :class:`~poslens.capture.builtin.base.BuiltinStatistic`: the ``--stats``
name, the accumulators it fills (their names are the ``maps.safetensors`` names) and what it adds
for one attention layer's batch, from the intermediates the capture computes once per layer
(:class:`~poslens.capture.builtin.base.LayerBatch`). Its sums live in the capture's accumulators,
so checkpoints, merges and the all-reduce treat it like every other. Adding one: its module, its
test, its line in :data:`BUILTINS` and its row in docs/scan.md.

The attention maps (``scores``, ``probs``, ``slash`` and the per-head maps share one chunked pass
over the softmax) and the cosine maps are still computed by
:class:`poslens.capture.attention.Capture` itself.
"""

from poslens.capture.builtin.dim_logit import DimLogit
from poslens.capture.builtin.qk import QKMoments

#: the registry: ``--stats`` name -> statistic, in the order they run in a layer
BUILTINS = {st.name: st for st in (QKMoments(), DimLogit())}
