"""``poslens compare``: two variants of one model (a RoPE rescaling, another base, a dtype, a narrower
window, an ablate intervention) measured on the same tokens. :mod:`.variants` parses the variant specs
and applies them to a loaded model and undoes them; the run and its options live beside it."""
