"""The report's cards, built the same way for every run from the common summary shape
(:func:`poslens.rundir.summary.envelope`): one card per paper a run measures (its readings from
:mod:`poslens.reporting.readings`, per-layer quantities as line plots with error bars, per-head
quantities as head × layer maps (:mod:`poslens.reporting.quantities`), its own figures by role, the short
tables a reader quotes),
comparison blocks that overlay like runs, the key findings, model cards and the reproduction page."""

from __future__ import annotations

import json

from poslens.errors import PoslensError
from poslens.fmt import fmt
from poslens.rundir.load import Run, load_run
from poslens.reporting.collect import expand
from poslens.reporting.elements import _MIME, _inside, _slug, embed_figure, embed_file, sparse_sentence, table
from poslens.reporting.readings.papers import PAPERS
from poslens.reporting.readings.findings import key_findings, model_readings, run_readings
from poslens.reporting.readings.notes import beyond_context_note
from poslens.metrics.judge.papers import num
from poslens.reporting.quantities import (HEAD_QUANTITIES, LAYER_QUANTITIES, MAX_TABLE_LAYERS, head_figure,
                                         layer_figure, layer_quantities, layer_table, slash_matrix, slash_profiles)
from poslens.rundir.summary import figure_caption
from poslens.rundir.figures import new_figure



#: the zoom figure's window (positions); a zoom is shown only on maps more than twice as large
ZOOM_POSITIONS = 64


def _hidden(run: Run, role: str, per_layer_drawn: bool) -> bool:
    """Whether a figure of this role stays in the run directory instead of on the page."""
    if role == "detail":
        return True
    if role == "per-layer":
        return per_layer_drawn  # the report draws the same numbers as line plots (or a table)
    if role == "zoom":
        n = num(run.summary.get("seq_len"))
        return n is not None and n <= 2 * ZOOM_POSITIONS  # the full map already shows those positions large
    return False


def run_figures(run: Run, notes: list[str] | None = None, *, per_layer_drawn: bool = False) -> list[dict]:
    """The run's own figures (``summary["figures"]``, older runs' ``files`` or PNGs), embedded; those
    whose role keeps them off the page (:data:`poslens.rundir.summary.FIGURE_ROLES`) are named in ``notes``."""
    out, kept_back = [], []
    for f in run.figures:
        rel, cap = f["file"], f["caption"]
        if _hidden(run, f.get("role", "main"), per_layer_drawn):
            kept_back.append(rel)
            continue
        p = _inside(run.path, rel)
        uri = embed_file(p) if p is not None else None
        if uri is None:
            if notes is not None:
                notes.append(f"figure {rel} is listed but missing or unreadable; not shown.")
            continue
        out.append({"src": uri, "caption": cap, "file": rel})
    if kept_back and notes is not None:
        notes.append(f"In the run directory, not shown here: {', '.join(kept_back)}.")
    return out


def _card(run: Run, *, title: str | None = None, subtitle: str = "", badge: str = "", readings=None, tables=None,
          figures=None, meta=None, notes=None, anchor: str = "") -> dict:
    return {"id": anchor or f"run-{_slug(run.name)}", "title": title or run.name, "subtitle": subtitle,
            "badge": badge or run.command, "path": str(run.display_path if run.display_path is not None else run.path),
            "readings": list(readings or []), "tables": [t for t in tables or [] if t],
            "figures": list(figures or []), "meta": list(meta or []), "notes": list(notes or [])}


# --------------------------------------------------------------------------------------------
# one card per (run, paper), the same way for every command
# --------------------------------------------------------------------------------------------
def run_label(run: Run) -> str:
    s = run.summary
    if isinstance(s.get("label"), str):
        return s["label"]
    layers = run.layers
    ropes = {bool(l.get("rope")) for l in layers if "rope" in l}
    pe = "RoPE" if ropes == {True} else "NoPE" if ropes == {False} else "partly RoPE" if ropes else ""
    ctrl = s.get("controls") or {}
    bits = [model_name(run), pe]
    if ctrl.get("bidirectional"):
        bits.append("bidirectional control")
    if ctrl.get("no_rope_layers"):
        bits.append(f"RoPE removed in layers {fmt(ctrl['no_rope_layers'])}")
    if s.get("num_seqs") is not None:
        bits.append(f"{fmt(s.get('num_seqs'))} sequences × {fmt(s.get('seq_len'))} tokens")
    src = (run.config.get("source") or {}).get("kind") if isinstance(run.config.get("source"), dict) else None
    if src:
        bits.append(f"data: {src}")
    if s.get("experiment"):
        bits.append(str(s["experiment"]))
    return ", ".join(b for b in bits if b)


scan_label = run_label  # older name


def model_name(run: Run) -> str:
    """The run's model by name, as the fingerprint names it (its directory's name, the ``.gguf`` file's
    stem: model_nope, SmolLM2-135M-Instruct.Q4_1), never only its architecture (the micro models are
    model_type smollm3); the model_type where the run records no model."""
    from poslens.capture.model.source import model_names

    opts = run.config.get("options") if isinstance(run.config.get("options"), dict) else run.config
    where = run.summary.get("model_dir") or (opts or {}).get("model_dir")
    return model_names([str(where)])[0] if isinstance(where, str) and where else str(run.summary.get("model_type") or "")


def readings_for(run: Run, paper: str) -> list[str]:
    """The run's readings for one paper (:func:`poslens.reporting.readings.findings.run_readings`)."""
    return run_readings(run.command, run.papers, run.summary, paper)


def _meta(run: Run) -> list[tuple[str, str]]:
    s, c = run.summary, run.config
    opts = c.get("options") if isinstance(c.get("options"), dict) else c
    meta = [(k.replace("_", " "), fmt(opts.get(k))) for k in ("model_dir", "alpha", "layers", "seq_len", "dim", "norm",
                                                             "scale", "rope", "causal", "num_seqs", "data", "seed")
            if k in opts and opts.get(k) is not None and not isinstance(opts.get(k), (dict, list))]
    for k in ("samples", "seconds", "wall_s"):
        if num(s.get(k)) is not None:
            meta.append((k.replace("_", " "), fmt(num(s[k]))))
    tp = s.get("throughput") or {}
    if isinstance(tp, dict) and num(tp.get("tokens_per_s")) is not None:
        meta.append(("tokens / s", fmt(num(tp.get("tokens_per_s")))))
    if isinstance(tp, dict) and num(tp.get("peak_gpu_memory_bytes")) is not None:  # scans on a GPU
        meta.append(("peak GPU memory", f"{num(tp['peak_gpu_memory_bytes']) / 2**30:.1f} GiB"))
    return meta


def generic_cards(run: Run, slash_cache: dict | None = None, *, overlaid: bool = False) -> list[tuple[str, dict]]:
    """One card per paper the run measures: readings, line plots of its per-layer quantities,
    head × layer maps, the short tables, its own figures (score maps with the first paper).
    ``overlaid``: the run's per-layer numbers are drawn in a comparison with like runs, so it gets
    no per-layer table of its own."""
    papers = [p for p in run.papers if p in PAPERS] or ["other"]
    quantities = layer_quantities(run)
    head_keys = [k for k in HEAD_QUANTITIES if any(isinstance(l.get(k), list) for l in run.layers)]
    slash = slash_matrix(run) if "slash" in papers else None
    if slash_cache is not None:
        slash_cache[id(run)] = slash
    notes: list[str] = []
    own_figs = run_figures(run, notes, per_layer_drawn=any(quantities.values()))
    if run.summary.get("stopped_early"):
        notes.append("stopped early: every score's standard error fell below the target.")
    beyond = beyond_context_note(run.summary)
    if beyond:
        notes.append(beyond)
    label = run_label(run)
    cards = []
    for i, paper in enumerate(papers):
        keys = quantities.get(paper, []) + ([k for p, ks in quantities.items() if p not in papers for k in ks]
                                            if i == 0 else [])
        figs = []
        # few layers: the short table says it all; many layers: line plots instead of a long table
        lf = layer_figure([run], keys, title=f"{run.name}: per layer") if len(run.layers) > MAX_TABLE_LAYERS else None
        if lf:
            figs.append(lf)
        if paper == "slash":
            hf = head_figure(run, head_keys, slash)
            if hf:
                figs.append(hf)
        # a run's own tables already say it; an overlaid run's numbers are in the comparison's line plots
        tables = [layer_table(run, keys)] if not run.tables and not overlaid else []
        if len(papers) == 1 or paper == run.paper:
            tables += [table(str(t.get("title") or ""), t["columns"], t["rows"],
                             note=str(t.get("note") or t.get("caption") or ""), definitions=t.get("definitions"))
                       for t in run.tables]
        said = [x for x in (sparse_sentence(str(t.get("title") or ""), t["columns"], t["rows"]) for t in run.tables)
                if x]
        card_notes = list(notes) if i == 0 else []
        if said and (len(papers) == 1 or paper == run.paper):
            card_notes += [f"Not shown as a table: {x}." for x in said]
        title = run.summary.get("title") if isinstance(run.summary.get("title"), str) else None
        cards.append((paper, _card(run, title=title or run.name, subtitle=label if not title else run.name,
                                   badge=run.command, anchor=f"{_slug(paper)}-{_slug(run.name)}",
                                   readings=readings_for(run, paper), tables=tables,
                                   figures=figs + (own_figs if i == 0 else []),
                                   meta=_meta(run) if i == 0 else [], notes=card_notes)))
    return cards


def cards_for(run: Run, *, compared: bool = False) -> list[tuple[str, dict]]:
    """The cards of one run; ``compared``: it is drawn beside like runs in a comparison block."""
    if run.kind == "model":
        return model_cards(run, compared=compared)
    return generic_cards(run, overlaid=compared)


# --------------------------------------------------------------------------------------------
# comparisons: several runs of one command, overlaid
# --------------------------------------------------------------------------------------------
def overlaid_groups(runs: list[Run]) -> dict[str, list[Run]]:
    """Command -> its runs whose per-layer numbers are overlaid in one set of line plots (two or
    more runs of one command with more than one layer each)."""
    by_command: dict[str, list[Run]] = {}
    for r in runs:
        if r.kind == "command" and len(r.layers) > 1:
            by_command.setdefault(r.command, []).append(r)
    return {c: g for c, g in by_command.items() if len(g) >= 2}


def compared_ids(runs: list[Run]) -> set[int]:
    """``id`` of every run drawn in a comparison block (overlaid runs; models beside other models)."""
    ids = {id(r) for g in overlaid_groups(runs).values() for r in g}
    models = [r for r in runs if r.kind == "model" and r.summary]
    return ids | ({id(r) for r in models} if len(models) >= 2 else set())


def comparisons(runs: list[Run]) -> dict[str, list[dict]]:
    """Section -> comparison blocks ({title, legend, readings, tables, figures}) for like runs."""
    out: dict[str, list[dict]] = {}
    by_command = overlaid_groups(runs)
    for command, group in by_command.items():
        legend = "; ".join(f"{r.name}: {run_label(r)}" for r in group)
        per_paper: dict[str, list[str]] = {}
        for r in group:
            for p, ks in layer_quantities(r).items():
                for k in ks:
                    if k not in per_paper.setdefault(p, []):
                        per_paper[p].append(k)
        order = list(LAYER_QUANTITIES)  # known quantities first, in their order, whichever run has them
        for ks in per_paper.values():
            ks.sort(key=lambda k: order.index(k) if k in order else len(order))
        for paper, keys in per_paper.items():
            fig = layer_figure(group, keys, title=f"{len(group)} {command} runs")
            if fig is None:
                continue
            out.setdefault(paper if paper in PAPERS else "other", []).append({
                "title": f"Comparison of {len(group)} {command} runs", "legend": legend, "readings": [],
                "tables": [], "figures": [fig]})
    # analysis runs of the same experiment: stack tables that share title and columns
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.kind == "command" and r.summary.get("experiment"):
            groups.setdefault(str(r.summary["experiment"]), []).append(r)
    overlaid = {id(r) for g in by_command.values() for r in g}
    for exp, group in groups.items():
        if len(group) < 2 or all(id(r) in overlaid for r in group):  # their per-layer plots are overlaid above
            continue
        tabs = []
        for t in group[0].tables:
            rows = []
            for r in group:
                match = next((u for u in r.tables if u.get("title") == t.get("title")
                              and u.get("columns") == t.get("columns")), None)
                if match is None:
                    rows = []
                    break
                rows += [[r.name] + (row if isinstance(row, list) else [row]) for row in match["rows"]]
            tabs.append(table(f"{t.get('title') or ''} (all runs)", ["run"] + list(t["columns"]), rows,
                              definitions=t.get("definitions")))
        tabs = [t for t in tabs if t]
        if tabs:
            paper = group[0].paper if group[0].paper in PAPERS else "other"
            out.setdefault(paper, []).append({"title": f"Comparison: {exp} ({len(group)} runs)", "legend": "",
                                              "readings": [], "tables": tabs, "figures": []})
    models = [r for r in runs if r.kind == "model" and r.summary]
    if len(models) >= 2:
        rows = [[r.name] + [r.summary.get(k) for k in ("pe", "task", "data", "steps", "params", "initial_loss",
                                                       "final_loss", "eval_accuracy", "eval_accuracy_long")]
                for r in models]
        loss = _loss_figure(models)
        out.setdefault("models", []).append({
            "title": f"Comparison of {len(models)} models", "legend": "", "readings": [],
            "figures": [loss] if loss else [],
            "tables": [table("Models side by side", ["model", "PE", "task", "data", "steps", "parameters",
                                                     "initial loss", "final loss", "accuracy", "accuracy (longer)"],
                             rows)]})
    return out


def findings(runs: list[Run]) -> list[dict]:
    """The page's key findings: one block per paper, from every run's numbers."""
    items = []
    for r in runs:
        if r.kind != "command":
            continue
        s = r.summary
        if "slash" in r.papers and not s.get("slash_heads"):  # older runs: the Δ-limited heads from the maps
            got = slash_profiles(r, upto=None)
            if got is not None:
                from poslens.metrics.slash import top_slash_heads

                ids = [l.get("layer") for l in r.layers] or None
                s = {**s, "slash_heads": top_slash_heads(got[0], k=10, layer_ids=ids)}
        items.append((r.name, r.command, r.papers, s))
    kf = key_findings(items)
    return [{"paper": k, "title": PAPERS[k]["short"], "ref": PAPERS[k]["ref"], "items": v, "anchor": f"sec-{k}"}
            for k, v in kf.items()]


def _loss_log(run: Run) -> tuple[list, list, list, list] | None:
    """``(steps, losses, eval steps, eval losses)`` from the run's ``train_log.jsonl``, or None."""
    log = run.path / "train_log.jsonl"
    if not log.is_file():
        return None
    steps, losses, ev_steps, ev_losses = [], [], [], []
    try:
        for line in log.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(r, dict):
                continue
            if r.get("kind") == "eval" and num(r.get("eval_loss")) is not None:
                ev_steps.append(r.get("step"))
                ev_losses.append(num(r["eval_loss"]))
            elif num(r.get("loss")) is not None and num(r.get("step")) is not None:
                steps.append(num(r["step"]))
                losses.append(num(r["loss"]))
    except OSError:
        return None
    return (steps, losses, ev_steps, ev_losses) if len(steps) >= 2 else None


def _loss_figure(runs: list[Run]) -> dict | None:
    """Loss curves of one or more training runs in one figure (drawn here, embedded as PNG)."""
    logs = [(r, lg) for r in runs for lg in [_loss_log(r)] if lg]
    if not logs:
        return None
    fig, ax = new_figure(figsize=(5.0, 3.0))
    for n, (r, (steps, losses, ev_steps, ev_losses)) in enumerate(logs):
        name = f"{r.name}: " if len(logs) > 1 else ""
        ax.plot(steps, losses, lw=1, color=f"C{n}", label=f"{name}training loss")
        if ev_losses:
            ax.plot(ev_steps, ev_losses, "o--", ms=3, color=f"C{n}", label=f"{name}evaluation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return {"src": embed_figure(fig), "caption": "Loss during training (from train_log.jsonl).",
            "file": "train_log.jsonl"}


def _loss_curve(run: Run) -> dict | None:
    """The loss curve of one training run."""
    return _loss_figure([run])


_MODEL_KEYS = ("pe", "task", "data", "preset", "steps", "params", "params_non_embedding", "initial_loss", "final_loss",
               "eval_loss", "eval_accuracy", "eval_accuracy_long", "tokens_per_second", "device")


#: what ``poslens train --pe`` puts in a model, in words
_PE_WORDS = {"none": "no positional encoding (NoPE)", "rope": "RoPE in every layer",
             "learned": "learned absolute positions"}


def model_subtitle(summary: dict, config: dict) -> str:
    """What a model directory is, in words: a model ``poslens train`` made says its size preset, its
    positional encoding and what it learned (the architecture it borrows comes last: the micro models are
    model_type smollm3 without being SmolLM3); any other, its architecture."""
    arch = str(config.get("model_type") or "unknown")
    pe = summary.get("pe")
    if not isinstance(pe, str):
        return f"a {arch} model directory"
    preset = f"{summary['preset']} " if isinstance(summary.get("preset"), str) else ""
    task = summary.get("task")
    what = f"the {task} task" if isinstance(task, str) and task else "language modelling"
    return (f"a {preset}model trained by poslens train on {what}, with {_PE_WORDS.get(pe, pe)} "
            f"({arch} layout)")


def model_cards(run: Run, *, compared: bool = False) -> list[tuple[str, dict]]:
    """A model directory's card; ``compared``: its numbers and loss curve are in the side-by-side block."""
    s, c = run.summary, run.config
    arch = [(k, fmt(c.get(k))) for k in ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "n_layer", "n_embd", "n_head", "vocab_size") if k in c]
    rows = [] if compared else [[k.replace("_", " "), s.get(k)] for k in _MODEL_KEYS if k in s and s.get(k) is not None]
    figs = [] if compared else [f for f in [_loss_curve(run)] if f]
    notes = [] if s else ["no summary.json: a model directory not written by `poslens train`; architecture only."]
    card = _card(run, subtitle=model_subtitle(s, c), badge="model", readings=model_readings(s, c),
                 tables=[table("Training summary", ["quantity", "value"], rows)] if rows else [], figures=figs,
                 meta=arch, notes=notes)
    return [("models", card)]



# --------------------------------------------------------------------------------------------
# the reproduction page
# --------------------------------------------------------------------------------------------
def reproduction_block(run: Run) -> dict:
    idx = run.index
    exps = []
    summary_rows = []
    for e in idx.get("experiments") or []:
        if not isinstance(e, dict):
            continue
        name = str(e.get("name") or "?")
        rep = e.get("reproduced")
        verdict = "reproduced" if rep is True else "not reproduced" if rep is False else "not decided"
        edir = _inside(run.path, name) if name != "?" else None
        figs, nested = [], []
        if edir is not None and edir.is_dir():
            for p in sorted(edir.glob("*")):
                if p.suffix.lower() in _MIME:
                    uri = embed_file(p)
                    if uri:
                        figs.append({"src": uri, "caption": figure_caption(p.name), "file": f"{name}/{p.name}"})
            paths, _ = expand(edir, depth=3)
            for rp in paths:
                if rp.resolve() == run.path.resolve():
                    continue
                try:
                    sub = load_run(rp)
                except PoslensError:
                    continue
                sub.name = str(rp.resolve().relative_to(run.path.resolve()))
                for _sec, c in cards_for(sub):
                    c["id"] = f"repro-{_slug(sub.name)}-{_sec}"
                    c["path"] = sub.name  # relative: the folder may be a staging copy or move later
                    nested.append(c)
        measured = e.get("measured")
        lines = measured if isinstance(measured, list) else str(measured if measured is not None else "").splitlines()
        exps.append({"id": f"exp-{_slug(name)}", "name": name, "paper": str(e.get("paper") or ""),
                     "claim": str(e.get("claim") or ""), "measured": [str(x) for x in lines if str(x).strip()],
                     "verdict": verdict, "ok": rep, "note": str(e.get("note") or ""), "figures": figs,
                     "cards": nested})
        summary_rows.append([name, str(e.get("paper") or ""), verdict])
    n_ok = sum(1 for e in exps if e["ok"] is True)
    setting = []
    if idx.get("samples") is not None:
        setting.append(f"Monte Carlo samples per simulation: {fmt(idx.get('samples'))}")
    if idx.get("seed") is not None:
        setting.append(f"seed {idx.get('seed')}")
    shown = run.display_path if run.display_path is not None else str(run.path)
    return {"id": f"repro-{_slug(run.name)}", "name": run.name, "path": shown, "experiments": exps,
            "n_ok": n_ok, "n": len(exps), "setting": ", ".join(setting),
            "table": table("Verdicts", ["experiment", "paper", "verdict"], summary_rows)}
