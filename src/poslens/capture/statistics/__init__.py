"""What a scan computes: :mod:`.protocol` (``Statistic``, users' own statistics, and the capture
points), :mod:`.accumulators` (mergeable sums and the noise groups), :mod:`.users` (users'
statistics fed from the attention pass), :mod:`.reservoir` (a bounded sample of pre-RoPE q/k),
:mod:`.builtin` (the built-in statistics, one module each) and :mod:`.reference` (the readable
eager capture every statistic is tested against)."""
