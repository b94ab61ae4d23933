"""One layer's attention pass and where its numbers are formed: :mod:`.attnpass` (the
intermediates its readers need, each computed once), :mod:`.choice` (torch, the C kernels or
Triton, chosen in one place, and the chunk sizes), :mod:`.cuda_maps` (the Triton kernels),
:mod:`.kernels` (small shared tensor kernels), :mod:`.sums` (float32 workspaces and their exact
addition into float64), :mod:`.blocks` (``--map-size`` block means), :mod:`.gram` (the cosine
maps' symmetric Gram) and :mod:`.rope` (RoPE undone)."""
