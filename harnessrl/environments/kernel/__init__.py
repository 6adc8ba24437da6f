"""The `kernel` environment: make a slow, correct Python/NumPy function fast (the CPU analogue of a GPU
kernel task).

- `tasks.py`: the task folders under `tasks/` as validated `KernelTask` records; `best_snapshot`.
- `grade.py`: the grader that runs inside the sandbox (stdlib + numpy only, no harnessrl import).
- `runner.py`: the host side: the sandbox's numpy-only env, the grading directory, `grade_solution`.
- `env.py`: the `Environment` (task rows, workspace hooks, snapshots, rewards) and `harnessrl tasks kernel`.
"""
