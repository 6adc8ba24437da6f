"""Pipeline plumbing: KFP pipeline definitions, compile/submit/local run, cluster placement helpers.

Import-light on purpose (a plain `import pipelines` needs no third-party package); the modules
import kfp themselves: `registry`, `data_prep`, `full`, `k8s`, `compile`, `submit`, `local_run`, `demo`,
`spec_checks`, and `cli` (registered into `harnessrl`'s command line).
"""
