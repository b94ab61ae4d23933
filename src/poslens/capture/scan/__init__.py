"""One scan, top to bottom: :mod:`.options` (``ScanConfig``: every option, declared once) ->
:mod:`.plan` (``plan_scan``: every check, nothing written -> a frozen ``ScanPlan``) -> :mod:`.run`
(``run_scan``: the batches, resume, ranks, progress) with :mod:`.checkpoint` (atomic,
fingerprinted sums) and :mod:`.distributed` (``torch.distributed`` and models over several
devices) -> :mod:`.finalize` (``maps.safetensors``, ``summary.json``, figures)."""
