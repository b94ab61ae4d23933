"""Models poslens builds or trains: NoPE / RoPE / learned-PE families (:mod:`.families`), the trainer
(:mod:`.train`) and its saves and checkpoints (:mod:`.checkpoint`), the small-model zoo (:mod:`.zoo`) and the real
pretrained GGUF models (:mod:`.realmodels`). Submodules are imported explicitly; this package imports nothing."""
