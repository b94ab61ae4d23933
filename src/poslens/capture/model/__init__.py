"""The model a scan reads: :mod:`.source` (a Hugging Face directory or a ``.gguf`` file),
:mod:`.load` (the refusals before loading: pickle weights, remote code; the loaders of config,
tokenizer and weights), :mod:`.borrow` (a model the caller already holds, handed back as it was)
and :mod:`.adapters` (the architecture table: decoder layers, rotary modules, capture points)."""
