"""Step-time benchmark: our Dual-GRPO trainer against TRL's GRPOTrainer, same model, data and batch, on the CPU.

    bash bench/setup_trl.sh                      # once: TRL in its own environment, .venv-trl
    .venv/bin/python bench/bench_step.py --data data/synth/train.jsonl [--steps 3] [--seed 42] [--json out.json]
    .venv/bin/python bench/bench_step.py --data D.jsonl --only trl --steps 2      # one side alone
    .venv/bin/python bench/bench_step.py --model models/Qwen2.5-Coder-0.5B-Instruct --data D.jsonl \
        --lora-rank 16 --lora-alpha 32 --dtype bfloat16 --micro-prompts 1           # the default's model, LoRA, dtype

Both workers are started up front and stay alive (`bench/ours_worker.py` in .venv, `bench/trl_worker.py` in
.venv-trl), so model loading and start-up never count. Each gets the same model, data file, seed and batch:
4 prompts x 7 samples, 128 new tokens, one optimizer step per batch, beta 0.04, learning rate 1e-6. After one
warm-up step each, steps alternate ours, TRL, ours, TRL, ... (`--steps` each), so slow drifts of a shared machine
hit both alike.

Worker protocol (one line each on the worker's stdout): `READY` once loaded; stdin `step` -> one optimizer step ->
`{"seconds": s, "phases": {...}}`; stdin `quit` -> `{"peak_rss_mib": x, ...}` from the worker's own
`getrusage` (the operating system's peak resident set size), then exit. Just before `quit`, the bench also reads
from /proc the peak RSS of the worker's live helper processes (reward grader workers, an inference engine), which
getrusage does not count until they exit. Worker stderr goes to `runs/bench/<side>_worker.log`.

Printed: median seconds per step of each side, `step time ratio (ours/TRL): X.XX`, the phases of our median step
as shares of it (with "everything else" as the remainder), `overhead share: X%` (everything but generation --
stage1, stage2 -- and forward_backward), TRL's phases likewise, and each worker's peak RSS. `--json` writes the
same figures to a file.

What differs between the two sides by construction (print it with the figures): TRL generates with Hugging Face
`generate` (use_vllm=False, its default and the one that runs on a CPU), we with vLLM; TRL has no second stage,
so it samples once per step where we sample twice and it has no influence reward. TRL's micro-batch
(`--micro-prompts`, default 2 prompts = 14 sequences, the same on both sides) matches ours; its
gradient checkpointing is off, as in our config (see trl_worker.py).

Memory: both workers are alive at once, and the alternation is what makes the timings fair. TRL alone peaked at
16 GiB with SmolLM2-135M (micro-batch 14, no checkpointing) on the 24 GiB development machine, so the two sides
together can run out of memory there; a smaller micro-batch on both sides is the first way out. With the default's
model in bfloat16 and LoRA, TRL peaked at 17 GiB even at micro-batch 7 and was killed beside our worker: there the
sides can only run one after the other (`--only`), their timings then not interleaved (say which beside the figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = REPO_ROOT / "runs" / "bench"

# The batch of the issue: fixed, so that both sides are always run with the same one.
BATCH_FLAGS = ["--prompts", "4", "--generations", "7", "--max-new-tokens", "128", "--beta", "0.04", "--lr", "1e-6"]

# Generation phases of our step; with forward_backward they are the work a GRPO step cannot avoid.
OURS_CORE_PHASES = ("stage1", "stage2", "forward_backward")
TRL_CORE_PHASES = ("generation", "forward_backward")


def descendant_peaks(root_pid: int) -> list[float]:
    """Peak RSS (VmHWM, MiB) of each live descendant of `root_pid`, from /proc: persistent helper processes (the
    reward grader's workers, an inference engine's) are not yet in the worker's RUSAGE_CHILDREN, which only
    counts children that have exited."""
    parents: dict[int, int] = {}
    peaks: dict[int, float] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:  # the process ended while we looked
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        pid = int(status.parent.name)
        parents[pid] = int(fields["PPid"])
        if "VmHWM" in fields:
            peaks[pid] = int(fields["VmHWM"].split()[0]) / 1024
    tree = {root_pid}
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return [peaks.get(pid, 0.0) for pid in tree - {root_pid}]


class Worker:
    """One benchmark worker process speaking the line protocol above."""

    def __init__(self, name: str, python: Path, script: Path, flags: list[str]) -> None:
        if not python.exists():
            hint = "run `bash bench/setup_trl.sh`" if name == "TRL" else "run `make setup`"
            raise SystemExit(f"{python} not found: {hint}")
        if not script.exists():
            raise SystemExit(f"{script} not found (use --only to run the other side alone)")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name.lower()}_worker.log"
        self.log_file = self.log_path.open("w")
        command = [str(python), str(script), *flags]
        print(f"starting {name}: {' '.join(command)}  (log: {self.log_path.relative_to(REPO_ROOT)})", flush=True)
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log_file, text=True
        )
        self.steps: list[dict] = []
        self.final: dict = {}
        self.live_children_peaks: list[float] = []

    def _read_line(self) -> str:
        """Next protocol line; other stdout lines are a protocol breach but only worth a warning."""
        while True:
            line = self.process.stdout.readline()
            if not line:
                self.process.wait()
                tail = self.log_path.read_text(errors="replace").splitlines()[-20:]
                raise SystemExit(
                    f"{self.name} worker exited (code {self.process.returncode}); last log lines:\n" + "\n".join(tail)
                )
            line = line.strip()
            if line == "READY" or line.startswith("{"):
                return line
            print(f"  [{self.name} stdout, not protocol] {line}", file=sys.stderr)

    def wait_ready(self) -> None:
        line = self._read_line()
        if line != "READY":
            raise SystemExit(f"{self.name} worker: expected READY, got {line!r}")

    def _command(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return json.loads(self._read_line())

    def step(self) -> dict:
        result = self._command("step")
        self.steps.append(result)
        return result

    def quit(self) -> dict:
        self.live_children_peaks = descendant_peaks(self.process.pid)
        self.final = self._command("quit")
        self.process.wait(timeout=120)
        self.log_file.close()
        return self.final

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log_file.close()


def median_step(steps: list[dict]) -> dict:
    """The measured step whose time is the median (the lower middle one for an even count), so that its phase
    shares add up to its own total."""
    ranked = sorted(steps, key=lambda step: step["seconds"])
    return ranked[(len(ranked) - 1) // 2]


def phase_shares(step: dict, core: tuple[str, ...]) -> tuple[dict[str, float], float]:
    """Shares of the step per phase, "everything else" as the remainder, and the share of non-core work."""
    total = step["seconds"]
    phases = dict(step.get("phases", {}))
    shares = {name: seconds / total for name, seconds in phases.items()}
    shares["everything else"] = 1.0 - sum(shares.values())
    overhead = 1.0 - sum(phases.get(name, 0.0) for name in core) / total
    return shares, overhead


def summarize(worker: Worker, core: tuple[str, ...], measured: int) -> dict:
    steps = worker.steps[1:]  # the first one is the warm-up
    assert len(steps) == measured, (worker.name, len(steps), measured)
    seconds = [step["seconds"] for step in steps]
    representative = median_step(steps)
    shares, overhead = phase_shares(representative, core)
    return {
        "warmup_seconds": worker.steps[0]["seconds"],
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "median_step": representative,
        "phase_shares": shares,
        "overhead_share": overhead,
        "peak_rss_mib": worker.final.get("peak_rss_mib"),
        "children_peak_rss_mib": worker.final.get("children_peak_rss_mib"),
        "live_children_peak_rss_mib": worker.live_children_peaks,
        "info": worker.final.get("info", {}),
    }


def print_side(label: str, summary: dict) -> None:
    seconds = ", ".join(f"{s:.2f}" for s in summary["seconds"])
    print(f"{label}: median {summary['median_seconds']:.2f} s/step  (steps: {seconds}; warm-up "
          f"{summary['warmup_seconds']:.2f})")
    completion = summary["median_step"].get("completion_tokens_mean")
    if completion is not None:
        prompt = summary["median_step"].get("prompt_tokens_mean", float("nan"))
        print(f"  mean prompt / completion length in its median step: {prompt:.0f} / {completion:.0f} tokens")
    print(f"  phases of its median step ({summary['median_step']['seconds']:.2f} s):")
    for name, share in summary["phase_shares"].items():
        seconds = summary["median_step"].get("phases", {}).get(name)
        seconds = summary["median_step"]["seconds"] * share if seconds is None else seconds
        print(f"    {name:<18} {100 * share:5.1f}%  {seconds:7.2f} s")


def print_memory(label: str, summary: dict) -> None:
    """The worker process's own peak RSS, then its helper processes' peaks (their sum bounds their joint peak)."""
    line = f"peak RSS {label}: {summary['peak_rss_mib']:.0f} MiB"
    live = summary["live_children_peak_rss_mib"]
    if live:
        line += f"; + {sum(live):.0f} MiB summed peaks of {len(live)} helper processes"
    if summary["children_peak_rss_mib"]:
        line += f"; largest exited child {summary['children_peak_rss_mib']:.0f} MiB"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct", help="Hugging Face-format model dir")
    parser.add_argument("--data", required=True, help="JSONL in the project format, given to both sides")
    parser.add_argument("--steps", type=int, default=3, help="measured steps per side, after one warm-up each")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--only", choices=["ours", "trl"], help="run one side alone")
    parser.add_argument("--micro-prompts", type=int, default=2,
                        help="prompts per forward/backward micro-batch on both sides (TRL: x7 completions)")
    parser.add_argument("--lora-rank", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    parser.add_argument("--lora-alpha", type=float, default=32.0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the weights' dtype on both sides (TRL: the model loaded in it)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")

    model = Path(args.model).resolve()
    data = Path(args.data).resolve()
    for path in (model, data):
        if not path.exists():
            raise SystemExit(f"{path} not found")
    flags = ["--model", str(model), "--data", str(data), "--seed", str(args.seed), *BATCH_FLAGS,
             "--lora-rank", str(args.lora_rank), "--lora-alpha", str(args.lora_alpha), "--dtype", args.dtype]

    sides = []  # (key, Worker, core phases): ours first, so the order is ours, TRL, ours, TRL, ...
    try:
        if args.only != "trl":
            sides.append(("ours", Worker("ours", REPO_ROOT / ".venv/bin/python",
                                         REPO_ROOT / "bench/ours_worker.py",
                                         [*flags, "--micro-prompts", str(args.micro_prompts)]), OURS_CORE_PHASES))
        if args.only != "ours":
            sides.append(("trl", Worker("TRL", REPO_ROOT / ".venv-trl/bin/python",
                                        REPO_ROOT / "bench/trl_worker.py",
                                        [*flags, "--micro-batch", str(7 * args.micro_prompts)]), TRL_CORE_PHASES))
        start = time.perf_counter()
        for _, worker, _ in sides:
            worker.wait_ready()
        print(f"workers ready after {time.perf_counter() - start:.0f} s", flush=True)

        for round_index in range(args.steps + 1):
            label = "warm-up" if round_index == 0 else f"step {round_index}/{args.steps}"
            for _, worker, _ in sides:
                result = worker.step()
                print(f"  {label:<10} {worker.name:<4} {result['seconds']:7.2f} s", flush=True)
        for _, worker, _ in sides:
            worker.quit()
    finally:
        for _, worker, _ in sides:
            worker.kill()

    summaries = {key: summarize(worker, core, args.steps) for key, worker, core in sides}
    print()
    adapters = f"LoRA rank {args.lora_rank}, alpha {args.lora_alpha:g}" if args.lora_rank else "full fine-tuning"
    print(f"settings: {' '.join(BATCH_FLAGS)} --seed {args.seed}; model {args.model}; {adapters}; {args.dtype}; "
          f"data {args.data}; {args.steps} measured steps each after 1 warm-up, alternating")
    if "trl" in summaries:
        info = summaries["trl"]["info"]
        print(f"TRL: {info.get('trainer')}, generation by {info.get('generation')}; rewards: {info.get('rewards')}; "
              f"per_device_train_batch_size {info.get('per_device_train_batch_size')} x "
              f"gradient_accumulation_steps {info.get('gradient_accumulation_steps')}, gradient checkpointing "
              f"{'on' if info.get('gradient_checkpointing') else 'off'}")
        print("TRL has no second stage (no stage-2 generation, no influence reward); its vLLM modes do not run on "
              "the CPU build, so it generates with transformers.")
    if "ours" in summaries:
        print_side("ours", summaries["ours"])
        print(f"overhead share: {100 * summaries['ours']['overhead_share']:.0f}%")
    if "trl" in summaries:
        print_side("TRL", summaries["trl"])
        print(f"  TRL share outside generation and forward_backward: {100 * summaries['trl']['overhead_share']:.0f}%")
    ratio = None
    if len(summaries) == 2:
        ratio = summaries["ours"]["median_seconds"] / summaries["trl"]["median_seconds"]
        print(f"step time ratio (ours/TRL): {ratio:.2f}")
    if "ours" in summaries:
        print_memory("ours", summaries["ours"])
    if "trl" in summaries:
        print_memory("TRL", summaries["trl"])

    if args.json:
        figures = {
            "settings": {"batch_flags": BATCH_FLAGS, "seed": args.seed, "model": args.model, "data": args.data,
                         "steps": args.steps, "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha,
                         "dtype": args.dtype},
            **summaries,
            "step_time_ratio_ours_over_trl": ratio,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
