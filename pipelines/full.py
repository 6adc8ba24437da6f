"""`harnessrl-full`: data prep → difficulty → select → the RL loop (one long-running step) → evaluation.

    import-source → synthesize → clean → validate
                                  │ kept (after validate)
    import-base-model ────────────┼─▶ estimate-difficulty ─▶ select ─▶ task-family ─┬─ train ─▶ rl-loop ─┐ model
          │                                                                         └─ test ──▶ evaluate ◀┘
          └──────────────────── policy (rl-loop), base_policy (evaluate) ────────────────────┘
                                              summarize-run ◀── every step's metrics

`harnessrl-full-cold-start` adds a `cold-start` step (SFT on scripted demonstrations of the selected tasks'
gold fixes, through the real harness and gateway) between select and rl-loop. `evaluate` measures base vs
trained pass@1 on the held-out tasks through the same rollout → verify path as training (sampled, `eval_k`
rollouts per task; `eval_k=1` is greedy).

`rl-loop` runs engine(s), gateway, rollout workers, verifiers and the trainer for `steps` optimizer steps
(mode `sync` | `colocated` | `separate`, docs/rl.md); weights sync into the engines in place, so no step
starts cold. `rl_gpus` is read when the run starts: the step's GPU request (the compiled `resourceCount` is that
parameter) and its trainer ranks (`nproc`) both follow it. The rounds unrolled into separate generate → verify → train steps are `harnessrl-rounds`
(pipelines/rounds.py). GPU steps (difficulty, cold-start, rl-loop, evaluate) are placed on GPU nodes and the steps that stream large
objects get the S3 credentials from a Secret; kfp.local ignores both, so the same pipeline runs locally and
on a cluster.
"""

from kfp import dsl

from components.evaluate.component import evaluate
from components.rl_loop.component import rl_loop
from components.sft.component import sft
from components.summarize_run.component import summarize_rl_run
from components.task_family.component import task_family
from pipelines.data_prep import add_data_prep
from pipelines.k8s import gpu_step, use_s3_credentials
from pipelines.selection import add_selection

FULL_PIPELINE_NAME = "harnessrl-full"
COLD_START_PIPELINE_NAME = "harnessrl-full-cold-start"
# Steps (by component name) that stream checkpoints/rollouts to the store, in any registered pipeline:
# `harnessrl compile --check` verifies they get the S3 credentials from the Secret.
S3_STEPS = ("generate-rollouts", "train-grpo", "rl-loop")


def build_full(cold_start: bool = False):
    """`harnessrl-full`; with `cold_start`, `harnessrl-full-cold-start`: an `sft` step on scripted
    demonstrations of the selected tasks' gold fixes before the RL loop, which then starts from its model
    (the evaluation still compares against the base model)."""

    @dsl.pipeline(
        name=COLD_START_PIPELINE_NAME if cold_start else FULL_PIPELINE_NAME,
        description="Data prep, difficulty estimation and selection, "
        + ("SFT on scripted demonstrations of the selected tasks' fixes, " if cold_start else "")
        + "then the RL loop (rollouts, verification, GRPO steps and in-place weight sync in one long-running "
        "step), then base vs trained on held-out tasks.",
    )
    def pipeline(
        source_uri: str,
        base_model_uri: str,
        max_tasks: int = 20,
        seed: int = 0,
        timeout_s: float = 120.0,
        max_tests: int = 200,
        require_f2p: bool = True,
        require_problem_statement: bool = True,
        check_branches: bool = True,
        drop_duplicates: bool = True,
        engine_url: str = "",
        specs_json: str = "",
        group_size: int = 4,
        difficulty_n: int = 4,
        rollout_concurrency: int = 8,  # rollouts in flight in estimate-difficulty and evaluate
        k_all_fail: int = 1000,
        test_fraction: float = 0.1,
        mode: str = "colocated",
        steps: int = 10,
        batch_groups: int = 4,
        max_staleness: int = 1,
        save_every: int = 0,
        config_json: str = "{}",
        lora_rank: int = 0,  # > 0: the RL loop trains LoRA adapters of this rank (docs/train.md)
        rl_gpus: int = 1,  # the rl-loop step's GPUs and trainer ranks, set per run
        eval_k: int = 4,
        rl_family: str = "auto",  # the RL loop's tasks: auto | swe | instruction | procedural | search | kernel
        family_train_tasks: int = 64,
        family_held_out_tasks: int = 40,
        family_kinds: str = "",  # narrows a generated family (components/task_family), comma-separated
        family_min_words: int = 12,  # instruction family: one-sentence replies of >= this many words (0: plain)
        family_specs_json: str = "",  # the generated family's rollout spec ("": its environment's default)
        cold_start_epochs: int = 3,  # harnessrl-full-cold-start only, as the next one
        cold_start_config_json: str = "{}",  # the sft stage's settings (components.sft.stage.SftConfig)
    ):
        prep = add_data_prep(
            source_uri,
            max_tasks=max_tasks,
            seed=seed,
            timeout_s=timeout_s,
            max_tests=max_tests,
            require_f2p=require_f2p,
            require_problem_statement=require_problem_statement,
            check_branches=check_branches,
            drop_duplicates=drop_duplicates,
        )
        chosen = add_selection(
            prep,
            base_model_uri,
            difficulty_n=difficulty_n,
            rollout_concurrency=rollout_concurrency,
            specs_json=specs_json,
            engine_url=engine_url,
            k_all_fail=k_all_fail,
            test_fraction=test_fraction,
            seed=seed,
        )
        base_model, estimate, selection = chosen.base_model, chosen.estimate, chosen.selection
        policy = base_model
        if cold_start:  # compile time: two pipelines, so no GPU step is ever started only to be skipped
            warm = sft(
                tasks=selection.outputs["selected"],
                policy=base_model,
                epochs=cold_start_epochs,
                config_json=cold_start_config_json,
                specs_json=specs_json,
                seed=seed,
            )
            warm.set_display_name("cold-start")
            gpu_step(warm, gpus=1)
            policy = warm.outputs["model"]
        family = task_family(
            selected=selection.outputs["selected"],
            held_out=selection.outputs["held_out"],
            family=rl_family,
            n_train=family_train_tasks,
            n_held_out=family_held_out_tasks,
            kinds=family_kinds,
            min_words=family_min_words,
            seed=seed,
            swe_specs_json=specs_json,
            family_specs_json=family_specs_json,
        )
        family.set_display_name("task-family")
        trained = rl_loop(
            tasks=family.outputs["train"],
            policy=policy,
            mode=mode,
            steps=steps,
            batch_groups=batch_groups,
            group_size=group_size,
            max_staleness=max_staleness,
            save_every=save_every,
            engine_url=engine_url,
            specs_json=family.outputs["Output"],
            config_json=config_json,
            seed=seed,
            nproc=rl_gpus,
            lora_rank=lora_rank,
        )
        gpu_step(trained, gpus=rl_gpus)
        use_s3_credentials(trained)
        evaluation = evaluate(
            tasks=family.outputs["test"],
            base_policy=base_model,
            policy=trained.outputs["model"],
            k=eval_k,
            concurrency=rollout_concurrency,
            specs_json=family.outputs["Output"],
            engine_url=engine_url,
            seed=seed,
        )
        gpu_step(evaluation, gpus=1)
        summarize_rl_run(
            difficulty=estimate.outputs["metrics"],
            selection=selection.outputs["metrics"],
            family=family.outputs["metrics"],
            trained=trained.outputs["metrics"],
            trained_steps=trained.outputs["tensorboard"],
            evaluated=evaluation.outputs["metrics"],
            evaluation=evaluation.outputs["evaluation"],
            mode=mode,
        ).set_display_name("summarize-run")

    return pipeline


harnessrl_full = build_full()
harnessrl_full_cold_start = build_full(cold_start=True)
