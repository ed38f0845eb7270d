"""One step of a run, shown: its rewards, advantages, stage-2 prompts and per-token loss, as training computed them.

    python -m training.explain runs/default [--step N]      # make explain: RUN/explain/step-N.html and step-N.json

Every `sample_every` steps, rank 0 writes `trace.jsonl` (`record`): for its first prompt, the prompt, the G
completions with each reward and advantage, the stage-2 prompt and answer of each, and token by token the values
`canoe.update` and `grpo_loss` computed (log π_θ, log π_ref, log π_old, ρ, the clip, the k3 KL, ℓ), for every
sequence of the micro-batch that holds the group; the other micro-batches' losses; the logged loss and rate. The
page (`write_page`) only adds them up: the group's mean and std, each sequence's mean ℓ, and the aggregation, ending
in the loss metrics.jsonl logged. It is one HTML file with its style inline and no script, and the JSON beside it
holds the same numbers for other tools.
"""

from __future__ import annotations

import argparse
import html
import json
import math
from pathlib import Path

from grading.tags import tag_content

def record(run, step, metrics: dict) -> dict:
    """The trace of `step` (a training.metrics.Step) for this rank's first prompt: JSON-ready, every number the one
    training used. `metrics` is the step's logged line."""
    cfg, G = run.cfg, run.cfg.num_generations
    batch, row, first = step.rollout, step.rollout.rows[0], step.micro_batches[0]
    names = list(cfg.rewards)
    completions = []
    for i, c in enumerate(batch.completions[:G]):
        stage2 = batch.stage2.completions[i]
        completions.append({
            "text": c.text, "token_ids": list(c.token_ids), "tokens": [run.tokenizer.decode([t]) for t in c.token_ids],
            "finish_reason": c.finish_reason, "scores": dict(zip(names, step.rollout.scores[i].tolist())),
            "reward": float(step.rewards[i]), "advantage": float(step.advantages[i]), "kept": bool(step.kept[i]),
            "long_answer": tag_content(c.text, "long_answer"), "stage2_problem": batch.stage2.problems[i],
            "stage2_text": None if stage2 is None else stage2.text,
            "stage2_answer": None if stage2 is None else tag_content(stage2.text, "answer")})
    lengths = [len(c.token_ids) for c in first.completions]  # each sequence's tokens, without the padding

    def rows(tensor) -> list | None:
        return None if tensor is None else [tensor[m, :n].tolist() for m, n in enumerate(lengths)]

    passes = [{"lr": p["lr"], "loss": float(p["loss"]), "total_sequences": p["total_sequences"],
               "total_tokens": p["total_tokens"], "other_losses": [float(b.passes[k]["loss"])
                                                                   for b in step.micro_batches[1:]],
               **{key: rows(p.get(key)) for key in ("logprobs", "ratio", "clipped", "kl", "token_loss")}}
              for k, p in enumerate(first.passes)]
    return {
        "step": run.step, "world_size": run.world_size, "model": cfg.model,
        "config": {key: getattr(cfg, key) for key in ("num_generations", "temperature", "beta", "clip_eps_low",
                                                      "clip_eps_high", "advantage_eps", "advantage_std",
                                                      "advantage_rule", "aggregation", "num_iterations")},
        "reward_weights": dict(cfg.rewards),
        "prompt": {"problem": row["problem"], "solution": row.get("solution"),
                   "text": run.tokenizer.decode(row["prompt_ids"]),
                   "token_ids": list(row["prompt_ids"]), "passage": tag_content(row["problem"], "context")},
        "completions": completions,
        "micro_batch": {"sequences": len(lengths), "ref": rows(first.ref), "old": rows(first.old),
                        "vllm": rows(first.vllm_logprobs), "mask": rows(first.mask)},
        "passes": passes,
        "logged": {"loss": metrics["loss/loss"], "lr_after": metrics["train/lr"], "kl": metrics["loss/kl"]},
    }


# === The page =====================================================================================================


def derive(trace: dict) -> dict:
    """What the page adds up from the trace: the group's mean and std of the total reward (the config's std), each
    sequence's mean ℓ over its trained tokens, and the first pass's loss, ending where metrics.jsonl's loss/loss is
    (this rank's sum over its micro-batches; with several ranks the log holds their mean)."""
    rewards = [c["reward"] for c in trace["completions"]]
    G, mean = len(rewards), sum(rewards) / len(rewards)
    correction = {"unbiased": 1, "biased": 0}.get(trace["config"]["advantage_std"])
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (G - correction)) if correction is not None else None
    first, mask = trace["passes"][0], trace["micro_batch"]["mask"]
    trained = [sum(m != 0 for m in row) for row in mask]
    token_sums = [sum(l for l, m in zip(losses, row) if m != 0) for losses, row in zip(first["token_loss"], mask)]
    means = [s / max(n, 1) for s, n in zip(token_sums, trained)]
    aggregation = trace["config"]["aggregation"]
    if aggregation == "seq-mean-token-mean":  # CANOE: the mean of each sequence's mean, over the batch's sequences
        batch_loss = sum(means) / first["total_sequences"]
    elif aggregation == "token-mean":  # DAPO: every trained token of the batch alike
        batch_loss = sum(token_sums) / first["total_tokens"]
    else:  # Dr. GRPO: sequences × the longest completion allowed, which the trace does not hold; training's value
        batch_loss = first["loss"]
    rank_loss = batch_loss + sum(first["other_losses"])
    return {"reward_mean": mean, "reward_std": std, "trained_tokens": trained, "token_loss_sums": token_sums,
            "sequence_means": means, "micro_batch_loss": batch_loss, "rank_loss": rank_loss}


def read_trace(run_dir: Path, step: int | None) -> dict:
    path = run_dir / "trace.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist: train first (the trace is written every sample_every steps)")
    traces = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            trace = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"error: {path}, line {number}: not JSON ({error.msg})") from None
        traces[trace["step"]] = trace
    if not traces:
        raise SystemExit(f"error: {path} is empty")
    chosen = max(traces) if step is None else step
    if chosen not in traces:
        raise SystemExit(f"error: step {step} is not in {path}; its steps: {', '.join(map(str, sorted(traces)))}")
    return traces[chosen]


def write_page(run_dir: Path, step: int | None = None, out: Path | None = None) -> tuple[Path, Path]:
    """RUN/explain/step-N.html and step-N.json for a step of `trace.jsonl` (its last when `step` is None)."""
    trace = read_trace(run_dir, step)
    trace = {**trace, "derived": derive(trace)}
    out = out or run_dir / "explain"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"step-{trace['step']}"
    stem.with_suffix(".json").write_text(json.dumps(trace, indent=1))
    stem.with_suffix(".html").write_text(render(trace, run_dir))
    return stem.with_suffix(".html"), stem.with_suffix(".json")


def _n(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _tagged(text: str | None) -> str:
    """The text escaped, its CANOE tags shown in colour."""
    out = html.escape(text or "")
    for tag in ("think", "long_answer", "answer"):
        for form in (f"&lt;{tag}&gt;", f"&lt;/{tag}&gt;"):
            out = out.replace(form, f'<b class="{tag}">{form}</b>')
    return out


def _shade(value: float, scale: float, hue: int) -> str:
    """A background whose strength grows with |value| / scale (a colour scale for ρ and the KL)."""
    alpha = min(1.0, abs(value) / scale) if scale > 0 else 0.0
    return f' style="background:hsla({hue},85%,55%,{0.6 * alpha:.2f})"'


def _glance(trace: dict, derived: dict) -> str:
    """The step on one screen: each completion's short answer, rewards, r, A and mean ℓ, then the loss."""
    names, cfg = list(trace["reward_weights"]), trace["config"]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(
        f"<tr><td>{i + 1}</td><td class='tok'>{html.escape(str(tag_content(c['text'], 'answer')))}</td>"
        + "".join(f"<td>{c['scores'][n]:g}</td>" for n in names)
        + f"<td><b>{c['reward']:g}</b></td><td>{_n(c['advantage'])}</td><td>{len(c['tokens'])}</td>"
        f"<td>{_n(derived['sequence_means'][i], 5)}</td></tr>" for i, c in enumerate(trace["completions"]))
    first = trace["passes"][0]
    return (f"<p>Solution: <b>{html.escape(str(trace['prompt'].get('solution')))}</b>. Group: mean(r) = "
            f"{_n(derived['reward_mean'])}, std(r) = {_n(derived['reward_std'])}. Loss: {_n(derived['rank_loss'], 6)} "
            f"added up here, {_n(trace['logged']['loss'], 6)} logged; learning rate {first['lr']:.3g}.</p>"
            f"<table class='num'><tr><th>i</th><th>&lt;answer&gt;</th>{head}<th>r<sub>i</sub></th>"
            f"<th>A<sub>i</sub></th><th>tokens</th><th>mean ℓ</th></tr>{rows}</table>")


def _prompt(trace: dict) -> str:
    text, passage = trace["prompt"]["text"], trace["prompt"]["passage"]
    at = text.rfind(passage) if passage else -1  # the question's passage: the worked example has one too
    shown = (html.escape(text) if at < 0 else f"{html.escape(text[:at])}<mark>{html.escape(passage)}</mark>"
             f"{html.escape(text[at + len(passage):])}")
    solution = trace["prompt"].get("solution")
    return (f"<p>The prompt as the model reads it (the chat template, the system prompt, any worked example, then the "
            f"question); the solution that accuracy and influence compare with: "
            f"<b>{html.escape(str(solution))}</b>.</p><pre>{shown}</pre>")


def _rewards(trace: dict, derived: dict) -> str:
    names, weights = list(trace["reward_weights"]), trace["reward_weights"]
    head = "".join(f"<th>{html.escape(n)} (×{weights[n]:g})</th>" for n in names)
    body = "".join(
        f"<tr><td>{i + 1}</td><td class='text'><pre>{_tagged(c['text'])}</pre></td>"
        + "".join(f"<td>{c['scores'][n]:g}</td>" for n in names) + f"<td><b>{c['reward']:g}</b></td></tr>"
        for i, c in enumerate(trace["completions"]))
    return (f"<p>r<sub>i</sub> is the weighted sum of the rewards, each 0 or 1 (docs/DESIGN.md states each rule)."
            f"</p><table><tr><th>i</th><th>completion o<sub>i</sub></th>{head}<th>r<sub>i</sub></th></tr>{body}"
            f"</table>")


def _advantages(trace: dict, derived: dict) -> str:
    cfg, mean, std = trace["config"], derived["reward_mean"], derived["reward_std"]
    eps = cfg["advantage_eps"]
    rule = (f"A<sub>i</sub> = (r<sub>i</sub> − {_n(mean)}) / ({_n(std)} + {eps:g})" if std is not None
            else f"A<sub>i</sub> = r<sub>i</sub> − {_n(mean)}")
    rows = "".join(f"<tr><td>{i + 1}</td><td>{c['reward']:g}</td><td>{_n(c['advantage'])}</td>"
                   f"<td>{'yes' if c['kept'] else 'no'}</td></tr>" for i, c in enumerate(trace["completions"]))
    if cfg["advantage_rule"] != "sum_then_normalize":  # GDPO normalises each reward first: A is not this rule's
        rule += f" under CANOE's rule; this run's rule is {cfg['advantage_rule']}, whose A the table gives"
    return (f"<p>mean(r) = {_n(mean)}, std(r) = {_n(std)} ({cfg['advantage_std']}), so {rule}."
            f" A group whose rewards are all equal gets A = 0.</p>"
            f"<table><tr><th>i</th><th>r<sub>i</sub></th><th>A<sub>i</sub></th><th>trained</th></tr>{rows}</table>")


def _stage2(trace: dict) -> str:
    parts = []
    for i, c in enumerate(trace["completions"]):
        verdict = c["scores"].get("influence")
        parts.append(
            f"<h3>completion {i + 1}: influence = {'–' if verdict is None else f'{verdict:g}'}</h3>"
            + ("<p>No long answer, so no stage 2.</p>" if c["stage2_problem"] is None else
               f"<p>Its long answer takes the passage's place; the stage-2 question, under the same system prompt "
               f"and example:</p><pre>{html.escape(c['stage2_problem'])}</pre>"
               f"<p>The stage-2 answer, sampled once:</p><pre>{_tagged(c['stage2_text'])}</pre>"))
    return "".join(parts)


def _tokens(trace: dict, derived: dict) -> str:
    micro, passes = trace["micro_batch"], trace["passes"]
    show_old = trace["config"]["num_iterations"] > 1
    parts = [] if show_old else [
        "<p>With μ = 1, π<sub>old</sub> is π<sub>θ</sub> itself, detached: ρ = 1, the clip never binds, and "
        "ℓ = −A + β·KL, whose gradient is −A ∇log π<sub>θ</sub> + β ∇KL. Grey rows are not trained. log "
        "π<sub>vLLM</sub> is what the sampler gave the token, for comparison.</p>"]
    for k, p in enumerate(passes):
        kl_scale = max((v for row in p["kl"] for v in row), default=0.0) or 1e-9
        if len(passes) > 1:
            parts.append(f"<h3>pass {k + 1} of {len(passes)} (rate {p['lr']:.3g})</h3>")
        for i, c in enumerate(trace["completions"]):
            cols = "<th>t</th><th>token</th><th>log π<sub>θ</sub></th><th>log π<sub>ref</sub></th>" + (
                "<th>log π<sub>old</sub></th>" if show_old else "") + \
                "<th>log π<sub>vLLM</sub></th><th>ρ</th><th>clip</th><th>KL</th><th>ℓ</th>"
            rows = []
            for t, token in enumerate(c["tokens"]):
                trained = micro["mask"][i][t] != 0
                ratio, kl = p["ratio"][i][t], p["kl"][i][t]
                ref = None if micro["ref"] is None else micro["ref"][i][t]
                rows.append(
                    f"<tr class='{'' if trained else 'off'}'><td>{t}</td>"
                    f"<td class='tok'>{html.escape(repr(token))}</td>"
                    f"<td>{_n(p['logprobs'][i][t])}</td><td>{_n(ref)}</td>"
                    + (f"<td>{_n(micro['old'][i][t])}</td>" if show_old else "")
                    + f"<td>{_n(micro['vllm'][i][t])}</td><td{_shade(math.log(ratio), 0.2, 210)}>{_n(ratio)}</td>"
                    f"<td>{'binds' if p['clipped'][i][t] else ''}</td><td{_shade(kl, kl_scale, 25)}>{_n(kl, 5)}</td>"
                    f"<td>{_n(p['token_loss'][i][t], 5)}</td></tr>")
            parts.append(f"<details{' open' if i == 0 else ''}><summary>completion {i + 1}: A = "
                         f"{_n(c['advantage'])}, {len(c['tokens'])} tokens</summary><table class='num'>"
                         f"<tr>{cols}</tr>{''.join(rows)}</table></details>")
    return "".join(parts)


def _loss(trace: dict, derived: dict) -> str:
    first, cfg, G = trace["passes"][0], trace["config"], len(trace["completions"])
    rows = "".join(f"<tr><td>{i + 1}{'' if i < G else ' (another prompt)'}</td><td>{_n(s, 5)}</td><td>{n}</td>"
                   f"<td>{_n(m, 5)}</td></tr>" for i, (s, n, m) in
                   enumerate(zip(derived["token_loss_sums"], derived["trained_tokens"], derived["sequence_means"])))
    others = first["other_losses"]
    lines = [f"the micro-batch's loss by {cfg['aggregation']} = {_n(derived['micro_batch_loss'], 6)}"
             + (f" = Σ mean ℓ / {first['total_sequences']:g} sequences in the step"
                if cfg["aggregation"] == "seq-mean-token-mean" else "")]
    if others:
        lines.append(f"+ the other {len(others)} micro-batch(es): {', '.join(_n(x, 6) for x in others)}")
    lines.append(f"= this rank's loss {_n(derived['rank_loss'], 6)}")
    logged = trace["logged"]["loss"]
    lines.append(f"metrics.jsonl logged loss/loss = {_n(logged, 6)}"
                 + (f" (the mean of {trace['world_size']} ranks' losses)" if trace["world_size"] > 1 else ""))
    lines.append(f"the update that followed used the learning rate {first['lr']:.3g}")
    head = "<tr><th>sequence</th><th>Σ<sub>t</sub> ℓ</th><th>trained tokens</th><th>mean ℓ</th></tr>"
    return (f"<table>{head}{rows}</table><ul>{''.join(f'<li>{line}</li>' for line in lines)}</ul>")


STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
pre{white-space:pre-wrap;background:#f6f6f6;padding:.5em;margin:0}mark{background:#ffe48a}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}
table.num td{text-align:right;font-family:monospace}td.tok{text-align:left}tr.off{color:#aaa}
td.text{max-width:520px}b.think{color:#777}b.long_answer{color:#0a6}b.answer{color:#c40}
nav a{margin-right:1em}h2{border-bottom:1px solid #ddd;margin-top:1.6em}"""


def render(trace: dict, run_dir: Path) -> str:
    """The page: one HTML document, its style inline, no script."""
    derived, cfg = trace["derived"], trace["config"]
    sections = [("glance", "The step at a glance", _glance(trace, derived)),
                ("prompt", "The prompt, its passage marked", _prompt(trace)),
                ("rewards", f"{cfg['num_generations']} completions and their rewards", _rewards(trace, derived)),
                ("advantages", "The group's advantages", _advantages(trace, derived)),
                ("stage2", "Stage 2: each long answer in the passage's place", _stage2(trace)),
                ("tokens", "Token by token", _tokens(trace, derived)),
                ("loss", "The loss, added up", _loss(trace, derived))]
    nav = "".join(f'<a href="#{key}">{title}</a>' for key, title, _ in sections)
    body = "".join(f'<h2 id="{key}">{title}</h2>{content}' for key, title, content in sections)
    title = f"{html.escape(str(run_dir))}, step {trace['step']}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style></head>"
            f"<body><h1>{title}</h1><p>{html.escape(trace['model'])}; τ = {cfg['temperature']:g}, "
            f"β = {cfg['beta']:g}, clip 1 − {cfg['clip_eps_low']:g} … 1 + {cfg['clip_eps_high']:g}, "
            f"μ = {cfg['num_iterations']}. Every number is the one training computed; the page only adds them up."
            f"</p><nav>{nav}</nav>{body}</body></html>")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="A page of one training step's numbers (its trace.jsonl line).")
    parser.add_argument("run", type=Path, help="the run's output folder, e.g. runs/default")
    parser.add_argument("--step", type=int, help="a step of trace.jsonl (default: its last)")
    parser.add_argument("--out", type=Path, help="the folder to write to (default: RUN/explain)")
    args = parser.parse_args(argv)
    page, numbers = write_page(args.run, args.step, args.out)
    print(f"{page}\n{numbers}")


if __name__ == "__main__":
    main()
