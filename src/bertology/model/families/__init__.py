"""The checkpoint families bertology reads and writes, one data module each (a `FAMILY`, a
`bertology.model.convert.CheckpointFamily`). `bertology.model.convert.registry()` registers them on first use; a new
family is a module like these plus `register_family(FAMILY)`."""
