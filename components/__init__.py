"""The pipeline's components, one folder per stage: `component.py` (the thin `@dsl.component`), the stage's
`cli.py` (`harnessrl stage <name>`), its stage logic where it is not a plain call into `harnessrl`, and its
tests. Shared libraries live in the `harnessrl` package; nothing here is imported by it."""
