"""Sources of sequences: text corpora (:mod:`.corpus`), tokenizers (:mod:`.tokenizer`) and positional
tasks (:mod:`.tasks`). Submodules are imported explicitly; this package imports nothing."""
