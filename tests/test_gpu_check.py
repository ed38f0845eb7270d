"""bench/gpu_check.py's CPU subset (`--cpu`): every check that can run without a GPU runs and passes, without vLLM;
a broken packed mask (`--break-mask`) fails the packing checks; and every module the run imports is one the GPU
machine will have: the standard library's, the project's, a package of its image that the run relies on
(`DEVICE`) or one such a package requires, an optional import (`OPTIONAL`), or a carried wheel
(bench/gpu_wheels.txt).

The GPU's run is recorded in bench/RESULTS.md; here the script must not be left to fail on the device for a reason
a CPU could have shown (an import of vLLM, a package the machine lacks, a wrong call into the project's code).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
# The script run as __main__, and at its exit every module the process holds, with its file, written to a file,
# and what `inspect.getmodule` made of a code object from no module's file (it reads every module's __file__, the
# vLLM stand-in's too).
TRACED = ("import atexit, inspect, json, runpy, sys; out = sys.argv.pop(1); sys.argv.pop(0)\n"
          "def getmodule():\n"
          "    try:\n"
          "        return repr(inspect.getmodule(compile('0', 'nowhere.py', 'eval')))\n"
          "    except Exception as error:\n"
          "        return f'raised {error!r}'\n"
          "atexit.register(lambda: open(out, 'w').write(json.dumps({'getmodule': getmodule(), 'modules': "
          "{name: str(vars(m).get('__file__') or '') for name, m in list(sys.modules.items())}})))\n"
          "runpy.run_path(sys.argv[0], run_name='__main__')")
# The GPU machine's packages the run takes as they are there: each one the device's documentation lists for its
# image (versions where a session's pip list there gave them). Whatever else the run imports must travel.
DEVICE = {"torch": "2.11.0", "triton": "3.6.0", "numpy": "2.5.2", "huggingface-hub": "1.33.0",
          "tokenizers": "0.23.2", "safetensors": "0.8.0", "accelerate": "1.15.0", "sympy": "", "mpmath": "",
          "networkx": "", "jinja2": "", "markupsafe": "", "filelock": "", "fsspec": "", "packaging": "",
          "psutil": "", "py-cpuinfo": "", "pyyaml": "", "tqdm": "", "requests": "", "urllib3": "", "idna": "",
          "certifi": "", "charset-normalizer": "", "hf-xet": "", "httpx": "", "httpcore": "", "h11": "",
          "anyio": "", "click": "", "typer": "", "rich": "", "markdown-it-py": "", "mdurl": "", "pygments": "",
          "shellingham": "", "annotated-doc": "", "ninja": "", "setuptools": "", "nvidia-ml-py": "", "pillow": "",
          "protobuf": "", "sentencepiece": ""}
# Imported here only because this machine has them; the importer goes on without them.
OPTIONAL = {"dill": "torch.utils._import_utils.import_dill, under dill_available()",
            "sniffio": "anyio/_core/_eventloop.py and httpcore2, under try: import sniffio"}


def wheels() -> set[str]:
    """The distributions bench/gpu_wheels.txt carries, by normalised name."""
    lines = (ROOT / "bench" / "gpu_wheels.txt").read_text().splitlines()
    return {normalised(line.split("==")[0]) for line in lines if line.strip() and not line.startswith("#")}


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(names: set[str]) -> set[str]:
    """`names` and, recursively, what their installed distributions require (no extras): what a package of the
    machine's image brings with it there."""
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            required = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [normalised(re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0]) for r in required if "extra ==" not in r]
    return found


def distribution(file: str, owners: dict[str, list[str]]) -> str | None:
    """The distribution a module's file belongs to (by its folder under site-packages), "stdlib", "project", or
    None for a file elsewhere."""
    path = Path(file).resolve()
    if path.is_relative_to(ROOT) and ".venv" not in path.relative_to(ROOT).parts:
        return "project"
    if "site-packages" not in path.parts:
        return "stdlib" if path.is_relative_to(Path(sysconfig.get_paths()["stdlib"]).resolve()) else None
    top = path.parts[path.parts.index("site-packages") + 1].split(".")[0]
    return normalised(owners.get(top, [top])[0])


def run(*args: str, trace: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    command = [sys.executable, "-c", TRACED, str(trace)] if trace else [sys.executable]
    done = subprocess.run([*command, str(SCRIPT), "--cpu", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    return done, [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]


@pytest.fixture(scope="module")
def cpu_subset(tmp_path_factory):
    """One run of the whole CPU subset: (its process, its PASS/FAIL/SKIP lines, every module it imported)."""
    trace = tmp_path_factory.mktemp("trace") / "modules.json"
    done, lines = run(trace=trace)
    traced = json.loads(trace.read_text()) if trace.exists() else {}
    return done, lines, traced.get("modules", {}), traced.get("getmodule")


# Each DeepSpeed engine's lines, in order (check_stages).
STAGE_LINES = ("full gradient vs a plain model", "two steps vs torch's AdamW on their gradients",
               "AdamW with a setting lost lands away from the two steps", "WeightSums of the pushed weights = their "
               "exact integer sums", "WeightSums see one value one step off", "the saved policy folder = what vLLM "
               "holds after a push", "save, load into a fresh engine, one more step each")


def test_the_cpu_subset_runs_every_check_it_can_and_passes_without_vllm(cpu_subset):
    done, lines, _, _ = cpu_subset
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    expected = [f"PASS  packing {backend}: {what}" for backend in ("default", "math")
                for what in ("log π packed vs alone (L = 41, max |Δ|)", "LoRA gradient packed vs alone (relative)")]
    expected += ["PASS  merge: "] * 3 + ["SKIP  memory"]
    expected += [f"PASS  deepspeed {mode} ZeRO-{stage}: {what}" for mode in ("lora", "full") for stage in (2, 3)
                 for what in STAGE_LINES]
    assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), "\n".join(lines)
    # the sums are of real weights, and each loaded engine's third step matched bit for bit
    sums = [line for line in lines if "exact integer sums" in line]
    assert len(sums) == 4 and all(line.split("total ")[1].split(" / ")[0] != "0" for line in sums)
    assert all(": 0 of " in line for line in lines if "save, load" in line)
    # the packing bound is the math kernel's noise, the same for every kernel's line
    assert len({line.rsplit("noise ", 1)[1] for line in lines if "log π packed" in line}) == 1


def test_it_says_what_a_world_of_one_cannot_show(cpu_subset):
    done, _, _, _ = cpu_subset
    (line,) = [line for line in done.stdout.splitlines() if "collective backend" in line]
    assert "world of 1: its collectives move nothing and ZeRO keeps every partition whole" in line


def test_the_vllm_stand_in_has_no_file_and_answers_no_dunder(cpu_subset):
    """`inspect.getmodule` reads every module's __file__: the stand-in's is None, not a stand-in name that raises
    when used (which stopped the run the first time anything called inspect.getmodule)."""
    _, _, modules, getmodule = cpu_subset
    assert "vllm" in modules and modules["vllm"] == ""
    assert getmodule == "None"


@pytest.mark.parametrize("breaks, engines, failing", [
    (["--break-step", "betas", "--break-sums"], "full:2",
     {"two steps vs torch's AdamW", "WeightSums of the pushed weights", "WeightSums see"}),
    (["--break-step", "decay", "--break-policy"], "lora:2", {"two steps vs torch's AdamW", "the saved policy folder"}),
    (["--break-step", "clip"], "full:3", {"two steps vs torch's AdamW"}),
])
def test_each_deepspeed_check_fails_when_what_it_checks_is_broken(breaks, engines, failing):
    """DeepSpeed's config without the run's betas, weight decay or clipping fails the two-step line (and only it);
    WeightSums that sum values in float32 fail both sums lines; a LoRA policy folder saved as its base (the update
    left out) fails the policy line. The other lines of the engine still pass: each check fails for its own reason."""
    done, lines = run("--only", "deepspeed", "--deepspeed", engines, *breaks)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(lines) == len(STAGE_LINES), "\n".join(lines)
    for line, what in zip(lines, STAGE_LINES):
        assert line.startswith(("FAIL" if any(what.startswith(f) for f in failing) else "PASS")
                               + f"  deepspeed {engines.replace(':', ' ZeRO-')}: {what}"), "\n".join(lines)


def test_a_mask_that_lets_completions_see_each_other_fails_the_packing_checks():
    done, lines = run("--only", "packing", "--break-mask")
    assert done.returncode == 1, done.stderr[-3000:]
    assert [line.split("  ")[0] for line in lines] == ["FAIL"] * 4
    gaps = [float(line.rsplit(": ", 1)[1].split(" ")[0]) for line in lines if "log π" in line]  # "5.72 nats, ..."
    assert len(gaps) == 2 and min(gaps) > 1.0  # nats: far beyond the bfloat16 noise the check allows


def test_its_first_line_gives_the_versions_found_before_any_import(cpu_subset):
    done, _, _, _ = cpu_subset
    first = done.stdout.splitlines()[0].split()
    names = first[0::2]
    assert names == ["python", "torch", "transformers", "peft", "huggingface-hub", "tokenizers", "safetensors"]
    assert first[1].rstrip(",") == ".".join(map(str, sys.version_info[:3]))
    assert first[-1] == importlib.metadata.version("safetensors")


def test_every_module_it_imports_is_on_the_gpu_machine_or_carried(cpu_subset):
    """By the trace of the CPU run, each module by its file: DeepSpeed, transformers, PEFT and the project, as the
    GPU run imports them (the CUDA paths add torch's own modules and DeepSpeed's optional nvtx, which it imports
    under a try). Modules without a file (built in, namespaces, Cython's runtimes, the vLLM stand-in) need none."""
    _, _, modules, _ = cpu_subset
    owners = importlib.metadata.packages_distributions()
    carried = wheels()
    allowed = carried | requirements(set(DEVICE)) | set(OPTIONAL) | {"stdlib", "project"}
    unknown = {}
    for module, file in modules.items():
        if file and distribution(file, owners) not in allowed:
            unknown.setdefault(distribution(file, owners), module)
    assert len(modules) > 1000 and "deepspeed.runtime.pipe.p2p" in modules and "einops" in modules
    assert unknown == {}, f"imported, neither on the GPU machine nor in bench/gpu_wheels.txt: {unknown}"
    assert not set(DEVICE) & carried  # one version of each: the machine's or the carried one


def test_the_check_of_the_imports_fails_without_einops(cpu_subset, monkeypatch):
    """einops is there only because DeepSpeed imports it: dropped from the wheels, the check above must fail."""
    carried = wheels() - {"einops"}
    monkeypatch.setattr(sys.modules[__name__], "wheels", lambda: carried)
    with pytest.raises(AssertionError, match="einops"):
        test_every_module_it_imports_is_on_the_gpu_machine_or_carried(cpu_subset)
