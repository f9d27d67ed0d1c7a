"""What both papers share: text (corpora, checksums, windows), model_files and models (loading, refusing a
model directory's code), gguf (GGUF files, SmolLM2), capture (`Trace`, the AttentionInterface function),
perplexity, result (`Result`, provenance), cache (the one cache-key recipe), verdicts (claim rows), style, util.
Imports nothing else of attnlab; everything else imports it."""
