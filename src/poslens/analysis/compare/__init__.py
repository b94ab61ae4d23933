"""``poslens compare``: two variants of a model (two checkpoints, or one model under RoPE scaling, a
dtype, a window or an ablation) on the same sequences, every positional reading tested for a change:
``config`` (the options), ``variants`` (parsed and applied, then undone), ``readings`` (what one
sequence group's capture gives), ``run`` (the loop, the pairing, the run directory), ``figures``."""
