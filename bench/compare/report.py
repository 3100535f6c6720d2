"""Derived numbers (added vs direct, ratios vs vllm-router, the issue's targets), the median over
passes, and the markdown table."""

from __future__ import annotations

import statistics
from typing import Any

ADDED = (("p50_ms_1", "added_p50_ms_1"), ("p99_ms_1", "added_p99_ms_1"), ("p50_ms_64", "added_p50_ms_64"),
         ("p99_ms_64", "added_p99_ms_64"), ("ttft_p50_ms", "added_ttft_p50_ms"),
         ("ttft_p99_ms", "added_ttft_p99_ms"), ("itl_p50_ms", "added_itl_p50_ms"),
         ("itl_p99_ms", "added_itl_p99_ms"))
CPU = ("cpu_us_per_request_64", "cpu_us_per_event_burst64", "cpu_us_per_event_paced256")


def judge(res: dict[str, Any], passes: list[dict[str, Any]]) -> None:
    """The issue's targets, judged on ``res``'s medians, each with its value in every pass."""
    t = res["targets"]
    gw = t.get("gateway", {})
    if "unavailable" in gw or not gw:
        return
    lite = t.get("litellm", {})
    per_pass = [p["targets"].get("gateway", {}) for p in passes]
    router_per_pass = [p["targets"].get("vllm-router", {}) for p in passes]
    checks: dict[str, Any] = {}

    def check(label: str, key: str, ok: Any) -> None:
        values = [row.get(key) for row in per_pass]
        met = sum(1 for row, rrow in zip(per_pass, router_per_pass, strict=True) if ok(row, rrow))
        checks[label] = {"median": gw.get(key), "met_on_median": bool(ok(gw, t.get("vllm-router", {}))),
                         "passes": values, "met_in_passes": f"{met} of {len(per_pass)}"}

    for k in CPU:
        if gw.get(f"{k}_vs_router") is not None:
            check(f"{k} <= 1.5x vllm-router", f"{k}_vs_router",
                  lambda g, _, k=k: g.get(f"{k}_vs_router") is not None and g[f"{k}_vs_router"] <= 1.5)
        if gw.get(k) and lite.get(k):
            ratio = round(lite[k] / gw[k], 1)
            checks[f"{k}: litellm / gateway >= 20"] = f"{ratio} ({'yes' if ratio >= 20 else 'NO'})"
    if gw.get("added_p50_ms_1") is not None and t.get("vllm-router", {}).get("added_p50_ms_1") is not None:
        check("added p50 (1 at a time) <= vllm-router's + 0.2 ms", "added_p50_ms_1",
              lambda g, r: None not in (g.get("added_p50_ms_1"), r.get("added_p50_ms_1"))
              and g["added_p50_ms_1"] <= r["added_p50_ms_1"] + 0.2)
    if gw.get("added_ttft_p99_ms") is not None:
        check("added TTFT p99, 256 paced streams <= 2 ms", "added_ttft_p99_ms",
              lambda g, _: g.get("added_ttft_p99_ms") is not None and g["added_ttft_p99_ms"] <= 2.0)
    res["issue_targets"] = checks


def derive(one_pass: dict[str, Any]) -> None:
    """One pass's "added" rows (against its own direct) and ratios (against its own vllm-router)."""
    t = one_pass["targets"]
    direct = t.get("direct", {})
    router = t.get("vllm-router", {})
    for name, row in t.items():
        if name == "direct" or "unavailable" in row:
            continue
        for src, dst in ADDED:
            if row.get(src) is not None and direct.get(src) is not None:
                row[dst] = round(row[src] - direct[src], 3)
        for k in CPU:
            if row.get(k) and router.get(k):
                row[f"{k}_vs_router"] = round(row[k] / router[k], 2)


def combine(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target's rows as the median over the passes that measured it (ratios and "added" rows
    are medians of each pass's own, never recomputed from medians); other fields from the last pass."""
    out: dict[str, Any] = {}
    for name in passes[-1]:
        rows = [p[name] for p in passes if name in p and "unavailable" not in p[name]]
        if not rows:
            out[name] = passes[-1][name]
            continue
        merged: dict[str, Any] = dict(rows[-1])
        for key, value in rows[-1].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                xs = [r[key] for r in rows if isinstance(r.get(key), int | float)]
                merged[key] = round(statistics.median(xs), 3)
        merged["errors"] = sum(r.get("errors", 0) for r in rows)
        merged["passes"] = len(rows)
        out[name] = merged
    return out


ROWS = (
    ("p50 latency, 1 at a time (ms)", "p50_ms_1", 2),
    ("  added p50, 1 at a time (ms)", "added_p50_ms_1", 2),
    ("  added p99, 1 at a time (ms)", "added_p99_ms_1", 2),
    ("p50 latency, 64 concurrent (ms)", "p50_ms_64", 2),
    ("  added p50, 64 concurrent (ms)", "added_p50_ms_64", 2),
    ("  added p99, 64 concurrent (ms)", "added_p99_ms_64", 2),
    ("requests/s, 64 concurrent", "rps_64", 0),
    ("**CPU µs per request, 64 concurrent**", "cpu_us_per_request_64", 0),
    ("  × vllm-router", "cpu_us_per_request_64_vs_router", 2),
    ("  of which kernel (system time)", "sys_us_per_request_64", 0),
    ("CPU µs per SSE event, 64 streams back to back", "cpu_us_per_event_burst64", 1),
    ("  × vllm-router", "cpu_us_per_event_burst64_vs_router", 2),
    ("**CPU µs per SSE event, 256 paced streams**", "cpu_us_per_event_paced256", 1),
    ("  × vllm-router", "cpu_us_per_event_paced256_vs_router", 2),
    ("  of which kernel (system time)", "sys_us_per_event_paced256", 1),
    ("proxy core busy, paced (fraction)", "proxy_cpu_frac_paced", 2),
    ("paced events/s delivered", "paced_events_per_s", 0),
    ("TTFT p50, paced (ms)", "ttft_p50_ms", 2),
    ("  added TTFT p50 (ms)", "added_ttft_p50_ms", 2),
    ("  added TTFT p99 (ms)", "added_ttft_p99_ms", 2),
    ("inter-token p50, paced (ms)", "itl_p50_ms", 2),
    ("  added inter-token p50 (ms)", "added_itl_p50_ms", 2),
    ("  added inter-token p99 (ms)", "added_itl_p99_ms", 2),
    ("CPU 1 busy (upstream+loadgen), conc", "cpu1_busy_conc", 2),
    ("CPU 1 busy (upstream+loadgen), paced", "cpu1_busy_paced", 2),
    ("other processes' CPU, conc (cores)", "other_cpu_conc", 2),
    ("other processes' CPU, paced (cores)", "other_cpu_paced", 2),
    ("errors", "errors", 0),
)


def _fmt(v: Any, digits: int) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def markdown(res: dict[str, Any]) -> str:
    t = res["targets"]
    names = list(t)
    live = [n for n in names if "unavailable" not in t[n]]
    p = res["params"]
    out = [f"Paced: {p['paced_streams']} streams × {p['paced_tokens']} tokens, {p['token_ms']:g} ms apart "
           f"({p['rounds']} rounds; LiteLLM: at most 2 rounds, half the tokens, a tenth of the other counts). "
           f"Proxy on CPU 0, upstream + load generator on CPU 1. Medians of {p.get('passes', 1)} passes; "
           f"the run took {res.get('wall_s')} s. "
           f"Other processes used {res['host'].get('other_cpu_before_cores')} cores before the start.", "",
           "| metric | " + " | ".join(live) + " |", "|---|" + "---|" * len(live)]
    for label, key, digits in ROWS:
        out.append(f"| {label} | " + " | ".join(_fmt(t[n].get(key), digits) for n in live) + " |")
    out.append("| version | " + " | ".join(str(t[n].get("version", "")) for n in live) + " |")
    for n in names:
        if "unavailable" in t[n]:
            out.append(f"\n**{n}: unavailable:** {t[n]['unavailable']}")
        elif t[n].get("timed_out") or t[n].get("first_error"):
            out.append(f"\n{n}: timed out in {t[n].get('timed_out', [])}; first error: {t[n].get('first_error', '')}")
    if res.get("issue_targets"):
        out += ["", f"Issue #5 targets (gateway), judged on the medians of {p.get('passes', 1)} passes:", ""]
        for k, v in res["issue_targets"].items():
            if isinstance(v, dict):
                each = ", ".join(_fmt(x, 2) for x in v["passes"])
                v = f"{_fmt(v['met_on_median'], 0)} (median {_fmt(v['median'], 2)}; per pass {each}: " \
                    f"met in {v['met_in_passes']})"
            out.append(f"- {k}: {v}")
    return "\n".join(out) + "\n"
