"""`harnessrl-rounds`: data prep, difficulty and selection, then training unrolled into rounds of separate
steps (generate → verify → train), for stepping through and rerunning one round. Real training is the
continuous `rl_loop` step of `harnessrl-full` (pipelines/full.py).

    import-source → synthesize → clean → validate
                                  │ kept (after validate)
    import-base-model ────────────┼─▶ estimate-difficulty ─▶ select ─┐
                                  │                                   ▼ selected
          ┌──────────── policy ◀──┴──────────────── round r: generate-rollouts ─▶ verify ─▶ train-grpo
          └─▶ round r+1 samples from round r's trained model                               │ metrics
                                                                   summary of rounds ≤ r ◀──┘

Rounds are unrolled at compile time (`ROUNDS`): round r+1's policy is round r's checkpoint, and a
`dsl.ParallelFor` cannot carry state from one iteration to the next. GPU steps (difficulty, generate, train)
are placed on GPU nodes and the steps that stream large objects get the S3 credentials from a Secret;
kfp.local ignores both, so the same pipeline runs locally and on a cluster. After each round a summary step
reports the run so far (the rounds travel from one summary to the next); the last one is the run's summary.
"""

from kfp import dsl

from components.generate.component import generate_rollouts
from components.summarize_run.component import summarize_run
from components.train.component import train_grpo
from components.verify.component import verify
from pipelines.data_prep import add_data_prep
from pipelines.k8s import gpu_step, use_s3_credentials
from pipelines.selection import add_selection

ROUNDS_PIPELINE_NAME = "harnessrl-rounds"
ROUNDS = 2


@dsl.pipeline(
    name=ROUNDS_PIPELINE_NAME,
    description="Data prep, difficulty estimation and selection, then rounds of rollout generation, "
    "verification and GRPO training.",
)
def harnessrl_rounds(
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
    rollout_concurrency: int = 8,  # rollouts in flight in estimate-difficulty and each round's generate
    k_all_fail: int = 1000,
    test_fraction: float = 0.1,
    config_json: str = "{}",
    lora_rank: int = 0,  # > 0: each round trains LoRA adapters of this rank on the last round's merged model
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
    estimate, selection = chosen.estimate, chosen.selection

    policy = chosen.base_model
    summary = None
    for round_index in range(1, ROUNDS + 1):
        rollouts = generate_rollouts(
            tasks=selection.outputs["selected"],
            policy=policy,
            group_size=group_size,
            concurrency=rollout_concurrency,
            specs_json=specs_json,
            engine_url=engine_url,
            seed=seed,
        )
        verified = verify(tasks=selection.outputs["selected"], rollouts=rollouts.outputs["rollouts"])
        trained = train_grpo(
            samples=rollouts.outputs["samples"],
            verified=verified.outputs["verified"],
            policy=policy,
            config_json=config_json,
            seed=seed,
            lora_rank=lora_rank,
        )
        for task, stage in ((rollouts, "generate-rollouts"), (verified, "verify"), (trained, "train-grpo")):
            task.set_display_name(f"{stage}-round-{round_index}")
        for task in (rollouts, trained):
            gpu_step(task, gpus=1)
            use_s3_credentials(task)
        policy = trained.outputs["model"]
        # the rounds before this one (none in round 1)
        earlier_rounds = {"earlier": summary.outputs["rounds"]} if summary is not None else {}
        summary = summarize_run(
            difficulty=estimate.outputs["metrics"],
            selection=selection.outputs["metrics"],
            generated=rollouts.outputs["metrics"],
            verified=verified.outputs["metrics"],
            trained=trained.outputs["metrics"],
            round_index=round_index,
            total_rounds=ROUNDS,
            **earlier_rounds,
        )
        summary.set_display_name(
            "summarize-run" if round_index == ROUNDS else f"summarize-run-round-{round_index}"
        )
