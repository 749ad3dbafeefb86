"""Estimates for machines you may not have: time, memory and parallelism, in one vocabulary
(docs/architecture.md lists the modules); nothing here runs the model on real data.
`bench --predict`, `memory --estimate`, `dist --estimate`, `plan` and the pre-flight are views."""
