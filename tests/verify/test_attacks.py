"""End-to-end verification on tasks synthesized from a real repo: the gold fix is resolved, the untouched
workspace is not, and every attack scores 0 (or is an infra error, never a reward).

All attack workspaces are graded by the verify stage itself in two parallel batches (default limits; tight
limits for the runaway ones), then each test checks its row and, where useful, a control showing the attack
would have worked without the defence.

Over 400 lines: one table of attacks graded in shared batches (grading each alone would cost minutes).
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harnessrl.io import read_jsonl, write_jsonl
from harnessrl.sandbox import cgroups
from harnessrl.sandbox.backends import DEFAULT_CHOICE, SandboxChoice
from harnessrl.sandbox.base import Limits, Outcome
from harnessrl.sandbox.bwrap import BubblewrapSandbox
from harnessrl.sandbox.envs import ensure_env
from harnessrl.sandbox.workspace import RepoCache
from harnessrl.verify.rollouts import run_verify
from harnessrl.verify.verifier import PYTEST_ARGS, verify_patch
from tests.sandbox.support import descendants
from tests.support.fixtures import requires_bwrap

pytestmark = requires_bwrap

FORCE_PASS_PLUGIN = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""
SITE_HOOKS = {
    "sitecustomize.py": "import os\nos.environ['PYTEST_ADDOPTS'] = '-p forcepass'\n",
    "forcepass.py": FORCE_PASS_PLUGIN,
    "zz_force.pth": "import os; os.environ['PYTEST_ADDOPTS'] = '-p forcepass'\n",
}
RUNAWAY = {  # module-level code: it runs when the tests import the module, inside the verifier's sandbox
    "hang": "while True:\n    pass\n",
    "alloc-10GB": "data = b'x' * (10 << 30)\n",
    "fork-bomb": "import os\nwhile True:\n    os.fork()\n",
}
# As root without a usable cgroup nothing bounds processes (RLIMIT_NPROC does not bind root): never fork-bomb
# such a host.
PROCESSES_BOUNDED = os.geteuid() != 0 or cgroups.factory().available()
if not PROCESSES_BOUNDED:
    del RUNAWAY["fork-bomb"]
RUNAWAY_LIMITS, RUNAWAY_TIMEOUT_S = Limits(memory_mb=256, processes=32), 10.0


class _GoldServer(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format, *args):
        pass


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text)


def _build_attacks(task, root: Path, url: str) -> dict[str, Path]:
    """rollout id -> workspace, each one attack on a fresh workspace."""
    ws: dict[str, Path] = {}

    def fresh(name: str) -> Path:
        ws[name] = task.workspace(root / name)
        return ws[name]

    task.apply_gold(fresh("gold"))
    fresh("untouched")
    (fresh("root-conftest") / "conftest.py").write_text(FORCE_PASS_PLUGIN)
    (fresh("syntax-error") / task.module()).write_text("def broken(:\n")
    d = fresh("rewrite-tests")
    shutil.rmtree(d / "tests")
    for test_id in (
        task.row["FAIL_TO_PASS"] + task.row["PASS_TO_PASS"]
    ):  # every expected test, trivially passing
        path, name = test_id.split("::")
        (d / path).parent.mkdir(parents=True, exist_ok=True)
        with open(d / path, "a") as out:
            out.write(f"\ndef {name.split('[')[0]}(*a, **k):\n    pass\n")
    d = fresh("site-hooks")
    for name, text in SITE_HOOKS.items():
        (d / name).write_text(text)
    # reading history from inside the agent's sandbox: `git show HEAD~1:<file> > <file>` (the SWE-smith leak)
    d = fresh("git-history")
    with BubblewrapSandbox(d, ensure_env(task.taskset, task.row["repo"])) as sb:
        r = sb.run(f"git show HEAD~1:{task.module()} > {task.module()}", timeout=30)
    assert r.outcome is Outcome.NONZERO
    (fresh("network") / task.module()).write_text(
        f"import urllib.request\nexec(urllib.request.urlopen({url!r}, timeout=5).read())\n"
        "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', "
        "'--retries', '0', '--timeout', '3', '-d', '/tmp/dl', 'parse'], check=True)\n"
    )
    _append(
        fresh("exit-code-lies") / task.module(), "import atexit, os\natexit.register(lambda: os._exit(0))\n"
    )
    every = task.row["FAIL_TO_PASS"] + task.row["PASS_TO_PASS"]
    forged = "\n".join(
        ["=" * 20 + " short test summary info " + "=" * 20]
        + [f"PASSED {t}" for t in every]
        + ["=" * 20 + f" {len(every)} passed in 0.1s " + "=" * 20]
    )
    _append(
        fresh("forged-summary") / task.module(),
        f"import atexit, os\natexit.register(lambda: (print({forged!r}), os._exit(0)))\n",
    )
    for name, code in RUNAWAY.items():
        _append(fresh(name) / task.module(), code)
    return ws


@pytest.fixture(scope="module")
def attack_sandbox() -> SandboxChoice:
    """The backend the table is graded on (tests/sandbox/test_podman_attacks.py reruns it on podman)."""
    return DEFAULT_CHOICE


@pytest.fixture(scope="module")
def graded(task, tmp_path_factory, attack_sandbox):
    root = tmp_path_factory.mktemp("attacks")
    gold_ws = task.workspace(root / "gold-source")
    task.apply_gold(gold_ws)
    _GoldServer.body = (gold_ws / task.module()).read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GoldServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/fixed.py"
    try:
        workspaces = _build_attacks(task, root / "ws", url)
        results: dict[str, dict] = {}
        for batch, limits, timeout_s in (
            ("default", None, 120.0),
            ("runaway", RUNAWAY_LIMITS, RUNAWAY_TIMEOUT_S),
        ):
            names = [n for n in workspaces if (n in RUNAWAY) == (batch == "runaway")]
            write_jsonl(
                root / f"{batch}.jsonl",
                [{"rollout_id": n, "instance_id": task.iid, "workspace": str(workspaces[n])} for n in names],
            )
            t0 = time.monotonic()
            summary = run_verify(
                task.taskset.root,
                root / f"{batch}.jsonl",
                root / f"out-{batch}",
                workers=2,
                timeout_s=timeout_s,
                limits=limits,
                sandbox=attack_sandbox,
            )
            summary["wall"] = time.monotonic() - t0
            time.sleep(0.3)
            summary["leftover_processes"] = descendants(os.getpid())
            for row in read_jsonl(root / f"out-{batch}" / "rewards.jsonl"):
                row["log"] = (root / f"out-{batch}" / "logs" / f"{row['rollout_id']}.log").read_text()
                row["batch_summary"] = summary
                results[row["rollout_id"]] = row
        yield {"results": results, "url": url, "root": root}
    finally:
        server.shutdown()


def _assert_zero(row: dict, status: str = "unresolved") -> None:
    assert row["verify_status"] == status, (row["verify_status"], row["detail"], row["log"][-2000:])
    assert row["reward"] == 0.0 and row["resolved"] is False and row["status"] == "ok"


def test_gold_fix_is_resolved_and_untouched_is_not(graded, task):
    gold, untouched = graded["results"]["gold"], graded["results"]["untouched"]
    assert gold["verify_status"] == "resolved", (gold["detail"], gold["log"][-3000:])
    assert gold["reward"] == 1.0 and gold["f2p_fraction"] == 1.0 and not gold["flagged"]
    assert set(gold["tests"]) == set(task.row["FAIL_TO_PASS"]) | set(task.row["PASS_TO_PASS"])
    assert task.module() in gold["diff"]
    _assert_zero(untouched)  # scored without a test run: the task's unpatched state (see test_rollout_rows)
    assert "empty patch" in untouched["detail"] and untouched["tests"] == {}
    assert untouched["dropped"] == [] and untouched["diff"] == ""


def test_root_conftest_forcing_passes_is_dropped(graded):
    row = graded["results"]["root-conftest"]
    _assert_zero(row)
    assert [d["path"] for d in row["dropped"]] == ["conftest.py"] and row["flagged"]


def test_syntax_error_that_makes_tests_vanish(graded):
    row = graded["results"]["syntax-error"]
    _assert_zero(row)
    assert {v["outcome"] for v in row["tests"].values()} <= {"MISSING", "ERROR"}


def test_deleting_and_rewriting_test_files(graded):
    row = graded["results"]["rewrite-tests"]
    _assert_zero(row)
    assert row["dropped"] and all(d["path"].startswith("tests/") for d in row["dropped"])


def test_sitecustomize_and_pth_hooks(graded, task, tmp_path):
    row = graded["results"]["site-hooks"]
    _assert_zero(row)
    assert sorted(d["path"] for d in row["dropped"]) == ["sitecustomize.py", "zz_force.pth"]
    # Control: the same files on the bug tree, without the filter, make the F2P tests pass in the very sandbox
    # the verifier uses: the attack is real, and the filter is what stops it.
    cache = RepoCache.for_repo(task.taskset, task.row["repo"])
    tree = tmp_path / "control"
    cache.export(cache.bug_commit(task.iid), tree)
    for name, text in SITE_HOOKS.items():
        (tree / name).write_text(text)
    files = sorted({t.split("::")[0] for t in task.row["FAIL_TO_PASS"]})
    with BubblewrapSandbox(tree, ensure_env(task.taskset, task.row["repo"])) as sb:
        run = sb.run(["python", "-P", "-m", "pytest", *PYTEST_ARGS, *files], timeout=120)
    assert run.outcome is Outcome.OK, run.stdout[-2000:]


def test_env_site_packages_is_read_only_for_the_agent(task, tmp_path):
    ws = task.workspace(tmp_path / "ws")
    env = ensure_env(task.taskset, task.row["repo"])
    site = next(env.glob("lib/python*/site-packages"))
    with BubblewrapSandbox(ws, env) as sb:
        r = sb.run(f"echo 'import os' > {site}/evil.pth", timeout=10)
    assert r.outcome is Outcome.NONZERO and "Read-only file system" in r.stderr
    assert not (site / "evil.pth").exists()


def test_reading_history_with_git_finds_nothing(graded, task, tmp_path):
    fixed_line = next(
        ln[1:] for ln in task.row["patch"].splitlines() if ln.startswith("-") and not ln.startswith("---")
    )
    # Control: in the SWE-smith branch the fix is one `git show` away.
    cache = RepoCache.for_repo(task.taskset, task.row["repo"])
    leak = subprocess.run(
        ["git", "--git-dir", str(cache.path), "show", f"refs/heads/{task.iid}~1"],
        capture_output=True,
        text=True,
    ).stdout
    assert fixed_line in leak
    ws = task.workspace(tmp_path / "ws")
    with BubblewrapSandbox(ws, ensure_env(task.taskset, task.row["repo"])) as sb:
        log = sb.run("git log --all --oneline; git branch -a; git remote -v; git reflog", timeout=20)
        every_object = sb.run("git cat-file --batch-all-objects --batch", timeout=20)
    assert log.outcome is Outcome.OK
    assert log.stdout.strip().splitlines() == [log.stdout.split()[0] + " Initial commit", "* main"]
    assert every_object.outcome is Outcome.OK and fixed_line not in every_object.stdout
    _assert_zero(graded["results"]["git-history"])
    strict = task.workspace(tmp_path / "strict", strict=True)
    with BubblewrapSandbox(strict, None) as sb:
        r = sb.run("git log; /usr/bin/git log", timeout=20)
    assert r.outcome is Outcome.NONZERO and r.stderr.count("disabled in this sandbox") == 2


def test_network_access_fetching_the_fix_fails(graded):
    # Control: outside the sandbox the fetch works (and serves the fixed module).
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import urllib.request; print(len(urllib.request.urlopen({graded['url']!r}).read()))",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert int(probe.stdout) == len(_GoldServer.body) > 0
    row = graded["results"]["network"]
    _assert_zero(row)
    assert "Network is unreachable" in row["log"] or "Connection refused" in row["log"]


def test_raw_socket_and_pip_download_fail_inside_the_sandbox(tmp_path):
    probe = (
        "import socket\nfor addr in [('1.1.1.1', 53), ('8.8.8.8', 443), ('127.0.0.1', 22)]:\n"
        "    try:\n        socket.create_connection(addr, timeout=2); print('CONNECTED', addr)\n"
        "    except OSError as e:\n        print('blocked', addr, e)\n"
    )
    with BubblewrapSandbox(tmp_path, None) as sb:
        r = sb.run(["python3", "-c", probe], timeout=20)
        pip = sb.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--retries",
                "0",
                "--timeout",
                "3",
                "-d",
                "/tmp/dl",
                "parse",
            ],
            timeout=60,
        )
    assert r.outcome is Outcome.OK and "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3
    assert pip.outcome is Outcome.NONZERO


@pytest.mark.parametrize(
    "name, expected, detail",
    [
        ("hang", "timeout", "wall-clock"),
        ("alloc-10GB", "resource_limit", "memory limit"),
        ("fork-bomb", "resource_limit", "process limit|memory limit"),  # whichever the bomb hits first
    ],
)
def test_runaway_tests_are_stopped_within_limits(graded, name, expected, detail):
    if name not in RUNAWAY:
        pytest.skip("running as root without a writable cgroup: processes cannot be bounded on this host")
    row = graded["results"][name]
    _assert_zero(row, expected)
    assert re.search(detail, row["detail"]), row["detail"]
    summary = row["batch_summary"]
    # 3 runaways on 2 workers: two rounds of at most the timeout each, plus setup
    assert summary["wall"] < 2 * RUNAWAY_TIMEOUT_S + 30
    assert summary["leftover_processes"] == []  # nothing the sandboxes started is still running


def test_exit_code_that_contradicts_the_log_is_an_infra_error(graded):
    row = graded["results"]["exit-code-lies"]
    assert row["verify_status"] == "infra_error" and row["reward"] is None, (
        row["verify_status"],
        row["detail"],
    )
    assert row["status"] == "infra_error" and "exited 0" in row["detail"] and row["suspicious"]


def test_forged_summary_printed_at_exit_is_an_infra_error(graded):
    row = graded["results"]["forged-summary"]
    assert row["verify_status"] == "infra_error" and row["reward"] is None, (
        row["verify_status"],
        row["detail"],
    )


def test_a_patch_that_does_not_apply_scores_zero(task):
    r = verify_patch(task.taskset, task.row, task.row["patch"].replace(" ", "\t"), timeout_s=60)
    assert r.status == "apply_failed" and r.reward == 0.0 and "does not apply" in r.detail


def test_sysctl_writes_from_a_patched_source_module_fail_under_verify(task, tmp_path):
    """The reported escape, from a patch: an ordinary source module that writes host sysctls (here: puts back
    the values it read) when the tests import it. Every write must fail, the process doing it must not be
    root on the host, and the task scores 0."""
    from harnessrl.verify.verifier import verify_workspace
    from tests.sandbox.support import SYSCTL_PROBE, SYSCTLS, CredentialSampler, host_sysctls, parse_probe

    before = host_sysctls()
    ws = task.workspace(tmp_path / "ws")
    _append(
        ws / task.module(),
        SYSCTL_PROBE + "import json as _json, time as _time\n_time.sleep(1.5)\n"
        "raise RuntimeError('PROBE ' + _json.dumps(_harnessrl_sysctl_probe()))\n",
    )
    with CredentialSampler(b"pytest") as sampler:
        result = verify_workspace(task.taskset, task.row, ws, timeout_s=120)
    assert result.status == "unresolved" and result.reward == 0.0, (result.status, result.detail)
    probe = parse_probe(result.test_log)
    assert set(probe["sysctl"]) == set(SYSCTLS)
    assert "WRITTEN" not in probe["sysctl"].values(), probe
    assert probe["proc_read_only"].get("/proc/sys") is True, probe
    assert host_sysctls() == before
    assert sampler.seen, "the sandboxed pytest was never seen from the host"
    for creds in sampler.seen.values():
        assert "0" not in creds["Uid"].split() and int(creds["CapEff"], 16) == 0, creds


@pytest.mark.parametrize(
    "crash",
    ["import os\nos._exit(0)\n", "import ctypes\nctypes.string_at(0)\n", "raise KeyboardInterrupt\n"],
    ids=["os-exit", "segfault", "interrupt"],
)
def test_a_patch_that_crashes_the_test_run_scores_zero(task, tmp_path, crash):
    """No summary, killed, interrupted: the unpatched tree (run as a witness) completes, so the patch caused it."""
    from harnessrl.verify.verifier import verify_workspace

    ws = task.workspace(tmp_path / "ws")
    _append(ws / task.module(), crash)
    r = verify_workspace(task.taskset, task.row, ws, timeout_s=120)
    assert r.status == "unresolved" and r.reward == 0.0, (r.status, r.detail, r.test_log[-2000:])
    assert "the unpatched tree's run completes" in r.detail and "witness_s" in r.timings
