"""Run the vendor plugins' own test files against lightning-anyaccel and write the record of what passed.

``make vendor-suites HABANA=path TECO=path`` (or ``python scripts/vendor_suites/run.py --habana ... --teco ...``):
given local checkouts of lightning-habana and lightning-teco (docs/evidence.md says which commits and how to
clone them; nothing is fetched here), each test file of :data:`FILES` runs alone, from its checkout, on the
emulated device of its type, with the migration shim (``shim/``: the vendors' names mapped onto the
package's classes, nothing reimplemented) first on the path. The run writes ``docs/records/vendor/suites.toml``:
its provenance (the package's commit, each checkout's commit, the date, the versions), per file the counts
of passed, failed, skipped, xfailed, xpassed and errors, and per failing test its message and reason
category (:data:`CATEGORIES`, matched on the message). docs/evidence.md renders that record.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from lightning_anyaccel.kit.tools import records  # noqa: E402

SHIM = Path(__file__).resolve().parent / "shim"
RECORD = ROOT / records.RECORD_DIR / "vendor" / "suites.toml"


class Suite(NamedTuple):
    """A vendor plugin: its repository, the commit the docs pin, its device type and its devices option."""

    repository: str
    commit: str
    device_type: str
    option: str


SUITES: dict[str, Suite] = {
    "lightning-habana": Suite("https://github.com/Lightning-AI/lightning-Habana",
                              "5549fa927d5501d31aac0c9b2ed479be62a02cbc", "hpu", "--hpus"),
    "lightning-teco": Suite("https://github.com/Rruown/lightning-Teco", "ac21e3c1f70cd08cb5db7dae6b79697d2f34b517",
                            "sdaa", "--sdaas"),
}

#: (suite, test file, emulated devices): each runs alone. One device, as the suites' default (``--hpus 1``),
#: but the file that tests a strategy over several devices.
FILES: tuple[tuple[str, str, int], ...] = (
    ("lightning-habana", "tests/test_pytorch/test_accelerator.py", 1),
    ("lightning-habana", "tests/test_pytorch/test_accelerator.py", 2),
    ("lightning-habana", "tests/test_pytorch/strategies/test_hpu_ddp.py", 1),
    ("lightning-habana", "tests/test_pytorch/strategies/test_hpu_parallel.py", 2),
    ("lightning-habana", "tests/test_pytorch/strategies/test_fsdp.py", 1),
    ("lightning-habana", "tests/test_pytorch/strategies/test_deepspeed.py", 1),
    ("lightning-habana", "tests/test_pytorch/test_precision.py", 1),
    ("lightning-habana", "tests/test_pytorch/test_profiler.py", 1),
    ("lightning-habana", "tests/test_pytorch/test_cli.py", 1),
    ("lightning-habana", "tests/test_fabric/test_accelerator.py", 1),
    ("lightning-habana", "tests/test_fabric/test_strategy.py", 1),
    ("lightning-habana", "tests/test_fabric/test_fsdp.py", 1),
    ("lightning-habana", "tests/test_fabric/test_precision.py", 1),
    ("lightning-teco", "tests/test_pytorch/test_accelerator.py", 1),
    ("lightning-teco", "tests/test_pytorch/strategies/test_ddp.py", 1),
    ("lightning-teco", "tests/test_pytorch/test_precision.py", 1),
    ("lightning-teco", "tests/test_pytorch/strategies/test_deepspeed.py", 1),
    ("lightning-teco", "tests/test_pytorch/strategies/test_fsdp.py", 1),
)

#: The vendors' test files not run, and why: each is about the vendor's own software, not Lightning's behaviour.
NOT_RUN: dict[str, str] = {
    "lightning-habana/tests/test_pytorch/test_hpu_graphs.py": "HPU graphs (`habana_frameworks.torch.hpu.graphs`)",
    "lightning-habana/tests/test_pytorch/test_dynamic_shapes.py": "Gaudi's graph recompilation metrics",
    "lightning-habana/tests/test_pytorch/test_compile.py": "`torch.compile`'s `hpu_backend` (Gaudi's compiler)",
    "lightning-habana/tests/test_pytorch/test_datamodule.py": "the Habana data loader (media pipe)",
    "lightning-habana/tests/test_pytorch/test_multi_tenancy.py": "Gaudi multi-tenancy (`HABANA_VISIBLE_MODULES` runs)",
    "lightning-habana/tests/test_common/test_resources.py": "`hl-smi` and the Synapse version",
}


class Category(NamedTuple):
    """A reason a vendor test fails against the package: matched on the test's id and its failure's message."""

    pattern: str
    text: str


#: Reason categories, first match wins; each is a difference docs/migration.md describes, or a vendor's own.
CATEGORIES: dict[str, Category] = {
    "works_here": Category(r"XPASS\(strict\)",
                           "the vendor marks it as failing (`xfail`): it works with the package (vendor strategy names)"),
    "vendor_private": Category(
        r"VendorPrivateError|hpex|fp8|_INTEL_NEURAL_COMPRESSOR|HABANA_LOGS|setup_hccl_env|convert_modules",
        "Gaudi software: hpex (fused optimizers, the fp8 Transformer Engine), fp8, Gaudi's logs, `setup_hccl_env`"),
    "gaudi_fact": Category(r"supported_reduce_op|precision_long_type|dtypes_op_output_dtype",
                           "a Gaudi fact: HCCL refuses reduce `product`; Gaudi's autocast op lists and its int64"
                           " handling (the emulated hpu uses torch's CPU kernels and autocast lists)"),
    "process_group_left": Category(r"No backend type associated with device type|ProcessGroupGloo::allgather",
                                   "the Gloo process group an earlier test's DDP on the CPU left in the process"
                                   " (each passes alone)"),
    "ddp_on_cpu": Category(r"device_not_(hpu|sdaa).*(DID NOT RAISE|already chose)",
                           "DDP, FSDP and DeepSpeed on `accelerator=\"cpu\"`: the package trains (Gloo) or refuses"
                           " with its own message where the vendor's strategy refused"),
    "single_device_several": Category(r"any_single' trains on one device|AnySingleDeviceStrategy\(\) has no device",
                                      "`SingleHPUStrategy()` with `devices=\"auto\"` on several devices, or with no"
                                      " device and no accelerator"),
    "numbered_devices": Category(r"index=0\) ==|== \[device\(type='(hpu|sdaa)'\)|index=0\)\] ==",
                                 "numbered devices: `hpu:0` where the vendor gave `hpu`"),
    "strategy_name": Category(r"'any_ddp' == 'hpu_parallel'", "the strategy's own name is the package's (`any_ddp`)"),
    "process_group_backend": Category(r"None == '(hccl|tccl)'",
                                      "`process_group_backend` is `None` until the strategy knows its devices"),
    "precision_names": Category(r"fp16-mixed|precision='fp32'|'bf16-mixed' == 'bf16'|invalid_precision",
                                "the vendors' own precision names (`\"fp16-mixed\"`, `\"fp32\"`, `\"bf16\"` kept"
                                " as `\"bf16\"`): Lightning's names and messages"),
    "plugin_objects": Category(r"has no attribute 'device'|isinstance\(\) arg 2",
                               "the vendors' precision plugin objects (`.device` in `32-true`): Lightning's plugins"),
    "loss_scaling": Category(r"compare_accuracy", "`16-mixed` scales the loss with the device's `GradScaler`, as"
                                                  " Lightning does (lightning-habana's plugin did not)"),
    "mixed_dtypes": Category(r"must have the same dtype",
                             "a float16 or bfloat16 tensor into a float32 layer outside autocast (no precision plugin given): the"
                             " emulated device's CPU kernels refuse mixed dtypes; SDAA's kernels were not run here"),
    "fsdp_dtypes": Category(r"fsdp.*bfloat16 == torch.float32", "FSDP `bf16-mixed` dtypes follow Lightning"),
    "deepspeed_config_optimizer": Category(r"with_optimizer_and_config",
                                           "an optimizer in DeepSpeed's `config` wins over `configure_optimizers`, as"
                                           " in Lightning (lightning-habana preferred the LightningModule's)"),
    "lightning_version": Category(r"random_train", "the test reads an attribute of an older Lightning's"
                                                   " `BoringDataModule` (`random_train`)"),
    "device_name": Category(r"get_device_name", "the accelerator's `get_device_name()`"),
    "memory_stat_names": Category(r"device_stats_monitor", "memory statistics' names"),
    "error_message": Category(r"Regex pattern did not match|import_order",
                              "the package's error messages, which name the fix (and no import order to get wrong)"),
    "profiler_env": Category(r"profiler_env", "`HPUProfiler`'s environment variable (`HABANA_PROFILE`)"),
    "tensorboard": Category(r"[Tt]ensor[Bb]oard", "TensorBoard is not installed here"),
}


def categorise(test: str, message: str) -> str:
    """The first category of :data:`CATEGORIES` whose pattern is in ``test`` and ``message``, else ``"unclassified"``."""
    text = f"{test} {message}"
    return next((key for key, category in CATEGORIES.items() if re.search(category.pattern, text, re.S)),
                "unclassified")


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def checkout_commit(path: Path, suite: str) -> str:
    """The commit ``path`` (a git checkout of ``suite``) is at; refuses a path that is not one."""
    if not (path / ".git").exists() or not (path / "tests").is_dir():
        raise SystemExit(f"{path} is not a git checkout of {suite}: `git clone {SUITES[suite].repository} {path}"
                         f" && git -C {path} checkout {SUITES[suite].commit}`")
    return _git(path, "rev-parse", "HEAD")


def run_file(checkout: Path, suite: str, test_file: str, devices: int, timeout: float) -> dict[str, Any]:
    """Run one test file alone in its checkout on ``devices`` emulated devices; its tests' outcomes and messages."""
    spec = SUITES[suite]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src/lightning_anyaccel/kit/emulator/autoload"),
                                          str(ROOT / "src"), str(SHIM)]),
           "LIGHTNING_ANYACCEL_EMULATE": f"{spec.device_type}:{devices}"}
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl", encoding="utf-8") as report:
        env["VENDOR_SUITES_REPORT"] = report.name
        # -W: the suites turn every FutureWarning into an error; torch warns about one inside Lightning
        command = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                   "-p", "vendor_suites_report", "-W", "ignore::FutureWarning", "--color=no", "--timeout=300",
                   f"{spec.option}={devices}"]
        started = time.monotonic()
        process = subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            tail = process.communicate(timeout=timeout)[0][-2000:]
            ended = f"exit status {process.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            tail = process.communicate()[0][-2000:]
            ended = f"stopped after {timeout:.0f} s"
        finally:  # interrupted (Ctrl-C, SIGTERM): the file's processes end with the run
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        tests: dict[str, dict[str, str]] = {}
        for line in report.read().splitlines():
            entry = json.loads(line)
            tests[entry.pop("test")] = entry
    if not tests:
        raise SystemExit(f"{suite} {test_file}: no test reported ({ended}):\n{tail}")
    counts = Counter(t["outcome"] for t in tests.values())
    failures = {name: {"category": categorise(name, t["message"]),
                       "message": (t["message"].strip().splitlines() or [""])[0][:300]}
                for name, t in tests.items() if t["outcome"] in ("failed", "error")}
    return {"suite": suite, "file": test_file, "emulate": env["LIGHTNING_ANYACCEL_EMULATE"],
            "seconds": round(time.monotonic() - started, 1), "ended": ended,
            **{key: counts.get(key, 0) for key in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")},
            "categories": dict(Counter(f["category"] for f in failures.values()).most_common()),
            "failures": failures}


def dumps(record: dict[str, Any], files: list[dict[str, Any]]) -> str:
    """The record's text: a header, the digest of the body, the body (the records' TOML spelling)."""
    lines = [records.toml_line(k, v) for k, v in record.items() if not isinstance(v, dict)]
    for section, table in record.items():
        if isinstance(table, dict):
            lines += ["", f"[{section}]", *(records.toml_line(k, v) for k, v in table.items())]
    for entry in files:
        lines += ["", "[[files]]", *(records.toml_line(k, v) for k, v in entry.items() if k != "failures")]
        lines += ["[files.failures]", *(records.toml_line(k, v) for k, v in entry["failures"].items())]
    body = "\n".join(lines) + "\n"
    header = "# Written by the run it describes (scripts/vendor_suites/run.py, `make vendor-suites`): never edit by hand.\n"
    return header + f'digest = "sha256:{hashlib.sha256(body.encode()).hexdigest()}"\n' + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--habana", type=Path, required=True, help="a git checkout of lightning-habana")
    parser.add_argument("--teco", type=Path, required=True, help="a git checkout of lightning-teco")
    parser.add_argument("--record", type=Path, default=RECORD, help=f"where to write the record ({RECORD.relative_to(ROOT)})")
    parser.add_argument("--only", default="", help="run only the files whose path contains this (the record says so)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file before it is stopped")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # run the cleanup in run_file
    checkouts = {"lightning-habana": args.habana.resolve(), "lightning-teco": args.teco.resolve()}
    commits = {suite: checkout_commit(path, suite) for suite, path in checkouts.items()}
    started = datetime.datetime.now(datetime.timezone.utc)
    code = records.provenance(ROOT)  # the code the files run against, before they run
    files = []
    for suite, test_file, devices in FILES:
        if args.only in f"{suite}/{test_file}":
            entry = run_file(checkouts[suite], suite, test_file, devices, args.timeout)
            files.append(entry)
            print(f"{suite} {test_file} ({entry['emulate']}): {entry['passed']} passed, {entry['failed']} failed,"
                  f" {entry['error']} errors, {entry['skipped']} skipped, {entry['xfailed']} xfailed"
                  f" in {entry['seconds']} s", flush=True)
    command = "make vendor-suites HABANA=<checkout> TECO=<checkout>" + (f" ONLY={args.only}" if args.only else "")
    record: dict[str, Any] = {
        "kind": "vendor-suites", "date": started, "command": command, **code,
        **records.software(),
        "suites": {suite: {"repository": SUITES[suite].repository, "commit": commits[suite],
                           "pinned": commits[suite] == SUITES[suite].commit} for suite in SUITES},
        "not_run": NOT_RUN, "categories": {key: c.text for key, c in CATEGORIES.items()},
    }
    records.write_text(args.record, dumps(record, files))
    print(f"wrote {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
