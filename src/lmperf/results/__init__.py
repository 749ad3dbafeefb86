"""Records, JSONL storage, tables: never runs a model, never imports torch."""
